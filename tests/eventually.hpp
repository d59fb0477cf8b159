// Polling with a deadline, for tests that wait on another thread or process: the one
// definition the unit, node and multi-process helpers share.
#pragma once
#include <chrono>
#include <functional>
#include <thread>

namespace cohort::test {

/// Polls PRED every 2 ms until it holds or TIMEOUT passes; its last value.
inline bool eventually(std::chrono::milliseconds timeout, const std::function<bool()>& pred) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return pred();
}

}  // namespace cohort::test
