// A device-library call that may never return (ncclCommAbort is known to hang: NVIDIA/nccl
// issues 549, 1013, 1317, 1777), run on a thread of its own and waited for until a deadline.
// The device layer's own small form of runtime/comm/deadline_call.* (gpu/ knows nothing of
// runtime/): it owns the thread and says whether the call returned; what the process does
// when it did not (leave its groups as a dead member) is the caller's rule.
#pragma once
#include <functional>

namespace cohort::gpu {

/// Runs FN on a new thread and waits at most DEADLINE_MS for it. True: FN returned in time
/// (the thread is joined). False: FN is still running; its thread is detached and owns only
/// what FN captured, so FN must capture by value (or keep its captures alive itself). An
/// exception FN throws ends FN (counted as returned) and is not rethrown.
bool call_within(std::function<void()> fn, int deadline_ms);

}  // namespace cohort::gpu
