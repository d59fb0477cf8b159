// Collectives across real processes (comm_mp_helper, one per rank) meeting through a file
// store: exact sums, and a rank that dies (SIGKILL) or hangs (SIGSTOP) mid-run makes the
// others fail with comm_error: fast for a death (sockets close), by the timeout for a hang.
// Children are always reaped, and killed if still running when a check ends.
#include <doctest/doctest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

namespace {

const std::string kHelper = std::string(COHORT_BINARY_DIR) + "/tests/comm/comm_mp_helper";

struct outcome {
  bool exited = false;
  int code = -1;                // exit code when exited
  int signal = 0;               // terminating signal otherwise
  bool stopped_killed = false;  // still alive (e.g. stopped) at the end: we killed it
};

// Runs `size` helpers; waits up to `limit_s`, then kills whatever is left.
std::vector<outcome> run_group(const std::string& mode, int size, int timeout_ms, double limit_s,
                               double* took_s) {
  char tmpl[] = "/tmp/cohort-test-mp-XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  const std::string dir = tmpl;
  std::vector<pid_t> pids;
  for (int r = 0; r < size; ++r) {
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      const std::string rank = std::to_string(r), n = std::to_string(size),
                        t = std::to_string(timeout_ms);
      execl(kHelper.c_str(), kHelper.c_str(), mode.c_str(), rank.c_str(), n.c_str(), dir.c_str(),
            t.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    pids.push_back(pid);
  }
  std::vector<outcome> out(size);
  std::vector<bool> done(size, false);
  int left = size;
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  while (left > 0 && elapsed() < limit_s) {
    for (int r = 0; r < size; ++r) {
      if (done[r]) continue;
      int status = 0;
      if (waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        done[r] = true;
        --left;
        out[r].exited = WIFEXITED(status);
        out[r].code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        out[r].signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      }
    }
    // Survivors are what we time: stop as soon as only stopped (SIGSTOP) ranks remain.
    if (mode == "hang" && left == 1 && !done[size - 1]) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  *took_s = elapsed();
  for (int r = 0; r < size; ++r) {
    if (done[r]) continue;
    kill(pids[r], SIGKILL);
    waitpid(pids[r], nullptr, 0);
    out[r].stopped_killed = true;
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return out;
}

}  // namespace

TEST_CASE("processes reduce exactly through the file store with 2 and 3 ranks") {
  for (int size : {2, 3}) {
    CAPTURE(size);
    double took = 0;
    auto out = run_group("sum", size, 10000, 120.0, &took);
    for (int r = 0; r < size; ++r) {
      CAPTURE(r);
      CHECK(out[r].exited);
      CHECK(out[r].code == 0);
    }
  }
}

TEST_CASE("a rank killed mid-run makes the survivors fail at once and not at the timeout") {
  double took = 0;
  auto out = run_group("die", 3, 60000, 120.0, &took);
  CHECK(out[2].signal == SIGKILL);
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(out[r].exited);
    CHECK(out[r].code == 3);  // comm_error
  }
  CHECK(took < 30.0);  // the collective timeout is 60 s: the closed sockets told them
}

TEST_CASE("a rank that hangs mid-run makes the survivors fail by the timeout") {
  double took = 0;
  auto out = run_group("hang", 3, 500, 120.0, &took);
  CHECK(out[2].stopped_killed);  // it was stopped, we killed it
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(out[r].exited);
    CHECK(out[r].code == 3);
  }
  CHECK(took < 60.0);
}
