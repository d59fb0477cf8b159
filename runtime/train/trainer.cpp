#include "runtime/train/trainer.hpp"

#include <fnmatch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "runtime/ckpt/checkpoint.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/sha256.hpp"
#include "runtime/core/trace.hpp"
#include "runtime/cpu/kernels.hpp"
#include "runtime/train/checkpoint_writer.hpp"
#include "runtime/train/fixed_point.hpp"
#include "runtime/train/param_stats.hpp"
#include "runtime/train/resume_plan.hpp"
#include "runtime/train/seat.hpp"

namespace cohort::train {

float learning_rate(const train_config& t, int64_t step) {
  if (t.warmup_steps > 0 && step < t.warmup_steps)
    return t.lr * static_cast<float>(step + 1) / static_cast<float>(t.warmup_steps);
  if (t.lr_schedule == "cosine") {
    int64_t span = t.steps - t.warmup_steps;
    if (span <= 1) return t.lr;
    double progress = static_cast<double>(step - t.warmup_steps) / static_cast<double>(span - 1);
    progress = std::min(1.0, std::max(0.0, progress));
    return static_cast<float>(t.min_lr +
                              0.5 * (t.lr - t.min_lr) * (1.0 + std::cos(M_PI * progress)));
  }
  return t.lr;
}

trainer::trainer(const config& c) : cfg_(c) {
  // One BLAS thread by default: results must not depend on the machine's core count.
  // Denormals flushed to zero: tiny late-training gradients otherwise slow every step
  // several-fold; the setting is the same in every process, so results stay reproducible.
  cpu::set_num_threads(std::max(1, c.train.threads));
  cpu::set_flush_denormals(true);
  data_ = make_dataset(c);
  const int vocab = data_->is_language_model() ? data_->num_classes() : 0;
  model_ = nn::make_model(c.model, vocab, c.train.micro_batch, c.train.seed);
  micro_batches_ = (c.train.global_batch + c.train.micro_batch - 1) / c.train.micro_batch;
  bitwise_ = c.train.determinism == "bitwise";
  if (bitwise_) {
    fixed_.assign(static_cast<std::size_t>(model_->num_params()), 0);
  }
  nn::optim_options o = optim_options_from(c.train);
  if (o.kind == "onebit_adam") o.compressed = onebit_ranges(*model_, c.train.onebit_exclude);
  opt_ = nn::make_optimizer(model_->flat_values(), model_->flat_grads(), o);
  onebit_ = dynamic_cast<nn::onebit_adam*>(opt_.get());
  wire_format_ = comm::wire_format_of(c.comm.compression);
  error_feedback_ = keeps_error_feedback(c);  // 1-bit Adam always feeds back what signs lose
  if (error_feedback_) kept_.reset(static_cast<std::size_t>(model_->num_params()));
}

std::vector<std::pair<int64_t, int64_t>> onebit_ranges(const nn::model& m,
                                                       const std::vector<std::string>& exclude) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const auto& p : m.parameters()) {
    bool kept = false;
    for (const std::string& pattern : exclude)
      kept = kept || fnmatch(pattern.c_str(), p.name.c_str(), 0) == 0;
    if (kept) continue;
    const int64_t n = p.value.numel();
    if (!out.empty() && out.back().first + out.back().second == p.offset)
      out.back().second += n;  // neighbours merge: fewer, larger segments
    else
      out.emplace_back(p.offset, n);
  }
  return out;
}

void trainer::add_momentum(int64_t offset, int64_t count) {
  float* g = model_->flat_grads().data();
  const float* m = onebit_->momentum();
  const float beta1 = cfg_.train.beta1;
  const float a = beta1 / static_cast<float>(replicas_), b = 1.0f - beta1;
  for (const auto& [off, n] : onebit_->options().compressed) {
    const int64_t from = std::max(off, offset), to = std::min(off + n, offset + count);
    for (int64_t i = from; i < to; ++i) g[i] = a * m[i] + b * g[i];
  }
}

