// Injected faults of a DP step (docs/faults.md), as a wrapper around the worker's seat, the
// way torchft wraps a process group: the step itself has no fault branches. The wrapper
// forwards every call to the seat it holds; for a step that has a fault armed it
//   - kill / hang / partition: carries the fault out in the middle of the step, right after
//     the first gradients were handed to the data plane (so peers are already inside the
//     step's collectives when this worker dies, stalls or goes silent);
//   - slow: stretches the step's compute passes (seat::stretch_compute).
// COHORT_TEST_ABORT_COMM=STEP:RANK (a test aid) aborts this worker's own communicator at
// the same point, once per process, to prove that every worker then aborts the step.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "runtime/net/protocol.hpp"
#include "runtime/train/seat.hpp"

namespace cohort::step {

/// A seat that forwards every call to the seat it holds (a base for wrappers).
class forwarding_seat : public train::seat {
 public:
  explicit forwarding_seat(std::unique_ptr<train::seat> inner) : inner_(std::move(inner)) {}
  train::seat& inner() { return *inner_; }

  std::pair<int, int> position() const override { return inner_->position(); }
  int micro_batches() const override { return inner_->micro_batches(); }
  comm::grad_type reduction_type() const override { return inner_->reduction_type(); }
  std::size_t elements() override { return inner_->elements(); }
  void set_links(train::stage_links l) override { inner_->set_links(std::move(l)); }
  void begin_step() override { inner_->begin_step(); }
  double compute_gradients(int64_t step, const std::vector<int>& micro,
                           const nn::grads_ready_fn& ready) override {
    return inner_->compute_gradients(step, micro, ready);
  }
  void* reduction_buffer() override { return inner_->reduction_buffer(); }
  comm::wire_plan wire(int replicas, int rank) override { return inner_->wire(replicas, rank); }
  void finish_gradients(int64_t step) override { inner_->finish_gradients(step); }
  void apply_step(int64_t step) override { inner_->apply_step(step); }
  bool speaks_for_loss() const override { return inner_->speaks_for_loss(); }
  void stretch_compute(double factor) override { inner_->stretch_compute(factor); }
  std::vector<std::pair<float*, std::size_t>> state_buffers() override {
    return inner_->state_buffers();
  }
  int64_t optimizer_steps() const override { return inner_->optimizer_steps(); }
  void set_optimizer_steps(int64_t s) override { inner_->set_optimizer_steps(s); }
  int64_t load_checkpoint(const std::string& d) override { return inner_->load_checkpoint(d); }
  bool saves_every_rank() const override { return inner_->saves_every_rank(); }
  void save(train::checkpoint_writer& w, int64_t next_step, uint64_t job_id) override {
    inner_->save(w, next_step, job_id);
  }
  train::evaluation evaluate(int64_t tag) override { return inner_->evaluate(tag); }
  train::seat_report report() override { return inner_->report(); }
  int64_t peak_pool_bytes() const override { return inner_->peak_pool_bytes(); }

 private:
  std::unique_ptr<train::seat> inner_;
};

/// How a fault reaches beyond the process's compute: the worker's heartbeat and control link.
struct fault_hooks {
  /// hang: no heartbeat for this long.
  std::function<void(uint32_t ms)> mute_heartbeats;
  /// partition: no heartbeats and no control frames either way for this long.
  std::function<void(uint32_t ms)> cut_off;
};

class fault_seat final : public forwarding_seat {
 public:
  fault_seat(std::unique_ptr<train::seat> inner, fault_hooks hooks);

  /// A fault for (f.generation, f.step); replaces one armed before.
  void arm(const net::fault_order& f) { armed_ = f; }
  /// The step about to run: its generation and step select the armed fault, `rank` the comm
  /// abort aid, and `abort_comm` aborts this worker's DP communicator.
  void begin(uint64_t generation, int64_t step, int rank, std::function<void()> abort_comm);

  double compute_gradients(int64_t step, const std::vector<int>& micro,
                           const nn::grads_ready_fn& ready) override;

 private:
  void carry_out(const net::fault_order& f);

  fault_hooks hooks_;
  std::optional<net::fault_order> armed_;
  std::optional<net::fault_order> now_;  ///< this step's, taken from armed_ by begin()
  bool abort_now_ = false;
  std::function<void()> abort_comm_;
  /// COHORT_TEST_ABORT_COMM: step and DP rank, once per process.
  int64_t abort_step_ = -1;
  int abort_rank_ = -1;
  bool abort_done_ = false;
};

}  // namespace cohort::step
