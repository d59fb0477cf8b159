#include "runtime/nn/gpt_stage.hpp"

#include <algorithm>
#include <functional>
#include <limits>
#include <string>

#include "runtime/core/error.hpp"
#include "runtime/core/rules.hpp"

namespace cohort::nn {

namespace {

/// Whether spec `p` belongs to a stage covering `r`.
bool in_range(const gpt_param_spec& p, const stage_range& r) {
  if (p.block == "embedding") return r.has_embedding;
  if (p.block == "head") return r.has_head;
  const int l = std::stoi(p.block.substr(2));
  return l >= r.first_layer && l < r.end_layer;
}

/// The initial values of a full gpt without allocating one. model draws parameter i from
/// rng(hash_coords(seed, i)), i being its index in the model; this model declares every
/// gpt parameter in gpt order, with zero elements outside the stage, so its draws for the
/// stage's parameters are the full gpt's, made by model::init_parameters itself (no second
/// copy of the drawing code that could drift from it).
class gpt_init_draws : public model {
 public:
  gpt_init_draws(const std::vector<gpt_param_spec>& specs, const stage_range& r, uint64_t seed,
                 pool& p)
      : model(p) {
    begin_block("all");
    for (const gpt_param_spec& s : specs)
      add_param(s.name, in_range(s, r) ? s.shape : shape_t{0}, s.init);
    finalize(seed);
  }
  float forward_backward(const batch&, float) override {
    throw usage_error("gpt_init_draws holds initial values only");
  }
  eval_result eval(const batch&) override {
    throw usage_error("gpt_init_draws holds initial values only");
  }
  std::string kind() const override { return "gpt_init_draws"; }
};

using tp_slice = gpt_stage::tp_slice;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

/// Which part of the whole tensor `p` TP rank `rank` of `T` holds (Megatron's split: the
/// rows of c_attn and c_fc, the input columns of both c_proj; everything else whole).
tp_slice slice_of(const gpt_param_spec& p, int T, int rank) {
  tp_slice s;
  s.full_shape = p.shape;
  if (T == 1 || p.block == "embedding" || p.block == "head") return s;
  const int64_t in = p.shape.back();  // a linear weight is [out, in]
  auto cut = [&](int dim, int64_t extent, int parts) {
    s.dim = dim;
    s.parts = parts;
    s.begin = extent / T * rank;
    s.end = extent / T * (rank + 1);
  };
  if (ends_with(p.name, ".attn.c_attn.weight") || ends_with(p.name, ".attn.c_attn.bias"))
    cut(0, p.shape[0] / 3, 3);  // q | k | v: the rows of this rank's heads in each
  else if (ends_with(p.name, ".mlp.c_fc.weight") || ends_with(p.name, ".mlp.c_fc.bias"))
    cut(0, p.shape[0], 1);
  else if (ends_with(p.name, ".attn.c_proj.weight") || ends_with(p.name, ".mlp.c_proj.weight"))
    cut(1, in, 1);
  return s;
}

/// The shape of the shard a slice describes.
shape_t shard_shape(const tp_slice& s) {
  shape_t out = s.full_shape;
  if (s.dim >= 0) out[s.dim] = s.parts * (s.end - s.begin);
  return out;
}

/// Copies the elements of `full` (of s.full_shape) that the shard holds into `shard`.
void copy_shard(const tp_slice& s, const float* full, float* shard) {
  const int64_t numel = shape_numel(s.full_shape);
  if (s.dim < 0) {
    std::copy(full, full + numel, shard);
  } else if (s.dim == 0) {
    const int64_t row = numel / s.full_shape[0], part = s.full_shape[0] / s.parts;
    for (int k = 0; k < s.parts; ++k) {
      const float* src = full + (k * part + s.begin) * row;
      shard = std::copy(src, src + (s.end - s.begin) * row, shard);
    }
  } else {
    const int64_t rows = s.full_shape[0], cols = s.full_shape[1];
    for (int64_t r = 0; r < rows; ++r)
      shard = std::copy(full + r * cols + s.begin, full + r * cols + s.end, shard);
  }
}

/// Block activations of one TP rank: the stream-wide tensors (LayerNorm outputs, residuals)
/// whole, the per-head and MLP-width tensors at 1/T (gpt_block_acts::allocate sizes for
/// T = 1).
void allocate_tp_acts(gpt_block_acts& a, int64_t sequences, const gpt_shape& s, int T, pool& p) {
  const int64_t B = sequences, TT = s.context, C = s.d_model, rows = B * TT;
  const int64_t cl = C / T, nhl = s.n_head / T;
  a.ln1 = tensor({rows, C}, p);
  a.ln1_mean = tensor({rows}, p);
  a.ln1_rstd = tensor({rows}, p);
  a.qkv = tensor({rows, 3 * cl}, p);
  a.att = tensor({B, nhl, TT, TT}, p);
  a.atty = tensor({rows, cl}, p);
  a.res2 = tensor({rows, C}, p);
  a.ln2 = tensor({rows, C}, p);
  a.ln2_mean = tensor({rows}, p);
  a.ln2_rstd = tensor({rows}, p);
  a.fch = tensor({rows, 4 * C / T}, p);
  a.fch_gelu = tensor({rows, 4 * C / T}, p);
  a.out = tensor({rows, C}, p);
}

/// Gradient scratch of one TP rank, sized like allocate_tp_acts.
void allocate_tp_scratch(gpt_grad_scratch& g, int64_t sequences, const gpt_shape& s, int T,
                         pool& p) {
  const int64_t B = sequences, TT = s.context, C = s.d_model, rows = B * TT;
  g.dtmp = tensor({rows, C}, p);
  g.dln = tensor({rows, C}, p);
  g.datty = tensor({rows, C / T}, p);
  g.dqkv = tensor({rows, 3 * C / T}, p);
  g.dfch = tensor({rows, 4 * C / T}, p);
  g.dfch_gelu = tensor({rows, 4 * C / T}, p);
  g.datt = tensor({B, s.n_head / T, TT, TT}, p);
}

/// y[r, :] += b for every row: a row-parallel layer's bias, added once after the sum.
void add_bias_rows(device& dev, float* y, const float* b, int rows, int c) {
  for (int r = 0; r < rows; ++r) dev.add_inplace(y + static_cast<int64_t>(r) * c, b, c);
}

using allreduce_fn = std::function<void(float*, int64_t)>;

/// gpt_block::forward of one TP rank: the column-parallel c_attn / c_fc need no
/// communication (the input is whole on every rank, each computes its own output slice);
/// each row-parallel c_proj yields a partial sum over its input slice, summed over the
/// group before the bias (added once) and the residual.
void tp_block_forward(const gpt_block& k, gpt_block_acts& a, const float* x, int b, int t,
                      const allreduce_fn& allreduce) {
  const int rows = b * t, c = k.ln_1.c, cl = k.attn_proj.in, fl = k.c_fc.out;
  const int64_t n = static_cast<int64_t>(rows) * c;
  k.ln_1.forward(a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), x, rows);
  k.c_attn.forward(a.qkv.data(), a.ln1.data(), rows);
  k.dev->attention_fwd(a.atty.data(), a.att.data(), a.qkv.data(), b, t, cl, k.n_head);
  k.dev->linear_fwd(a.res2.data(), a.atty.data(), k.attn_proj.w.data(), nullptr, rows, cl, c);
  allreduce(a.res2.data(), n);
  add_bias_rows(*k.dev, a.res2.data(), k.attn_proj.b.data(), rows, c);
  k.dev->add_inplace(a.res2.data(), x, n);
  k.ln_2.forward(a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(), a.res2.data(), rows);
  k.c_fc.forward(a.fch.data(), a.ln2.data(), rows);
  k.dev->gelu_fwd(a.fch_gelu.data(), a.fch.data(), static_cast<int64_t>(rows) * fl);
  k.dev->linear_fwd(a.out.data(), a.fch_gelu.data(), k.mlp_proj.w.data(), nullptr, rows, fl, c);
  allreduce(a.out.data(), n);
  add_bias_rows(*k.dev, a.out.data(), k.mlp_proj.b.data(), rows, c);
  k.dev->add_inplace(a.out.data(), a.res2.data(), n);
}

/// gpt_block::backward of one TP rank. A row-parallel layer needs no communication: its
/// output gradient is whole on every rank, so its bias gradient is the same everywhere and
/// its weight and input gradients are the rank's own slices. A column-parallel layer's
/// input gradient is this rank's share of a sum over all output rows, summed over the
/// group before the LayerNorm backward that needs the whole of it.
void tp_block_backward(gpt_block& k, gpt_block_acts& a, gpt_grad_scratch& s, float* dres,
                       const float* x, int b, int t, const grads_ready_span& report,
                       const allreduce_fn& allreduce) {
  const int rows = b * t, c = k.ln_1.c, cl = k.attn_proj.in, fl = k.c_fc.out;
  const int64_t n = static_cast<int64_t>(rows) * c;
  k.mlp_proj.backward(s.dfch_gelu.data(), dres, a.fch_gelu.data(), rows, report);
  k.dev->gelu_bwd(s.dfch.data(), s.dfch_gelu.data(), a.fch.data(), static_cast<int64_t>(rows) * fl);
  k.c_fc.backward(s.dln.data(), s.dfch.data(), a.ln2.data(), rows, report);
  allreduce(s.dln.data(), n);
  k.ln_2.backward(s.dtmp.data(), s.dln.data(), a.res2.data(), a.ln2_mean.data(), a.ln2_rstd.data(),
                  rows, report);
  k.dev->add_inplace(dres, s.dtmp.data(), n);
  k.attn_proj.backward(s.datty.data(), dres, a.atty.data(), rows, report);
  k.dev->attention_bwd(s.dqkv.data(), s.datt.data(), s.datty.data(), a.qkv.data(), a.att.data(), b,
                       t, cl, k.n_head);
  k.c_attn.backward(s.dln.data(), s.dqkv.data(), a.ln1.data(), rows, report);
  allreduce(s.dln.data(), n);
  k.ln_1.backward(s.dtmp.data(), s.dln.data(), x, a.ln1_mean.data(), a.ln1_rstd.data(), rows,
                  report);
  k.dev->add_inplace(dres, s.dtmp.data(), n);
}

std::string range_str(const stage_range& r) {
  return "layers [" + std::to_string(r.first_layer) + ", " + std::to_string(r.end_layer) + ")" +
         (r.has_embedding ? " + embedding" : "") + (r.has_head ? " + head" : "");
}

}  // namespace

