// Injected faults of the control plane (docs/faults.md) as pieces the control plane is given,
// the way step_faults wraps the seat: the coordinator passes each frame between it and a
// member through a frame_filter and knows no fault by name. Owns `drop control`'s draw (a
// pure function of seed and frame number), the coordinator's link cut (`partition
// coordinator`) and a worker's held link (`hang` and `partition` of a worker).
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
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

/// A worker's control link under `hang` and `partition`: muted, it sends no heartbeats (a
/// stopped process's silence); cut, it also holds every frame in and out, not losing them,
/// as TCP holds them across a cut, and gives them back in order once the cut ends. The
/// worker's node asks it at its send and receive points and knows no fault by name.
/// Thread-safe: cut from the group's thread, used on the bridge's and the heartbeat's.
class held_link {
 public:
  using held_in = std::pair<std::string, net::message>;  ///< (peer, frame)
  /// NOW: the clock (empty: std::chrono::steady_clock::now).
  explicit held_link(const link_cut::clock_fn& now = {}) : mute_(now), cut_(now) {}
  /// No heartbeats for MS from now (`hang`).
  void mute_for(std::chrono::milliseconds ms) { mute_.cut_for(ms); }
  /// Muted, and every frame held, for MS from now (`partition`).
  void cut_for(std::chrono::milliseconds ms);
  bool muted() const { return mute_.down(); }
  bool cut() const { return cut_.down(); }
  /// True: M was held (the link is cut); false: the caller sends it now.
  bool hold_out(const net::message& m);
  /// True: M from PEER was held (the link is cut); false: the caller delivers it now.
  bool hold_in(const std::string& peer, net::message& m);
  /// What a cut that has ended held, each direction in order; nothing while still cut.
  std::pair<std::vector<net::message>, std::vector<held_in>> release();

 private:
  link_cut mute_;
  link_cut cut_;
  std::mutex mu_;
  std::vector<net::message> out_;
  std::vector<held_in> in_;
};

}  // namespace cohort::step
