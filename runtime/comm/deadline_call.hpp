// A call that may never return (ncclCommAbort and ncclCommShrink are known to hang:
// NVIDIA/nccl issues 549, 1013, 1317, 1777), run on its own thread and waited for until a
// deadline. Owns the thread and the outcome; what the caller does after an expiry (leave
// the group as a dead member, never wait longer) is the caller's rule, stated here.
#pragma once
#include <chrono>
#include <functional>
#include <string>

namespace cohort::comm {

enum class deadline_outcome {
  done,     ///< returned true before the deadline
  failed,   ///< returned false or threw before the deadline
  expired,  ///< still running at the deadline: the thread is left behind
};

/// "done", "failed", "expired".
const char* to_string(deadline_outcome o);

struct deadline_result {
  deadline_outcome outcome = deadline_outcome::done;
  double seconds = 0;  ///< from the start to the return, or to the deadline when expired
  /// One line for the log and the events table. On expiry it says the worker must leave as
  /// dead: a thread stuck in NCCL holds the device, so the process cannot be trusted again.
  std::string text;
};

/// Runs `fn` (true = success; a throw counts as failure, its message kept) on a new thread
/// and waits at most `deadline`. On expiry the thread is detached: it owns only what `fn`
/// captured, so `fn` must capture by value or keep its captures alive (shared_ptr). The
/// caller then leaves the group as a dead member and exits; the process is replaced.
deadline_result run_with_deadline(const std::string& what, std::function<bool()> fn,
                                  std::chrono::milliseconds deadline);

}  // namespace cohort::comm
