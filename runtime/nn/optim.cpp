#include "runtime/nn/optim.hpp"

#include <cmath>

#include "runtime/core/error.hpp"

namespace cohort::nn {

adamw::adamw(tensor params, tensor grads, const optim_options& o, pool& p)
    : optimizer(std::move(params), std::move(grads)), o_(o) {
  COHORT_CHECK(params_.numel() == grads_.numel());
  m_ = tensor({params_.numel()}, p);
  v_ = tensor({params_.numel()}, p);
  COHORT_CHECK(&p.dev() == &params_.dev());  // state lives where the parameters do
}

void adamw::step(float lr) {
  ++steps_;
  params_.dev().adamw_step(params_.data(), grads_.data(), m_.data(), v_.data(), params_.numel(), lr,
                           o_.beta1, o_.beta2, o_.eps, o_.weight_decay, static_cast<int>(steps_));
}

std::vector<std::pair<std::string, tensor>> adamw::state() {
  return {{"exp_avg", m_}, {"exp_avg_sq", v_}};
}

sgd::sgd(tensor params, tensor grads, const optim_options& o, pool& p)
    : optimizer(std::move(params), std::move(grads)), o_(o) {
  COHORT_CHECK(params_.numel() == grads_.numel());
  buf_ = tensor({params_.numel()}, p);
  COHORT_CHECK(&p.dev() == &params_.dev());  // state lives where the parameters do
}

void sgd::step(float lr) {
  ++steps_;
  params_.dev().sgd_step(params_.data(), grads_.data(), buf_.data(), params_.numel(), lr,
                         o_.momentum, o_.weight_decay);
}

std::vector<std::pair<std::string, tensor>> sgd::state() { return {{"momentum_buffer", buf_}}; }

onebit_adam::onebit_adam(tensor params, tensor grads, const optim_options& o, pool& p)
    : optimizer(std::move(params), std::move(grads)), o_(o) {
  COHORT_CHECK(params_.numel() == grads_.numel());
  COHORT_CHECK(o_.freeze_step >= 1);
  int64_t at = 0;
  for (const auto& [off, count] : o_.compressed) {
    COHORT_CHECK(off >= at && count >= 0 && off + count <= params_.numel());
    at = off + count;
  }
  m_ = tensor({params_.numel()}, p);
  v_ = tensor({params_.numel()}, p);
  COHORT_CHECK(&p.dev() == &params_.dev());  // state lives where the parameters do
}

void onebit_adam::step(float lr) {
  const bool compressed = frozen();
  ++steps_;
  float* p = params_.data();
  float* g = grads_.data();
  float* m = m_.data();
  float* v = v_.data();
  const int t = static_cast<int>(steps_);
  device& dev = params_.dev();
  auto adamw_range = [&](int64_t off, int64_t count) {
    if (count > 0)
      dev.adamw_step(p + off, g + off, m + off, v + off, count, lr, o_.beta1, o_.beta2, o_.eps,
                     o_.weight_decay, t);
  };
  if (!compressed) return adamw_range(0, params_.numel());
  int64_t at = 0;
  for (const auto& [off, count] : o_.compressed) {
    adamw_range(at, off - at);
    dev.onebit_adam_frozen_step(p + off, g + off, m + off, v + off, count, lr, o_.beta1, o_.beta2,
                                o_.eps, o_.weight_decay, t, static_cast<int>(o_.freeze_step));
    at = off + count;
  }
  adamw_range(at, params_.numel() - at);
}

std::vector<std::pair<std::string, tensor>> onebit_adam::state() {
  return {{"exp_avg", m_}, {"exp_avg_sq", v_}};
}

std::unique_ptr<optimizer> make_optimizer(tensor params, tensor grads, const optim_options& o,
                                          pool& p) {
  if (o.kind == "adamw") return std::make_unique<adamw>(std::move(params), std::move(grads), o, p);
  if (o.kind == "sgd") return std::make_unique<sgd>(std::move(params), std::move(grads), o, p);
  if (o.kind == "onebit_adam")
    return std::make_unique<onebit_adam>(std::move(params), std::move(grads), o, p);
  throw usage_error("unknown optimizer '" + o.kind + "' (expected adamw, sgd or onebit_adam)");
}

double grad_sum_squares(const tensor& grads) {
  return grads.dev().sum_squares(grads.data(), grads.numel());
}

float clip_coefficient(double total_norm, float max_norm) {
  if (max_norm <= 0.0f) return 1.0f;
  const double coef = max_norm / (total_norm + 1e-6);
  return coef < 1.0 ? static_cast<float>(coef) : 1.0f;
}

double clip_grad_norm(tensor& grads, float max_norm) {
  const double norm = std::sqrt(grad_sum_squares(grads));
  const float coef = clip_coefficient(norm, max_norm);
  if (coef < 1.0f) grads.dev().scale(grads.data(), coef, grads.numel());
  return norm;
}

}  // namespace cohort::nn
