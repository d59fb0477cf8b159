#include "tools/launch_cpu_limits.hpp"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>

#include "runtime/core/cpu_limit.hpp"
#include "runtime/core/error.hpp"

namespace cohort::cli {

launch_cpu_limits::launch_cpu_limits(const std::vector<std::string>& specs) {
  for (const std::string& s : specs) {
    const auto eq = s.find('=');
    char* end = nullptr;
    const double cpus = eq == std::string::npos ? 0 : std::strtod(s.c_str() + eq + 1, &end);
    if (eq == std::string::npos || eq == 0 || end == s.c_str() + eq + 1 || *end != '\0')
      throw usage_error("--cpu-limit " + s +
                        ": expected NAME=CPUS, a worker's name and its cores, e.g. worker-1=0.5");
    if (!(cpus >= proc::min_cpus && cpus <= proc::max_cpus))
      throw usage_error("--cpu-limit " + s + ": CPUS must be a number of cores in [0.01, 1024]");
    if (!cpus_.emplace(s.substr(0, eq), cpus).second)
      throw usage_error("--cpu-limit " + s + ": " + s.substr(0, eq) +
                        " is limited twice: give each worker one limit");
  }
  std::string why;
  if (!cpus_.empty() && !proc::cpu_cgroup_root(&why))
    throw usage_error("--cpu-limit: " + why +
                      ": run launch as root on a host with cgroups, or leave --cpu-limit out");
}

void launch_cpu_limits::started(const std::string& name, pid_t pid) {
  const auto it = cpus_.find(name);
  if (it == cpus_.end()) return;
  try {
    dirs_[pid] = proc::limit_cpu(pid, it->second);
    std::printf("launch: %s (pid %d) limited to %g CPU(s) (%s)\n", name.c_str(),
                static_cast<int>(pid), it->second, dirs_[pid].c_str());
    std::fflush(stdout);
  } catch (const error& e) {
    std::fprintf(stderr, "launch: %s runs without its limit: %s\n", name.c_str(), e.what());
  }
}

void launch_cpu_limits::reaped(pid_t pid) {
  const auto it = dirs_.find(pid);
  if (it == dirs_.end()) return;
  proc::remove_cpu_limit(it->second);
  dirs_.erase(it);
}

launch_cpu_limits::~launch_cpu_limits() {
  for (const auto& [pid, dir] : dirs_) proc::remove_cpu_limit(dir);
}

void add_cpu_limit_option(CLI::App& cmd, std::vector<std::string>* specs) {
  cmd.add_option("--cpu-limit", *specs,
                 "Run the local worker NAME under a CPU budget of CPUS cores (a cgroup of its "
                 "own, as docker --cpus; needs root), e.g. worker-1=0.5: workers of different "
                 "speeds on one host (repeatable; docs/data_parallel.md)")
      ->type_name("NAME=CPUS");
}

}  // namespace cohort::cli
