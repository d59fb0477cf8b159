#include "runtime/train/stage_trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "runtime/core/error.hpp"
#include "runtime/core/rules.hpp"
#include "runtime/core/trace.hpp"
#include "runtime/cpu/kernels.hpp"
#include "runtime/nn/device.hpp"
#include "runtime/train/checkpoint_writer.hpp"
#include "runtime/train/fixed_point.hpp"
#include "runtime/train/param_stats.hpp"
#include "runtime/train/seat.hpp"

namespace cohort::train {

namespace {

using clock_type = std::chrono::steady_clock;

uint64_t micros_since(clock_type::time_point t0) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(clock_type::now() - t0).count());
}

}  // namespace

uint64_t stage_tag(stage_msg kind, int64_t step, int micro) {
  // kind: 4 bits, micro-batch: 20 bits, step: the rest.
  return (static_cast<uint64_t>(step) << 24) | (static_cast<uint64_t>(micro & 0xFFFFF) << 4) |
         static_cast<uint64_t>(kind);
}

stage_trainer::stage_trainer(const config& c, int stage, int tp_rank, nn::device* given)
    : cfg_(c), stage_(stage), stages_(c.parallel.pp), tp_rank_(tp_rank), tp_size_(c.parallel.tp) {
  if (!rules::model_splits(c.model.kind))
    throw usage_error("pipeline and tensor parallelism split a GPT; model.kind is " + c.model.kind +
                      " (set parallel.pp: 1 and parallel.tp: 1)");
  if (stage < 0 || stage >= stages_ || tp_rank < 0 || tp_rank >= tp_size_)
    throw usage_error("stage " + std::to_string(stage) + " / TP rank " + std::to_string(tp_rank) +
                      " is outside the grid pp=" + std::to_string(stages_) +
                      " tp=" + std::to_string(tp_size_));
  cpu::set_num_threads(std::max(1, c.train.threads));
  cpu::set_flush_denormals(true);
  // The device train.device names, as the whole-model trainer's: the stage's tensors come
  // from its pool.
  nn::device& dev = step_device(c.train, given);
  if (!dev.host_visible()) device_pool_ = std::make_unique<nn::pool>(dev);
  nn::pool& memory = device_pool_ ? *device_pool_ : nn::pool::global();
  data_ = make_dataset(c);
  nn::gpt_shape shape;
  shape.vocab = data_->num_classes();
  shape.context = c.model.context;
  shape.n_layer = c.model.n_layer;
  shape.n_head = c.model.n_head;
  shape.d_model = c.model.d_model;
  for (const auto& spec : nn::gpt_param_specs(shape)) model_params_ += nn::shape_numel(spec.shape);
  const std::vector<nn::stage_range> parts =
      nn::partition_gpt(shape, stages_, c.parallel.stage_layers);
  micro_batches_ = (c.train.global_batch + c.train.micro_batch - 1) / c.train.micro_batch;
  bitwise_ = c.train.determinism == "bitwise";
  kind_ = parse_schedule(c.parallel.schedule);
  nn::gpt_stage_options o;
  // GPipe holds every micro-batch of the step (all of them when the replica is alone);
  // 1F1B at most P - s at once.
  o.slots =
      kind_ == schedule_kind::gpipe ? micro_batches_ : std::min(stages_ - stage_, micro_batches_);
  o.max_batch = c.train.micro_batch;
  o.activation_checkpointing = c.parallel.activation_checkpointing;
  o.tp_size = tp_size_;
  o.tp_rank = tp_rank_;
  if (tp_size_ > 1) o.tp_allreduce = [this](float* d, int64_t n) { tp_sum(d, n); };
  model_ = std::make_unique<nn::gpt_stage>(shape, parts.at(static_cast<std::size_t>(stage_)), o,
                                           c.train.seed, memory);
  if (bitwise_) fixed_.assign(static_cast<std::size_t>(model_->num_params()), 0);
  if (!dev.host_visible()) host_grads_.assign(static_cast<std::size_t>(model_->num_params()), 0.0f);
  opt_ = nn::make_optimizer(model_->flat_values(), model_->flat_grads(), optim_options_from(c.train),
                            memory);
}