int64_t stage_param_count(const gpt_shape& shape, const stage_range& r) {
  int64_t n = 0;
  for (const gpt_param_spec& p : gpt_param_specs(shape))
    if (in_range(p, r)) n += shape_numel(p.shape);
  return n;
}

gpt_stage::gpt_stage(const gpt_shape& shape, const stage_range& range,
                     const gpt_stage_options& options, uint64_t seed, pool& p)
    : model(p), shape_(shape), range_(range), options_(options), acts_(pool::account, p) {
  const std::vector<gpt_param_spec> specs = gpt_param_specs(shape);  // validates the shape
  const int L = shape.n_layer;
  if (range.first_layer < 0 || range.end_layer > L || range.first_layer >= range.end_layer)
    throw usage_error("gpt_stage: " + range_str(range) + " is not a non-empty range of the " +
                      std::to_string(L) + " blocks");
  if (range.has_embedding != (range.first_layer == 0) || range.has_head != (range.end_layer == L))
    throw usage_error("gpt_stage: " + range_str(range) +
                      ": the embedding belongs exactly to the stage with block 0 and the head to "
                      "the stage with the last block");
  if (options.slots < 1 || options.max_batch < 1)
    throw usage_error("gpt_stage: slots and max_batch must be >= 1");
  const int T = options.tp_size;
  if (T < 1 || options.tp_rank < 0 || options.tp_rank >= T)
    throw usage_error("gpt_stage: tp_rank " + std::to_string(options.tp_rank) + " outside [0, " +
                      "tp_size=" + std::to_string(T) + "); parallel.tp must be >= 1");
  if (T > 1 && !options.tp_allreduce)
    throw usage_error("gpt_stage: tp_size " + std::to_string(T) +
                      " needs tp_allreduce, the sum over the tensor-parallel group");
  if (!rules::tp_divides_heads(shape.n_head, T))  // then T divides d_model: specs checked heads
    throw usage_error("gpt_stage: tensor parallelism over " + std::to_string(T) +
                      " ranks splits the heads and the MLP width evenly, but n_head = " +
                      std::to_string(shape.n_head) +
                      " and 4 * d_model = " + std::to_string(4 * int64_t{shape.d_model}) +
                      "; set parallel.tp to a divisor of n_head (or change n_head)");

  for (const gpt_param_spec& spec : specs) {
    if (!in_range(spec, range)) continue;
    if (blocks().empty() || blocks().back().name != spec.block) begin_block(spec.block);
    const tp_slice sl = slice_of(spec, T, options.tp_rank);
    add_param(spec.name, shard_shape(sl), spec.init);
    tp_replicated_.push_back(sl.dim < 0);
    tp_slices_.push_back(sl);
  }
  finalize(seed);  // draws by stage-local index; replaced just below
  init_like_gpt(seed);

  // Bind layers by name: the names are the contract with gpt (and checkpoints).
  const int C = shape.d_model;
  auto bind_linear = [&](linear& l, const std::string& name, int in, int out, bool bias) {
    parameter& w = param(name + ".weight");
    l.w = w.value;
    l.dw = w.grad;
    if (bias) {
      parameter& b = param(name + ".bias");
      l.b = b.value;
      l.db = b.grad;
    }
    l.in = in;
    l.out = out;
    l.dev = &p.dev();
  };
  auto bind_ln = [&](layernorm& ln, const std::string& name) {
    parameter& w = param(name + ".weight");
    parameter& b = param(name + ".bias");
    ln.w = w.value;
    ln.dw = w.grad;
    ln.b = b.value;
    ln.db = b.grad;
    ln.c = C;
    ln.dev = &p.dev();
  };
  if (range.has_embedding) {
    parameter& wte = param("transformer.wte.weight");
    parameter& wpe = param("transformer.wpe.weight");
    emb_.wte = wte.value;
    emb_.dwte = wte.grad;
    emb_.wpe = wpe.value;
    emb_.dwpe = wpe.grad;
    emb_.c = C;
    emb_.dev = &p.dev();
  }
  layers_.resize(range.layers());
  for (int k = 0; k < range.layers(); ++k) {
    const std::string h = "transformer.h." + std::to_string(range.first_layer + k) + ".";
    gpt_block& blk = layers_[k];
    // A TP rank holds n_head / T heads (3C/T rows of c_attn, C/T input columns of
    // attn.c_proj) and 4C/T of the MLP width; T = 1 gives the whole block.
    blk.n_head = shape.n_head / T;
    blk.dev = &p.dev();
    bind_ln(blk.ln_1, h + "ln_1");
    bind_linear(blk.c_attn, h + "attn.c_attn", C, 3 * C / T, true);
    bind_linear(blk.attn_proj, h + "attn.c_proj", C / T, C, true);
    bind_ln(blk.ln_2, h + "ln_2");
    bind_linear(blk.c_fc, h + "mlp.c_fc", C, 4 * C / T, true);
    bind_linear(blk.mlp_proj, h + "mlp.c_proj", 4 * C / T, C, true);
  }
  if (range.has_head) {
    bind_ln(ln_f_, "transformer.ln_f");
    bind_linear(lm_head_, "lm_head", C, shape.vocab, false);
  }

  // Every buffer is sized for max_batch. A slot's buffers are taken at its forward and
  // given back at its backward, so the activation account sees what is really held; with
  // checkpointing the one shared set is held throughout.
  const int64_t B = options.max_batch, rows = B * shape.context, V = shape.vocab;
  pool& mem = memory();
  slots_.resize(options.slots);
  sets_.resize(options.activation_checkpointing ? 1 : options.slots);
  {
    act_set probe;
    allocate_set(probe);
    per_slot_bytes_ = static_cast<std::size_t>(rows * C) * sizeof(float);
    if (!options.activation_checkpointing)
      per_slot_bytes_ += acts_.stats().bytes_in_use;  // the probe set
  }
  if (options.activation_checkpointing) allocate_set(sets_[0]);
  acts_.reset_peak();  // the probe was never held for a micro-batch
  if (range.has_head) {
    logits_ = tensor({rows, V}, mem);
    losses_ = tensor({rows}, mem);
    dlogits_ = tensor({rows, V}, mem);
  }
  if (T == 1)
    scratch_.allocate(B, shape, mem);
  else
    allocate_tp_scratch(scratch_, B, shape, T, mem);
  dres_ = tensor({rows, C}, mem);
}

