// The warm worker of `cohort launch` (elastic.respawn): one `cohort worker --name-from-stdin`
// process started ahead of the next respawn, its exec, libraries and keys done, blocked on
// its stdin until launch writes the name it takes. Owns that process's pipe; launch owns
// the process itself (its children and their exits).
#pragma once
#include <sys/types.h>

#include <string>
#include <vector>

namespace cohort::cli {

class warm_worker {
 public:
  warm_worker() = default;
  warm_worker(const warm_worker&) = delete;
  warm_worker& operator=(const warm_worker&) = delete;
  ~warm_worker() { close(); }

  /// Starts `cohort WORKER_ARGS --name-from-stdin` unless one is waiting already: its pid,
  /// or 0 when none could be started (the next respawn then starts cold).
  pid_t start(std::vector<std::string> worker_args);
  /// Hands it NAME and LOCAL_RANK ("NAME LOCAL_RANK\n"; a line written before its exec is
  /// done waits in the pipe): its pid, now that worker's, or 0 when none waits or its pipe
  /// is broken (it died). Either way no warm worker waits afterwards.
  pid_t take(const std::string& name, int local_rank);
  /// Process PID exited: true when it was the waiting one, now forgotten.
  bool exited(pid_t pid);
  /// The end of its input: a waiting one exits 0.
  void close();
  /// The waiting one's pid, or -1.
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;  ///< the write end of its stdin
};

}  // namespace cohort::cli
