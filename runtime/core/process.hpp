// Process plumbing shared by the control-plane commands: which thread receives SIGINT /
// SIGTERM, starting child cohort processes that die with their parent, and logging to
// stderr (stdout carries the lines other programs parse). POSIX only; no CAF, no sockets.
#pragma once
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace cohort::proc {

/// Blocks SIGINT and SIGTERM in the calling thread. Call it before starting threads, so
/// the signals are delivered to a thread that is not busy (any thread runs the handler).
void block_termination_signals();

/// Turns SIGNALS into bytes on a pipe (self-pipe trick): a handler that only write()s is
/// installed for each, so a signal can never take its default action in some thread we
/// did not create (a library's thread pool that predates any sigmask we set). One instance
/// per process at a time.
class signal_pipe {
 public:
  explicit signal_pipe(const std::vector<int>& signals);
  ~signal_pipe();  ///< restores the default actions
  signal_pipe(const signal_pipe&) = delete;
  signal_pipe& operator=(const signal_pipe&) = delete;

  /// Read end, for poll(): readable when a signal arrived.
  int fd() const { return read_fd_; }
  /// Signals received since the last call, oldest first (non-blocking).
  std::vector<int> take();

 private:
  std::vector<int> signals_;
  int read_fd_ = -1;
};

/// A thread that waits for SIGINT / SIGTERM and calls on_signal(signo) for each one.
class signal_watcher {
 public:
  explicit signal_watcher(std::function<void(int)> on_signal);
  ~signal_watcher();
  signal_watcher(const signal_watcher&) = delete;
  signal_watcher& operator=(const signal_watcher&) = delete;

 private:
  signal_pipe pipe_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

/// Starts `/proc/self/exe ARGS...` (this very cohort binary) as a child: same process group,
/// SIGKILLed by the kernel if this process dies (PR_SET_PDEATHSIG), signal mask cleared.
/// stdout_fd / stderr_fd >= 0 become the child's stdout / stderr. Throws cohort::error when
/// fork fails.
pid_t spawn_self(const std::vector<std::string>& args, int stdout_fd = -1, int stderr_fd = -1,
                 int stdin_fd = -1);

/// Exit status of a waitpid() result as one number: the exit code, or 128 + signal.
int exit_code_of(int wait_status);
/// Stops the child PID: SIGTERM, up to GRACE for it to exit, then SIGKILL; reaps it and returns
/// its exit code (exit_code_of; -1 when it was not a child waiting to be reaped). *KILLED:
/// whether it needed SIGKILL.
int stop_child(pid_t pid, std::chrono::milliseconds grace, bool* killed = nullptr);
/// exit_code_of's number in words: "exit code N" or "killed by signal N" (above 128).
std::string describe_exit_code(int code);

/// A private folder (0700) for this process's run files: $TMPDIR (else /tmp)/NAME-PID-XXXXXX.
/// First removes the NAME-PID-* folders of processes that are gone (a launch killed
/// outright cannot remove its own: its keys or etcd data would pile up). Throws io_error.
std::string private_run_dir(const std::string& name);

/// Routes spdlog's default logger to stderr (once per process).
void log_to_stderr();

}  // namespace cohort::proc
