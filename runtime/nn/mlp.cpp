#include "runtime/nn/mlp.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#include "runtime/core/error.hpp"
#include "runtime/core/trace.hpp"

namespace cohort::nn {

mlp::mlp(int in, std::vector<int> hidden, int classes, int max_batch, uint64_t seed, pool& p)
    : model(p), in_(in), classes_(classes) {
  if (in < 1 || classes < 1) throw usage_error("mlp: in and classes must be >= 1");
  std::vector<int> widths = hidden;
  widths.push_back(classes);
  int fan_in = in;
  std::vector<std::pair<std::size_t, std::size_t>> idx;
  for (std::size_t i = 0; i < widths.size(); ++i) {
    if (widths[i] < 1) throw usage_error("mlp: every hidden size must be >= 1");
    // Sequential numbering counts the ReLUs too: linears sit at 0, 2, 4, ...
    const std::string name = "net." + std::to_string(2 * i);
    const float bound = 1.0f / std::sqrt(static_cast<float>(fan_in));
    begin_block(name);
    const std::size_t w =
        add_param(name + ".weight", {widths[i], fan_in}, {init_spec::uniform, bound});
    const std::size_t b = add_param(name + ".bias", {widths[i]}, {init_spec::uniform, bound});
    idx.emplace_back(w, b);
    fan_in = widths[i];
  }
  finalize(seed);
  fan_in = in;
  for (std::size_t i = 0; i < widths.size(); ++i) {
    linear l;
    l.w = parameters()[idx[i].first].value;
    l.dw = parameters()[idx[i].first].grad;
    l.b = parameters()[idx[i].second].value;
    l.db = parameters()[idx[i].second].grad;
    l.in = fan_in;
    l.out = widths[i];
    l.dev = &p.dev();
    layers_.push_back(l);
    fan_in = widths[i];
  }
  reserve(std::max(1, max_batch));
}

void mlp::reserve(int rows) {
  if (rows <= capacity_) return;
  int widest = in_;
  acts_.clear();
  for (const linear& l : layers_) {
    acts_.emplace_back(shape_t{rows, l.out}, memory());
    widest = std::max(widest, l.out);
  }
  probs_ = tensor({rows, classes_}, memory());
  losses_ = tensor({rows}, memory());
  dcur_ = tensor({rows, widest}, memory());
  dnext_ = tensor({rows, widest}, memory());
  capacity_ = rows;
}

void mlp::check(const batch& b) const {
  if (b.n < 1) throw usage_error("mlp: empty batch");
  if (b.features != in_ || b.x.size() != static_cast<std::size_t>(b.n) * in_)
    throw usage_error("mlp: batch has " + std::to_string(b.features) + " features (" +
                      std::to_string(b.x.size()) + " floats for " + std::to_string(b.n) +
                      " rows); the model expects " + std::to_string(in_));
  if (b.targets.size() != static_cast<std::size_t>(b.n))
    throw usage_error("mlp: batch needs one target per row");
  for (int32_t t : b.targets)
    if (t < 0 || t >= classes_)
      throw usage_error("mlp: target " + std::to_string(t) + " outside [0, " +
                        std::to_string(classes_) + ")");
}

float mlp::forward(const batch& b) {
  check(b);
  reserve(b.n);
  x_ = on_device(b.x, x_dev_);
  targets_ = on_device(b.targets, targets_dev_);
  const float* x = x_;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    float* y = acts_[i].data();
    need_params(i);
    layers_[i].forward(y, x, b.n);
    done_params(i);
    if (i + 1 < layers_.size()) dev().relu_fwd(y, y, static_cast<int64_t>(b.n) * layers_[i].out);
    x = y;
  }
  return dev().softmax_xent_fwd(probs_.data(), losses_.data(), acts_.back().data(), targets_, b.n,
                                classes_);
}

float mlp::forward_backward(const batch& b, float loss_scale) {
  float loss = 0;
  {
    trace::span s("forward", "compute", trace::track::compute);
    loss = forward(b);
  }
  trace::span s("backward", "compute", trace::track::compute);
  const int n = b.n;
  float* dcur = dcur_.data();
  float* dnext = dnext_.data();
  dev().softmax_xent_bwd(dcur, probs_.data(), targets_, n, classes_, loss_scale / n);
  for (std::size_t i = layers_.size(); i-- > 0;) {
    const float* input = i == 0 ? x_ : acts_[i - 1].data();
    float* dx = i == 0 ? nullptr : dnext;
    // Reports layer i's bias, then its weight rows from the last down: the layers
    // below never touch them again.
    need_params(i);
    layers_[i].backward(dx, dcur, input, n, reporter());
    done_params(i);
    if (i > 0) {
      // ReLU's output is positive exactly where its input was, so the saved output
      // serves as the mask.
      dev().relu_bwd(dx, dx, acts_[i - 1].data(), static_cast<int64_t>(n) * layers_[i].in);
      std::swap(dcur, dnext);
    }
  }
  return loss;
}

eval_result mlp::eval(const batch& b) {
  eval_result r;
  r.loss = forward(b);
  r.count = b.n;
  std::vector<float> copy;
  const float* logits = on_host(acts_.back(), static_cast<int64_t>(b.n) * classes_, copy);
  for (int i = 0; i < b.n; ++i) {
    const float* row = logits + static_cast<int64_t>(i) * classes_;
    const int arg = static_cast<int>(std::max_element(row, row + classes_) - row);
    r.correct += arg == b.targets[i];
  }
  return r;
}

}  // namespace cohort::nn
