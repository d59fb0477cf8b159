// Signals are taken synchronously (sigtimedwait on a dedicated thread) rather than by
// handlers, so reacting to them may allocate, log and send messages.
#include "actors/process.hpp"

#include <signal.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "runtime/core/error.hpp"

namespace cohort::actors {
namespace {

sigset_t termination_set() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

}  // namespace

void block_termination_signals() {
  sigset_t set = termination_set();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

signal_watcher::signal_watcher(std::function<void(int)> on_signal) {
  thread_ = std::thread([this, on_signal = std::move(on_signal)] {
    const sigset_t set = termination_set();
    // Short waits so the destructor never waits long for this thread.
    const timespec period{0, 100 * 1000 * 1000};
    while (!stop_.load()) {
      const int sig = sigtimedwait(&set, nullptr, &period);
      if (sig > 0) on_signal(sig);
    }
  });
}

signal_watcher::~signal_watcher() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

pid_t spawn_self(const std::vector<std::string>& args, int stdout_fd, int stderr_fd) {
  std::vector<std::string> argv_s;
  argv_s.push_back("cohort");
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  // Built before fork: the child must not allocate (another thread may hold malloc's lock).
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) throw error(std::string("cannot start a child process: ") + std::strerror(errno));
  if (pid == 0) {
    // Backstop against orphans: if the parent dies (even by SIGKILL) the kernel kills us.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);  // the parent died before prctl took effect
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    if (stdout_fd >= 0) dup2(stdout_fd, STDOUT_FILENO);
    if (stderr_fd >= 0) dup2(stderr_fd, STDERR_FILENO);
    execv("/proc/self/exe", argv.data());
    _exit(127);
  }
  return pid;
}

int exit_code_of(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return 1;
}

void log_to_stderr() {
  static const bool once = [] {
    auto logger = spdlog::stderr_color_mt("cohort-stderr");
    spdlog::set_default_logger(logger);
    return true;
  }();
  (void)once;
}

}  // namespace cohort::actors