namespace {

// 1-bit Adam after its freeze sends each momentum share divided by its frozen Adam
// denominator d = sqrt(v) / sqrt(1 - beta2^T) + eps (T: the freeze step), and multiplies
// the sum back by d: the signs then carry the update direction m / d, whose elements Adam
// has already brought to one scale, so one magnitude per chunk fits them all. Sent as m
// itself, a weight whose gradients were always small gets the chunk's magnitude, divided by
// its small d (docs/compression.md has the figures).
// v is frozen and the same on every replica, so the map is one fixed diagonal scaling:
// error feedback works in its space as in any other. An element with v = 0 never had a
// gradient: it sends 0 (divided by eps alone it would swamp its chunk's magnitude).
void scale_by_denominator(nn::onebit_adam& opt, float* g, int64_t offset, int64_t count,
                          bool divide) {
  const nn::optim_options& o = opt.options();
  const float* v = opt.state()[1].second.data();
  const float eps = o.eps;  // a local: g could alias o for all the compiler knows
  const float sqrt_bc2 = static_cast<float>(
      std::sqrt(1.0 - std::pow(static_cast<double>(o.beta2), static_cast<double>(o.freeze_step))));
  for (const auto& [off, n] : o.compressed) {
    const int64_t from = std::max(off, offset), to = std::min(off + n, offset + count);
    // Selects rather than branches, and the direction chosen outside the loop (one
    // instantiation each): the loop vectorizes (sqrt and division are exact in SIMD too, so
    // the bits are the scalar loop's).
    auto scaled = [&](auto apply) {
      for (int64_t i = from; i < to; ++i) {
        const float gi = v[i] == 0.0f ? 0.0f : g[i];
        g[i] = apply(gi, std::sqrt(v[i]) / sqrt_bc2 + eps);
      }
    };
    if (divide)
      scaled([](float x, float d) { return x / d; });
    else
      scaled([](float x, float d) { return x * d; });
  }
}

}  // namespace

void trainer::begin_step() {
  model_->zero_grad();
  if (bitwise_) std::fill(fixed_.begin(), fixed_.end(), 0);
  converted_ = false;
  momentum_in_ = false;
  if (error_feedback_) next_ = kept_;  // an aborted step leaves kept_ as it was
}

comm::grad_type trainer::reduction_type() const {
  return bitwise_ && wire_format_ == comm::wire_format::f32 && onebit_ == nullptr
             ? comm::grad_type::i64
             : comm::grad_type::f32;
}

comm::wire_plan trainer::wire(int replicas, int rank) {
  replicas_ = replicas;
  rank_ = rank;
  comm::wire_plan plan;
  // Bitwise with a float buffer: the plain stretches too are summed in rank order, so the
  // bits do not depend on the transport nor on which ranks share a host.
  if (bitwise_) plan.plain = comm::plain_sum::rank_order;
  const auto n = static_cast<std::size_t>(model_->num_params());
  if (onebit_ != nullptr) {
    if (!onebit_->frozen()) return plan;  // warm-up: plain float sums
    for (const auto& [off, count] : onebit_->options().compressed)
      plan.compressed.push_back({static_cast<std::size_t>(off), static_cast<std::size_t>(count),
                                 comm::wire_format::sign});
  } else if (wire_format_ != comm::wire_format::f32) {
    plan.compressed.push_back({0, n, wire_format_});
  }
  if (!error_feedback_ || plan.compressed.empty()) return plan;
  if (pending_.replicas > 0) restore_feedback(replicas, rank);
  // The chunks this worker owned belong to others now: what it kept for them becomes part of
  // what it feeds back as a sender (both are in the units of the sum).
  if (next_.replicas != 0 && (next_.replicas != replicas || next_.rank != rank))
    next_.fold_owner_into_sender();
  next_.replicas = replicas;
  next_.rank = rank;
  plan.memory = {next_.worker.data(), next_.server.data()};
  return plan;
}

std::vector<int> replica_micro_batches(int micro_batches, int dp, int d) {
  if (dp < 1 || d < 0 || d >= dp)
    throw usage_error("replica " + std::to_string(d) + " of a data-parallel group of " +
                      std::to_string(dp) + " does not exist (need 0 <= replica < dp)");
  if (micro_batches < 0)
    throw usage_error("micro-batches per step must be >= 0 (got " + std::to_string(micro_batches) +
                      ")");
  // Round-robin rather than contiguous ranges: when dp does not divide M, replicas differ
  // by at most one micro-batch and the extra ones go to the lowest replicas.
  std::vector<int> out;
  for (int i = d; i < micro_batches; i += dp) out.push_back(i);
  return out;
}

void trainer::accumulate_fixed(int64_t step, int64_t offset, int64_t count) {
  accumulate_gradients(fixed_.data(), model_->flat_grads().data(), offset, count,
                       "step " + std::to_string(step));
}

