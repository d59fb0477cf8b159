// The single-process training step every distributed run must reproduce: which samples a
// step holds, how micro-batch gradients are summed (float or fixed point), the learning-rate
// schedule, clipping, the optimizer, evaluation and checkpoints. Knows nothing of workers
// or collectives: a data-parallel worker calls compute_gradients for its share of the
// micro-batches, sums gradients with its peers, then calls apply_step.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/core/config.hpp"
#include "runtime/data/dataset.hpp"
#include "runtime/nn/model.hpp"
#include "runtime/nn/optim.hpp"

namespace cohort::train {

/// Held-out evaluation of the whole model.
struct evaluation {
  double loss = 0.0;      ///< mean loss per prediction
  double accuracy = 0.0;  ///< share of argmax predictions equal to the target
  int64_t count = 0;      ///< predictions (images, or tokens for a language model)
};

/// Learning rate of `step` (0-based): linear warm-up over warmup_steps, then constant or a
/// cosine from lr down to min_lr at the last step.
float learning_rate(const train_config& t, int64_t step);

class trainer {
 public:
  /// Builds the data set and the model (initialised from train.seed) the config names,
  /// and sets the compute thread count. Throws data_error when a data package is missing.
  explicit trainer(const config& c);

  const config& cfg() const { return cfg_; }
  nn::model& model() { return *model_; }
  const cohort::dataset& data() const { return *data_; }
  /// Micro-batches per step: ceil(global_batch / micro_batch).
  int micro_batches() const { return micro_batches_; }

  /// Clears the gradient sums of the step about to run.
  void begin_step();
  /// Forward and backward of micro-batches [first, last) of step `step`, adding their
  /// gradients (scaled so that the sum over the whole global batch is the mean-loss
  /// gradient) into the step's sum: float sums in `fast` mode, int64 fixed point in
  /// `bitwise` mode. Returns the sum over those micro-batches of (mean loss * rows).
  double compute_gradients(int64_t step, int first, int last);
  /// In bitwise mode, the step's int64 gradient sum (what peers add together); empty in
  /// fast mode, where model().flat_grads() holds the float sum.
  std::vector<int64_t>& fixed_grads() { return fixed_; }
  /// Clips, applies the optimizer for step `step` and returns the gradient norm before
  /// clipping. In bitwise mode first converts the fixed-point sum to floats, once.
  double apply_step(int64_t step);

  /// Loss and accuracy over the whole held-out split.
  evaluation evaluate();

  /// Writes a training checkpoint (parameters, optimizer state, metadata) atomically.
  /// `next_step` is the first step not yet applied.
  void save_checkpoint(const std::string& path, int64_t next_step) const;
  /// Loads parameters and optimizer state; returns the next step to run. Throws
  /// checkpoint_error on any mismatch or corruption, leaving the model untouched.
  int64_t load_checkpoint(const std::string& path);

  /// SHA-256 over every parameter's float32 bytes, parameters taken in name order.
  std::string params_sha256() const;
  /// Peak bytes in use of the memory pool so far.
  int64_t peak_pool_bytes() const;

 private:
  config cfg_;
  std::unique_ptr<cohort::dataset> data_;
  std::unique_ptr<nn::model> model_;
  int micro_batches_ = 1;
  bool bitwise_ = false;
  std::vector<int64_t> fixed_;
  std::unique_ptr<nn::optimizer> opt_;
  cohort::batch batch_;
};

}  // namespace cohort::train
