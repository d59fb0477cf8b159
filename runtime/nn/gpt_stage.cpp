#include "runtime/nn/gpt_stage.hpp"

#include <algorithm>
#include <limits>
#include <string>

#include "runtime/core/error.hpp"

namespace cohort::nn {

namespace cpu = gpu::cpu;

namespace {

/// Parameter elements of the embedding, of each block and of the head, summed from
/// gpt_param_specs so the partition counts exactly what the models allocate.
struct block_sizes {
  int64_t embedding = 0, head = 0;
  std::vector<int64_t> layers;
};

block_sizes sizes_of(const gpt_shape& shape) {
  block_sizes s;
  s.layers.assign(shape.n_layer, 0);
  for (const gpt_param_spec& p : gpt_param_specs(shape)) {
    const int64_t n = shape_numel(p.shape);
    if (p.block == "embedding")
      s.embedding += n;
    else if (p.block == "head")
      s.head += n;
    else
      s.layers.at(std::stoi(p.block.substr(2))) += n;
  }
  return s;
}

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

std::vector<stage_range> partition_gpt(const gpt_shape& shape, int stages,
                                       const std::vector<int>& explicit_layers) {
  const block_sizes sz = sizes_of(shape);  // also validates the shape
  const int L = shape.n_layer, P = stages;
  if (P < 1)
    throw usage_error("pipeline: parallel.pp must be >= 1 (got " + std::to_string(P) + ")");
  if (P > L)
    throw usage_error(
        "pipeline: " + std::to_string(P) + " stages for " + std::to_string(L) +
        " transformer blocks; every stage needs at least one block, so pp <= n_layer");
  std::vector<int> counts;
  if (!explicit_layers.empty()) {
    if (static_cast<int>(explicit_layers.size()) != P)
      throw usage_error("pipeline: " + std::to_string(explicit_layers.size()) +
                        " explicit stage layer counts for " + std::to_string(P) + " stages");
    int sum = 0;
    for (int c : explicit_layers) {
      if (c < 1)
        throw usage_error("pipeline: every stage needs at least one block (explicit count " +
                          std::to_string(c) + ")");
      sum += c;
    }
    if (sum != L)
      throw usage_error("pipeline: explicit stage layer counts sum to " + std::to_string(sum) +
                        ", the model has n_layer = " + std::to_string(L));
    counts = explicit_layers;
  } else {
    // prefix[i] = parameters of blocks [0, i); cost of stage s over blocks [i, j).
    std::vector<int64_t> prefix(L + 1, 0);
    for (int l = 0; l < L; ++l) prefix[l + 1] = prefix[l] + sz.layers[l];
    auto cost = [&](int s, int i, int j) {
      return prefix[j] - prefix[i] + (s == 0 ? sz.embedding : 0) + (s == P - 1 ? sz.head : 0);
    };
    // best[s][i]: the smallest possible largest stage when stages s..P-1 cover blocks
    // [i, L), each with at least one block (exact, O(P L^2): L is at most a few hundred).
    constexpr int64_t inf = std::numeric_limits<int64_t>::max();
    std::vector<std::vector<int64_t>> best(P + 1, std::vector<int64_t>(L + 1, inf));
    for (int i = 0; i < L; ++i) best[P - 1][i] = cost(P - 1, i, L);
    for (int s = P - 2; s >= 0; --s)
      for (int i = s; i <= L - (P - s); ++i)
        for (int j = i + 1; j <= L - (P - s - 1); ++j)
          if (best[s + 1][j] != inf)
            best[s][i] = std::min(best[s][i], std::max(cost(s, i, j), best[s + 1][j]));
    const int64_t opt = best[0][0];
    // Walk forward taking, at each stage, the fewest blocks that still allow a cut of the
    // rest within opt: the lexicographically smallest optimal cut.
    int i = 0;
    for (int s = 0; s < P - 1; ++s) {
      int j = i + 1;
      while (cost(s, i, j) > opt || best[s + 1][j] > opt) ++j;
      COHORT_CHECK(j <= L - (P - s - 1));
      counts.push_back(j - i);
      i = j;
    }
    counts.push_back(L - i);
  }
  std::vector<stage_range> out;
  int first = 0;
  for (int s = 0; s < P; ++s) {
    out.push_back({first, first + counts[s], s == 0, s == P - 1});
    first += counts[s];
  }
  return out;
}

gpt_stage::gpt_stage(const gpt_shape& shape, const stage_range& range,
                     const gpt_stage_options& options, uint64_t seed, pool& p)
    : model(p), shape_(shape), range_(range), options_(options) {
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

  for (const gpt_param_spec& spec : specs) {
    if (!in_range(spec, range)) continue;
    if (blocks().empty() || blocks().back().name != spec.block) begin_block(spec.block);
    add_param(spec.name, spec.shape, spec.init);
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
  };
  auto bind_ln = [&](layernorm& ln, const std::string& name) {
    parameter& w = param(name + ".weight");
    parameter& b = param(name + ".bias");
    ln.w = w.value;
    ln.dw = w.grad;
    ln.b = b.value;
    ln.db = b.grad;
    ln.c = C;
  };
  if (range.has_embedding) {
    parameter& wte = param("transformer.wte.weight");
    parameter& wpe = param("transformer.wpe.weight");
    emb_.wte = wte.value;
    emb_.dwte = wte.grad;
    emb_.wpe = wpe.value;
    emb_.dwpe = wpe.grad;
    emb_.c = C;
  }
  layers_.resize(range.layers());
  for (int k = 0; k < range.layers(); ++k) {
    const std::string h = "transformer.h." + std::to_string(range.first_layer + k) + ".";
    gpt_block& blk = layers_[k];
    blk.n_head = shape.n_head;
    bind_ln(blk.ln_1, h + "ln_1");
    bind_linear(blk.c_attn, h + "attn.c_attn", C, 3 * C, true);
    bind_linear(blk.attn_proj, h + "attn.c_proj", C, C, true);
    bind_ln(blk.ln_2, h + "ln_2");
    bind_linear(blk.c_fc, h + "mlp.c_fc", C, 4 * C, true);
    bind_linear(blk.mlp_proj, h + "mlp.c_proj", 4 * C, C, true);
  }
  if (range.has_head) {
    bind_ln(ln_f_, "transformer.ln_f");
    bind_linear(lm_head_, "lm_head", C, shape.vocab, false);
  }

  // Everything is sized once for max_batch: growing later would move saved activations.
  const int64_t B = options.max_batch, rows = B * shape.context, V = shape.vocab;
  pool& mem = memory();
  slots_.resize(options.slots);
  for (slot_state& s : slots_) {
    s.input = tensor({rows, C}, mem);
    activation_bytes_ += s.input.bytes();
  }
  sets_.resize(options.activation_checkpointing ? 1 : options.slots);
  for (act_set& a : sets_) {
    a.blocks.resize(range.layers());
    for (gpt_block_acts& b : a.blocks) {
      b.allocate(B, shape, mem);
      activation_bytes_ += b.bytes();
    }
    if (range.has_head) {
      a.lnf = tensor({rows, C}, mem);
      a.lnf_mean = tensor({rows}, mem);
      a.lnf_rstd = tensor({rows}, mem);
      a.probs = tensor({rows, V}, mem);
      activation_bytes_ +=
          a.lnf.bytes() + a.lnf_mean.bytes() + a.lnf_rstd.bytes() + a.probs.bytes();
    }
  }
  if (range.has_head) {
    logits_ = tensor({rows, V}, mem);
    losses_ = tensor({rows}, mem);
    dlogits_ = tensor({rows, V}, mem);
  }
  scratch_.allocate(B, shape, mem);
  dres_ = tensor({rows, C}, mem);
}

void gpt_stage::init_like_gpt(uint64_t seed) {
  gpt_init_draws draws(gpt_param_specs(shape_), range_, seed, memory());
  for (parameter& p : parameters()) p.value.copy_from(draws.param(p.name).value);
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
    layers_[l].forward(a.blocks[l], x, s.n, s.t);
    x = a.blocks[l].out.data();
  }
  if (!range_.has_head) return 0.0f;
  const int V = shape_.vocab;
  ln_f_.forward(a.lnf.data(), a.lnf_mean.data(), a.lnf_rstd.data(), x, rows);
  lm_head_.forward(logits_.data(), a.lnf.data(), rows);
  if (correct) {
    *correct = 0;
    for (int i = 0; i < rows; ++i) {
      const float* row = logits_.data() + static_cast<int64_t>(i) * V;
      *correct += static_cast<int>(std::max_element(row, row + V) - row) == s.targets[i];
    }
  }
  return cpu::softmax_xent_fwd(a.probs.data(), losses_.data(), logits_.data(), s.targets.data(),
                               rows, V);
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
  if (range_.has_embedding) {
    s.ids = b.ids;
    emb_.forward(s.input.data(), s.ids.data(), b.n, b.t);
  } else {
    std::copy(x_in, x_in + rows * shape_.d_model, s.input.data());
  }
  if (range_.has_head) s.targets = b.targets;
  act_set& a = acts_of(slot);
  stage_forward r;
  r.loss = run_forward(s, a, &r.correct);
  if (!range_.has_head) r.out = a.blocks.back().out.data();
  s.busy = true;
  return r;
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
  const grad_report& report = reporter();
  // Parameters are walked from the end of memory down, as in gpt::forward_backward.
  if (range_.has_head) {
    cpu::softmax_xent_bwd(dlogits_.data(), a.probs.data(), s.targets.data(), rows, shape_.vocab,
                          loss_scale / rows);
    lm_head_.backward(scratch_.dln.data(), dlogits_.data(), a.lnf.data(), rows, report);
    ln_f_.backward(dres_.data(), scratch_.dln.data(), a.blocks.back().out.data(), a.lnf_mean.data(),
                   a.lnf_rstd.data(), rows, report);
  } else {
    std::copy(d_out, d_out + n, dres_.data());
  }
  for (std::size_t l = layers_.size(); l-- > 0;) {
    const float* x = l == 0 ? s.input.data() : a.blocks[l - 1].out.data();
    layers_[l].backward(a.blocks[l], scratch_, dres_.data(), x, s.n, s.t, report);
  }
  s.busy = false;
  if (range_.has_embedding) {
    emb_.backward(dres_.data(), s.ids.data(), s.n, s.t, report);
    return nullptr;
  }
  return dres_.data();
}

void gpt_stage::drop(int slot) {
  check_slot(slot);
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