void gpt_stage::allocate_set(act_set& a) {
  const int64_t B = options_.max_batch, rows = B * shape_.context, C = shape_.d_model;
  a.blocks.resize(range_.layers());
  for (gpt_block_acts& b : a.blocks) {
    if (options_.tp_size == 1)
      b.allocate(B, shape_, acts_);
    else
      allocate_tp_acts(b, B, shape_, options_.tp_size, acts_);
  }
  if (range_.has_head) {
    a.lnf = tensor({rows, C}, acts_);
    a.lnf_mean = tensor({rows}, acts_);
    a.lnf_rstd = tensor({rows}, acts_);
    a.probs = tensor({rows, shape_.vocab}, acts_);
  }
}

void gpt_stage::hold(int slot) {
  const int64_t rows = int64_t{options_.max_batch} * shape_.context;
  slots_[slot].input = tensor({rows, shape_.d_model}, acts_);
  if (!options_.activation_checkpointing) allocate_set(sets_[slot]);
}

void gpt_stage::release(int slot) {
  slots_[slot].input = tensor();
  if (!options_.activation_checkpointing) sets_[slot] = act_set();
}

void gpt_stage::load_from(const model& whole) {
  // Cut on the host (either model may live on a GPU), then one copy to this stage's device.
  std::vector<parameter>& ps = parameters();
  std::vector<float> values(static_cast<std::size_t>(flat_values().numel())), copy;
  for (std::size_t i = 0; i < ps.size(); ++i) {
    const parameter& full = whole.param(ps[i].name);
    if (full.value.shape() != tp_slices_[i].full_shape)
      throw usage_error("gpt_stage: " + ps[i].name + " has another shape in the model loaded");
    copy_shard(tp_slices_[i], on_host(full.value, full.value.numel(), copy),
               values.data() + ps[i].offset);
  }
  flat_values().copy_from_host(values.data());
}

