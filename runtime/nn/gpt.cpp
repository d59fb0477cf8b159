#include "runtime/nn/gpt.hpp"

#include <algorithm>
#include <cmath>

#include "runtime/core/error.hpp"
#include "runtime/core/rules.hpp"
#include "runtime/core/trace.hpp"

namespace cohort::nn {

void gpt_block::forward(gpt_block_acts& a, const float* x, int b, int t) const {
  const int rows = b * t, c = ln_1.c;
  ln_1.forward(a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), x, rows);
  c_attn.forward(a.qkv.data(), a.ln1.data(), rows);
  dev->attention_fwd(a.atty.data(), a.att.data(), a.qkv.data(), b, t, c, n_head);
  attn_proj.forward(a.res2.data(), a.atty.data(), rows);
  dev->add_inplace(a.res2.data(), x, static_cast<int64_t>(rows) * c);
  ln_2.forward(a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(), a.res2.data(), rows);
  if (moe) {
    if (!a.moe) a.moe = std::make_shared<moe_acts>();
    moe->forward(*a.moe, a.out.data(), a.ln2.data(), rows);
  } else {
    c_fc.forward(a.fch.data(), a.ln2.data(), rows);
    dev->gelu_fwd(a.fch_gelu.data(), a.fch.data(), static_cast<int64_t>(rows) * 4 * c);
    mlp_proj.forward(a.out.data(), a.fch_gelu.data(), rows);
  }
  dev->add_inplace(a.out.data(), a.res2.data(), static_cast<int64_t>(rows) * c);
}

void gpt_block::backward(gpt_block_acts& a, gpt_grad_scratch& s, float* dres, const float* x, int b,
                         int t, const grads_ready_span& report) {
  const int rows = b * t, c = ln_1.c;
  const int64_t n = static_cast<int64_t>(rows) * c;
  // Parameters are visited in reverse memory order (mlp.c_proj .. ln_1), so the reports
  // come out in descending offsets. MLP branch: the residual passes dres through unchanged, the
  // branch adds its part.
  if (moe) {
    moe->backward(*a.moe, s.dln.data(), dres, a.ln2.data(), rows, aux_scale, report);
  } else {
    mlp_proj.backward(s.dfch_gelu.data(), dres, a.fch_gelu.data(), rows, report);
    dev->gelu_bwd(s.dfch.data(), s.dfch_gelu.data(), a.fch.data(), 4 * n);
    c_fc.backward(s.dln.data(), s.dfch.data(), a.ln2.data(), rows, report);
  }
  ln_2.backward(s.dtmp.data(), s.dln.data(), a.res2.data(), a.ln2_mean.data(), a.ln2_rstd.data(),
                rows, report);
  dev->add_inplace(dres, s.dtmp.data(), n);
  // Attention branch.
  attn_proj.backward(s.datty.data(), dres, a.atty.data(), rows, report);
  dev->attention_bwd(s.dqkv.data(), s.datt.data(), s.datty.data(), a.qkv.data(), a.att.data(), b, t,
                     c, n_head);
  c_attn.backward(s.dln.data(), s.dqkv.data(), a.ln1.data(), rows, report);
  ln_1.backward(s.dtmp.data(), s.dln.data(), x, a.ln1_mean.data(), a.ln1_rstd.data(), rows, report);
  dev->add_inplace(dres, s.dtmp.data(), n);
}

