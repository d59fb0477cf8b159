// One Chrome trace-event file for a whole job (the JSON object format: loads in Perfetto and
// chrome://tracing): a process track per worker and one for the coordinator, events on the
// coordinator's steady clock (workers' spans arrive already shifted by their clock offset).
// Events are queued and written by a background thread, so the coordinator's actor never
// waits for the disk; past `max_pending` queued events new ones are dropped and counted
// (the file's otherData says how many). The file appears under its name only when closed
// complete: until then it is PATH.partial, so a reader never takes half a trace for one.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "runtime/core/trace.hpp"

namespace cohort::obs {

class trace_file {
 public:
  /// Creates PATH.partial for writing; usage_error (exit 2) naming PATH when it cannot be
  /// (no such folder, no permission). ZERO_NS: the coordinator clock's time shown as 0.
  trace_file(std::string path, int64_t zero_ns, std::size_t max_pending = 1 << 20);
  /// close().
  ~trace_file();
  trace_file(const trace_file&) = delete;
  trace_file& operator=(const trace_file&) = delete;

  /// Names process PID (sorted by SORT_INDEX in the viewer) and its thread TID.
  void name_process(int pid, const std::string& name, int sort_index);
  void name_thread(int pid, uint32_t tid, const std::string& name);
  /// One event, its ts_ns on the coordinator's clock.
  void add(int pid, const trace::event& e);
  /// A key of the file's otherData (clock offsets and errors, the run's figures).
  void set_meta(const std::string& key, nlohmann::json value);

  /// Writes what is queued, the metadata and the closing brackets, and renames the file
  /// into place. Idempotent. Throws cohort::error when the disk refused the file (or the
  /// writer failed on an event): what was written stays in PATH.partial.
  void close();
  /// Stops and removes PATH.partial: nothing ran that the trace could show (the command
  /// failed to start). Idempotent; after close() it does nothing.
  void abandon();

  const std::string& path() const { return path_; }
  uint64_t dropped() const;

 private:
  void writer_loop();
  std::string format(int pid, const trace::event& e) const;

  const std::string path_;
  const int64_t zero_ns_;
  const std::size_t max_pending_;
  std::FILE* out_ = nullptr;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  // Queued, oldest first: an event to format (on the writer's thread, off the caller's), or
  // a line already formatted (metadata).
  struct item {
    int pid = 0;
    trace::event e;
    std::string line;
  };
  std::deque<item> pending_;
  nlohmann::json meta_ = nlohmann::json::object();
  bool closing_ = false;
  bool closed_ = false;
  bool failed_ = false;
  uint64_t written_ = 0;
  uint64_t dropped_ = 0;
  std::thread writer_;
};

}  // namespace cohort::obs
