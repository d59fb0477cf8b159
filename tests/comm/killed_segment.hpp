// A shared-memory segment left by a process that died holding it: what the unit and the
// launch tests of stale-segment removal (runtime/comm/shm_names.hpp) start from.
#pragma once
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <string>

#include "runtime/comm/shm_names.hpp"

namespace cohort::test {

/// A child makes a segment of BYTES named as shm_comm names them (generation GEN), reports
/// the name through a pipe and waits to be killed (as the workers of a launch SIGKILLed
/// mid-rendezvous); returns the name once the child is SIGKILLed and reaped.
inline std::string segment_of_a_killed_child(int gen, std::size_t bytes) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    const std::string name = cohort::comm::shm_segment_name(gen);
    const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) ::_exit(1);
    const std::string line = name + "\n";
    if (::write(fds[1], line.data(), line.size()) != static_cast<ssize_t>(line.size())) ::_exit(1);
    for (;;) ::pause();
  }
  ::close(fds[1]);
  std::string name;
  char c = 0;
  while (::read(fds[0], &c, 1) == 1 && c != '\n') name += c;
  ::close(fds[0]);
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  return name;
}

}  // namespace cohort::test
