// Injected faults of a DP step (docs/faults.md), as a wrapper around the worker's seat, the
// way torchft wraps a process group: the step itself has no fault branches. The wrapper
// forwards every call to the seat it holds; for a step that has a fault armed it
//   - kill / hang / partition: carries the fault out in the middle of the step, right after
//     the first gradients were handed to the data plane (so peers are already inside the
//     step's collectives when this worker dies, stalls or goes silent);
//   - slow: stretches the step's compute: each pass the seat reports through
//     stage_links::after_compute (a stage, inside its schedule, so its neighbours wait as for
//     a slower device), or else the whole compute_gradients call (the whole model).
// COHORT_TEST_ABORT_COMM=STEP:RANK (a test aid) aborts this worker's own communicator at
// the same point, once per process, to prove that every worker then aborts the step.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "runtime/net/protocol.hpp"
#include "runtime/train/seat_forwarding.hpp"

namespace cohort::step {

/// How a fault reaches beyond the process's compute: the worker's heartbeat and control link.
struct fault_hooks {
  /// hang: no heartbeat for this long.
  std::function<void(uint32_t ms)> mute_heartbeats;
  /// partition: no heartbeats and no control frames either way for this long.
  std::function<void(uint32_t ms)> cut_off;
};

/// How a `slow` waits and times; empty members: the real ones (tests give a fake clock).
struct slow_clock {
  /// Waits this long (empty: std::this_thread::sleep_for).
  std::function<void(std::chrono::steady_clock::duration)> pause;
  /// Times a compute the seat does not report pass by pass (empty: steady_clock::now).
  std::function<std::chrono::steady_clock::time_point()> now;
};

/// What an injected `slow` with FACTOR adds after compute that took SPENT:
/// (FACTOR - 1) x SPENT (nothing for FACTOR <= 1).
std::chrono::steady_clock::duration slow_extra(std::chrono::steady_clock::duration spent,
                                               double factor);

class fault_seat final : public train::forwarding_seat {
 public:
  fault_seat(std::unique_ptr<train::seat> inner, fault_hooks hooks, slow_clock clock = {});

  /// A fault for (f.generation, f.step); replaces one armed before.
  void arm(const net::fault_order& f) { armed_ = f; }
  /// The step about to run: its generation and step select the armed fault, `rank` the comm
  /// abort aid, and `abort_comm` aborts this worker's DP communicator.
  void begin(uint64_t generation, int64_t step, int rank, std::function<void()> abort_comm);

  double compute_gradients(int64_t step, const std::vector<int>& micro,
                           const nn::grads_ready_fn& ready) override;
  /// Passes the links on with a hook after each compute pass that stretches it (slow).
  void set_links(train::stage_links l) override;

 private:
  void carry_out(const net::fault_order& f);
  void stretch(std::chrono::steady_clock::duration spent);

  fault_hooks hooks_;
  slow_clock clock_;
  std::optional<net::fault_order> armed_;
  std::optional<net::fault_order> now_;  ///< this step's, taken from armed_ by begin()
  double slow_factor_ = 1;               ///< during compute_gradients of a `slow` step: its factor
  int passes_seen_ = 0;                  ///< passes the seat reported during this compute_gradients
  bool abort_now_ = false;
  std::function<void()> abort_comm_;
  /// COHORT_TEST_ABORT_COMM: step and DP rank, once per process.
  int64_t abort_step_ = -1;
  int abort_rank_ = -1;
  bool abort_done_ = false;
};

}  // namespace cohort::step
