// `cohort launch --cpu-limit NAME=CPUS`: local workers of different speeds on one host. The
// named worker, whenever launch starts it (first start, respawn, or the warm worker taking
// its name), is moved into a cgroup of its own limited to CPUS cores (proc::limit_cpu), and
// the cgroup is removed once launch has reaped it.
#pragma once
#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace cohort::cli {

class launch_cpu_limits {
 public:
  /// From the option's values ("worker-1=0.5", ...); throws usage_error for a value that is
  /// not NAME=CPUS, CPUS outside [0.01, 1024], a name given twice, or (any limit at all) a
  /// host where this process may not make cgroups (the reason and the fix).
  explicit launch_cpu_limits(const std::vector<std::string>& specs);
  /// PID was started (or renamed) as NAME: limited when NAME has a limit. A refusal by the
  /// kernel is said on stderr; the worker runs unlimited.
  void started(const std::string& name, pid_t pid);
  /// PID was reaped: its cgroup, if it had one, is removed.
  void reaped(pid_t pid);
  ~launch_cpu_limits();

 private:
  std::map<std::string, double> cpus_;  ///< per worker name
  std::map<pid_t, std::string> dirs_;   ///< per limited child: its cgroup
};

/// Registers `--cpu-limit NAME=CPUS` (repeatable) on CMD.
void add_cpu_limit_option(CLI::App& cmd, std::vector<std::string>* specs);

}  // namespace cohort::cli
