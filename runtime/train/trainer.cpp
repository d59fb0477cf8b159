#include "runtime/train/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "runtime/ckpt/checkpoint.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/host_pages.hpp"
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

trainer::trainer(const config& c, nn::device* given) : cfg_(c) {
  // One BLAS thread by default: results must not depend on the machine's core count.
  // Denormals flushed to zero: tiny late-training gradients otherwise slow every step
  // several-fold; the setting is the same in every process, so results stay reproducible.
  cpu::set_num_threads(std::max(1, c.train.threads));
  cpu::set_flush_denormals(true);
  data_ = make_dataset(c);
  const int vocab = data_->is_language_model() ? data_->num_classes() : 0;
  // The one step on the device train.device names: the model's tensors come from its pool.
  nn::device& dev = step_device(c.train, given);
  if (!dev.host_visible()) device_pool_ = std::make_unique<nn::pool>(dev);
  nn::pool& memory = device_pool_ ? *device_pool_ : nn::pool::global();
  model_ = nn::make_model(c.model, vocab, c.train.micro_batch, c.train.seed, memory);
  if (!dev.host_visible()) host_grads_.assign(static_cast<std::size_t>(model_->num_params()), 0.0f);
  // NCCL sums the gradients where they are; every other transport in host memory.
  sum_on_device_ = !dev.host_visible() && c.comm.backend == comm_backend::nccl;
  micro_batches_ = (c.train.global_batch + c.train.micro_batch - 1) / c.train.micro_batch;
  bitwise_ = c.train.determinism == "bitwise";
  if (bitwise_) {
    fixed_.assign(static_cast<std::size_t>(model_->num_params()), 0);
    if (sum_on_device_)
      fixed_dev_ = nn::basic_tensor<int64_t>({model_->num_params()}, *device_pool_);
  }
  nn::optim_options o = optim_options_from(c.train);
  if (o.kind == "onebit_adam") o.compressed = onebit_ranges(*model_, c.train.onebit_exclude);
  if (c.train.zero > 0) {
    auto z = std::make_unique<zero_optimizer>(model_->flat_values(), model_->flat_grads(), o, memory);
    zero_ = z.get();
    opt_ = std::move(z);
    // Sharded parameters: forward and backward gather each block as they reach it.
    if (c.train.zero >= 3) {
      // The order one pass needs the blocks in (the prefetch follows it), from the model.
      model_->set_params_hook([this](std::size_t block, nn::model::params_use use) {
        if (use == nn::model::params_use::need) params_order_.push_back(block);
      });
      model_->params_pass(nullptr);
      model_->set_params_hook([this](std::size_t block, nn::model::params_use use) {
        on_params(block, use == nn::model::params_use::need);
      });
    }
  } else {
    opt_ = nn::make_optimizer(model_->flat_values(), model_->flat_grads(), o, memory);
  }
  mode_.bitwise = bitwise_;
  mode_.compression = comm::wire_format_of(c.comm.compression);
  mode_.error_feedback = keeps_error_feedback(c);  // 1-bit Adam always feeds back what signs lose
  mode_.grad_clip = c.train.grad_clip;
  error_feedback_ = mode_.error_feedback;
  if (error_feedback_) kept_.reset(static_cast<std::size_t>(model_->num_params()));
  mode_.onebit = onebit_phase_of(*opt_);
  pipeline_ = choose_grad_pipeline(mode_, model_->num_params(), *opt_);
}

void trainer::choose_pipeline() {
  const onebit_phase now = onebit_phase_of(*opt_);
  // The phase moves only with the optimizer's step count; the stages hold no per-step state.
  if (pipeline_.phase == now) return;
  mode_.onebit = now;
  pipeline_ = choose_grad_pipeline(mode_, model_->num_params(), *opt_);
}

grad_buffers trainer::buffers(int64_t step) {
  grad_buffers b;
  b.grads = model_->flat_grads().data();
  b.dev = &model_->dev();
  b.host = host_grads_.empty() ? nullptr : host_grads_.data();
  b.fixed = fixed_.empty() ? nullptr : fixed_.data();
  b.size = model_->num_params();
  b.step = step;
  b.replicas = replicas_;
  b.held = held_elements();
  return b;
}

