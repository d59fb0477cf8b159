// Two kv_clients that need no coordinator: memory_kv (one process: ranks as threads in
// tests) and file_kv (processes on one machine sharing a directory: the multi-process
// tests and `cohort bench allreduce`). The coordinator-backed kv_client lives in actors/.
#pragma once
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/comm/kv_client.hpp"

namespace cohort::comm {

/// In-process store: a map under a mutex, waits on a condition variable.
class memory_kv : public kv_client {
 public:
  void set(const std::string& key, const std::vector<char>& value) override;
  std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;

  /// Keys currently set (tests check what a rendezvous left behind).
  std::vector<std::string> keys() const;

  /// Test seam, empty in production: called by a get or wait that finds a key missing, just
  /// before it waits (with the store's lock held, so a set from the hook's signal lands
  /// while the caller waits). Set before the store is shared.
  std::function<void()> before_wait;

 private:
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::vector<char>> values_;
};

/// Store in a directory every rank can reach (a local temp dir). One file per key, named
/// by the percent-encoded key, written to a temporary name and renamed into place, so a
/// reader sees a whole value or none. Waits poll (1 ms growing to 20 ms): rendezvous
/// happens once per generation, so latency matters little and no inotify is needed.
class file_kv : public kv_client {
 public:
  /// Uses `dir`, creating it (one level) if missing; throws comm_error(rendezvous) if it
  /// cannot.
  explicit file_kv(std::string dir);

  void set(const std::string& key, const std::vector<char>& value) override;
  std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;

  const std::string& dir() const { return dir_; }

  /// Test seam, empty in production: called by a get or wait that finds a key missing, just
  /// before it starts polling. Set before the store is shared.
  std::function<void()> before_wait;
  /// The file that holds `key` (percent-encoding keeps '/' and odd bytes out of names).
  std::string path_of(const std::string& key) const;

 private:
  std::string dir_;
};

}  // namespace cohort::comm
