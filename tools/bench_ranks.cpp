#include "tools/bench_ranks.hpp"

#include <CLI/CLI.hpp>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

#include "runtime/core/error.hpp"

namespace cohort::cli {

// "4096", "4K", "1M", "64MiB" -> bytes (K/M/G are powers of 1024).
std::size_t parse_size(const std::string& text) {
  std::size_t pos = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(text, &pos);
  } catch (const std::exception&) {
    throw usage_error("--sizes: '" + text + "' is not a size (examples: 4096, 64K, 1M, 16MiB)");
  }
  std::string unit = text.substr(pos);
  if (unit.size() == 3 && (unit.substr(1) == "iB" || unit.substr(1) == "ib"))
    unit = unit.substr(0, 1);
  if (unit.empty() || unit == "B") return v;
  if (unit == "K" || unit == "k") return v << 10;
  if (unit == "M" || unit == "m") return v << 20;
  if (unit == "G" || unit == "g") return v << 30;
  throw usage_error("--sizes: unknown unit in '" + text + "' (use K, M or G)");
}

// The subcommand names from the root to `cmd` ("bench", "allreduce"), so a child is
// started with the same command line shape whatever app it is registered in.
std::vector<std::string> command_path(const CLI::App* cmd) {
  std::vector<std::string> path;
  for (const CLI::App* a = cmd; a != nullptr && a->get_parent() != nullptr; a = a->get_parent())
    path.insert(path.begin(), a->get_name());
  return path;
}

// Starts the ranks, waits for all; on the first failure kills the rest. Throws on failure.
void run_ranks(const std::vector<std::vector<std::string>>& argvs) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids;
  for (const auto& args : argvs) {
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    const pid_t pid = fork();
    if (pid < 0) {
      for (pid_t p : pids) kill(p, SIGKILL);
      for (pid_t p : pids) waitpid(p, nullptr, 0);
      throw error("bench: fork failed");
    }
    if (pid == 0) {
      execv("/proc/self/exe", argv.data());
      std::perror("bench: exec /proc/self/exe");
      _exit(127);
    }
    pids.push_back(pid);
  }
  std::string failure;
  std::size_t running = pids.size();
  std::vector<bool> done(pids.size(), false);
  while (running > 0) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0) break;
    for (std::size_t r = 0; r < pids.size(); ++r) {
      if (pids[r] != pid || done[r]) continue;
      done[r] = true;
      --running;
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!ok && failure.empty()) {
        failure = "rank " + std::to_string(r) + " " +
                  (WIFEXITED(status) ? "exited with code " + std::to_string(WEXITSTATUS(status))
                                     : "was killed by signal " + std::to_string(WTERMSIG(status)));
        for (std::size_t k = 0; k < pids.size(); ++k)
          if (!done[k]) kill(pids[k], SIGKILL);  // the others would only wait for it
      }
    }
  }
  if (!failure.empty()) throw error("bench: " + failure + " (see its message above)");
}

}  // namespace cohort::cli
