// The one family of recoverable errors in runtime/ and the process exit codes.
// Expected failures (bad YAML, missing data package, corrupt checkpoint, peer gone)
// are thrown as cohort::error subclasses carrying a message a user can act on;
// broken invariants use COHORT_CHECK, which aborts with file:line.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace cohort {

/// Process exit codes used by every subcommand (documented in README and docs/).
/// exit_stopped: a run stopped early on purpose with a complete checkpoint of the step it
/// stopped at (fault_tolerance.on_sigterm: checkpoint, `cohort ctl stop --checkpoint`):
/// `--resume` goes on from it.
/// exit_device_stuck: a worker whose GPU communicator's abort did not return (NCCL's
/// ncclCommAbort can hang) left its groups as a dead member; the launcher replaces it.
enum exit_code : int {
  exit_ok = 0,
  exit_runtime = 1,
  exit_usage = 2,
  exit_stopped = 3,
  exit_device_stuck = 4
};

/// Base of every recoverable error; `what()` is the user-facing message.
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
  /// Exit code a command should return when this error ends it.
  virtual int exit_status() const { return exit_runtime; }
};

/// Invalid configuration or command line: exit code 2.
class usage_error : public error {
 public:
  using error::error;
  int exit_status() const override { return exit_usage; }
};

class io_error : public error { public: using error::error; };
class data_error : public error { public: using error::error; };
class checkpoint_error : public error { public: using error::error; };
class protocol_error : public error { public: using error::error; };

}  // namespace cohort

/// Invariant check: a broken invariant is a bug, so abort with file:line.
#define COHORT_CHECK(cond)                                                             \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      std::fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                    \
    }                                                                                  \
  } while (0)
