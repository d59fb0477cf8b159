// cluster.bind: which processing units each local rank gets (plan_binding, a pure function,
// as tables), how they print (cpu_list), and bind_self in a forked child: the kernel's own
// affinity (sched_getaffinity) says where it ended up.
#include <doctest/doctest.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/core/cpu_bind.hpp"

using namespace cohort::proc;

namespace {

// N cores of T hardware threads each (core c: PUs c*T .. c*T+T-1), NUMA node c / PER_NODE.
std::vector<core_info> machine(int n, int t = 1, int per_node = 1 << 20) {
  std::vector<core_info> out;
  for (int c = 0; c < n; ++c) {
    core_info k;
    for (int i = 0; i < t; ++i) k.pus.push_back(c * t + i);
    k.numa = c / per_node;
    out.push_back(k);
  }
  return out;
}

}  // namespace

TEST_CASE("cores: contiguous runs as even as they go, one per local rank") {
  struct row {
    int cores, threads, rank, size;
    std::string want;
  };
  const std::vector<row> rows = {
      {8, 1, 0, 2, "0-3"},   {8, 1, 1, 2, "4-7"},  {8, 2, 1, 4, "4-7"},   // 2 cores x 2 threads
      {6, 1, 0, 4, "0"},     {6, 1, 1, 4, "1-2"},  {6, 1, 3, 4, "4-5"},   // 6 over 4: 1,2,1,2
      {2, 1, 0, 1, "0-1"},   {2, 1, 5, 2, "1"},                           // rank past size wraps
      {2, 1, 2, 3, "0"},     {2, 1, 1, 3, "1"},                           // more ranks than cores
  };
  for (const row& r : rows) {
    CAPTURE(r.cores);
    CAPTURE(r.rank);
    CAPTURE(r.size);
    CHECK(cpu_list(plan_binding("cores", machine(r.cores, r.threads), r.rank, r.size)) == r.want);
  }
}

TEST_CASE("numa: a node per local rank, round robin, all of its cores") {
  const auto m = machine(8, 1, 4);  // nodes 0 (cores 0-3) and 1 (4-7)
  CHECK(cpu_list(plan_binding("numa", m, 0, 4)) == "0-3");
  CHECK(cpu_list(plan_binding("numa", m, 1, 4)) == "4-7");
  CHECK(cpu_list(plan_binding("numa", m, 2, 4)) == "0-3");
  // Only some cores allowed (a Slurm task's): the nodes they are on.
  std::vector<core_info> part{m[2], m[3], m[6]};
  CHECK(cpu_list(plan_binding("numa", part, 0, 2)) == "2-3");
  CHECK(cpu_list(plan_binding("numa", part, 1, 2)) == "6");
}

TEST_CASE("no plan for none, an unknown mode, no cores or no workers") {
  CHECK(plan_binding("none", machine(4), 0, 2).empty());
  CHECK(plan_binding("sockets", machine(4), 0, 2).empty());
  CHECK(plan_binding("cores", {}, 0, 2).empty());
  CHECK(plan_binding("cores", machine(4), 0, 0).empty());
}

TEST_CASE("cpu_list writes ranges as the kernel's cpulist files do") {
  CHECK(cpu_list({}) == "");
  CHECK(cpu_list({3}) == "3");
  CHECK(cpu_list({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11");
  CHECK(cpu_list({5, 1, 2, 2}) == "1-2,5");
}

TEST_CASE("bind_self in a child: the kernel's affinity is the plan's, and srun's binding is kept") {
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  // Rank 1 of 2 ("cores") in a child; it writes what the kernel says (sched_getaffinity).
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    ::unsetenv("SLURM_CPU_BIND_TYPE");
    const cpu_binding b = bind_self("cores", 1, 2);
    cpu_set_t set;
    CPU_ZERO(&set);
    sched_getaffinity(0, sizeof set, &set);
    std::vector<int> pus;
    for (int i = 0; i < CPU_SETSIZE; ++i)
      if (CPU_ISSET(i, &set)) pus.push_back(i);
    const std::string line = (b.bound ? "bound " : "not ") + cpu_list(pus) + " " + b.cpus + "\n";
    if (::write(fds[1], line.data(), line.size()) < 0) _exit(2);
    _exit(0);
  }
  ::close(fds[1]);
  char buf[256] = {};
  const ssize_t got = ::read(fds[0], buf, sizeof buf - 1);
  ::close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  REQUIRE(got > 0);
  const std::string said(buf);
  CAPTURE(said);
  if (online >= 2) {
    CHECK(said.rfind("bound ", 0) == 0);
    // What the kernel reports is what bind_self said, and not the whole machine.
    const std::string kernel = said.substr(6, said.find(' ', 6) - 6);
    CHECK(said.find(" " + kernel + "\n") != std::string::npos);
    CHECK(kernel != cpu_list([&] {
            std::vector<int> all;
            for (int i = 0; i < online; ++i) all.push_back(i);
            return all;
          }()));
  }
  // A task srun bound (one worker a task): kept, and said so.
  ::setenv("SLURM_CPU_BIND_TYPE", "mask_cpu:", 1);
  const cpu_binding kept = bind_self("cores", 0, 1);
  ::unsetenv("SLURM_CPU_BIND_TYPE");
  CHECK_FALSE(kept.bound);
  CHECK(kept.note.find("kept the binding srun gave") != std::string::npos);
  CHECK(kept.cpus == current_cpus());
}
