// The model interface the trainer, the optimizers and (later) the pipeline / tensor-parallel
// splitters work against: named parameters in one stable order, stored back to back in one
// flat value and one flat gradient tensor, grouped into named blocks, plus the hook backward
// calls as each range of gradient elements becomes final. Owns parameter bookkeeping and
// seeded initialisation; mlp.hpp / gpt.hpp own the arithmetic; knows nothing of workers or
// configs.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/batch.hpp"
#include "runtime/nn/layers.hpp"
#include "runtime/nn/tensor.hpp"

namespace cohort {
struct model_config;
}

namespace cohort::nn {

struct moe_exchange;  // runtime/nn/moe.hpp

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
  const tensor& flat_grads() const { return grads_; }
  /// Total number of parameter elements.
  int64_t num_params() const { return values_.numel(); }
  /// Sets every gradient to zero.
  void zero_grad() { grads_.zero(); }
  /// Re-draws every parameter from `seed` (a pure function of seed and parameter index).
  void init_parameters(uint64_t seed);
  /// The pool tensors of this model come from.
  pool& memory() { return *pool_; }
  /// The device the model computes on (its pool's).
  device& dev() const { return pool_->dev(); }
  /// Elements [first, first + count) of flat_values() / flat_grads() that block `i` holds
  /// (its parameters are consecutive, so the range is contiguous).
  std::pair<int64_t, int64_t> block_elements(std::size_t i) const;

  /// Called during forward_backward with elements [offset, offset + count) of
  /// flat_grads() as soon as their values are final for this micro-batch. Every element is
  /// reported exactly once per forward_backward, never before it is final, in DESCENDING
  /// offsets as far as the maths allows (backward produces the last parameters first, and a
  /// bucket engine reduces the end of the buffer first). A range is one parameter, a
  /// chunk of weight rows (linear::dw_chunk_rows) or two adjacent parameters one kernel
  /// writes together (a LayerNorm's weight and bias, wte and wpe); count is always > 0.
  /// eval() never calls it. (grads_ready_fn: runtime/nn/layers.hpp.)
  ///
  /// Installs the hook; an empty function removes it (no calls, no cost). The gradient
  /// bits are the same with and without a hook.
  void set_grads_ready_hook(grads_ready_fn fn);
  /// Whether a hook is installed (callers that install one temporarily must remove it).
  bool has_grads_ready_hook() const { return static_cast<bool>(grads_ready_); }

  /// How forward_backward, eval and inference use block B's parameter values:
  /// `need` before the first read of them (in a pass), `done` after the last. Each need is
  /// followed by its done before the next need of the same block; a block's values are
  /// read only between the two. Sharded parameters (train.zero: 3) gather a block's
  /// values on need and give them back on done. Forward needs the blocks in order, backward
  /// again from the last down (those whose backward reads them: the head's forward runs
  /// straight into its backward under one need); eval once each, in order.
  enum class params_use { need, done };
  using params_fn = std::function<void(std::size_t block, params_use use)>;
  /// Installs the hook (empty: none, and nothing is called).
  void set_params_hook(params_fn fn) { params_hook_ = std::move(fn); }
  bool has_params_hook() const { return static_cast<bool>(params_hook_); }
  /// The params hook's calls of one forward_backward, in the same order, computing nothing
  /// (a member with fewer micro-batches than its group's most takes part in the gathers so).
  /// BACKWARD_DONE(b), when set, runs where backward would have finished block b's gradients:
  /// after its need in backward's order (for a block backward reads no value of, after the
  /// later blocks'), before its done. The default is every block up, then every block down
  /// (what mlp's forward_backward does); models that call the hook otherwise override it.
  /// EXCHANGES: the pass is one of moe_pass's too (expert parallelism with sharded
  /// parameters), each MoE layer's exchanges inside its block's need and done, where
  /// forward_backward runs them, so that the gathers and the exchanges, on two communicators,
  /// come in the same order on every member. Models without experts ignore it.
  virtual void params_pass(const std::function<void(std::size_t block)>& backward_done,
                           bool exchanges = false);

  /// Expert parallelism (parallel.ep; runtime/nn/moe.hpp): lends EX to every mixture-of-experts
  /// layer for a training step's passes; null takes it back. A model without experts has no
  /// use for it.
  virtual void set_moe_exchange(const moe_exchange* ex) { (void)ex; }
  /// Whether the model has mixture-of-experts layers.
  virtual bool has_moe() const { return false; }
  /// A training pass without a micro-batch of its own: every MoE layer's exchanges of one
  /// forward_backward, in the same order, computing this rank's experts for the others' tokens
  /// (a member with fewer micro-batches than its group's most takes part so). Gradients it
  /// computes are the others' and are not reported.
  virtual void moe_pass() {}

 protected:
  /// Subclasses call this from backward once nothing more will touch elements
  /// [offset, offset + count) of flat_grads() in this micro-batch; calls the hook if set.
  void grads_ready(int64_t offset, int64_t count);
  /// The same for a span given by its first element inside flat_grads().
  void grads_ready(const float* first, int64_t count);
  /// HOST's elements where the device reads them: HOST itself on the CPU, else copied into
  /// STAGING (grown as needed, from this model's pool).
  template <class T>
  const T* on_device(const std::vector<T>& host, basic_tensor<T>& staging) {
    if (dev().host_visible()) return host.data();
    if (staging.numel() < static_cast<int64_t>(host.size()))
      staging = basic_tensor<T>({static_cast<int64_t>(host.size())}, *pool_);
    dev().from_host(staging.data(), host.data(), host.size() * sizeof(T));
    return staging.data();
  }
  /// The params hook's calls (no-ops without one).
  void need_params(std::size_t block) {
    if (params_hook_) params_hook_(block, params_use::need);
  }
  void done_params(std::size_t block) {
    if (params_hook_) params_hook_(block, params_use::done);
  }
  /// What layers report through: empty when no hook is set, so layers skip the calls.
  const grads_ready_span& reporter() const { return reporter_; }
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
  grads_ready_fn grads_ready_;
  grads_ready_span reporter_;  // forwards spans to grads_ready(const float*, count)
  params_fn params_hook_;
};

/// Builds the model a config names. `vocab` is used by gpt only; `max_batch` is the
/// largest micro-batch (rows) activations are allocated for.
std::unique_ptr<model> make_model(const model_config& cfg, int vocab, int max_batch, uint64_t seed,
                                  pool& p = pool::global());

}  // namespace cohort::nn