double trainer::run_micro_batch(int64_t step, int i, const nn::grads_ready_fn* ready) {
  const auto& t = cfg_.train;
  // The model's forward and backward spans say which step and micro-batch they belong to.
  const trace::context_scope traced(trace::args({{"step", step}, {"mb", i}}));
  data_->train_micro_batch(t.seed, step, i, t.micro_batch, t.global_batch, batch_);
  const int rows = micro_batch_rows(i, t.micro_batch, t.global_batch);
  // Each micro-batch's loss is a mean over its rows; weighting it by rows/global_batch
  // makes the sum over all micro-batches the gradient of the global-batch mean loss.
  const float scale = static_cast<float>(rows) / static_cast<float>(t.global_batch);
  // Bitwise mode converts each micro-batch's gradient on its own, so it starts from zero.
  if (bitwise_) model_->flat_grads().zero();
  if (ready == nullptr) {
    // No hook: the plain path costs what it always did.
    const double loss_rows = static_cast<double>(model_->forward_backward(batch_, scale)) * rows;
    if (bitwise_) accumulate_fixed(step, 0, model_->num_params());
    return loss_rows;
  }
  // Every range the model reports, to check afterwards that they tile the buffer once.
  std::vector<std::pair<int64_t, int64_t>> seen;
  const bool to_float = bitwise_ && reduction_type() == comm::grad_type::f32;
  const bool with_momentum = onebit_ != nullptr && onebit_->frozen();
  model_->set_grads_ready_hook([&](int64_t offset, int64_t count) {
    seen.emplace_back(offset, count);
    if (bitwise_) accumulate_fixed(step, offset, count);
    // The range is final: a float wire carries the exact fixed-point sum, rounded once.
    if (to_float)
      fixed_to_float(model_->flat_grads().data() + offset, fixed_.data() + offset, count);
    if (with_momentum) {
      add_momentum(offset, count);
      scale_by_denominator(*onebit_, model_->flat_grads().data(), offset, count, true);
    }
    (*ready)(static_cast<std::size_t>(offset), static_cast<std::size_t>(count));
  });
  // The hook captures locals: it must be gone however forward_backward ends.
  struct unhook {
    nn::model& m;
    ~unhook() { m.set_grads_ready_hook(nullptr); }
  } guard{*model_};
  const double loss_rows = static_cast<double>(model_->forward_backward(batch_, scale)) * rows;
  // A model that skipped or repeated a range would leave gradients unconverted and
  // unreported, or counted twice.
  std::sort(seen.begin(), seen.end());
  int64_t next = 0;
  for (const auto& [offset, count] : seen) {
    COHORT_CHECK(offset == next && count > 0);
    next = offset + count;
  }
  COHORT_CHECK(next == model_->num_params());
  return loss_rows;
}

double trainer::compute_gradients(int64_t step, int first, int last) {
  double loss_rows = 0.0;
  for (int i = first; i < last; ++i) loss_rows += run_micro_batch(step, i, nullptr);
  return loss_rows;
}

double trainer::compute_gradients(int64_t step, const std::vector<int>& micro,
                                  const nn::grads_ready_fn& ready) {
  for (std::size_t k = 0; k < micro.size(); ++k) {
    if (micro[k] < 0 || micro[k] >= micro_batches_ || (k > 0 && micro[k] <= micro[k - 1]))
      throw usage_error(
          "compute_gradients: micro-batch list must be strictly ascending within [0, " +
          std::to_string(micro_batches_) + "); entry " + std::to_string(k) + " is " +
          std::to_string(micro[k]));
  }
  // An empty `ready` asks for no reports: the plain path, no hook.
  const nn::grads_ready_fn* report = ready ? &ready : nullptr;
  if (micro.empty()) {
    if (report == nullptr) return 0.0;
    // Nothing to compute: the buffer holds begin_step's zeros, all final now.
    converted_ = bitwise_ && reduction_type() == comm::grad_type::f32;
    momentum_in_ = onebit_ != nullptr && onebit_->frozen();
    for (std::size_t b = model_->blocks().size(); b-- > 0;) {
      const auto [offset, count] = model_->block_elements(b);
      if (momentum_in_) {
        add_momentum(offset, count);
        scale_by_denominator(*onebit_, model_->flat_grads().data(), offset, count, true);
      }
      if (count > 0) ready(static_cast<std::size_t>(offset), static_cast<std::size_t>(count));
    }
    return 0.0;
  }
  double loss_rows = 0.0;
  for (std::size_t k = 0; k < micro.size(); ++k)
    loss_rows += run_micro_batch(step, micro[k], k + 1 == micro.size() ? report : nullptr);
  converted_ = report != nullptr && bitwise_ && reduction_type() == comm::grad_type::f32;
  momentum_in_ = report != nullptr && onebit_ != nullptr && onebit_->frozen();
  return loss_rows;
}

