// Helpers of the bridge tests over real sockets (test_zmq_bridge, test_curve): an inbox a
// bridge callback fills (and tests/eventually.hpp for polling with a deadline).
#pragma once
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/net/zmq_bridge.hpp"
#include "tests/eventually.hpp"

namespace cohort::test {

/// Thread-safe inbox filled by a bridge callback.
class inbox {
 public:
  net::zmq_bridge::inbound_fn fn() {
    return [this](const net::sender& from, net::message m) {
      std::lock_guard<std::mutex> lock(mu);
      items.emplace_back(from.peer, std::move(m));
      roles.push_back(from.role);
      cv.notify_all();
    };
  }
  /// True once N messages arrived within TIMEOUT.
  bool wait_for(size_t n, std::chrono::milliseconds timeout = std::chrono::milliseconds(10000)) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, timeout, [&] { return items.size() >= n; });
  }
  size_t size() {
    std::lock_guard<std::mutex> lock(mu);
    return items.size();
  }
  std::pair<std::string, net::message> at(size_t i) {
    std::lock_guard<std::mutex> lock(mu);
    return items.at(i);
  }
  /// The key role the bridge gave the I-th message's sender (nullopt without CURVE).
  std::optional<net::key_role> role_at(size_t i) {
    std::lock_guard<std::mutex> lock(mu);
    return roles.at(i);
  }

 private:
  // Appended by the bridge's thread: read only under the lock (size, at, wait_for).
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<std::string, net::message>> items;
  std::vector<std::optional<net::key_role>> roles;
};

}  // namespace cohort::test