void gpt_stage::init_like_gpt(uint64_t seed) {
  // The draws are the host's (as model::init_parameters'), cut there and copied once.
  gpt_init_draws draws(gpt_param_specs(shape_), range_, seed, pool::global());
  std::vector<parameter>& ps = parameters();
  std::vector<float> values(static_cast<std::size_t>(flat_values().numel()));
  for (std::size_t i = 0; i < ps.size(); ++i)
    copy_shard(tp_slices_[i], draws.param(ps[i].name).value.data(), values.data() + ps[i].offset);
  flat_values().copy_from_host(values.data());
}

void gpt_stage::block_forward(std::size_t l, gpt_block_acts& a, const float* x, int n, int t) {
  if (options_.tp_size == 1)
    layers_[l].forward(a, x, n, t);
  else
    tp_block_forward(layers_[l], a, x, n, t, options_.tp_allreduce);
}

void gpt_stage::block_backward(std::size_t l, gpt_block_acts& a, float* dres, const float* x, int n,
                               int t) {
  if (options_.tp_size == 1)
    layers_[l].backward(a, scratch_, dres, x, n, t, reporter());
  else
    tp_block_backward(layers_[l], a, scratch_, dres, x, n, t, reporter(), options_.tp_allreduce);
}

void gpt_stage::check_slot(int slot) const {
  if (slot < 0 || slot >= static_cast<int>(slots_.size()))
    throw usage_error("gpt_stage: slot " + std::to_string(slot) + " outside [0, " +
                      std::to_string(slots_.size()) + ")");
}