void* trainer::reduction_buffer() {
  if (reduction_type() == comm::grad_type::i64) return fixed_.data();
  return model_->flat_grads().data();
}

std::vector<std::pair<float*, std::size_t>> state_buffers_of(nn::model& m, nn::optimizer& opt) {
  const auto n = static_cast<std::size_t>(m.num_params());
  std::vector<std::pair<float*, std::size_t>> out;
  out.emplace_back(m.flat_values().data(), n);
  // state() hands out views; the optimizer keeps the storage alive.
  for (auto& [slot, t] : opt.state()) {
    COHORT_CHECK(static_cast<std::size_t>(t.numel()) == n);
    out.emplace_back(t.data(), n);
  }
  return out;
}

std::vector<std::pair<float*, std::size_t>> trainer::state_buffers() {
  return state_buffers_of(*model_, *opt_);
}

nn::optim_options optim_options_from(const train_config& t) {
  nn::optim_options o;
  o.kind = t.optimizer;
  o.beta1 = t.beta1;
  o.beta2 = t.beta2;
  o.eps = t.eps;
  o.weight_decay = t.weight_decay;
  o.momentum = t.momentum;
  o.freeze_step = t.onebit_freeze_step;
  return o;
}

double trainer::apply_step(int64_t step) {
  nn::tensor& grads = model_->flat_grads();
  if (bitwise_ && !converted_) fixed_to_float(grads.data(), fixed_.data(), grads.numel());
  const bool frozen = onebit_ != nullptr && onebit_->frozen();
  if (frozen) {
    if (!momentum_in_) {  // one process: a group of one, whose sum is its own share
      add_momentum(0, grads.numel());
      scale_by_denominator(*onebit_, grads.data(), 0, grads.numel(), true);
    }
    scale_by_denominator(*onebit_, grads.data(), 0, grads.numel(), false);  // the momentum
  }
  // Per-parameter sums added in parameter order: pipeline stages reproduce these bits by
  // continuing each other's running sum (runtime/train/param_stats.hpp).
  const double norm = std::sqrt(ordered_sum(grad_sum_squares_by_param(*model_)));
  // After 1-bit Adam's freeze the buffer holds momentum on most ranges: no global gradient
  // exists to clip (DeepSpeed's 1-bit Adam does not clip either); the norm still tells
  // whether the run diverged.
  if (!frozen) clip_grads(*model_, norm, cfg_.train.grad_clip);
  if (!std::isfinite(norm))
    throw cohort::error("step " + std::to_string(step) +
                        ": gradient norm is not finite (the run diverged: lower train.lr or "
                        "set train.grad_clip)");
  {
    trace::span s("optimizer", "compute", trace::track::compute, trace::args({{"step", step}}));
    opt_->step(learning_rate(cfg_.train, step));
  }
  if (error_feedback_) std::swap(kept_, next_);  // the step is committed, and so is its memory
  committed_replicas_ = replicas_;
  committed_rank_ = rank_;
  return norm;
}

evaluation trainer::evaluate() {
  evaluation e;
  double loss_sum = 0.0;
  int64_t correct = 0;
  for_each_eval_batch(*data_, cfg_.train.micro_batch, cfg_.train.eval_tokens,
                      [&](const cohort::batch& b) {
                        nn::eval_result r = model_->eval(b);
                        loss_sum += static_cast<double>(r.loss) * r.count;
                        correct += r.correct;
                        e.count += r.count;
                      });
  if (e.count > 0) {
    e.loss = loss_sum / e.count;
    e.accuracy = static_cast<double>(correct) / e.count;
  }
  return e;
}