void trainer::begin_step() {
  sum_pending_ = false;
  if (const auto* keep = held_elements()) {
    // Zeros that take no memory until backward writes them, outside the held ranges: what
    // this member does not hold goes back to the kernel again as each bucket's sum ends
    // (grads_reduced). The held ranges stay in RAM, written with zeros.
    const auto n = static_cast<std::size_t>(model_->num_params());
    zero_keeping(model_->flat_grads().data(), sizeof(float), n, *keep);
    // The fixed-point sum is given back whole once converted (grads_reduced).
    if (!fixed_.empty()) zero_by_release(fixed_.data(), fixed_.size() * sizeof(int64_t));
  } else {
    model_->zero_grad();
    if (bitwise_) std::fill(fixed_.begin(), fixed_.end(), 0);
  }
  sent_ = false;
  if (error_feedback_) next_ = kept_;  // an aborted step leaves kept_ as it was
}

comm::grad_type trainer::reduction_type() const { return pipeline_.sum.type; }

comm::wire_plan trainer::wire(int replicas, int rank) {
  replicas_ = replicas;
  rank_ = rank;
  comm::wire_plan plan;
  plan.plain = pipeline_.sum.plain;
  plan.compressed = pipeline_.sum.compressed;
  if (!pipeline_.sum.error_feedback) return plan;
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

double trainer::run_micro_batch(int64_t step, int i, const nn::grads_ready_fn* ready) {
  const auto& t = cfg_.train;
  // The model's forward and backward spans say which step and micro-batch they belong to.
  const trace::context_scope traced(trace::args({{"step", step}, {"mb", i}}));
  data_->train_micro_batch(t.seed, step, i, t.micro_batch, t.global_batch, batch_);
  const int rows = micro_batch_rows(i, t.micro_batch, t.global_batch);
  // Each micro-batch's loss is a mean over its rows; weighting it by rows/global_batch
  // makes the sum over all micro-batches the gradient of the global-batch mean loss.
  const float scale = static_cast<float>(rows) / static_cast<float>(t.global_batch);
  grad_buffers b = buffers(step);
  for (const auto& s : pipeline_.micro_batch) s->begin_micro_batch(b);
  if (ready == nullptr) {
    // No hook: the plain path costs what it always did.
    const double loss_rows = static_cast<double>(model_->forward_backward(batch_, scale)) * rows;
    count_moe();
    run_stages(pipeline_.micro_batch, b, 0, model_->num_params());
    return loss_rows;
  }
  // Every range the model reports, to check afterwards that they tile the buffer once.
  std::vector<std::pair<int64_t, int64_t>> seen;
  model_->set_grads_ready_hook([&](int64_t offset, int64_t count) {
    seen.emplace_back(offset, count);
    // The range is final: this micro-batch's stages, then what goes before the sum.
    run_stages(pipeline_.micro_batch, b, offset, count);
    run_stages(pipeline_.before_sum, b, offset, count);
    stage_for_sum(offset, count);
    (*ready)(static_cast<std::size_t>(offset), static_cast<std::size_t>(count));
  });
  // The hook captures locals: it must be gone however forward_backward ends.
  struct unhook {
    nn::model& m;
    ~unhook() { m.set_grads_ready_hook(nullptr); }
  } guard{*model_};
  const double loss_rows = static_cast<double>(model_->forward_backward(batch_, scale)) * rows;
  count_moe();
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
  sharded_step_ = step;
  // Sharded parameters in a group: every member takes part in as many passes' gathers as
  // the group's busiest computes, the passes it has no micro-batch for first, so that every
  // member's last pass (whose gradients go out as backward finishes them) gathers together.
  const bool gathers = params_comm_ != nullptr && !values_whole_;
  const int idle_passes =
      gathers ? std::max(0, params_passes_ - static_cast<int>(micro.size())) : 0;
  // Expert parallelism: likewise every member takes part in as many passes' exchanges as
  // its EP group's busiest computes, the passes without a micro-batch of its own first. With
  // gathers too (an EP group's busiest computes at most the DP group's most) they are the
  // last of the idle passes, each exchange inside its block's gather as a real pass has it.
  const int exchange_passes =
      experts_comm_ != nullptr ? std::max(0, experts_passes_ - static_cast<int>(micro.size()))
                               : 0;
  COHORT_CHECK(!gathers || exchange_passes <= idle_passes);
  const bool report_pass = micro.empty() && report != nullptr && idle_passes > 0;
  for (int k = 0; k + (report_pass ? 1 : 0) < idle_passes; ++k)
    model_->params_pass(nullptr, k >= idle_passes - exchange_passes);
  if (!gathers)
    for (int k = 0; k < exchange_passes; ++k) model_->moe_pass();
  if (micro.empty()) {
    if (report == nullptr) return 0.0;
    // Nothing to compute: the buffer holds begin_step's zeros, all final now.
    sent_ = true;
    grad_buffers buf = buffers(step);
    auto report_block = [&](std::size_t b) {
      const auto [offset, count] = model_->block_elements(b);
      run_stages(pipeline_.before_sum, buf, offset, count);
      stage_for_sum(offset, count);
      if (count > 0) ready(static_cast<std::size_t>(offset), static_cast<std::size_t>(count));
    };
    if (idle_passes > 0) {
      // Where the others' backward reports them (the last idle pass: an exchange pass too
      // when there are any).
      model_->params_pass(report_block, exchange_passes > 0);
    } else {
      for (std::size_t b = model_->blocks().size(); b-- > 0;) report_block(b);
    }
    return 0.0;
  }
  double loss_rows = 0.0;
  for (std::size_t k = 0; k < micro.size(); ++k) {
    loss_rows += run_micro_batch(step, micro[k], k + 1 == micro.size() ? report : nullptr);
    // Sharded gradients: the most memory they take is at a micro-batch's end (an earlier
    // one's sum is in every element; the last one's sums to holders may not have begun).
    sample_grads();
  }
  sent_ = report != nullptr;
  return loss_rows;
}

void* trainer::reduction_buffer() {
  const bool i64 = reduction_type() == comm::grad_type::i64;
  // NCCL sums device memory: the gradients, or a device copy of the fixed-point sum.
  if (sum_on_device_)
    return i64 ? static_cast<void*>(fixed_dev_.data()) : model_->flat_grads().data();
  if (i64) return fixed_.data();
  // A GPU's float gradients are summed in host memory (the transports are the host's).
  return host_grads_.empty() ? model_->flat_grads().data() : host_grads_.data();
}

void trainer::stage_for_sum(int64_t offset, int64_t count) {
  if (host_grads_.empty() || count == 0) return;  // the CPU: the sum reads what backward wrote
  const bool i64 = reduction_type() == comm::grad_type::i64;
  nn::device& dev = model_->dev();
  if (sum_on_device_) {
    if (i64)
      dev.from_host(fixed_dev_.data() + offset, fixed_.data() + offset,
                    static_cast<std::size_t>(count) * sizeof(int64_t));
    // NCCL runs on a stream of its own: the range must be final there too. (One wait per
    // range; a CUDA event the communicator's stream waits on would spare the host the wait.)
    dev.synchronize();
  } else if (!i64) {
    dev.to_host(host_grads_.data() + offset, model_->flat_grads().data() + offset,
                static_cast<std::size_t>(count) * sizeof(float));
  } else {
    return;  // the fixed-point sum lives on the host already
  }
  sum_pending_ = true;
}

void trainer::take_sum() {
  if (!sum_pending_) return;
  sum_pending_ = false;
  const bool i64 = reduction_type() == comm::grad_type::i64;
  if (sum_on_device_) {
    if (i64)
      model_->dev().to_host(fixed_.data(), fixed_dev_.data(), fixed_.size() * sizeof(int64_t));
    return;  // float sums are already in the gradients
  }
  model_->flat_grads().copy_from_host(host_grads_.data());
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

std::vector<std::pair<float*, std::size_t>> state_on_host(
    nn::device& dev, const std::vector<std::pair<float*, std::size_t>>& views,
    std::vector<std::vector<float>>& host) {
  host.clear();
  if (dev.host_visible()) return views;
  std::vector<std::pair<float*, std::size_t>> out;
  for (const auto& [ptr, n] : views) {
    host.emplace_back(n);
    dev.to_host(host.back().data(), ptr, n * sizeof(float));
    out.emplace_back(host.back().data(), n);
  }
  return out;
}

void state_from_host(nn::device& dev, const std::vector<std::pair<float*, std::size_t>>& views,
                     std::vector<std::vector<float>>& host) {
  if (host.empty()) return;  // the buffers handed out were the state itself
  COHORT_CHECK(views.size() == host.size());
  for (std::size_t i = 0; i < views.size(); ++i)
    dev.from_host(views[i].first, host[i].data(), views[i].second * sizeof(float));
  host.clear();
}

nn::device& step_device(const train_config& t, nn::device* given) {
  nn::device& dev =
      given ? *given : nn::open_device(nn::resolve_device(t.device, nn::local_rank_from_env()));
  dev.set_matmul_precision(nn::parse_precision(t.precision));
  return dev;
}

std::vector<std::pair<float*, std::size_t>> trainer::state_buffers() {
  std::vector<std::pair<float*, std::size_t>> views = state_buffers_of(*model_, *opt_);
  if (sum_on_device_) {  // NCCL moves the device's buffers themselves
    state_host_.clear();
    return views;
  }
  // A GPU's state travels through host copies over host transports; state_received puts
  // them back.
  return state_on_host(model_->dev(), views, state_host_);
}

void trainer::state_received() {
  state_from_host(model_->dev(), state_buffers_of(*model_, *opt_), state_host_);
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
  const int64_t n = model_->num_params();
  take_sum();
  grad_buffers b = buffers(step);
  if (zero_ && !zero_->holds()) zero_hold_alone();  // one process: it holds everything
  // Sharded gradients in a group: finish_sharded_sum ran the after-sum stages on the held
  // ranges and took the norm with its peers; only those ranges are the step's sum here.
  const bool sharded_sum = shards_grads() && sharded_norm_step_ == step;
  std::vector<elem_range> ranges{{0, n}};
  double norm = 0.0;
  if (sharded_sum) {
    ranges = zero_->ranges();
    norm = sharded_norm_;
  } else {
    COHORT_CHECK(!shards_grads() || zero_->replicas() == 1);  // a group of one holds it all
    // Nothing reported range by range (one process, no hook): a group of one, whose sum is
    // its own buffer, sent and received whole.
    if (!sent_) run_stages(pipeline_.before_sum, b, 0, n);
    run_stages(pipeline_.after_sum, b, 0, n);
    // Per-parameter sums added in parameter order: pipeline stages reproduce these bits by
    // continuing each other's running sum (runtime/train/param_stats.hpp); exact ones in
    // bitwise mode and with sharded gradients, whose members each hold a part.
    norm = std::sqrt(
        ordered_sum(grad_sum_squares_by_param(*model_, bitwise_ || shards_grads())));
  }
  sharded_norm_step_ = -1;
  b.norm = norm;
  for (const elem_range& r : ranges) run_stages(pipeline_.before_optimizer, b, r.begin, r.size());
  if (!std::isfinite(norm))
    throw cohort::error("step " + std::to_string(step) +
                        ": gradient norm is not finite (the run diverged: lower train.lr or "
                        "set train.grad_clip)");
  {
    trace::span s("optimizer", "compute", trace::track::compute, trace::args({{"step", step}}));
    opt_->step(learning_rate(cfg_.train, step));
  }
  zero_fresh_ = false;
  if (error_feedback_) std::swap(kept_, next_);  // the step is committed, and so is its memory
  committed_replicas_ = replicas_;
  committed_rank_ = rank_;
  choose_pipeline();  // the step may have ended 1-bit Adam's warm-up
  return norm;
}

evaluation trainer::evaluate() {
  // Sharded parameters: only the held ranges are here between steps (gather_params first).
  if (!values_whole_)
    throw cohort::error("evaluation needs every parameter, and this member holds only its shards "
                        "of them (train.zero: 3): gather them first");
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

std::string trainer::params_sha256() const {
  if (!values_whole_)
    throw cohort::error("the parameters' digest needs every parameter, and this member holds only "
                        "its shards of them (train.zero: 3): gather them first");
  return combine_param_digests(param_digests(*model_));
}

int64_t trainer::peak_pool_bytes() const {
  return static_cast<int64_t>(model_->memory().stats().peak_bytes);
}

namespace {

// The whole model as a DP group's seat (runtime/train/seat.hpp).
class whole_seat final : public seat {
 public:
  explicit whole_seat(const config& c) : tr_(c) {}

  std::pair<int, int> position() const override { return {0, 0}; }
  std::string device_name() const override { return tr_.dev().name(); }
  int micro_batches() const override { return tr_.micro_batches(); }
  comm::grad_type reduction_type() const override { return tr_.reduction_type(); }
  std::size_t elements() override { return static_cast<std::size_t>(tr_.model().num_params()); }
  void set_links(stage_links) override {}

  void begin_step() override { tr_.begin_step(); }
  double compute_gradients(int64_t step, const std::vector<int>& micro,
                           const nn::grads_ready_fn& ready) override {
    return tr_.compute_gradients(step, micro, ready);
  }
  void* reduction_buffer() override { return tr_.reduction_buffer(); }
  comm::wire_plan wire(int replicas, int rank) override { return tr_.wire(replicas, rank); }
  // apply_step computes the norm (no peers needed); a float sum that is not finite fails
  // the step here, before the vote, so that the job ends at once and says why (every
  // member holds the same sum: a retry would fail the same).
  void finish_gradients(int64_t step) override {
    if (tr_.reduction_type() != comm::grad_type::f32)
      return;  // fixed point cannot overflow silently
    tr_.take_sum();
    const nn::tensor& g = tr_.model().flat_grads();
    if (!std::isfinite(g.dev().sum_squares(g.data(), g.numel())))
      throw cohort::error("step " + std::to_string(step) +
                          ": the replicas' summed gradient is not finite (the run diverged: "
                          "lower train.lr or set train.grad_clip)");
  }
  void apply_step(int64_t step) override { tr_.apply_step(step); }
  bool speaks_for_loss() const override { return true; }

  std::vector<std::pair<float*, std::size_t>> state_buffers() override {
    return tr_.state_buffers();
  }
  int64_t optimizer_steps() const override { return tr_.optimizer_steps(); }
  void state_received() override { tr_.state_received(); }
  void set_optimizer_steps(int64_t s) override { tr_.set_optimizer_steps(s); }
  int64_t load_checkpoint(const std::string& step_dir) override {
    return tr_.load_checkpoint(step_dir);
  }
  void save(checkpoint_writer& w, int64_t next_step, uint64_t job_id) override {
    if (!tr_.keeps_feedback() && !tr_.sharded()) return w.save(tr_, next_step);
    std::vector<std::string> all;
    std::vector<shard_snapshot> parts = tr_.sharded()
                                            ? tr_.zero_checkpoint_parts(next_step, job_id, all)
                                            : tr_.checkpoint_parts(next_step, job_id, all);
    w.save_parts(std::move(parts), std::move(all));
  }
  bool saves_every_rank() const override { return tr_.keeps_feedback() || tr_.sharded(); }
  trainer* sharded() override { return tr_.sharded() ? &tr_ : nullptr; }
  trainer* whole_model() override { return &tr_; }
  int64_t peak_pool_bytes() const override { return tr_.peak_pool_bytes(); }
  evaluation evaluate(int64_t) override { return tr_.evaluate(); }
  seat_report report() override {
    seat_report r;
    r.params_sha256 = tr_.params_sha256();
    r.model_params = tr_.model().num_params();
    r.peak_pool_bytes = tr_.peak_pool_bytes();
    r.state = tr_.state_bytes();
    return r;
  }

 private:
  trainer tr_;
};

}  // namespace

std::unique_ptr<seat> make_whole_seat(const config& c) { return std::make_unique<whole_seat>(c); }

}  // namespace cohort::train