bool gpt_stage::busy(int slot) const {
  check_slot(slot);
  return slots_[slot].busy;
}

void gpt_stage::check_batch(const batch& b) const {
  if (b.n < 1 || b.n > options_.max_batch)
    throw usage_error("gpt_stage: micro-batch of " + std::to_string(b.n) +
                      " sequences outside [1, max_batch=" + std::to_string(options_.max_batch) +
                      "]");
  if (b.t < 1 || b.t > shape_.context)
    throw usage_error("gpt_stage: sequence length " + std::to_string(b.t) +
                      " outside [1, context=" + std::to_string(shape_.context) + "]");
  const std::size_t rows = static_cast<std::size_t>(b.n) * b.t;
  auto check_tokens = [&](const std::vector<int32_t>& v, const char* what) {
    if (v.size() != rows)
      throw usage_error(std::string("gpt_stage: batch needs n*t = ") + std::to_string(rows) + " " +
                        what + " (got " + std::to_string(v.size()) + ")");
    for (int32_t id : v)
      if (id < 0 || id >= shape_.vocab)
        throw usage_error("gpt_stage: token id outside [0, vocab=" + std::to_string(shape_.vocab) +
                          ")");
  };
  if (range_.has_embedding) check_tokens(b.ids, "ids");
  if (range_.has_head) check_tokens(b.targets, "targets");
}

