// The process's trace recorder: spans (forward, backward, a bucket's collective, the
// optimizer step, a checkpoint write ...) and instants, timed on this process's steady clock
// and kept in memory until the owner takes them (a worker ships them to its coordinator
// with each step; the coordinator writes one Chrome trace for the job, runtime/obs/trace_file).
// Off by default, and then every record call is one relaxed atomic load. The buffer is
// bounded: past `capacity` events nothing is kept and dropped() counts what was lost.
#pragma once
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace cohort::trace {

/// The thread a span ran on, as the trace's tracks (tid) name them.
enum track : uint32_t {
  compute = 0,  ///< forward, backward, the optimizer, evaluation, checkpoints
  comm = 1,     ///< data-parallel collectives (the bucket engine's communication thread)
  p2p = 2,      ///< pipeline sends and receives
  control = 3,  ///< the step as the worker saw it: setup, state transfer, waits
};

/// Name of a track ("compute").
const char* track_name(uint32_t t);

/// One recorded event. ph: 'X' a span (dur_ns), 'i' an instant.
struct event {
  std::string name;
  std::string cat;
  char ph = 'X';
  int64_t ts_ns = 0;  ///< this process's steady clock (now_ns())
  int64_t dur_ns = 0;
  uint32_t tid = track::compute;
  std::string args;  ///< a JSON object's members without braces ("\"mb\":0,\"step\":3"), or empty
};

/// Steady-clock nanoseconds, the clock every event is timed on.
int64_t now_ns();
/// A steady_clock time point in the same nanoseconds.
inline int64_t ns(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

/// True while recording. One relaxed load: the price of a record call when tracing is off.
inline std::atomic<bool>& enabled_flag() {
  static std::atomic<bool> on{false};
  return on;
}
inline bool enabled() { return enabled_flag().load(std::memory_order_relaxed); }

/// Starts (or stops) recording, keeping at most CAPACITY events between two take() calls.
void enable(bool on, std::size_t capacity = 1 << 16);

/// Records a span [start_ns, end_ns) (nothing when tracing is off).
void complete(const char* name, const char* cat, int64_t start_ns, int64_t end_ns, uint32_t tid,
              std::string args = {});
/// Records an instant at at_ns.
void instant(const char* name, const char* cat, int64_t at_ns, uint32_t tid, std::string args = {});

/// Takes every event recorded since the last take(), oldest first.
std::vector<event> take();
/// Events that did not fit in the buffer since recording started.
uint64_t dropped();

/// Formats the args of an event: args({"mb", 3}, {"step", 12}) -> "\"mb\":3,\"step\":12";
/// empty while tracing is off (call sites need no test of their own).
std::string args(std::initializer_list<std::pair<const char*, int64_t>> kv);

/// The args this thread's spans carry when they name none: the trainer sets the step and
/// micro-batch before it calls the model, whose forward and backward spans then say which.
const std::string& context();
/// Sets this thread's context for as long as the returned guard lives.
class context_scope {
 public:
  explicit context_scope(std::string args);
  ~context_scope();
  context_scope(const context_scope&) = delete;
  context_scope& operator=(const context_scope&) = delete;

 private:
  std::string previous_;
};

/// A span from construction to destruction on TRACK (when tracing was on at construction).
class span {
 public:
  /// No ARGS: the thread's context().
  span(const char* name, const char* cat, uint32_t tid, std::string a = {})
      : name_(name), cat_(cat), tid_(tid), args_(std::move(a)), start_(enabled() ? now_ns() : -1) {
    if (start_ >= 0 && args_.empty()) args_ = context();
  }
  ~span() {
    if (start_ < 0) return;
    try {
      complete(name_, cat_, start_, now_ns(), tid_, std::move(args_));
    } catch (...) {
      // Out of memory: the span is lost; a destructor must not throw.
    }
  }
  span(const span&) = delete;
  span& operator=(const span&) = delete;

 private:
  const char* name_;
  const char* cat_;
  uint32_t tid_;
  std::string args_;
  int64_t start_;
};

}  // namespace cohort::trace
