// The data set interface the trainer samples from, and the factory from the config.
// Owns deterministic sampling (which samples a micro-batch holds) and evaluation
// iteration; knows nothing of models, workers or how micro-batches are shared out.
// Implementations: fashion_mnist.hpp (classification), kjv.hpp (character LM).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "runtime/core/batch.hpp"
#include "runtime/core/config.hpp"

namespace cohort {

/// Where training stands in the data, for checkpoint metadata. Data order is a pure
/// function of (seed, step, global_batch), so these fields are enough to resume exactly.
struct data_position {
  std::string dataset;       ///< "fashion_mnist" | "kjv"
  uint64_t seed = 0;         ///< train.seed the order was drawn with
  int64_t step = 0;          ///< next step to run (steps [0, step) are done)
  int global_batch = 0;      ///< samples per step
  int64_t samples_seen = 0;  ///< step * global_batch
  int64_t epoch = 0;         ///< samples_seen / train_size (Fashion); windows have no epochs
  int64_t train_size = 0;    ///< training samples (Fashion) or characters (KJV)

  /// As "data.*" string pairs, the form checkpoint metadata stores.
  std::map<std::string, std::string> to_metadata() const;
  /// Parses what to_metadata wrote; throws data_error naming a missing or bad key.
  static data_position from_metadata(const std::map<std::string, std::string>& m);
};

/// A training and held-out split with deterministic sampling. All sampling methods are
/// const and thread-safe: their result depends only on their arguments.
class dataset {
 public:
  virtual ~dataset() = default;

  /// "fashion_mnist" or "kjv".
  virtual std::string name() const = 0;
  /// True for next-token language modelling (ids/targets [n, t]); false for
  /// classification (x [n, features], targets [n]).
  virtual bool is_language_model() const = 0;
  /// Classification: number of classes (10); LM: vocabulary size.
  virtual int num_classes() const = 0;
  /// Classification: floats per sample (784); LM: 0.
  virtual int features() const = 0;
  /// LM: time steps per sequence (model.context); classification: 1.
  virtual int context() const = 0;
  /// Training samples (Fashion: images) or characters (KJV).
  virtual int64_t train_size() const = 0;

  /// Fills `out` with micro-batch `micro` of step `step`: a pure function of the five
  /// numbers. Sample j of it is sample (micro * micro_batch + j) of the step's global
  /// batch, so splitting a step into different micro-batch sizes yields the same samples.
  /// The last micro-batch is short when micro_batch does not divide global_batch.
  virtual void train_micro_batch(uint64_t seed, int64_t step, int micro, int micro_batch,
                                 int global_batch, batch& out) const = 0;

  /// Number of held-out samples: Fashion: the 10k test images; KJV: non-overlapping
  /// windows of the validation text, at most max_tokens / context of them when
  /// max_tokens > 0 (and at least one).
  virtual int64_t eval_size(int64_t max_tokens = 0) const = 0;
  /// Fills `out` with held-out samples [first, first + n) (first + n <= eval_size()).
  virtual void eval_batch(int64_t first, int n, batch& out) const = 0;

  /// Normalisation and vocabulary facts a checkpoint must carry so a model can be used
  /// later without this code ("data.norm_mean", "data.norm_std" or "data.vocab", ...).
  virtual std::map<std::string, std::string> preprocessing_metadata() const = 0;

  /// Position after `step` completed steps, for checkpoint metadata.
  data_position position(uint64_t seed, int64_t step, int global_batch) const;
};

/// Calls fn(batch) for each batch of the held-out split in order, batch_size samples
/// each (the last one shorter); max_tokens as for eval_size.
void for_each_eval_batch(const dataset& ds, int batch_size, int64_t max_tokens,
                         const std::function<void(const batch&)>& fn);

/// Builds the data set config.data.dataset names ("fashion_mnist" or "kjv"), reading the
/// installed Debian packages. Throws usage_error for an unknown name, data_error when a
/// package is missing or its files are corrupt.
std::unique_ptr<dataset> make_dataset(const config& c);

/// Number of samples of micro-batch `micro` (checks 0 <= micro and that it is not past the
/// end of the global batch; aborts on a caller bug).
int micro_batch_rows(int micro, int micro_batch, int global_batch);

}  // namespace cohort