const void* stage_trainer::to_link(const float* d, std::size_t bytes, std::vector<float>& buf) {
  if (dev().host_visible()) return d;
  buf.resize(bytes / sizeof(float));
  dev().to_host(buf.data(), d, bytes);
  return buf.data();
}

const float* stage_trainer::from_link(std::size_t bytes) {
  if (dev().host_visible()) return recv_buf_.data();
  const auto n = static_cast<int64_t>(bytes / sizeof(float));
  if (in_dev_.numel() < n) in_dev_ = nn::tensor({n}, *device_pool_);
  dev().from_host(in_dev_.data(), recv_buf_.data(), bytes);
  return in_dev_.data();
}

void stage_trainer::stage_for_sum(int64_t offset, int64_t count) {
  if (host_grads_.empty() || bitwise_ || count == 0) return;
  dev().to_host(host_grads_.data() + offset, model_->flat_grads().data() + offset,
                static_cast<std::size_t>(count) * sizeof(float));
  sum_pending_ = true;
}

void stage_trainer::tp_sum(float* data, int64_t count) {
  const auto t0 = clock_type::now();
  if (!links_.tp_allreduce)
    throw usage_error("stage_trainer: tensor parallelism without a TP group link");
  if (dev().host_visible()) {
    links_.tp_allreduce(data, count);
  } else if (links_.tp_reads_device) {
    // NCCL runs on a stream of its own: the partial sums must be final there too. (Its call
    // returns once the sum is complete on the device, so the kernels after it see it.)
    dev().synchronize();
    links_.tp_allreduce(data, count);
  } else {
    // Host transports: the partial sums go to the host, the group's sum comes back.
    const std::size_t bytes = static_cast<std::size_t>(count) * sizeof(float);
    tp_buf_.resize(static_cast<std::size_t>(count));
    dev().to_host(tp_buf_.data(), data, bytes);
    links_.tp_allreduce(tp_buf_.data(), count);
    dev().from_host(data, tp_buf_.data(), bytes);
  }
  if (in_schedule_) timing_.tp_us += micros_since(t0);
}

void stage_trainer::begin_step() {
  // An aborted step may have left micro-batches between forward and backward.
  for (int slot = 0; slot < model_->options().slots; ++slot)
    if (model_->busy(slot)) model_->drop(slot);
  model_->zero_grad();
  if (bitwise_) std::fill(fixed_.begin(), fixed_.end(), 0);
  sum_pending_ = false;
}

void stage_trainer::accumulate_fixed(int64_t step, int64_t offset, int64_t count) {
  const float* grads = model_->flat_grads().data();
  if (!dev().host_visible()) {
    // The range is read on the host: copied there first (host_grads_ is free in bitwise mode).
    dev().to_host(host_grads_.data() + offset, grads + offset,
                  static_cast<std::size_t>(count) * sizeof(float));
    grads = host_grads_.data();
  }
  accumulate_gradients(fixed_.data(), grads, offset, count,
                       "stage " + std::to_string(stage_) + " in step " + std::to_string(step));
}

