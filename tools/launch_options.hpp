// What `cohort launch` was asked on its command line (tools/cmd_launch_cli.cpp), and the
// launcher that carries it out (tools/cmd_launch.cpp).
#pragma once
#include <string>
#include <vector>

#include "runtime/core/config.hpp"

namespace cohort::cli {

struct launch_options {
  std::string config_path;
  std::vector<std::string> overrides;
  std::string bind;
  std::string summary;
  std::string trace;
  std::string metrics;
  bool control_only = false;
  bool quiet = false;
  bool respawn = true;
  std::vector<std::string> inject;
  bool resume = false;
  std::string resume_from;  // --resume-from, passed to the coordinator
  int stop_timeout_ms = 5000;
  std::string keys;  // --keys: use (or write) the job's keys there
  bool insecure = false;
  std::vector<std::string> cpu_limits;  // --cpu-limit NAME=CPUS
  bool agent = true;  // !--no-agent: the workers reach the coordinator through launch's relay
};

/// Supervises one local cluster as OPT asks for the job CFG until it ends: the exit code.
int run_launch(const launch_options& opt, const config& cfg);

}  // namespace cohort::cli
