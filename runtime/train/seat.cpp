// The two seats: the whole model (trainer) and one pipeline stage / TP shard (stage_trainer).
#include "runtime/train/seat.hpp"

#include <thread>

#include "runtime/train/checkpoint_writer.hpp"
#include "runtime/train/param_stats.hpp"

namespace cohort::train {

namespace {

using clock_type = std::chrono::steady_clock;

class whole_seat final : public seat {
 public:
  explicit whole_seat(const config& c) : tr_(c) {}

  std::pair<int, int> position() const override { return {0, 0}; }
  int micro_batches() const override { return tr_.micro_batches(); }
  bool bitwise() const override { return tr_.bitwise(); }
  std::size_t elements() override { return static_cast<std::size_t>(tr_.model().num_params()); }
  void set_links(stage_links) override {}

  void begin_step() override { tr_.begin_step(); }
  double compute_gradients(int64_t step, const std::vector<int>& micro,
                           const ready_fn& ready) override {
    const auto t0 = clock_type::now();
    const double loss_rows = tr_.compute_gradients(step, micro, ready);
    if (stretch_ > 1) {
      // The whole step's compute at once: the model has no per-pass callback.
      const auto spent = clock_type::now() - t0;
      std::this_thread::sleep_for(
          std::chrono::duration_cast<clock_type::duration>(spent * (stretch_ - 1)));
    }
    stretch_ = 1;
    return loss_rows;
  }
  void* reduction_buffer() override { return tr_.reduction_buffer(); }
  void finish_gradients(int64_t) override {}  // apply_step computes the norm: no peers needed
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
  void save(checkpoint_writer& w, int64_t next_step, uint64_t) override {
    w.save(tr_, next_step);
  }
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

class stage_seat final : public seat {
 public:
  stage_seat(const config& c, int stage, int tp_rank) : st_(c, stage, tp_rank) {}

  std::pair<int, int> position() const override { return {st_.stage(), st_.tp_rank()}; }
  int micro_batches() const override { return st_.micro_batches(); }
  bool bitwise() const override { return st_.bitwise(); }
  std::size_t elements() override { return static_cast<std::size_t>(st_.model().num_params()); }
  void set_links(stage_links l) override {
    // An injected `slow` stretches the stage's passes where they run, inside the schedule,
    // so the neighbours wait for it as they would for a slower device.
    l.after_compute = [this](clock_type::duration spent) {
      if (stretch_ > 1)
        std::this_thread::sleep_for(
            std::chrono::duration_cast<clock_type::duration>(spent * (stretch_ - 1)));
    };
    st_.set_links(std::move(l));
  }

  void begin_step() override { st_.begin_step(); }
  double compute_gradients(int64_t step, const std::vector<int>& micro,
                           const ready_fn& ready) override {
    struct reset {
      double& f;
      ~reset() { f = 1; }
    } r{stretch_};
    return st_.compute_gradients(step, micro, ready);
  }
  void* reduction_buffer() override { return st_.reduction_buffer(); }
  void finish_gradients(int64_t step) override { st_.finish_gradients(step); }
  void apply_step(int64_t step) override { st_.apply_step(step); }
  bool speaks_for_loss() const override {
    return st_.stage() == st_.stages() - 1 && st_.tp_rank() == 0;
  }
  void stretch_compute(double factor) override { stretch_ = factor; }

  std::vector<std::pair<float*, std::size_t>> state_buffers() override {
    return st_.state_buffers();
  }
  int64_t optimizer_steps() const override { return st_.optimizer_steps(); }
  void set_optimizer_steps(int64_t s) override { st_.set_optimizer_steps(s); }
  int64_t load_checkpoint(const std::string& step_dir) override {
    return st_.load_checkpoint(step_dir);
  }
  void save(checkpoint_writer& w, int64_t next_step, uint64_t job_id) override {
    // One shard per seat, written by replica 0's member; the last one in completes it.
    std::vector<std::pair<int, int>> all;
    for (int s = 0; s < st_.cfg().parallel.pp; ++s)
      for (int r = 0; r < st_.cfg().parallel.tp; ++r) all.emplace_back(s, r);
    shard_snapshot snap = st_.snapshot(next_step);
    snap.meta.extra["checkpoint.job"] = std::to_string(job_id);
    w.save_part(std::move(snap), all);
  }
  evaluation evaluate(int64_t tag) override {
    evaluation e = st_.evaluate(tag);
    if (!speaks_for_loss()) e.count = 0;  // TP rank 0 speaks for its replicas of the loss
    return e;
  }
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
  double stretch_ = 1;
};

}  // namespace

std::unique_ptr<seat> make_whole_seat(const config& c) { return std::make_unique<whole_seat>(c); }

std::unique_ptr<seat> make_stage_seat(const config& c, int stage, int tp_rank) {
  return std::make_unique<stage_seat>(c, stage, tp_rank);
}

}  // namespace cohort::train