void require_layout(const std::string& step_dir, const training_metadata& meta, int pp, int tp) {
  auto get = [&](const char* key) {
    auto it = meta.extra.find(key);
    return it == meta.extra.end() ? std::string("1") : it->second;
  };
  const std::string cpp = get("parallel.pp"), ctp = get("parallel.tp");
  if (cpp != std::to_string(pp) || ctp != std::to_string(tp))
    throw usage_error("checkpoint " + step_dir + " was written by a grid of pp = " + cpp +
                      " x tp = " + ctp +
                      " (one shard per stage and TP rank), not pp = " + std::to_string(pp) +
                      " x tp = " + std::to_string(tp) + "; resume it with parallel.pp: " + cpp +
                      " and parallel.tp: " + ctp + " (dp may change)");
}

std::vector<shard_snapshot::entry> param_layout(const nn::model& m) {
  std::vector<shard_snapshot::entry> out;
  for (const auto& p : m.parameters())
    out.push_back({p.name, p.value.shape(), static_cast<std::size_t>(p.offset)});
  return out;
}

std::vector<tensor_target> param_targets(const nn::model& m, float* base) {
  std::vector<tensor_target> out;
  for (const auto& p : m.parameters()) {
    tensor_target v;
    v.name = p.name;
    v.shape = p.value.shape();
    v.data = base + p.offset;
    out.push_back(v);
  }
  return out;
}

shard_snapshot snapshot_state(const config& c, const cohort::dataset& data, const nn::model& m,
                              nn::optimizer& opt, int64_t next_step, int stage, int tp_rank) {
  shard_snapshot s;
  s.stage = stage;
  s.tp_rank = tp_rank;
  s.layout = param_layout(m);
  const auto& flat = const_cast<nn::model&>(m).flat_values();
  s.params.assign(flat.data(), flat.data() + flat.numel());
  for (auto& [slot, t] : opt.state()) {
    const float* d = static_cast<const float*>(t.data());
    s.optimizer_state.emplace_back(slot, std::vector<float>(d, d + t.numel()));
  }
  training_metadata& meta = s.meta;
  meta.step = next_step;
  meta.config_hash = config_hash(c);
  meta.optimizer = c.train.optimizer;
  meta.extra = data.position(c.train.seed, next_step, c.train.global_batch).to_metadata();
  for (auto& [k, v] : data.preprocessing_metadata()) meta.extra[k] = v;
  meta.extra["optimizer.steps"] = std::to_string(opt.steps());
  meta.extra["model.kind"] = c.model.kind;
  meta.extra[run_identity_key] = run_identity(c);  // which run --resume may go on from
  meta.extra["train.determinism"] = c.train.determinism;
  meta.extra["parallel.pp"] = std::to_string(c.parallel.pp);
  meta.extra["parallel.tp"] = std::to_string(c.parallel.tp);
  return s;
}

int64_t load_state(const std::string& step_dir, const config& c, nn::model& m, nn::optimizer& opt,
                   int stage, int tp_rank) {
  training_metadata head = read_checkpoint_metadata(step_dir);
  require_layout(step_dir, head, c.parallel.pp, c.parallel.tp);
  if (head.optimizer != c.train.optimizer)
    throw checkpoint_error("checkpoint " + step_dir + ": holds " + head.optimizer +
                           " optimizer state but the config says train.optimizer: " +
                           c.train.optimizer + " (use the config the checkpoint was written with)");
  std::vector<tensor_target> params = param_targets(m, m.flat_values().data());
  std::vector<optimizer_state_target> state;
  for (auto& [slot, t] : opt.state())
    for (auto& v : param_targets(m, t.data())) state.push_back({slot, v});
  training_metadata meta = load_checkpoint_shard(step_dir, stage, tp_rank, params, state);
  auto it = meta.extra.find("optimizer.steps");
  int64_t steps = meta.step;
  if (it != meta.extra.end()) {
    try {
      steps = std::stoll(it->second);
    } catch (const std::exception&) {
      throw checkpoint_error("checkpoint " + step_dir +
                             ": metadata optimizer.steps is not an integer: " + it->second);
    }
  }
  opt.set_steps(steps);
  return meta.step;
}

shard_snapshot trainer::snapshot(int64_t next_step) const {
  shard_snapshot s = snapshot_state(cfg_, *data_, *model_, *opt_, next_step);
  // The whole model in one shard, whatever grid the config names.
  s.meta.extra["parallel.pp"] = s.meta.extra["parallel.tp"] = "1";
  return s;
}

void trainer::save_checkpoint(const std::string& step_dir, int64_t next_step) const {
  write_training_checkpoint(step_dir, {snapshot(next_step)});
}