double stage_trainer::compute_gradients(int64_t step, const std::vector<int>& micro,
                                        const nn::grads_ready_fn& ready) {
  if (micro.empty()) {
    // Nothing to compute: the buffer holds begin_step's zeros, all final now (a GPU's host
    // copy is what the DP group sums in fast mode: zeros too).
    if (ready && !bitwise_) std::fill(host_grads_.begin(), host_grads_.end(), 0.0f);
    for (std::size_t b = model_->blocks().size(); ready && b-- > 0;) {
      const auto [offset, count] = model_->block_elements(b);
      if (count > 0) ready(static_cast<std::size_t>(offset), static_cast<std::size_t>(count));
    }
    sum_pending_ = ready && !host_grads_.empty() && !bitwise_;  // begin_step's host zeros
    return 0.0;
  }
  const auto& t = cfg_.train;
  const int M = static_cast<int>(micro.size());
  const bool first = stage_ == 0, last = stage_ == stages_ - 1;
  const int C = cfg_.model.d_model;
  const std::vector<pipe_op> ops = stage_ops(kind_, stages_, M, stage_);
  // The stage's gradients are final during its last backward: that one reports its ranges.
  std::size_t last_backward = ops.size();
  for (std::size_t j = 0; j < ops.size(); ++j)
    if (ops[j].k != pipe_op::forward) last_backward = j;
  std::vector<std::pair<int64_t, int64_t>> seen;  // to check they tile the buffer once
  struct unhook {
    nn::model& m;
    ~unhook() { m.set_grads_ready_hook(nullptr); }
  } guard{*model_};
  const int slots = model_->options().slots;
  std::vector<int64_t> positions(static_cast<std::size_t>(M), 0);  // n*t of each micro-batch
  double loss_rows = 0.0;
  int held = 0;
  const auto t_sched = clock_type::now();
  in_schedule_ = true;
  struct leave_schedule {
    bool& flag;
    ~leave_schedule() { flag = false; }
  } leave{in_schedule_};
  // A span of this stage's schedule from T0 to now (the trace: docs/observability.md).
  auto traced = [this](const char* name, const char* cat, clock_type::time_point t0, uint32_t tid,
                       int64_t at_step, int mb, std::size_t bytes) {
    if (!trace::enabled()) return;
    std::string a = trace::args({{"step", at_step}, {"mb", mb}, {"stage", stage_}});
    if (bytes > 0) a += ",\"bytes\":" + std::to_string(bytes);
    trace::complete(name, cat, trace::ns(t0), trace::now_ns(), tid, std::move(a));
  };
  for (std::size_t j = 0; j < ops.size(); ++j) {
    const pipe_op& op = ops[j];
    const int k = op.micro;
    const int i = micro.at(static_cast<std::size_t>(k));
    const int slot = k % slots;  // 1F1B holds a window of at most `slots` consecutive ones
    const int rows = micro_batch_rows(i, t.micro_batch, t.global_batch);
    if (op.k == pipe_op::forward) {
      data_->train_micro_batch(t.seed, step, i, t.micro_batch, t.global_batch, batch_);
      const int64_t pos = int64_t{batch_.n} * batch_.t;
      positions[static_cast<std::size_t>(k)] = pos;
      const std::size_t bytes = static_cast<std::size_t>(pos) * C * sizeof(float);
      const float* x_in = nullptr;
      if (!first) {
        recv_buf_.resize(static_cast<std::size_t>(pos) * C);
        const auto tw = clock_type::now();
        links_.recv(stage_ - 1, stage_tag(stage_msg::activation, step, i), recv_buf_.data(), bytes);
        timing_.wait_us += micros_since(tw);
        traced("bubble", "pipeline", tw, trace::track::compute, step, i, bytes);
        x_in = from_link(bytes);
      }
      const auto tc = clock_type::now();
      const nn::stage_forward f = model_->forward(slot, batch_, x_in);
      if (links_.after_compute) links_.after_compute(clock_type::now() - tc);
      const uint64_t spent = micros_since(tc);
      timing_.compute_us += spent;
      timing_.forward_us += spent;
      ++timing_.forwards;
      traced("forward", "compute", tc, trace::track::compute, step, i, 0);
      if (last) {
        loss_rows += static_cast<double>(f.loss) * rows;
      } else {
        const auto ts = clock_type::now();
        links_.send(stage_ + 1, stage_tag(stage_msg::activation, step, i),
                    to_link(f.out, bytes, send_buf_), bytes);
        timing_.send_us += micros_since(ts);
        traced("send", "p2p", ts, trace::track::p2p, step, i, bytes);
        timing_.p2p_bytes += bytes;
      }
      peak_held_ = std::max(peak_held_, ++held);
    } else {
      const int64_t pos = positions[static_cast<std::size_t>(k)];
      const std::size_t bytes = static_cast<std::size_t>(pos) * C * sizeof(float);
      const float* d_out = nullptr;
      if (!last) {
        recv_buf_.resize(static_cast<std::size_t>(pos) * C);
        const auto tw = clock_type::now();
        links_.recv(stage_ + 1, stage_tag(stage_msg::gradient, step, i), recv_buf_.data(), bytes);
        timing_.wait_us += micros_since(tw);
        traced("bubble", "pipeline", tw, trace::track::compute, step, i, bytes);
        d_out = from_link(bytes);
      }
      // Each micro-batch's loss is a mean over its rows; rows / global_batch makes the sum
      // over the global batch the mean-loss gradient (as trainer does).
      const float scale = static_cast<float>(rows) / static_cast<float>(t.global_batch);
      const auto tc = clock_type::now();
      const bool reports = ready && j == last_backward;
      if (reports)
        model_->set_grads_ready_hook([&](int64_t offset, int64_t count) {
          seen.emplace_back(offset, count);
          if (bitwise_) accumulate_fixed(step, offset, count);
          stage_for_sum(offset, count);
          ready(static_cast<std::size_t>(offset), static_cast<std::size_t>(count));
        });
      if (bitwise_) model_->flat_grads().zero();
      const float* d_in = model_->backward(slot, d_out, scale);
      if (reports) {
        model_->set_grads_ready_hook(nullptr);
        // A model that skipped or repeated a range would leave gradients unconverted and
        // unreported, or counted twice.
        std::sort(seen.begin(), seen.end());
        int64_t next = 0;
        for (const auto& [offset, count] : seen) {
          COHORT_CHECK(offset == next && count > 0);
          next = offset + count;
        }
        COHORT_CHECK(next == model_->num_params());
      } else if (bitwise_) {
        accumulate_fixed(step, 0, model_->num_params());
      }
      if (links_.after_compute) links_.after_compute(clock_type::now() - tc);
      timing_.compute_us += micros_since(tc);
      traced("backward", "compute", tc, trace::track::compute, step, i, 0);
      if (!first) {
        const auto ts = clock_type::now();
        links_.send(stage_ - 1, stage_tag(stage_msg::gradient, step, i),
                    to_link(d_in, bytes, send_buf_), bytes);
        timing_.send_us += micros_since(ts);
        traced("send", "p2p", ts, trace::track::p2p, step, i, bytes);
        timing_.p2p_bytes += bytes;
      }
      --held;
    }
  }
  timing_.schedule_us += micros_since(t_sched);
  return loss_rows;
}