float gpt_stage::run_forward(const slot_state& s, act_set& a, int64_t* correct) {
  const int rows = s.n * s.t;
  const float* x = s.input.data();
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    block_forward(l, a.blocks[l], x, s.n, s.t);
    x = a.blocks[l].out.data();
  }
  if (!range_.has_head) return 0.0f;
  const int V = shape_.vocab;
  ln_f_.forward(a.lnf.data(), a.lnf_mean.data(), a.lnf_rstd.data(), x, rows);
  lm_head_.forward(logits_.data(), a.lnf.data(), rows);
  if (correct) {
    *correct = 0;
    std::vector<float> copy;
    const float* logits = on_host(logits_, static_cast<int64_t>(rows) * V, copy);
    for (int i = 0; i < rows; ++i) {
      const float* row = logits + static_cast<int64_t>(i) * V;
      *correct += static_cast<int>(std::max_element(row, row + V) - row) == s.targets[i];
    }
  }
  return dev().softmax_xent_fwd(a.probs.data(), losses_.data(), logits_.data(), s.targets_dev, rows,
                                V);
}

stage_forward gpt_stage::forward(int slot, const batch& b, const float* x_in) {
  check_slot(slot);
  slot_state& s = slots_[slot];
  if (s.busy)
    throw usage_error("gpt_stage: slot " + std::to_string(slot) +
                      " still holds a micro-batch waiting for backward");
  check_batch(b);
  if (range_.has_embedding == (x_in != nullptr))
    throw usage_error(range_.has_embedding
                          ? "gpt_stage: the first stage embeds b.ids; x_in must be null"
                          : "gpt_stage: a stage after the first needs x_in, the previous "
                            "stage's output");
  s.n = b.n;
  s.t = b.t;
  const int64_t rows = static_cast<int64_t>(b.n) * b.t;
  hold(slot);
  try {
    if (range_.has_embedding) {
      s.ids = b.ids;
      s.ids_dev = on_device(s.ids, s.ids_staging);
      emb_.forward(s.input.data(), s.ids_dev, b.n, b.t);
    } else {
      dev().copy(s.input.data(), x_in, static_cast<std::size_t>(rows * shape_.d_model) * sizeof(float));
    }
    if (range_.has_head) {
      s.targets = b.targets;
      s.targets_dev = on_device(s.targets, s.targets_staging);
    }
    act_set& a = acts_of(slot);
    stage_forward r;
    r.loss = run_forward(s, a, &r.correct);
    if (!range_.has_head) r.out = a.blocks.back().out.data();
    s.busy = true;
    return r;
  } catch (...) {
    release(slot);  // a failed TP sum: nothing is held for this slot
    throw;
  }
}