std::vector<gpt_param_spec> gpt_param_specs(const gpt_shape& s) {
  if (s.vocab < 1 || s.context < 1 || s.n_layer < 1 || s.n_head < 1 || s.d_model < 1)
    throw usage_error("gpt: vocab, context, n_layer, n_head and d_model must all be >= 1");
  if (!rules::heads_divide_width(s.d_model, s.n_head))
    throw usage_error("gpt: d_model (" + std::to_string(s.d_model) +
                      ") must be divisible by n_head (" + std::to_string(s.n_head) + ")");
  if (s.moe_experts < 0 || (s.moe_experts > 0 && (s.moe_every < 1 || s.moe_top_k < 1 ||
                                                   s.moe_top_k > 2 || s.moe_top_k > s.moe_experts ||
                                                   !(s.moe_capacity_factor > 0) || s.moe_hidden < 0)))
    throw usage_error("gpt: model.moe needs experts >= 1, top_k 1 or 2 (at most experts), "
                      "every >= 1, capacity_factor > 0 and hidden >= 0");
  const int64_t C = s.d_model;
  const init_spec w_init{init_spec::normal, 0.02f};
  const init_spec proj_init{init_spec::normal,
                            0.02f / std::sqrt(2.0f * static_cast<float>(s.n_layer))};
  const init_spec zero{init_spec::constant, 0.0f};
  const init_spec one{init_spec::constant, 1.0f};

  std::vector<gpt_param_spec> out;
  std::string block = "embedding";
  auto add = [&](std::string name, shape_t shape, init_spec init) {
    out.push_back({block, std::move(name), std::move(shape), init});
  };
  add("transformer.wte.weight", {s.vocab, C}, w_init);
  add("transformer.wpe.weight", {s.context, C}, w_init);
  for (int l = 0; l < s.n_layer; ++l) {
    const std::string h = "transformer.h." + std::to_string(l) + ".";
    block = "h." + std::to_string(l);
    add(h + "ln_1.weight", {C}, one);
    add(h + "ln_1.bias", {C}, zero);
    add(h + "attn.c_attn.weight", {3 * C, C}, w_init);
    add(h + "attn.c_attn.bias", {3 * C}, zero);
    add(h + "attn.c_proj.weight", {C, C}, proj_init);
    add(h + "attn.c_proj.bias", {C}, zero);
    add(h + "ln_2.weight", {C}, one);
    add(h + "ln_2.bias", {C}, zero);
    if (s.moe_at(l)) {  // the router, then each expert's MLP (runtime/nn/moe.hpp)
      add(h + "mlp.router.weight", {s.moe_experts, C}, w_init);
      for (int e = 0; e < s.moe_experts; ++e) {
        const std::string x = h + "mlp.experts." + std::to_string(e) + ".";
        const int64_t H = s.expert_hidden();
        add(x + "c_fc.weight", {H, C}, w_init);
        add(x + "c_fc.bias", {H}, zero);
        add(x + "c_proj.weight", {C, H}, proj_init);
        add(x + "c_proj.bias", {C}, zero);
      }
      continue;
    }
    add(h + "mlp.c_fc.weight", {4 * C, C}, w_init);
    add(h + "mlp.c_fc.bias", {4 * C}, zero);
    add(h + "mlp.c_proj.weight", {C, 4 * C}, proj_init);
    add(h + "mlp.c_proj.bias", {C}, zero);
  }
  block = "head";
  add("transformer.ln_f.weight", {C}, one);
  add("transformer.ln_f.bias", {C}, zero);
  add("lm_head.weight", {s.vocab, C}, w_init);
  return out;
}

void gpt_block_acts::allocate(int64_t sequences, const gpt_shape& s, pool& p) {
  const int64_t B = sequences, T = s.context, C = s.d_model, NH = s.n_head, rows = B * T;
  ln1 = tensor({rows, C}, p);
  ln1_mean = tensor({rows}, p);
  ln1_rstd = tensor({rows}, p);
  qkv = tensor({rows, 3 * C}, p);
  att = tensor({B, NH, T, T}, p);
  atty = tensor({rows, C}, p);
  res2 = tensor({rows, C}, p);
  ln2 = tensor({rows, C}, p);
  ln2_mean = tensor({rows}, p);
  ln2_rstd = tensor({rows}, p);
  fch = tensor({rows, 4 * C}, p);
  fch_gelu = tensor({rows, 4 * C}, p);
  out = tensor({rows, C}, p);
}

std::size_t gpt_block_acts::bytes() const {
  std::size_t n = 0;
  for (const tensor* t : {&ln1, &ln1_mean, &ln1_rstd, &qkv, &att, &atty, &res2, &ln2, &ln2_mean,
                          &ln2_rstd, &fch, &fch_gelu, &out})
    n += t->bytes();
  return n;
}

void gpt_grad_scratch::allocate(int64_t sequences, const gpt_shape& s, pool& p) {
  const int64_t B = sequences, T = s.context, C = s.d_model, NH = s.n_head, rows = B * T;
  dtmp = tensor({rows, C}, p);
  dln = tensor({rows, C}, p);
  datty = tensor({rows, C}, p);
  dqkv = tensor({rows, 3 * C}, p);
  dfch = tensor({rows, 4 * C}, p);
  dfch_gelu = tensor({rows, 4 * C}, p);
  datt = tensor({B, NH, T, T}, p);
}

