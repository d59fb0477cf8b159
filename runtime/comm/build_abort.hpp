// build_abort: fails the building of one generation's links from another thread. A
// communicator under construction is not yet a communicator anyone can abort(), and Gloo
// lets a TCP connect to a published address wait 5x the rendezvous timeout for a peer that
// died after publishing it (a survivor once sat 200 s there while the job moved on). The
// builder arms the handle with what ends its current wait; whoever learns that the
// generation is over (the worker actor, on a newer roster) calls abort(). Owns only that
// hand-over, not any transport.
#pragma once
#include <atomic>
#include <cstddef>
#include <functional>
#include <map>
#include <mutex>
#include <string>

namespace cohort::comm {

/// Thread-safe. Every armed action runs at most once, under the handle's lock, either at
/// abort() or at once when armed after it.
class build_abort {
 public:
  /// Any thread, idempotent (the first reason stays): runs the armed actions.
  void abort(const std::string& why);
  bool aborted() const { return aborted_.load(); }
  /// Why abort() was called ("" before).
  std::string why() const;
  /// Registers ACTION; returns the id disarm() takes. Runs it at once if already aborted.
  std::size_t arm(std::function<void()> action);
  /// Drops the action of ID (the wait it ends is over); unknown ids are ignored.
  void disarm(std::size_t id);
  /// Throws comm_error(aborted) naming OP and the reason, if aborted.
  void check(const std::string& op) const;

 private:
  mutable std::mutex mu_;
  std::atomic<bool> aborted_{false};
  std::string why_;
  std::size_t next_id_ = 0;
  std::map<std::size_t, std::function<void()>> armed_;
};

}  // namespace cohort::comm
