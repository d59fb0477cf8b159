// cluster.bind (docs/slurm.md, "Binding"): each worker of a host on cores of its own, or on
// a NUMA node of its own, by its local rank among the host's workers, the way Slurm's
// --cpu-bind and torchrun's numa binding place processes. The plan is a pure function of the
// cores a worker may use (its affinity when it starts: the whole machine, or what Slurm or
// taskset gave the process that started it), tested as tables; bind_self reads the
// topology with hwloc (Debian's libhwloc-dev) and binds the calling process, every thread.
#pragma once
#include <initializer_list>
#include <string>
#include <vector>

namespace cohort::proc {

/// One core a worker may run on: its processing units (hardware threads, OS indexes) and the
/// NUMA node it belongs to (OS index; 0 on a machine without NUMA).
struct core_info {
  std::vector<int> pus;
  int numa = 0;
};

/// The processing units local rank RANK of SIZE workers gets under MODE ("cores" or "numa")
/// from CORES (in topology order). cores: the cores split in SIZE contiguous runs as even as
/// they go (more workers than cores: rank r shares core r % cores); numa: the NUMA nodes of
/// CORES, node RANK % nodes, all its cores. Empty for "none", no cores, or SIZE < 1.
std::vector<int> plan_binding(const std::string& mode, const std::vector<core_info>& cores,
                              int rank, int size);

/// PUS as a list of ranges ("0-3,8,10-11"), as Linux's cpulist files and taskset -c write it.
std::string cpu_list(std::vector<int> pus);

/// What bind_self did.
struct cpu_binding {
  std::string cpus;  ///< the process's processing units after it (cpu_list); "" if unknown
  std::string note;  ///< one line for the log: what was bound, or kept, and why
  bool bound = false;
};

/// Binds this process (all its threads; threads made later inherit it) per MODE for local
/// rank RANK of SIZE, within the processing units it may use now. MODE "none" binds nothing.
/// A process that srun started and bound itself (SLURM_CPU_BIND_TYPE set, SIZE 1: one task a
/// worker) keeps Slurm's binding, and the note says so. Never throws: a failure is the note.
cpu_binding bind_self(const std::string& mode, int rank, int size);

/// This process's processing units now (cpu_list), or "" when they cannot be read.
std::string current_cpus();

/// The workers on this host the caller counts among (its local rank's range): from
/// COHORT_LOCAL_SIZE (`cohort worker --local-size`, set by launch and the host agent),
/// SLURM_NTASKS_PER_NODE or LOCAL_WORLD_SIZE (torchrun's), else 1.
int local_size_from_env();

/// The first of NAMES set in the environment to a whole number in [LO, HI], or FALLBACK:
/// how a process learns its local rank and size from its launcher (cohort's, Slurm's,
/// torchrun's variables).
int int_from_env(std::initializer_list<const char*> names, long lo, long hi, int fallback);

}  // namespace cohort::proc