void* stage_trainer::reduction_buffer() {
  if (bitwise_) return fixed_.data();
  // A GPU's float gradients are summed in host memory (stage_for_sum copies them there).
  return host_grads_.empty() ? model_->flat_grads().data() : host_grads_.data();
}

double stage_trainer::finish_gradients(int64_t step) {
  nn::tensor& grads = model_->flat_grads();
  if (bitwise_) {
    if (host_grads_.empty()) {
      fixed_to_float(grads.data(), fixed_.data(), grads.numel());
    } else {
      fixed_to_float(host_grads_.data(), fixed_.data(), grads.numel());
      grads.copy_from_host(host_grads_.data());
    }
  } else if (sum_pending_) {
    grads.copy_from_host(host_grads_.data());  // the DP group's sum, back on the device
    sum_pending_ = false;
  }
  std::vector<double> parts = grad_sum_squares_by_param(*model_, bitwise_);
  if (tp_size_ > 1) {
    // A TP shard holds part of a tensor: the tensor's sum of squares is the sum over the
    // group. Replicated tensors are the same on every rank and count once.
    const auto& rep = model_->tp_replicated();
    std::vector<double> shard;
    for (std::size_t i = 0; i < parts.size(); ++i)
      if (!rep[i]) shard.push_back(parts[i]);
    if (!shard.empty()) {
      links_.tp_allreduce_f64(shard.data(), static_cast<int64_t>(shard.size()));
      std::size_t j = 0;
      for (std::size_t i = 0; i < parts.size(); ++i)
        if (!rep[i]) parts[i] = shard[j++];
    }
  }
  // The whole model's sum, parameter by parameter in order: stage 0 starts it, each stage
  // continues the running sum, the last sends the total back down.
  double running = 0.0;
  if (stage_ > 0)
    links_.recv(stage_ - 1, stage_tag(stage_msg::norm_up, step, 0), &running, sizeof running);
  running = ordered_sum(parts, running);
  double total = running;
  if (stage_ + 1 < stages_) {
    links_.send(stage_ + 1, stage_tag(stage_msg::norm_up, step, 0), &running, sizeof running);
    links_.recv(stage_ + 1, stage_tag(stage_msg::norm_down, step, 0), &total, sizeof total);
  }
  if (stage_ > 0)
    links_.send(stage_ - 1, stage_tag(stage_msg::norm_down, step, 0), &total, sizeof total);
  norm_ = std::sqrt(total);
  if (!std::isfinite(norm_))
    throw cohort::error("step " + std::to_string(step) +
                        ": gradient norm is not finite (the run diverged: lower train.lr or "
                        "set train.grad_clip)");
  return norm_;
}

