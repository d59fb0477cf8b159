// Signal handlers only write a byte to a pipe; a normal thread (or poll loop) reads it, so
// reacting to a signal may allocate, log and send messages.
#include "runtime/core/process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "runtime/core/error.hpp"

namespace cohort::proc {
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

namespace {

// Written by the handler; only async-signal-safe calls (write) happen there.
std::atomic<int> signal_write_fd{-1};

extern "C" void on_signal_write(int sig) {
  const int saved = errno;
  const int fd = signal_write_fd.load();
  if (fd >= 0) {
    const unsigned char b = static_cast<unsigned char>(sig);
    (void)!write(fd, &b, 1);
  }
  errno = saved;
}

}  // namespace

signal_pipe::signal_pipe(const std::vector<int>& signals) : signals_(signals) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    throw error(std::string("cannot create a signal pipe: ") + std::strerror(errno));
  }
  read_fd_ = fds[0];
  signal_write_fd = fds[1];
  struct sigaction sa {};
  sa.sa_handler = on_signal_write;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : signals_) sigaction(sig, &sa, nullptr);
  // Handlers installed: now the signals may be delivered anywhere.
  sigset_t set;
  sigemptyset(&set);
  for (int sig : signals_) sigaddset(&set, sig);
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
}

signal_pipe::~signal_pipe() {
  struct sigaction sa {};
  sa.sa_handler = SIG_DFL;
  sigemptyset(&sa.sa_mask);
  for (int sig : signals_) sigaction(sig, &sa, nullptr);
  const int w = signal_write_fd.exchange(-1);
  if (w >= 0) close(w);
  close(read_fd_);
}

std::vector<int> signal_pipe::take() {
  std::vector<int> out;
  unsigned char buf[64];
  ssize_t n;
  while ((n = read(read_fd_, buf, sizeof buf)) > 0) out.insert(out.end(), buf, buf + n);
  return out;
}

signal_watcher::signal_watcher(std::function<void(int)> on_signal) : pipe_({SIGINT, SIGTERM}) {
  thread_ = std::thread([this, on_signal = std::move(on_signal)] {
    while (!stop_.load()) {
      // Short waits so the destructor never waits long for this thread.
      pollfd p{pipe_.fd(), POLLIN, 0};
      if (poll(&p, 1, 100) > 0) {
        for (int sig : pipe_.take()) on_signal(sig);
      }
    }
  });
}

signal_watcher::~signal_watcher() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

pid_t spawn_self(const std::vector<std::string>& args, int stdout_fd, int stderr_fd, int stdin_fd) {
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
    if (stdin_fd >= 0) dup2(stdin_fd, STDIN_FILENO);
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

int stop_child(pid_t pid, std::chrono::milliseconds grace, bool* killed) {
  if (killed != nullptr) *killed = false;
  ::kill(pid, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + grace;
  int status = 0;
  for (pid_t r; (r = ::waitpid(pid, &status, WNOHANG)) != pid;) {
    if (r < 0 && errno != EINTR) return -1;
    if (std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    ::kill(pid, SIGKILL);
    if (killed != nullptr) *killed = true;
    while ((r = ::waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
    }
    if (r != pid) return -1;
    break;
  }
  return exit_code_of(status);
}

std::string describe_exit_code(int code) {
  return code > 128 ? "killed by signal " + std::to_string(code - 128)
                    : "exit code " + std::to_string(code);
}

void log_to_stderr() {
  static const bool once = [] {
    auto logger = spdlog::stderr_color_mt("cohort-stderr");
    spdlog::set_default_logger(logger);
    return true;
  }();
  (void)once;
}

std::string private_run_dir(const std::string& name) {
  const char* tmp = std::getenv("TMPDIR");
  const std::string base = tmp != nullptr && *tmp != 0 ? tmp : "/tmp";
  const std::string head = name + "-";
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(base, ec)) {
    const std::string leaf = e.path().filename().string();
    if (leaf.rfind(head, 0) != 0 || !e.is_directory(ec)) continue;
    // NAME-PID-XXXXXX, PID all digits: anything else is not ours.
    const std::size_t dash = leaf.find('-', head.size());
    const std::string pid = leaf.substr(head.size(), dash - head.size());
    if (dash == std::string::npos || pid.empty() ||
        pid.find_first_not_of("0123456789") != std::string::npos || pid.size() > 9)
      continue;
    // Gone: no such process. A pid reused since keeps its folder (never removes a live one).
    if (::kill(static_cast<pid_t>(std::stol(pid)), 0) != 0 && errno == ESRCH)
      std::filesystem::remove_all(e.path(), ec);
  }
  std::string templ = base + "/" + head + std::to_string(::getpid()) + "-XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr)
    throw io_error("cannot make a private folder under " + base + " (" + templ +
                   "): " + std::strerror(errno) + "; set TMPDIR to a writable folder");
  return templ;
}

}  // namespace cohort::proc
