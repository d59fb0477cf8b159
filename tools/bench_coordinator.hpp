// The coordinator the control benchmarks run against (`cohort bench control --agents`,
// `--kills`): a `cohort coordinator --control-only` child with the benchmark's timing, keys
// when asked, killed and reaped on destruction.
#pragma once
#include <sys/types.h>

#include <string>

#include "tools/bench_agents.hpp"

namespace cohort::cli {

/// Workers the simulation runs: one per agent, or per_host per host agent.
int workers(const agents_options& o);

// The coordinator as a child process; killed and reaped on destruction.
class bench_coordinator {
 public:
  /// Starts it and reads its endpoint; throws cohort::error when it does not start.
  bench_coordinator(const agents_options& o, const std::string& dir);
  /// Kills and reaps it; keeps its log at o.coordinator_log when set.
  ~bench_coordinator();
  bench_coordinator(const bench_coordinator&) = delete;
  bench_coordinator& operator=(const bench_coordinator&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& endpoint() const { return endpoint_; }

 private:
  std::string log_;
  std::string keep_;
  pid_t pid_ = -1;
  std::string endpoint_;
};

}  // namespace cohort::cli