void stage_trainer::apply_step(int64_t step) {
  trace::span traced("optimizer", "compute", trace::track::compute,
                     trace::args({{"step", step}, {"stage", stage_}}));
  clip_grads(*model_, norm_, cfg_.train.grad_clip);
  opt_->step(learning_rate(cfg_.train, step));
}

evaluation stage_trainer::evaluate(int64_t tag_step) {
  evaluation e;
  double loss_sum = 0.0;
  int64_t correct = 0, count = 0;
  const bool first = stage_ == 0, last = stage_ == stages_ - 1;
  const int C = cfg_.model.d_model;
  int idx = 0;
  for_each_eval_batch(
      *data_, cfg_.train.micro_batch, cfg_.train.eval_tokens, [&](const cohort::batch& b) {
        const int64_t pos = int64_t{b.n} * b.t;
        const std::size_t bytes = static_cast<std::size_t>(pos) * C * sizeof(float);
        const float* x_in = nullptr;
        if (!first) {
          recv_buf_.resize(static_cast<std::size_t>(pos) * C);
          links_.recv(stage_ - 1, stage_tag(stage_msg::eval, tag_step, idx), recv_buf_.data(),
                      bytes);
          x_in = from_link(bytes);
        }
        const nn::stage_forward f = model_->forward(0, b, x_in);
        if (last) {
          loss_sum += static_cast<double>(f.loss) * static_cast<double>(pos);
          correct += f.correct;
          count += pos;
        } else {
          links_.send(stage_ + 1, stage_tag(stage_msg::eval, tag_step, idx),
                      to_link(f.out, bytes, send_buf_), bytes);
        }
        model_->drop(0);
        ++idx;
      });
  if (count > 0) {
    e.count = count;
    e.loss = loss_sum / static_cast<double>(count);
    e.accuracy = static_cast<double>(correct) / static_cast<double>(count);
  }
  return e;
}

std::vector<std::pair<float*, std::size_t>> stage_trainer::state_buffers() {
  // A GPU's state travels through host copies over host transports (as trainer's).
  return state_on_host(dev(), state_buffers_of(*model_, *opt_), state_host_);
}

void stage_trainer::state_received() {
  state_from_host(dev(), state_buffers_of(*model_, *opt_), state_host_);
}

shard_snapshot stage_trainer::snapshot(int64_t next_step) const {
  return snapshot_state(cfg_, *data_, *model_, *opt_, next_step, stage_, tp_rank_);
}

int64_t stage_trainer::load_checkpoint(const std::string& step_dir) {
  return load_state(step_dir, cfg_, *model_, *opt_, stage_, tp_rank_);
}

std::map<std::string, std::string> stage_trainer::param_digests() const {
  std::map<std::string, std::string> d = train::param_digests(*model_);
  if (tp_size_ == 1) return d;
  // A shard's digest is not the whole tensor's: name it as the shard it is.
  std::map<std::string, std::string> out;
  const auto& rep = model_->tp_replicated();
  const auto& ps = model_->parameters();
  for (std::size_t i = 0; i < ps.size(); ++i) {
    const std::string& n = ps[i].name;
    out[rep[i] ? n : n + "#t" + std::to_string(tp_rank_)] = d.at(n);
  }
  return out;
}

