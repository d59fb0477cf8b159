// Injected faults of the control plane (docs/faults.md) as pieces the control plane is given,
// the way step_faults wraps the seat: the coordinator passes each frame between it and a
// member through a frame_filter and knows no fault by name. Owns `drop control`'s draw (a
// pure function of seed and frame number) and the coordinator's link cut (`partition
// coordinator`); not a worker's cut and hold queues (actors/worker*).
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
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

/// `partition coordinator`: a link that is down until a deadline; every frame in or out is
/// lost meanwhile, as a cut cable loses it. Thread-safe: cut from the fault's thread, read
/// on the bridge's and the actor's.
class link_cut {
 public:
  using clock_fn = std::function<std::chrono::steady_clock::time_point()>;
  /// NOW: the clock (empty: std::chrono::steady_clock::now).
  explicit link_cut(clock_fn now = {}) : now_(std::move(now)) {}
  /// Down for MS from now (a later cut replaces the deadline).
  void cut_for(std::chrono::milliseconds ms);
  /// True while the link is down.
  bool down() const;

 private:
  int64_t now_ns() const;
  clock_fn now_;
  std::atomic<int64_t> until_ns_{INT64_MIN};
};

}  // namespace cohort::step