gpt::gpt(int vocab, int context, int n_layer, int n_head, int d_model, int max_batch, uint64_t seed,
         pool& p)
    : gpt(gpt_shape{vocab, context, n_layer, n_head, d_model}, max_batch, seed, p) {}

gpt::gpt(const gpt_shape& s, int max_batch, uint64_t seed, pool& p) : model(p), shape_(s) {
  const int C = s.d_model, vocab = s.vocab, n_layer = s.n_layer, n_head = s.n_head;
  if (s.moe_experts > 0 && !p.dev().host_visible())
    throw usage_error("gpt: model.moe runs on the CPU only for now (train.device cpu)");
  device* dev = &p.dev();
  for (const gpt_param_spec& spec : gpt_param_specs(shape_)) {
    if (blocks().empty() || blocks().back().name != spec.block) begin_block(spec.block);
    add_param(spec.name, spec.shape, spec.init);
  }
  finalize(seed);

  // Bind layers to the views, walking parameters in the order they were declared.
  std::size_t k = 0;
  auto next = [&]() -> parameter& { return parameters()[k++]; };
  auto bind_linear = [&](linear& l, int in, int out, bool bias) {
    parameter& w = next();
    l.w = w.value;
    l.dw = w.grad;
    if (bias) {
      parameter& b = next();
      l.b = b.value;
      l.db = b.grad;
    }
    l.in = in;
    l.out = out;
    l.dev = dev;
  };
  auto bind_ln = [&](layernorm& ln) {
    parameter& w = next();
    parameter& b = next();
    ln.w = w.value;
    ln.dw = w.grad;
    ln.b = b.value;
    ln.db = b.grad;
    ln.c = C;
    ln.dev = dev;
  };
  {
    parameter& wte = next();
    parameter& wpe = next();
    emb_.wte = wte.value;
    emb_.dwte = wte.grad;
    emb_.wpe = wpe.value;
    emb_.dwpe = wpe.grad;
    emb_.c = C;
    emb_.dev = dev;
  }
  layers_.resize(n_layer);
  for (int l = 0; l < n_layer; ++l) {
    gpt_block& blk = layers_[static_cast<std::size_t>(l)];
    blk.n_head = n_head;
    blk.dev = dev;
    bind_ln(blk.ln_1);
    bind_linear(blk.c_attn, C, 3 * C, true);
    bind_linear(blk.attn_proj, C, C, true);
    bind_ln(blk.ln_2);
    if (s.moe_at(l)) {
      auto m = std::make_shared<moe_layer>();
      bind_linear(m->router, C, s.moe_experts, false);
      m->fc.resize(static_cast<std::size_t>(s.moe_experts));
      m->proj.resize(static_cast<std::size_t>(s.moe_experts));
      for (int e = 0; e < s.moe_experts; ++e) {
        bind_linear(m->fc[static_cast<std::size_t>(e)], C, s.expert_hidden(), true);
        bind_linear(m->proj[static_cast<std::size_t>(e)], s.expert_hidden(), C, true);
      }
      m->top_k = s.moe_top_k;
      m->capacity_factor = s.moe_capacity_factor;
      m->aux_coef = s.moe_aux_coef;
      m->dev = dev;
      blk.moe = std::move(m);
      continue;
    }
    bind_linear(blk.c_fc, C, 4 * C, true);
    bind_linear(blk.mlp_proj, 4 * C, C, true);
  }
  bind_ln(ln_f_);
  bind_linear(lm_head_, C, vocab, false);
  COHORT_CHECK(k == parameters().size());
  reserve(std::max(1, max_batch));
}

