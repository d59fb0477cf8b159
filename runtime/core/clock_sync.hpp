// The offset of a peer's steady clock from ours, from round trips (NTP's rule): a probe sent
// at t0 on our clock, answered at r on the peer's, back at t1 on ours, puts the peer's clock
// at r - (t0 + t1) / 2 ahead of ours, and that is wrong by at most (t1 - t0) / 2 however the
// delay splits between the two directions. The estimate is the probe with the shortest round
// trip among the last `window` (older probes would carry the clocks' drift). Thread-safe: a
// worker's actor feeds it, its group actor reads it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>

namespace cohort {

class clock_sync {
 public:
  struct estimate {
    int64_t offset_ns = 0;  ///< add to our clock to get the peer's
    int64_t error_ns = -1;  ///< bound on |offset - true offset|; -1: no probe yet
  };

  explicit clock_sync(std::size_t window = 16) : window_(window < 1 ? 1 : window) {}

  /// A probe sent at T0 (ours), answered at REMOTE (the peer's), back at T1 (ours). A probe
  /// that came back before it left (a clock that stepped) is ignored.
  void sample(int64_t t0, int64_t remote, int64_t t1) {
    if (t1 < t0) return;
    std::lock_guard<std::mutex> lock(mu_);
    probes_.push_back({t0, remote, t1});
    while (probes_.size() > window_) probes_.pop_front();
  }

  estimate current() const {
    std::lock_guard<std::mutex> lock(mu_);
    estimate best;
    int64_t best_rtt = -1;
    for (const probe& p : probes_) {
      const int64_t rtt = p.t1 - p.t0;
      if (best_rtt >= 0 && rtt >= best_rtt) continue;
      best_rtt = rtt;
      // r - (t0 + t1) / 2 without overflow: t0 + rtt / 2 is the probe's midpoint.
      best.offset_ns = p.remote - (p.t0 + rtt / 2);
      best.error_ns = (rtt + 1) / 2;
    }
    return best;
  }

 private:
  struct probe {
    int64_t t0, remote, t1;
  };
  mutable std::mutex mu_;
  std::size_t window_;
  std::deque<probe> probes_;
};

}  // namespace cohort
