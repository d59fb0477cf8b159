// proc::limit_cpu (runtime/core/cpu_limit.*): a real cgroup bandwidth limit on a child that
// spins, its CPU time read back from /proc, and the cgroup gone once the child is reaped.
// Skipped (exit 77) where this process may not make cgroups (not root, no cpu controller).
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "runtime/core/cpu_limit.hpp"
#include "runtime/core/error.hpp"

using namespace cohort;

namespace {

void skip_without_cgroups() {
  std::string why;
  if (proc::cpu_cgroup_root(&why)) return;
  std::printf("skipped: %s\n", why.c_str());
  std::fflush(stdout);
  std::_Exit(77);
}

// utime + stime of PID in seconds (/proc/PID/stat fields 14 and 15).
double cpu_seconds(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(f, line);
  std::istringstream ss(line.substr(line.rfind(')') + 2));
  std::string x;
  long long utime = 0, stime = 0;
  for (int field = 3; field <= 15 && ss >> x; ++field) {
    if (field == 14) utime = std::stoll(x);
    if (field == 15) stime = std::stoll(x);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

}  // namespace

TEST_CASE("cpu limit: a spinning child gets at most its quota of CPU time, and its cgroup goes") {
  skip_without_cgroups();
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    for (volatile unsigned long i = 0;; ++i) {
    }
  }
  const std::string dir = proc::limit_cpu(child, 0.2);
  struct stat st {};
  CHECK(stat(dir.c_str(), &st) == 0);
  const double before = cpu_seconds(child);
  const auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  const double used = cpu_seconds(child) - before;
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // The kernel grants 20 ms per 100 ms period: over ~1.5 s at most 0.2 x wall plus one
  // period's quota and a tick of accounting, however idle the machine (unlimited, the
  // spinner would take up to 1.5 s).
  MESSAGE("used " << used << " s of CPU in " << wall << " s");
  CHECK(used <= 0.2 * wall + 0.02 + 0.02);
  CHECK(used > 0.0);
  // Still inside: the cgroup cannot go yet.
  CHECK_FALSE(proc::remove_cpu_limit(dir));
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  CHECK(proc::remove_cpu_limit(dir));
  CHECK(stat(dir.c_str(), &st) != 0);
}

TEST_CASE("cpu limit: a number of cores out of range is refused with the range") {
  for (const double bad : {0.0, -1.0, 0.001, 5000.0}) {
    try {
      proc::limit_cpu(getpid(), bad);
      FAIL("accepted " << bad);
    } catch (const usage_error& e) {
      CHECK(std::string(e.what()).find("[0.01, 1024]") != std::string::npos);
    }
  }
}
