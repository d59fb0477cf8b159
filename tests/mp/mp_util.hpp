// Helpers for multi-process tests: start the built `cohort` binary as children in their own
// process groups, and always kill those groups (RAII) even when a check fails midway.
// Only for tests/mp; nothing here is part of the runtime.
#pragma once
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/eventually.hpp"

namespace cohort::mp {

using std::chrono::milliseconds;
using clock_type = std::chrono::steady_clock;

/// How much slower than a plain build the processes under test run: COHORT_TEST_TIME_SCALE
/// (a whole number >= 1, default 1). .ci/run sets it for the ThreadSanitizer build, whose
/// processes run 5-15x slower, so that a timeout meant to catch a dead worker does not
/// catch a merely instrumented one. Tests multiply the timings they configure by it.
inline int time_scale() {
  const char* e = std::getenv("COHORT_TEST_TIME_SCALE");
  const int v = e != nullptr ? std::atoi(e) : 1;
  return v >= 1 ? v : 1;
}

/// Path of the cohort executable under test.
inline std::string cohort_binary() { return std::string(COHORT_BINARY_DIR) + "/cohort"; }

/// A scratch directory removed on destruction.
class temp_dir {
 public:
  temp_dir() {
    char tmpl[] = "/tmp/cohort-mp-XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  /// Removes the folder and its children's logs, unless COHORT_TEST_KEEP is set (to debug
  /// a failing case: the folder is then named on stderr and left).
  ~temp_dir() {
    if (std::getenv("COHORT_TEST_KEEP") != nullptr) {
      std::fprintf(stderr, "kept %s (COHORT_TEST_KEEP)\n", path_.c_str());
      return;
    }
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  /// Writes TEXT to NAME inside the directory; returns the full path.
  std::string write(const std::string& name, const std::string& text) const {
    const std::string p = path_ + "/" + name;
    std::ofstream(p) << text;
    return p;
  }

 private:
  std::string path_;
};

inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// Another program than cohort for a child_process (an etcd, say): its path.
struct program {
  std::string path;
};

/// One `cohort ARGS...` child, leader of its own process group, stdout/stderr in files.
/// ENV ("NAME=VALUE" entries) is added to the test's own environment for the child.
/// The destructor SIGKILLs the whole group and reaps the child: no test leaves processes.
class child_process {
 public:
  /// PREFIX runs before the binary (e.g. {"/usr/sbin/ip", "netns", "exec", NS}: it execs
  /// cohort in that network namespace, so the pid is still cohort's).
  child_process(const std::vector<std::string>& args, const std::string& dir,
                const std::string& tag, const std::vector<std::string>& env = {},
                const std::vector<std::string>& prefix = {})
      : child_process(program{cohort_binary()}, args, dir, tag, env, prefix) {}
  /// The same for PROG ARGS...
  child_process(const program& prog, const std::vector<std::string>& args,
                const std::string& dir, const std::string& tag,
                const std::vector<std::string>& env = {},
                const std::vector<std::string>& prefix = {})
      : out_path_(dir + "/" + tag + ".out"), err_path_(dir + "/" + tag + ".err") {
    std::vector<std::string> all(prefix);
    all.push_back(prog.path);
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    // Built before fork: the child only calls exec (nothing that allocates).
    std::vector<std::string> env_all(env);
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string entry(*e);
      bool overridden = false;
      for (const auto& x : env)
        overridden |= x.substr(0, x.find('=') + 1) == entry.substr(0, entry.find('=') + 1);
      if (!overridden) env_all.push_back(entry);
    }
    std::vector<char*> envp;
    for (auto& e : env_all) envp.push_back(e.data());
    envp.push_back(nullptr);
    const pid_t parent = ::getpid();
    // Unflushed test output would otherwise be written twice (once by the child).
    std::fflush(stdout);
    std::fflush(stderr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // the test binary died: so do we
      if (::getppid() != parent) ::_exit(1);
      if (!std::freopen(out_path_.c_str(), "w", stdout)) ::_exit(1);
      if (!std::freopen(err_path_.c_str(), "w", stderr)) ::_exit(1);
      ::execve(argv[0], argv.data(), envp.data());
      ::_exit(127);
    }
    // Also from the parent, so a kill right after fork already finds the group.
    if (pid_ > 0) ::setpgid(pid_, pid_);
  }
  ~child_process() {
    if (pid_ <= 0) return;
    ::kill(-pid_, SIGKILL);
    if (!reaped_) ::waitpid(pid_, nullptr, 0);
  }
  child_process(const child_process&) = delete;
  child_process& operator=(const child_process&) = delete;

  pid_t pid() const { return pid_; }
  std::string out() const { return read_file(out_path_); }
  std::string err() const { return read_file(err_path_); }
  void signal(int sig) const { ::kill(pid_, sig); }

  /// Exit code (or 128 + signal) if the child ends within TIMEOUT.
  std::optional<int> wait_exit(milliseconds timeout) {
    if (reaped_) return code_;
    const auto deadline = clock_type::now() + timeout;
    while (true) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        reaped_ = true;
        code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        return code_;
      }
      if (clock_type::now() >= deadline) return std::nullopt;
      std::this_thread::sleep_for(milliseconds(10));
    }
  }

  /// Waits until stdout contains PREFIX at the start of a line; returns the rest of it.
  std::optional<std::string> wait_line(const std::string& prefix, milliseconds timeout) const {
    const auto deadline = clock_type::now() + timeout;
    while (clock_type::now() < deadline) {
      std::istringstream in(out());
      std::string line;
      while (std::getline(in, line)) {
        if (line.rfind(prefix, 0) == 0 && in.good()) return line.substr(prefix.size());
      }
      std::this_thread::sleep_for(milliseconds(10));
    }
    return std::nullopt;
  }

 private:
  pid_t pid_ = -1;
  std::string out_path_, err_path_;
  bool reaped_ = false;
  int code_ = -1;
};

/// Runs the shell command CMD to completion: its exit code, its stdout into *OUT if given.
inline int run_shell(const std::string& cmd, std::string* out = nullptr) {
  FILE* p = ::popen(cmd.c_str(), "r");
  std::string text;
  char buf[4096];
  size_t n;
  while (p != nullptr && (n = std::fread(buf, 1, sizeof buf, p)) > 0) text.append(buf, n);
  const int status = p != nullptr ? ::pclose(p) : -1;
  if (out != nullptr) *out = text;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/// Runs `cohort ARGS...` to completion and returns its stdout; stderr is discarded, or
/// with WITH_STDERR returned too (so that an error message can be checked).
inline std::string run_capture(const std::string& args, int* exit_code = nullptr,
                               bool with_stderr = false) {
  std::string out;
  const int code = run_shell(
      cohort_binary() + " " + args + (with_stderr ? " 2>&1" : " 2>/dev/null"), &out);
  if (exit_code != nullptr) *exit_code = code;
  return out;
}

using cohort::test::eventually;

/// Pids of every process whose process group is PGID (from /proc/<pid>/stat).
inline std::vector<pid_t> processes_in_group(pid_t pgid) {
  std::vector<pid_t> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = read_file(e.path().string() + "/stat");
    // Fields after the command (which may contain spaces) start after the last ')'.
    const auto close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream in(stat.substr(close + 2));
    std::string state;
    long ppid = 0, pgrp = 0;
    in >> state >> ppid >> pgrp;
    if (pgrp == pgid && state != "Z") out.push_back(static_cast<pid_t>(std::stol(name)));
  }
  return out;
}

}  // namespace cohort::mp
