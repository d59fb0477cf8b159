// cluster.bind: the plan (pure) and hwloc's part (the topology, the binding).
#include "runtime/core/cpu_bind.hpp"

#include <hwloc.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>

namespace cohort::proc {

std::vector<int> plan_binding(const std::string& mode, const std::vector<core_info>& cores,
                              int rank, int size) {
  std::vector<int> out;
  if (size < 1 || rank < 0 || cores.empty() || (mode != "cores" && mode != "numa")) return out;
  if (mode == "cores") {
    const int n = static_cast<int>(cores.size());
    if (n < size) {
      out = cores[rank % n].pus;
    } else {
      // Rank r gets cores [r * n / size, (r + 1) * n / size): runs that differ by one at most.
      const int r = rank % size;
      for (int c = r * n / size; c < (r + 1) * n / size; ++c)
        out.insert(out.end(), cores[c].pus.begin(), cores[c].pus.end());
    }
  } else {
    std::vector<int> nodes;  // in the order the cores meet them
    for (const core_info& c : cores)
      if (std::find(nodes.begin(), nodes.end(), c.numa) == nodes.end()) nodes.push_back(c.numa);
    const int node = nodes[rank % nodes.size()];
    for (const core_info& c : cores)
      if (c.numa == node) out.insert(out.end(), c.pus.begin(), c.pus.end());
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::string cpu_list(std::vector<int> pus) {
  std::sort(pus.begin(), pus.end());
  pus.erase(std::unique(pus.begin(), pus.end()), pus.end());
  std::string s;
  for (std::size_t i = 0; i < pus.size();) {
    std::size_t j = i;
    while (j + 1 < pus.size() && pus[j + 1] == pus[j] + 1) ++j;
    if (!s.empty()) s += ',';
    s += std::to_string(pus[i]);
    if (j > i) s += '-' + std::to_string(pus[j]);
    i = j + 1;
  }
  return s;
}

namespace {

struct topology {
  hwloc_topology_t t = nullptr;
  topology() {
    if (hwloc_topology_init(&t) != 0 || hwloc_topology_load(t) != 0) {
      if (t != nullptr) hwloc_topology_destroy(t);
      t = nullptr;
    }
  }
  ~topology() {
    if (t != nullptr) hwloc_topology_destroy(t);
  }
  topology(const topology&) = delete;
  topology& operator=(const topology&) = delete;
};

struct bitmap {
  hwloc_bitmap_t b = hwloc_bitmap_alloc();
  ~bitmap() { hwloc_bitmap_free(b); }
  bitmap() = default;
  bitmap(const bitmap&) = delete;
  bitmap& operator=(const bitmap&) = delete;
};

std::vector<int> pus_of(hwloc_const_bitmap_t set) {
  std::vector<int> out;
  for (int i = hwloc_bitmap_first(set); i >= 0; i = hwloc_bitmap_next(set, i)) out.push_back(i);
  return out;
}

// The cores of T that share a processing unit with ALLOWED, each with those units and its
// NUMA node (the first whose cpuset holds them).
std::vector<core_info> allowed_cores(hwloc_topology_t t, hwloc_const_bitmap_t allowed) {
  std::vector<core_info> out;
  const int numas = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE);
  // Machines whose topology has no cores (some VMs report only PUs): each PU is a core.
  const hwloc_obj_type_t unit =
      hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_CORE) > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
  const int n = hwloc_get_nbobjs_by_type(t, unit);
  for (int i = 0; i < n; ++i) {
    hwloc_obj_t core = hwloc_get_obj_by_type(t, unit, i);
    bitmap in;
    hwloc_bitmap_and(in.b, core->cpuset, allowed);
    if (hwloc_bitmap_iszero(in.b)) continue;
    core_info c;
    c.pus = pus_of(in.b);
    for (int k = 0; k < numas; ++k) {
      hwloc_obj_t node = hwloc_get_obj_by_type(t, HWLOC_OBJ_NUMANODE, k);
      if (hwloc_bitmap_intersects(node->cpuset, in.b)) {
        c.numa = static_cast<int>(node->os_index);
        break;
      }
    }
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace

int int_from_env(std::initializer_list<const char*> names, long lo, long hi, int fallback) {
  for (const char* name : names) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') continue;
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (*end == '\0' && n >= lo && n <= hi) return static_cast<int>(n);
  }
  return fallback;
}

int local_size_from_env() {
  return int_from_env({"COHORT_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE", "LOCAL_WORLD_SIZE"}, 1,
                      (1 << 20) - 1, 1);
}

std::string current_cpus() {
  topology topo;
  if (topo.t == nullptr) return {};
  bitmap now;
  if (hwloc_get_cpubind(topo.t, now.b, HWLOC_CPUBIND_PROCESS) != 0) return {};
  return cpu_list(pus_of(now.b));
}

cpu_binding bind_self(const std::string& mode, int rank, int size) {
  cpu_binding out;
  topology topo;
  if (topo.t == nullptr) {
    out.note = "cluster.bind: the topology could not be read (hwloc): not bound";
    return out;
  }
  bitmap allowed;
  if (hwloc_get_cpubind(topo.t, allowed.b, HWLOC_CPUBIND_PROCESS) != 0)
    hwloc_bitmap_copy(allowed.b, hwloc_topology_get_allowed_cpuset(topo.t));
  out.cpus = cpu_list(pus_of(allowed.b));
  if (mode != "cores" && mode != "numa") return out;
  const char* slurm = std::getenv("SLURM_CPU_BIND_TYPE");
  if (slurm != nullptr && *slurm != '\0' && std::string(slurm).rfind("none", 0) != 0 &&
      size <= 1) {
    out.note = "cluster.bind " + mode + ": kept the binding srun gave this task (--cpu-bind=" +
               slurm + "): cpus " + out.cpus;
    return out;
  }
  const std::vector<int> plan = plan_binding(mode, allowed_cores(topo.t, allowed.b), rank, size);
  if (plan.empty()) {
    out.note = "cluster.bind " + mode + ": no core to bind to: not bound";
    return out;
  }
  bitmap set;
  for (int pu : plan) hwloc_bitmap_set(set.b, static_cast<unsigned>(pu));
  if (hwloc_set_cpubind(topo.t, set.b, HWLOC_CPUBIND_PROCESS) != 0) {
    out.note = "cluster.bind " + mode + ": the kernel refused cpus " + cpu_list(plan) +
               ": not bound";
    return out;
  }
  // numa: memory from the node too, where the machine has NUMA (best effort).
  if (mode == "numa" && hwloc_get_nbobjs_by_type(topo.t, HWLOC_OBJ_NUMANODE) > 1)
    hwloc_set_membind(topo.t, set.b, HWLOC_MEMBIND_BIND, HWLOC_MEMBIND_PROCESS);
  out.bound = true;
  out.cpus = cpu_list(plan);
  out.note = "cluster.bind " + mode + ": local rank " + std::to_string(rank) + " of " +
             std::to_string(size) + " on cpus " + out.cpus;
  return out;
}

}  // namespace cohort::proc
