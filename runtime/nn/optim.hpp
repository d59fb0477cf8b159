// Optimizers (AdamW, SGD with momentum, 1-bit Adam; PyTorch conventions) and global
// gradient-norm clipping, on the parameters' device (state tensors come from a pool of the
// same device). They update one contiguous range of parameters (a model's flat
// tensors, or the slice a pipeline stage owns) in place; they own their state tensors and
// step count, not the parameters, learning-rate schedules or any communication.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "runtime/nn/tensor.hpp"

namespace cohort::nn {

/// Hyper-parameters shared by the optimizers (lr is passed per step so schedules stay
/// outside).
struct optim_options {
  std::string kind = "adamw";  ///< adamw | sgd | onebit_adam
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float weight_decay = 0.0f;  ///< adamw: decoupled; sgd: added to the gradient
  float momentum = 0.9f;      ///< sgd
  /// onebit_adam: AdamW updates before the variance freezes (>= 1), and the element ranges
  /// [offset, offset + count) whose momentum travels compressed from then on (sorted).
  int64_t freeze_step = 100;
  std::vector<std::pair<int64_t, int64_t>> compressed;
};

class optimizer {
 public:
  /// params and grads are the same length; the optimizer keeps views of both.
  optimizer(tensor params, tensor grads) : params_(std::move(params)), grads_(std::move(grads)) {}
  virtual ~optimizer() = default;
  /// One update with learning rate lr from the current gradients.
  virtual void step(float lr) = 0;
  /// Named state tensors (for checkpoints and live recovery), e.g. {"exp_avg", m}.
  virtual std::vector<std::pair<std::string, tensor>> state() = 0;
  /// Updates applied so far (AdamW's t); settable when state is restored.
  int64_t steps() const { return steps_; }
  void set_steps(int64_t t) { steps_ = t; }

 protected:
  tensor params_, grads_;
  int64_t steps_ = 0;
};

/// torch.optim.AdamW: p *= 1 - lr*wd; m, v moments; p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps).
class adamw : public optimizer {
 public:
  /// State tensors come from `p`.
  adamw(tensor params, tensor grads, const optim_options& o, pool& p = pool::global());
  void step(float lr) override;
  std::vector<std::pair<std::string, tensor>> state() override;

 private:
  optim_options o_;
  tensor m_, v_;
};

/// torch.optim.SGD with momentum (dampening 0): g += wd*p; buf = mu*buf + g; p -= lr*buf.
class sgd : public optimizer {
 public:
  sgd(tensor params, tensor grads, const optim_options& o, pool& p = pool::global());
  void step(float lr) override;
  std::vector<std::pair<std::string, tensor>> state() override;

 private:
  optim_options o_;
  tensor buf_;
};

/// DeepSpeed's 1-bit Adam: AdamW (with bias corrections) for the first freeze_step updates;
/// then, on the compressed ranges, v is frozen and the gradient buffer holds not the
/// gradient but the group's new momentum (each replica sends beta1 * m / replicas +
/// (1 - beta1) * its gradient, compressed; their sum is the momentum), which becomes m and
/// drives the AdamW update with v and its bias correction frozen at the freeze step. The
/// other ranges stay AdamW throughout. State: exp_avg, exp_avg_sq, like adamw's.
class onebit_adam : public optimizer {
 public:
  onebit_adam(tensor params, tensor grads, const optim_options& o, pool& p = pool::global());
  void step(float lr) override;
  std::vector<std::pair<std::string, tensor>> state() override;
  /// True when the next step() is a compressed one (steps() >= freeze_step).
  bool frozen() const { return steps_ >= o_.freeze_step; }
  /// The momentum of the compressed ranges (what replicas combine with their gradients).
  const float* momentum() const { return m_.data(); }
  /// Where the parameters, gradients and state live (the gradient path's ops run there).
  device& dev() const { return params_.dev(); }
  const optim_options& options() const { return o_; }

 private:
  optim_options o_;
  tensor m_, v_;
};

/// Builds the optimizer o.kind names over (params, grads); throws usage_error otherwise.
std::unique_ptr<optimizer> make_optimizer(tensor params, tensor grads, const optim_options& o,
                                          pool& p = pool::global());

/// Sum of squares of all gradient elements (double), the local part of a global norm.
double grad_sum_squares(const tensor& grads);
/// Scale factor clip_grad_norm_ applies for a total norm: max_norm / (norm + 1e-6) when
/// that is below 1, else 1 (also 1 when max_norm <= 0, meaning "no clipping").
float clip_coefficient(double total_norm, float max_norm);
/// torch.nn.utils.clip_grad_norm_ over one tensor: returns the norm before clipping.
double clip_grad_norm(tensor& grads, float max_norm);

}  // namespace cohort::nn
