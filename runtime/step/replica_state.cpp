// The state a step opens with when it is not the worker's own from the step before: a
// donor's (a member behind), a checkpoint's (a rollback from disk) or a rollback point's in
// memory (fault_tolerance.memory_every), and the points themselves (docs/compression.md
// "Rollback points in memory"). The step that uses them is replica_step.cpp's.
#include <spdlog/spdlog.h>

#include <string>

#include "runtime/ckpt/checkpoint_dir.hpp"
#include "runtime/comm/comm_error.hpp"
#include "runtime/comm/shm_comm.hpp"
#include "runtime/core/paths.hpp"
#include "runtime/core/trace.hpp"
#include "runtime/step/replica_step.hpp"
#include "runtime/train/seat.hpp"
#include "runtime/train/trainer.hpp"

namespace cohort::step {

// Every member of the DP group takes the donor's parameters, optimizer state and step
// counters; a member that was behind reports how long that took in T.
void replica_step::receive_state(int donor, int64_t step, net::step_timing& t) {
  const auto ts = io_.now();
  const auto trace_ts = trace::now_ns();
  const bool behind = next_step_ != step;  // the joiner's figure is the one reported
  uint64_t bytes = 0;
  for (auto& [ptr, n] : seat_->state_buffers()) {
    links_.comm->broadcast(ptr, n * sizeof(float), donor);
    bytes += n * sizeof(float);
  }
  seat_->state_received();
  int64_t counters[2] = {seat_->optimizer_steps(), step};
  links_.comm->broadcast(counters, sizeof counters, donor);
  seat_->set_optimizer_steps(counters[0]);
  next_step_ = counters[1];
  if (behind) {
    t.state_bytes = bytes + sizeof counters;
    t.state_us = std::max<uint64_t>(1, micros(io_.now() - ts));
  }
  trace::complete(behind ? "state received" : "state sent", "state", trace_ts, trace::now_ns(),
                  trace::track::control,
                  trace::args({{"donor", donor},
                               {"step", step},
                               {"bytes", static_cast<int64_t>(bytes + sizeof counters)}}));
}

void replica_step::restore(const net::step_open& o) {
  const std::string dir =
      checkpoint_path(expand_user(cfg_->fault_tolerance.checkpoint_dir), o.restore);
  try {
    next_step_ = seat_->load_checkpoint(dir);
  } catch (const std::exception& e) {
    refuse("cannot roll back to " + dir + ": " + e.what());
  }
  spdlog::info("dp group: rolled back to {} (step {})", dir, next_step_);
}

uint64_t replica_step::host_key() const {
  // As the transports tell "same host": comm.host_id, else the detected identity.
  const std::string host =
      cfg_->comm.host_id == "auto" ? comm::host_identity() : cfg_->comm.host_id;
  uint64_t key = 1469598103934665603ull;  // FNV-1a
  for (unsigned char ch : host) key = (key ^ ch) * 1099511628211ull;
  return key;
}

// A rollback to the point in memory of step o.restore (fault_tolerance.memory_every): a
// member that kept it takes its own state back; the lost members' error memory comes from
// their successors' copies (trainer::restore_point); a member without the point takes a
// donor's state next.
void replica_step::restore_from_memory(const net::step_open& o, net::step_timing& t) {
  train::trainer* w = seat_->whole_model();
  if (w == nullptr || !w->keeps_feedback())
    refuse("asked to roll back to a point in memory, and this seat keeps none");
  const auto ts = io_.now();
  const comm::comm_traffic before = links_.traffic();
  bool own = false;
  try {
    own = w->restore_point(o.restore, o.restore_parts, *links_.comm);
  } catch (const comm::comm_error&) {
    throw;
  } catch (const std::exception& e) {
    refuse(e.what());
  }
  if (own) next_step_ = o.restore;
  ++t.points;
  t.point_us += micros(io_.now() - ts);
  t.point_bytes += links_.traffic().received - before.received;
  spdlog::info("dp group: rolled back to the point of step {} in memory{}", o.restore,
               own ? "" : " (this worker's state comes from a donor)");
}

// fault_tolerance.memory_every: at a point's step, every member of the group keeps one
// (its state, its error memory and its predecessor's), before the step computes anything;
// the coordinator counts it once the step commits (training_job::commit).
void replica_step::take_point(const net::step_open& o, net::step_vote& v, net::step_timing& t) {
  const int64_t every = cfg_->fault_tolerance.memory_every;
  train::trainer* w = seat_->whole_model();
  // A step replayed from its own point (o.point is it) takes none: the point holds already.
  if (every <= 0 || o.step % every != 0 || o.step == o.point || w == nullptr ||
      !w->keeps_feedback())
    return;
  const auto ts = io_.now();
  const comm::comm_traffic before = links_.traffic();
  v.point_ring = w->take_point(o.step, o.point, *links_.comm, host_key());
  ++t.points;
  t.point_us += micros(io_.now() - ts);
  t.point_bytes += links_.traffic().received - before.received;
}

}  // namespace cohort::step