void gpt::reserve(int sequences) {
  if (sequences <= capacity_) return;
  const int64_t B = sequences, T = shape_.context, C = shape_.d_model;
  const int64_t V = shape_.vocab, rows = B * T;
  pool& p = memory();
  encoded_ = tensor({rows, C}, p);
  acts_.clear();
  acts_.resize(shape_.n_layer);
  for (gpt_block_acts& a : acts_) a.allocate(B, shape_, p);
  lnf_ = tensor({rows, C}, p);
  lnf_mean_ = tensor({rows}, p);
  lnf_rstd_ = tensor({rows}, p);
  logits_ = tensor({rows, V}, p);
  probs_ = tensor({rows, V}, p);
  losses_ = tensor({rows}, p);
  scratch_.allocate(B, shape_, p);
  dres_ = tensor({rows, C}, p);
  dlogits_ = tensor({rows, V}, p);
  capacity_ = sequences;
}

void gpt::check(const batch& b) const {
  if (b.n < 1) throw usage_error("gpt: empty batch");
  if (b.t < 1 || b.t > shape_.context)
    throw usage_error("gpt: sequence length " + std::to_string(b.t) +
                      " outside [1, context=" + std::to_string(shape_.context) + "]");
  const std::size_t rows = static_cast<std::size_t>(b.n) * b.t;
  if (b.ids.size() != rows || b.targets.size() != rows)
    throw usage_error("gpt: batch needs n*t = " + std::to_string(rows) + " ids and targets (got " +
                      std::to_string(b.ids.size()) + " and " + std::to_string(b.targets.size()) +
                      ")");
  for (std::size_t i = 0; i < rows; ++i)
    if (b.ids[i] < 0 || b.ids[i] >= shape_.vocab || b.targets[i] < 0 ||
        b.targets[i] >= shape_.vocab)
      throw usage_error("gpt: token id outside [0, vocab=" + std::to_string(shape_.vocab) + ")");
}

float gpt::forward(const batch& b, bool keep_head) {
  check(b);
  reserve(b.n);
  const int rows = b.n * b.t;
  ids_ = on_device(b.ids, ids_dev_);
  targets_ = on_device(b.targets, targets_dev_);
  // Blocks: 0 the embedding, 1 + l block h.l, L + 1 the head (need_params / done_params).
  const std::size_t head = layers_.size() + 1;
  need_params(0);
  emb_.forward(encoded_.data(), ids_, b.n, b.t);
  done_params(0);
  const float* x = encoded_.data();
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    need_params(l + 1);
    layers_[l].forward(acts_[l], x, b.n, b.t);
    done_params(l + 1);
    x = acts_[l].out.data();
  }
  need_params(head);
  ln_f_.forward(lnf_.data(), lnf_mean_.data(), lnf_rstd_.data(), x, rows);
  lm_head_.forward(logits_.data(), lnf_.data(), rows);
  // The head's values stay for backward, which starts with them (forward_backward).
  if (!keep_head) done_params(head);
  return dev().softmax_xent_fwd(probs_.data(), losses_.data(), logits_.data(), targets_, rows,
                                shape_.vocab);
}

gpt::moe_stats gpt::last_moe() const {
  moe_stats st;
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    if (!layers_[l].moe || !acts_[l].moe) continue;
    const moe_routing& r = acts_[l].moe->route;
    st.tokens.resize(std::max(st.tokens.size(), r.kept.size()), 0);
    for (std::size_t e = 0; e < r.kept.size(); ++e) st.tokens[e] += r.kept[e];
    st.dropped += r.dropped;
    st.aux_loss += layers_[l].moe->aux_coef * acts_[l].moe->aux;
  }
  return st;
}

float gpt::forward_backward(const batch& b, float loss_scale) {
  float loss = 0;
  {
    trace::span s("forward", "compute", trace::track::compute);
    loss = forward(b, true);
  }
  if (shape_.moe_experts > 0) {
    loss += last_moe().aux_loss;  // the objective the gradients below are of
    for (gpt_block& blk : layers_) blk.aux_scale = loss_scale;
  }
  trace::span s("backward", "compute", trace::track::compute);
  const int rows = b.n * b.t;
  const std::size_t head = layers_.size() + 1;
  dev().softmax_xent_bwd(dlogits_.data(), probs_.data(), targets_, rows, shape_.vocab,
                         loss_scale / rows);
  // Memory order is wte, wpe, h.0 .. h.{L-1}, ln_f, lm_head and backward walks it from the
  // end, so every report lies below the previous one.
  const grads_ready_span& report = reporter();
  lm_head_.backward(scratch_.dln.data(), dlogits_.data(), lnf_.data(), rows, report);
  const float* last = layers_.empty() ? encoded_.data() : acts_.back().out.data();
  ln_f_.backward(dres_.data(), scratch_.dln.data(), last, lnf_mean_.data(), lnf_rstd_.data(), rows,
                 report);
  done_params(head);
  for (std::size_t l = layers_.size(); l-- > 0;) {
    const float* x = l == 0 ? encoded_.data() : acts_[l - 1].out.data();
    need_params(l + 1);
    layers_[l].backward(acts_[l], scratch_, dres_.data(), x, b.n, b.t, report);
    done_params(l + 1);
  }
  // The embedding's backward reads no parameter value (it adds dres into rows of dwte, dwpe).
  emb_.backward(dres_.data(), ids_, b.n, b.t, report);
  return loss;
}