int64_t stage_trainer::peak_pool_bytes() const {
  return static_cast<int64_t>(model_->memory().stats().peak_bytes);
}

namespace {

// One pipeline stage / TP shard as a DP group's seat (runtime/train/seat.hpp).
class stage_seat final : public seat {
 public:
  stage_seat(const config& c, int stage, int tp_rank, nn::device* given)
      : st_(c, stage, tp_rank, given) {}

  std::pair<int, int> position() const override { return {st_.stage(), st_.tp_rank()}; }
  std::string device_name() const override { return st_.dev().name(); }
  int micro_batches() const override { return st_.micro_batches(); }
  comm::grad_type reduction_type() const override {
    return st_.bitwise() ? comm::grad_type::i64 : comm::grad_type::f32;
  }
  // comm.compression is refused for pipeline and TP jobs (config rules): plain sums.
  comm::wire_plan wire(int, int) override { return {}; }
  std::size_t elements() override { return static_cast<std::size_t>(st_.model().num_params()); }
  void set_links(stage_links l) override { st_.set_links(std::move(l)); }

  void begin_step() override { st_.begin_step(); }
  double compute_gradients(int64_t step, const std::vector<int>& micro,
                           const nn::grads_ready_fn& ready) override {
    return st_.compute_gradients(step, micro, ready);
  }
  void* reduction_buffer() override { return st_.reduction_buffer(); }
  void finish_gradients(int64_t step) override { st_.finish_gradients(step); }
  void apply_step(int64_t step) override { st_.apply_step(step); }
  bool speaks_for_loss() const override {
    return st_.stage() == st_.stages() - 1 && st_.tp_rank() == 0;
  }
  std::vector<std::pair<float*, std::size_t>> state_buffers() override {
    return st_.state_buffers();
  }
  void state_received() override { st_.state_received(); }
  int64_t optimizer_steps() const override { return st_.optimizer_steps(); }
  void set_optimizer_steps(int64_t s) override { st_.set_optimizer_steps(s); }
  int64_t load_checkpoint(const std::string& step_dir) override {
    return st_.load_checkpoint(step_dir);
  }
  void save(checkpoint_writer& w, int64_t next_step, uint64_t job_id) override {
    // One shard per seat, written by replica 0's member; the last one in completes it.
    std::vector<std::string> all;
    for (int s = 0; s < st_.cfg().parallel.pp; ++s)
      for (int r = 0; r < st_.cfg().parallel.tp; ++r) all.push_back(shard_file_name(s, r));
    std::vector<shard_snapshot> mine;
    mine.push_back(st_.snapshot(next_step));
    mine.back().meta.extra["checkpoint.job"] = std::to_string(job_id);
    w.save_parts(std::move(mine), std::move(all));
  }
  bool saves_every_rank() const override { return false; }  // no error feedback in pipelines
  evaluation evaluate(int64_t tag) override {
    evaluation e = st_.evaluate(tag);
    if (!speaks_for_loss()) e.count = 0;  // TP rank 0 speaks for its replicas of the loss
    return e;
  }
  int64_t peak_pool_bytes() const override { return st_.peak_pool_bytes(); }
  seat_report report() override {
    seat_report r;
    r.param_digests = st_.param_digests();
    r.params_sha256 = combine_param_digests(r.param_digests);
    r.model_params = st_.model_params();
    r.peak_pool_bytes = st_.peak_pool_bytes();
    r.staged = true;
    r.stage = st_.stage();
    r.tp_rank = st_.tp_rank();
    r.timing = st_.timing();
    r.activation_bytes = st_.activation_bytes();
    r.peak_held = st_.peak_held();
    return r;
  }

 private:
  stage_trainer st_;
};

}  // namespace

std::unique_ptr<seat> make_stage_seat(const config& c, int stage, int tp_rank, nn::device* given) {
  return std::make_unique<stage_seat>(c, stage, tp_rank, given);
}

}  // namespace cohort::train
