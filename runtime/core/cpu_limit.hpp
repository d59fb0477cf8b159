// A CPU budget for one process through the kernel's cgroups: the `cpu` controller's
// bandwidth limit (v1: cpu.cfs_quota_us over cpu.cfs_period_us; v2: cpu.max), the way
// Docker's --cpus and Kubernetes' CPU limits work. `cohort launch --cpu-limit NAME=CPUS` and
// `cohort worker --cpu-limit CPUS` use it to give one host's workers different speeds with
// real throttling by the scheduler (docs/data_parallel.md, "Workers of different speeds"),
// not a sleep: each limited process gets its own cgroup `cohort-cpu-PID` beside the others
// at the controller's root, removed once the process is gone. Needs root (or a delegated
// cgroup tree); POSIX only.
#pragma once
#include <sys/types.h>

#include <optional>
#include <string>

namespace cohort::proc {

/// The CPU budgets limit_cpu takes, in cores (the options that pass one on check the same).
constexpr double min_cpus = 0.01, max_cpus = 1024;

/// The directory under which limit_cpu makes its cgroups: the v1 `cpu` controller's mount,
/// else a cgroup2 mount whose root offers the `cpu` controller to its children (enabled
/// there when it is not). nullopt when there is none this process may write to, with the
/// reason in *WHY.
std::optional<std::string> cpu_cgroup_root(std::string* why = nullptr);

/// Moves PID (all its threads) into a new cgroup `cohort-cpu-PID` under cpu_cgroup_root(),
/// limited to CPUS cores' time (quota CPUS x 100 ms per 100 ms period; CPUS in [min_cpus,
/// max_cpus]).
/// Returns the cgroup's directory. Throws cohort::error saying what failed and how to fix it
/// (not root, no cpu controller, a bad CPUS).
std::string limit_cpu(pid_t pid, double cpus);

/// Removes DIR, a cgroup limit_cpu made, once no process is left in it (its process exited).
/// False when it still holds one or is gone already.
bool remove_cpu_limit(const std::string& dir);

/// Moves the calling process to the controller's root cgroup (unlimited) and removes DIR,
/// its own limit_cpu cgroup: what a limited `cohort worker` does as it exits. Best effort.
void release_own_cpu_limit(const std::string& dir);

}  // namespace cohort::proc
