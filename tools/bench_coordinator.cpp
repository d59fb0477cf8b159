#include "tools/bench_coordinator.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "runtime/core/error.hpp"
#include "runtime/core/process.hpp"

namespace cohort::cli {

int workers(const agents_options& o) { return o.agents * std::max(1, o.per_host); }

bench_coordinator::bench_coordinator(const agents_options& o, const std::string& dir)
    : log_(dir + "/coordinator.log"), keep_(o.coordinator_log) {
  std::vector<std::string> args{
      "coordinator", "--control-only", "--set", "cluster.workers=" + std::to_string(workers(o)),
      "--set",
      // A control-only job still passes the config's checks: one sample per replica.
      "train.global_batch=" + std::to_string(workers(o)), "--set", "train.micro_batch=1", "--set",
      "fault_tolerance.heartbeat_ms=" + std::to_string(o.heartbeat_ms), "--set",
      "fault_tolerance.timeout_ms=" + std::to_string(o.timeout_ms)};
  if (o.secure) args.insert(args.end(), {"--keys", dir + "/keys"});
  if (o.coordinator_log.empty()) args.push_back("-q");
  if (o.join_window_ms >= 0)
    args.insert(args.end(),
                {"--set", "fault_tolerance.join_window_ms=" + std::to_string(o.join_window_ms)});
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw error("bench control: pipe failed");
  const int log = open((dir + "/coordinator.log").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  pid_ = proc::spawn_self(args, fds[1], log);
  close(fds[1]);
  if (log >= 0) close(log);
  std::string line;
  char c;
  while (read(fds[0], &c, 1) == 1 && c != '\n') line.push_back(c);
  close(fds[0]);
  const std::string prefix = "coordinator listening on ";
  if (line.rfind(prefix, 0) != 0) {
    std::ifstream in(dir + "/coordinator.log");
    std::stringstream why;
    why << in.rdbuf();
    throw error("bench control: the coordinator did not start: " + why.str());
  }
  endpoint_ = line.substr(prefix.size());
}

bench_coordinator::~bench_coordinator() {
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  if (!keep_.empty()) {
    std::error_code ec;
    std::filesystem::copy_file(log_, keep_, std::filesystem::copy_options::overwrite_existing,
                               ec);
    if (ec)
      std::fprintf(stderr, "bench control: cannot copy the coordinator's log to %s: %s\n",
                   keep_.c_str(), ec.message().c_str());
  }
}

}  // namespace cohort::cli