const float* gpt_stage::backward(int slot, const float* d_out, float loss_scale) {
  check_slot(slot);
  slot_state& s = slots_[slot];
  if (!s.busy)
    throw usage_error("gpt_stage: backward of slot " + std::to_string(slot) +
                      ", which holds no forwarded micro-batch");
  if (range_.has_head == (d_out != nullptr))
    throw usage_error(range_.has_head ? "gpt_stage: the last stage starts backward from its loss; "
                                        "d_out must be null"
                                      : "gpt_stage: a stage before the last needs d_out, the "
                                        "next stage's input gradient");
  act_set& a = acts_of(slot);
  // The same kernels on the same inputs give the same bits, so the recomputed activations
  // equal the ones forward computed and the gradients match a run without checkpointing.
  if (options_.activation_checkpointing) run_forward(s, a, nullptr);

  const int rows = s.n * s.t;
  const int64_t n = static_cast<int64_t>(rows) * shape_.d_model;
  const grads_ready_span& report = reporter();
  // Parameters are walked from the end of memory down, as in gpt::forward_backward.
  if (range_.has_head) {
    dev().softmax_xent_bwd(dlogits_.data(), a.probs.data(), s.targets_dev, rows, shape_.vocab,
                           loss_scale / rows);
    lm_head_.backward(scratch_.dln.data(), dlogits_.data(), a.lnf.data(), rows, report);
    ln_f_.backward(dres_.data(), scratch_.dln.data(), a.blocks.back().out.data(), a.lnf_mean.data(),
                   a.lnf_rstd.data(), rows, report);
  } else {
    dev().copy(dres_.data(), d_out, static_cast<std::size_t>(n) * sizeof(float));
  }
  for (std::size_t l = layers_.size(); l-- > 0;) {
    const float* x = l == 0 ? s.input.data() : a.blocks[l - 1].out.data();
    block_backward(l, a.blocks[l], dres_.data(), x, s.n, s.t);
  }
  s.busy = false;
  release(slot);  // dres_ (the result) is scratch, not the slot's
  if (range_.has_embedding) {
    emb_.backward(dres_.data(), s.ids_dev, s.n, s.t, report);
    return nullptr;
  }
  return dres_.data();
}

void gpt_stage::drop(int slot) {
  check_slot(slot);
  if (slots_[slot].busy) release(slot);
  slots_[slot].busy = false;
}

float gpt_stage::forward_backward(const batch& b, float loss_scale) {
  if (!range_.has_embedding || !range_.has_head)
    throw usage_error("gpt_stage: forward_backward needs the whole model (" + range_str(range_) +
                      "); run forward / backward per slot and pass activations between stages");
  const float loss = forward(0, b).loss;
  backward(0, nullptr, loss_scale);
  return loss;
}

eval_result gpt_stage::eval(const batch& b) {
  if (!range_.has_embedding || !range_.has_head)
    throw usage_error("gpt_stage: eval needs the whole model (" + range_str(range_) +
                      "); chain forward over the stages instead");
  const stage_forward f = forward(0, b);
  drop(0);
  return {f.loss, f.correct, static_cast<int64_t>(b.n) * b.t};
}

}  // namespace cohort::nn
