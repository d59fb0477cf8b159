#include "tools/launch_warm.hpp"

#include <fcntl.h>
#include <unistd.h>

#include "runtime/core/process.hpp"

namespace cohort::cli {

pid_t warm_worker::start(std::vector<std::string> worker_args) {
  if (pid_ > 0) return pid_;
  int fds[2];
  // Close-on-exec: no other child holds the write end, so close() is its end of input.
  if (::pipe2(fds, O_CLOEXEC) != 0) return 0;
  worker_args.push_back("--name-from-stdin");
  pid_t pid = 0;
  try {
    pid = proc::spawn_self(worker_args, -1, -1, fds[0]);
  } catch (...) {
    ::close(fds[0]);
    ::close(fds[1]);
    return 0;
  }
  ::close(fds[0]);
  pid_ = pid;
  fd_ = fds[1];
  return pid_;
}

pid_t warm_worker::take(const std::string& name, int local_rank) {
  if (pid_ <= 0) return 0;
  const std::string line = name + " " + std::to_string(local_rank) + "\n";
  // A few dozen bytes: one write into an empty pipe, never partial (PIPE_BUF).
  const bool sent = ::write(fd_, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  const pid_t pid = pid_;
  ::close(fd_);
  fd_ = -1;
  pid_ = -1;
  return sent ? pid : 0;
}

bool warm_worker::exited(pid_t pid) {
  if (pid != pid_ || pid_ <= 0) return false;
  close();
  return true;
}

void warm_worker::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  pid_ = -1;
}

}  // namespace cohort::cli