int64_t trainer::load_checkpoint(const std::string& step_dir) {
  // The whole model is shard p0_t0 of a pp = tp = 1 checkpoint (whatever this config's
  // grid: `cohort train` runs the whole model).
  config whole = cfg_;
  whole.parallel.pp = whole.parallel.tp = 1;
  const int64_t step = load_state(step_dir, whole, *model_, *opt_, 0, 0);
  pending_ = {};
  if (error_feedback_) {
    kept_.reset(static_cast<std::size_t>(model_->num_params()));
    next_ = kept_;
    pending_ = {step_dir, checkpoint_feedback_parts(step_dir)};
  }
  return step;
}

std::string trainer::params_sha256() const { return combine_param_digests(param_digests(*model_)); }

int64_t trainer::peak_pool_bytes() const {
  return static_cast<int64_t>(model_->memory().stats().peak_bytes);
}

namespace {

// The whole model as a DP group's seat (runtime/train/seat.hpp).
using clock_type = std::chrono::steady_clock;

class whole_seat final : public seat {
 public:
  explicit whole_seat(const config& c) : tr_(c) {}

  std::pair<int, int> position() const override { return {0, 0}; }
  int micro_batches() const override { return tr_.micro_batches(); }
  comm::grad_type reduction_type() const override { return tr_.reduction_type(); }
  std::size_t elements() override { return static_cast<std::size_t>(tr_.model().num_params()); }
  void set_links(stage_links) override {}

  void begin_step() override { tr_.begin_step(); }
  double compute_gradients(int64_t step, const std::vector<int>& micro,
                           const nn::grads_ready_fn& ready) override {
    const auto t0 = clock_type::now();
    const double loss_rows = tr_.compute_gradients(step, micro, ready);
    // The whole step's compute at once: the model has no per-pass callback.
    stretch_sleep(clock_type::now() - t0, stretch_);
    stretch_ = 1;
    return loss_rows;
  }
  void* reduction_buffer() override { return tr_.reduction_buffer(); }
  comm::wire_plan wire(int replicas, int rank) override { return tr_.wire(replicas, rank); }
  // apply_step computes the norm (no peers needed); a float sum that is not finite fails
  // the step here, before the vote, so that the job ends at once and says why (every
  // member holds the same sum: a retry would fail the same).
  void finish_gradients(int64_t step) override {
    if (tr_.reduction_type() != comm::grad_type::f32)
      return;  // fixed point cannot overflow silently
    const nn::tensor& g = tr_.model().flat_grads();
    if (!std::isfinite(cpu::sum_squares(g.data(), g.numel())))
      throw cohort::error("step " + std::to_string(step) +
                          ": the replicas' summed gradient is not finite (the run diverged: "
                          "lower train.lr or set train.grad_clip)");
  }
  void apply_step(int64_t step) override { tr_.apply_step(step); }
  bool speaks_for_loss() const override { return true; }
  void stretch_compute(double factor) override { stretch_ = factor; }

  std::vector<std::pair<float*, std::size_t>> state_buffers() override {
    return tr_.state_buffers();
  }
  int64_t optimizer_steps() const override { return tr_.optimizer_steps(); }
  void set_optimizer_steps(int64_t s) override { tr_.set_optimizer_steps(s); }
  int64_t load_checkpoint(const std::string& step_dir) override {
    return tr_.load_checkpoint(step_dir);
  }
  void save(checkpoint_writer& w, int64_t next_step, uint64_t job_id) override {
    if (!tr_.keeps_feedback()) return w.save(tr_, next_step);
    std::vector<std::string> all;
    std::vector<shard_snapshot> parts = tr_.checkpoint_parts(next_step, job_id, all);
    w.save_parts(std::move(parts), std::move(all));
  }
  bool saves_every_rank() const override { return tr_.keeps_feedback(); }
  int64_t peak_pool_bytes() const override { return tr_.peak_pool_bytes(); }
  evaluation evaluate(int64_t) override { return tr_.evaluate(); }
  seat_report report() override {
    seat_report r;
    r.params_sha256 = tr_.params_sha256();
    r.model_params = tr_.model().num_params();
    r.peak_pool_bytes = tr_.peak_pool_bytes();
    return r;
  }

 private:
  trainer tr_;
  double stretch_ = 1;
};

}  // namespace

std::unique_ptr<seat> make_whole_seat(const config& c) { return std::make_unique<whole_seat>(c); }

}  // namespace cohort::train
