// Injected faults of the control plane (docs/faults.md) as pieces the control plane is given,
// the way step_faults wraps the seat: the coordinator passes each frame between it and a
// member through a frame_filter and knows no fault by name. Owns `drop control`'s draw (a
// pure function of seed and frame number); not the link cut (coordinator_node, worker).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/core/faults.hpp"
#include "runtime/net/protocol.hpp"

namespace cohort::step {

class training_job;

/// What the coordinator asks of each control frame between it and a member, in and out.
class frame_filter {
 public:
  virtual ~frame_filter() = default;
  /// True: the frame (of type T) is lost; the caller acts as if it never came or went.
  virtual bool drop(net::msg_type t) = 0;
  /// Whether frames of type T may be dropped (a heartbeat that may be must reach drop(),
  /// not a shortcut that answers it elsewhere).
  virtual bool decides(net::msg_type t) const = 0;
  /// What the filter has dropped so far, for status replies.
  virtual std::vector<net::counter> counters() const = 0;
};

/// `drop control`: the types it may drop (the step protocol, rosters, heartbeats);
/// registration, the rendezvous store, stop and the admin channel never are.
bool drop_control_may_drop(net::msg_type t);
/// `drop control`'s draw number DRAW: lost with probability d.p, from (d.seed, DRAW) alone.
bool drop_control_draw(const faults::fault_spec& d, uint64_t draw);

/// The job's control-plane faults as a filter: `drop control` when the job has one (also
/// one `ctl inject` adds later), counting each drop in the job's report.
std::shared_ptr<frame_filter> job_frame_filter(std::shared_ptr<training_job> job);

}  // namespace cohort::step
