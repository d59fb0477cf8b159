// The seat forwarding written once: a seat that hands every call of train::seat to the seat it
// holds. Wrappers (the fault wrapper, test probes) derive from it and override only what they
// change. Owns no behaviour of its own.
#pragma once
#include <memory>
#include <utility>

#include "runtime/train/seat.hpp"

namespace cohort::train {

/// A seat that forwards every call to the seat it holds (a base for wrappers).
class forwarding_seat : public seat {
 public:
  explicit forwarding_seat(std::unique_ptr<seat> inner) : inner_(std::move(inner)) {}
  /// The seat this one forwards to.
  seat& inner() { return *inner_; }
  const seat& inner() const { return *inner_; }

  std::pair<int, int> position() const override { return inner_->position(); }
  std::string device_name() const override { return inner_->device_name(); }
  int micro_batches() const override { return inner_->micro_batches(); }
  comm::grad_type reduction_type() const override { return inner_->reduction_type(); }
  std::size_t elements() override { return inner_->elements(); }
  void set_links(stage_links l) override { inner_->set_links(std::move(l)); }
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
  std::vector<std::pair<float*, std::size_t>> state_buffers() override {
    return inner_->state_buffers();
  }
  void state_received() override { inner_->state_received(); }
  int64_t optimizer_steps() const override { return inner_->optimizer_steps(); }
  void set_optimizer_steps(int64_t s) override { inner_->set_optimizer_steps(s); }
  int64_t load_checkpoint(const std::string& d) override { return inner_->load_checkpoint(d); }
  void save(checkpoint_writer& w, int64_t next_step, uint64_t job_id) override {
    inner_->save(w, next_step, job_id);
  }
  bool saves_every_rank() const override { return inner_->saves_every_rank(); }
  evaluation evaluate(int64_t tag) override { return inner_->evaluate(tag); }
  seat_report report() override { return inner_->report(); }
  int64_t peak_pool_bytes() const override { return inner_->peak_pool_bytes(); }
  trainer* sharded() override { return inner_->sharded(); }
  trainer* whole_model() override { return inner_->whole_model(); }

 private:
  std::unique_ptr<seat> inner_;
};

}  // namespace cohort::train