void gpt::set_moe_exchange(const moe_exchange* ex) {
  for (gpt_block& blk : layers_)
    if (blk.moe) blk.moe->ep = ex;
}

void gpt::moe_pass() {
  // forward_backward's order of the exchanges: params_pass's, with no block gathered (a need
  // or done reaches no hook here, or one with every value already here).
  params_pass(nullptr, true);
}

void gpt::params_pass(const std::function<void(std::size_t block)>& backward_done,
                      bool exchanges) {
  // forward_backward's order: the embedding, the blocks and the head forward; the head's
  // backward under the same need; the blocks from the last down; the embedding (no value).
  // Block b > 0 of the hook is layer b - 1; its MoE exchanges run inside its need and done.
  std::vector<moe_acts> acts(exchanges ? layers_.size() : 0);
  auto exchange = [&](std::size_t b, bool forward) {
    if (!exchanges || b == 0 || b > layers_.size() || !layers_[b - 1].moe) return;
    if (forward)
      layers_[b - 1].moe->forward(acts[b - 1], nullptr, nullptr, 0);
    else
      layers_[b - 1].moe->backward(acts[b - 1], nullptr, nullptr, nullptr, 0, 0.0f);
  };
  const std::size_t head = layers_.size() + 1;
  for (std::size_t b = 0; b < head; ++b) {
    need_params(b);
    exchange(b, true);
    done_params(b);
  }
  need_params(head);
  if (backward_done) backward_done(head);
  done_params(head);
  for (std::size_t b = head - 1; b >= 1; --b) {
    need_params(b);
    exchange(b, false);
    if (backward_done) backward_done(b);
    done_params(b);
  }
  if (backward_done) backward_done(0);
}

std::vector<float> gpt::next_logits(const std::vector<int32_t>& ids) {
  batch b;
  b.n = 1;
  b.t = static_cast<int>(ids.size());
  b.ids = ids;
  b.targets.assign(ids.size(), 0);
  check(b);
  reserve(1);
  ids_ = on_device(b.ids, ids_dev_);
  need_params(0);
  emb_.forward(encoded_.data(), ids_, 1, b.t);
  done_params(0);
  const float* x = encoded_.data();
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    need_params(l + 1);
    layers_[l].forward(acts_[l], x, 1, b.t);
    done_params(l + 1);
    x = acts_[l].out.data();
  }
  // Only the last position's row goes through ln_f and lm_head.
  const int64_t C = shape_.d_model, V = shape_.vocab;
  need_params(layers_.size() + 1);
  ln_f_.forward(lnf_.data(), lnf_mean_.data(), lnf_rstd_.data(), x + (b.t - 1) * C, 1);
  lm_head_.forward(logits_.data(), lnf_.data(), 1);
  done_params(layers_.size() + 1);
  std::vector<float> copy;
  const float* row = on_host(logits_, V, copy);
  return std::vector<float>(row, row + V);
}

eval_result gpt::eval(const batch& b) {
  eval_result r;
  r.loss = forward(b);
  const int rows = b.n * b.t, V = shape_.vocab;
  r.count = rows;
  std::vector<float> copy;
  const float* logits = on_host(logits_, static_cast<int64_t>(rows) * V, copy);
  for (int i = 0; i < rows; ++i) {
    const float* row = logits + static_cast<int64_t>(i) * V;
    r.correct += static_cast<int>(std::max_element(row, row + V) - row) == b.targets[i];
  }
  return r;
}

}  // namespace cohort::nn
