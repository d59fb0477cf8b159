#include "runtime/nn/model.hpp"

#include "runtime/core/config.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/rng.hpp"
#include "runtime/nn/gpt.hpp"
#include "runtime/nn/mlp.hpp"

namespace cohort::nn {

const parameter& model::param(const std::string& name) const {
  for (const auto& p : params_)
    if (p.name == name) return p;
  throw usage_error("model has no parameter named '" + name + "'");
}

parameter& model::param(const std::string& name) {
  return const_cast<parameter&>(static_cast<const model&>(*this).param(name));
}

std::vector<std::string> model::block_param_names(std::size_t i) const {
  const block_info& b = blocks_.at(i);
  std::vector<std::string> out;
  for (std::size_t k = b.first; k < b.first + b.count; ++k) out.push_back(params_[k].name);
  return out;
}

std::pair<int64_t, int64_t> model::block_elements(std::size_t i) const {
  const block_info& b = blocks_.at(i);
  if (b.count == 0) return {b.first < params_.size() ? params_[b.first].offset : num_params(), 0};
  const parameter& last = params_[b.first + b.count - 1];
  const int64_t first = params_[b.first].offset;
  return {first, last.offset + last.grad.numel() - first};
}

void model::set_grads_ready_hook(grads_ready_fn fn) {
  grads_ready_ = std::move(fn);
  // Layers see an empty reporter when nobody listens, so the plain path pays nothing.
  if (grads_ready_)
    reporter_ = [this](const float* first, int64_t count) { grads_ready(first, count); };
  else
    reporter_ = nullptr;
}

void model::grads_ready(int64_t offset, int64_t count) {
  COHORT_CHECK(offset >= 0 && count >= 0 && offset + count <= grads_.numel());
  if (grads_ready_ && count > 0) grads_ready_(offset, count);
}

void model::grads_ready(const float* first, int64_t count) {
  grads_ready(static_cast<int64_t>(first - grads_.data()), count);
}

void model::params_pass(const std::function<void(std::size_t block)>& backward_done,
                        bool exchanges) {
  (void)exchanges;  // no experts here
  const std::size_t n = blocks_.size();
  for (std::size_t b = 0; b < n; ++b) {
    need_params(b);
    done_params(b);
  }
  for (std::size_t b = n; b-- > 0;) {
    need_params(b);
    if (backward_done) backward_done(b);
    done_params(b);
  }
}

void model::begin_block(std::string name) {
  block_info b;
  b.name = std::move(name);
  b.first = params_.size();
  blocks_.push_back(std::move(b));
}

std::size_t model::add_param(std::string name, shape_t shape, init_spec init) {
  COHORT_CHECK(!blocks_.empty() && values_.empty());
  parameter p;
  p.name = std::move(name);
  p.init = init;
  params_.push_back(std::move(p));
  shapes_pending_.push_back(std::move(shape));
  ++blocks_.back().count;
  return params_.size() - 1;
}

void model::finalize(uint64_t seed) {
  int64_t total = 0;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    params_[i].offset = total;
    total += shape_numel(shapes_pending_[i]);
  }
  values_ = tensor({total}, *pool_);
  grads_ = tensor({total}, *pool_);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    params_[i].value = values_.view(params_[i].offset, shapes_pending_[i]);
    params_[i].grad = grads_.view(params_[i].offset, shapes_pending_[i]);
  }
  shapes_pending_.clear();
  init_parameters(seed);
}

void model::init_parameters(uint64_t seed) {
  // Drawn on the host (the same draws on every device), then copied once to a GPU.
  const bool direct = values_.host_visible();
  std::vector<float> host(direct ? 0 : static_cast<std::size_t>(values_.numel()));
  for (std::size_t i = 0; i < params_.size(); ++i) {
    parameter& p = params_[i];
    rng r(hash_coords(seed, i));
    float* v = direct ? p.value.data() : host.data() + p.offset;
    const int64_t n = p.value.numel();
    switch (p.init.kind) {
      case init_spec::uniform:
        for (int64_t k = 0; k < n; ++k) v[k] = (2.0f * r.uniform() - 1.0f) * p.init.a;
        break;
      case init_spec::normal:
        for (int64_t k = 0; k < n; ++k) v[k] = r.normal() * p.init.a;
        break;
      case init_spec::constant:
        for (int64_t k = 0; k < n; ++k) v[k] = p.init.a;
        break;
    }
  }
  if (!direct) values_.copy_from_host(host.data());
}

std::unique_ptr<model> make_model(const model_config& cfg, int vocab, int max_batch, uint64_t seed,
                                  pool& p) {
  if (cfg.kind == "mlp") return std::make_unique<mlp>(784, cfg.hidden, 10, max_batch, seed, p);
  if (cfg.kind == "gpt") {
    gpt_shape s{vocab, cfg.context, cfg.n_layer, cfg.n_head, cfg.d_model};
    s.moe_experts = cfg.moe_experts;
    s.moe_top_k = cfg.moe_top_k;
    s.moe_every = cfg.moe_every;
    s.moe_capacity_factor = cfg.moe_capacity_factor;
    s.moe_aux_coef = cfg.moe_aux_loss;
    s.moe_hidden = cfg.moe_hidden;
    return std::make_unique<gpt>(s, max_batch, seed, p);
  }
  throw usage_error("unknown model kind '" + cfg.kind + "' (expected mlp or gpt)");
}

}  // namespace cohort::nn
