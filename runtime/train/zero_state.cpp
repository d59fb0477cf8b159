#include "runtime/train/zero_state.hpp"

#include "runtime/core/error.hpp"

namespace cohort::train {

zero_optimizer::zero_optimizer(nn::tensor params, nn::tensor grads, nn::optim_options o,
                               nn::pool& p)
    : optimizer(std::move(params), std::move(grads)), o_(std::move(o)), pool_(&p) {
  COHORT_CHECK(params_.numel() == grads_.numel());
  if (o_.kind == "adamw")
    slots_ = {"exp_avg", "exp_avg_sq"};
  else if (o_.kind == "sgd")
    slots_ = {"momentum_buffer"};
  else
    throw usage_error("train.zero shards the state of adamw or sgd, not " + o_.kind);
}

void zero_optimizer::step(float lr) {
  COHORT_CHECK(holds());
  for (auto& part : parts_) {
    part->set_steps(steps_);
    part->step(lr);
  }
  ++steps_;
}

std::vector<std::pair<std::string, nn::tensor>> zero_optimizer::state() {
  if (w_ == 1 && parts_.size() == 1 && ranges_[0] == elem_range{0, params_.numel()})
    return parts_[0]->state();
  return {};
}

nn::tensor zero_optimizer::slot(std::size_t i, std::size_t s) {
  return parts_.at(i)->state().at(s).second;
}

void zero_optimizer::hold(int w, int r) { hold(even_cut(params_.numel(), w), r); }

void zero_optimizer::hold(const shard_cut& c, int r) {
  COHORT_CHECK(c.n == params_.numel() && r >= 0 && r < c.w());
  parts_.clear();
  ranges_.clear();
  replica_.clear();
  const std::size_t own = c.shards[static_cast<std::size_t>(r)].size();
  const std::vector<elem_range> all = ranges_held(c, r);
  for (std::size_t i = 0; i < all.size(); ++i) {
    const elem_range& x = all[i];
    if (x.size() == 0) continue;
    ranges_.push_back(x);
    replica_.push_back(i >= own);
    parts_.push_back(nn::make_optimizer(params_.view(x.begin, {x.size()}),
                                        grads_.view(x.begin, {x.size()}), o_, *pool_));
  }
  w_ = c.w();
  r_ = r;
  cut_ = c;
}

zero_optimizer::held zero_optimizer::release() {
  held h;
  h.ranges = ranges_;
  h.w = w_;
  h.r = r_;
  h.cut = cut_;
  for (auto& part : parts_) {
    std::vector<nn::tensor> s;
    for (auto& [name, t] : part->state()) s.push_back(t);
    h.slots.push_back(std::move(s));
  }
  parts_.clear();
  ranges_.clear();
  replica_.clear();
  w_ = 0;
  r_ = -1;
  cut_ = shard_cut{};
  return h;
}

void zero_optimizer::restore(const held& h) {
  if (h.w <= 0) {
    release();
    return;
  }
  hold(h.cut, h.r);
  COHORT_CHECK(ranges_ == h.ranges);
  for (std::size_t i = 0; i < ranges_.size(); ++i)
    for (std::size_t s = 0; s < slots_.size(); ++s) slot(i, s).copy_from(h.slots[i][s]);
}

int64_t zero_optimizer::held_bytes() const {
  int64_t total = 0;
  for (const elem_range& x : ranges_) total += x.size();
  return total * static_cast<int64_t>(slots_.size() * sizeof(float));
}

int64_t zero_optimizer::replica_bytes() const {
  int64_t total = 0;
  for (std::size_t i = 0; i < ranges_.size(); ++i)
    if (replica_[i]) total += ranges_[i].size();
  return total * static_cast<int64_t>(slots_.size() * sizeof(float));
}

}  // namespace cohort::train
