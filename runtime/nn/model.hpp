// The model interface the trainer, the optimizers and (later) the pipeline / tensor-parallel
// splitters work against: named parameters in one stable order, stored back to back in one
// flat value and one flat gradient tensor, grouped into named blocks, plus the hook backward
// calls as each block's gradients become final. Owns parameter bookkeeping and seeded
// initialisation; mlp.hpp / gpt.hpp own the arithmetic; knows nothing of workers or configs.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/batch.hpp"
#include "runtime/nn/tensor.hpp"

namespace cohort {
struct model_config;
}

namespace cohort::nn {

/// How a parameter is initialised; every draw comes from rng(hash_coords(seed, index)).
struct init_spec {
  enum kind_t { uniform, normal, constant } kind = constant;
  float a = 0.0f;  ///< uniform: bound (U(-a, a)); normal: std; constant: the value
};

/// One named parameter. `value` and `grad` are views into the model's flat tensors, so
/// writing through them writes the model.
struct parameter {
  std::string name;    ///< PyTorch state_dict name, e.g. "transformer.h.0.attn.c_attn.weight"
  tensor value;        ///< shape as in PyTorch
  tensor grad;         ///< same shape; accumulated by forward_backward
  int64_t offset = 0;  ///< first element inside flat_values() / flat_grads()
  init_spec init;
};

/// A named group of consecutive parameters that is cut as a unit: pipeline stages take
/// whole blocks. Blocks cover all parameters, in order.
struct block_info {
  std::string name;       ///< "net.0", "embedding", "h.3", "head", ...
  std::size_t first = 0;  ///< index of its first parameter
  std::size_t count = 0;  ///< number of parameters
};

/// Result of evaluating one micro-batch.
struct eval_result {
  float loss = 0.0f;    ///< mean loss over the `count` predictions
  int64_t correct = 0;  ///< predictions whose argmax equals the target
  int64_t count = 0;    ///< predictions made: n (classification) or n*t (language model)
};

/// Base of every model. Subclasses declare parameters in their constructor
/// (begin_block / add_param), call finalize(seed), then bind their layers to the views.
class model {
 public:
  virtual ~model() = default;
  model(const model&) = delete;
  model& operator=(const model&) = delete;

  /// Runs forward and backward on one micro-batch: accumulates d(loss * loss_scale)/dparam
  /// into the gradients and returns the mean loss of the micro-batch. Throws
  /// cohort::usage_error for a batch of the wrong kind or size.
  virtual float forward_backward(const batch& b, float loss_scale) = 0;
  /// Loss and accuracy of one micro-batch; gradients are left untouched.
  virtual eval_result eval(const batch& b) = 0;
  /// "mlp" or "gpt".
  virtual std::string kind() const = 0;

  /// Parameters in their stable order (the order of PyTorch's named_parameters()).
  std::vector<parameter>& parameters() { return params_; }
  const std::vector<parameter>& parameters() const { return params_; }
  /// The parameter called `name`; throws usage_error if there is none.
  const parameter& param(const std::string& name) const;
  parameter& param(const std::string& name);
  /// Blocks in order; each names a consecutive range of parameters.
  const std::vector<block_info>& blocks() const { return blocks_; }
  /// Names of the parameters of block `i`.
  std::vector<std::string> block_param_names(std::size_t i) const;
  /// All parameter values back to back, in parameter order.
  tensor& flat_values() { return values_; }
  /// All gradients back to back, in parameter order.
  tensor& flat_grads() { return grads_; }
  /// Total number of parameter elements.
  int64_t num_params() const { return values_.numel(); }
  /// Sets every gradient to zero.
  void zero_grad() { grads_.zero(); }
  /// Re-draws every parameter from `seed` (a pure function of seed and parameter index).
  void init_parameters(uint64_t seed);
  /// The pool tensors of this model come from.
  pool& memory() { return *pool_; }
  /// Elements [first, first + count) of flat_values() / flat_grads() that block `i` holds
  /// (its parameters are consecutive, so the range is contiguous).
  std::pair<int64_t, int64_t> block_elements(std::size_t i) const;

  /// Called during forward_backward as soon as block `block`'s parameter gradients are
  /// final for this micro-batch (backward visits blocks last to first, so the calls come
  /// in decreasing block index, each block exactly once). eval() never calls it.
  using block_done_fn = std::function<void(std::size_t block)>;
  /// Installs the hook; an empty function removes it (no calls, no cost).
  void set_block_done_hook(block_done_fn fn) { block_done_ = std::move(fn); }
  /// Whether a hook is installed (callers that install one temporarily must remove it).
  bool has_block_done_hook() const { return static_cast<bool>(block_done_); }

 protected:
  /// Subclasses call this from backward once nothing more will touch block `block`'s
  /// gradients in this micro-batch; calls the hook if one is set.
  void block_done(std::size_t block) {
    if (block_done_) block_done_(block);
  }
  explicit model(pool& p) : pool_(&p) {}
  /// Starts a new block; following add_param calls belong to it.
  void begin_block(std::string name);
  /// Declares a parameter; returns its index.
  std::size_t add_param(std::string name, shape_t shape, init_spec init);
  /// Allocates the flat tensors, creates the views and initialises from `seed`.
  void finalize(uint64_t seed);

 private:
  pool* pool_;
  std::vector<parameter> params_;
  std::vector<block_info> blocks_;
  std::vector<shape_t> shapes_pending_;  // shapes declared before finalize()
  tensor values_, grads_;
  block_done_fn block_done_;
};

/// Builds the model a config names. `vocab` is used by gpt only; `max_batch` is the
/// largest micro-batch (rows) activations are allocated for.
std::unique_ptr<model> make_model(const model_config& cfg, int vocab, int max_batch, uint64_t seed,
                                  pool& p = pool::global());

}  // namespace cohort::nn
