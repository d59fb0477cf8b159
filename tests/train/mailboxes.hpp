// The links between the pipeline stages of one process, for tests that run each stage on a
// thread of its own: a message sent from stage `from` to stage `to` under a tag waits in a
// mailbox until the receiver takes it (what the point-to-point channel does between processes).
#pragma once
#include <doctest/doctest.h>

#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

namespace cohort::test {

/// Messages between stages of one process: (from, to, tag) -> bytes, waited for.
class mailboxes {
 public:
  void send(int from, int to, uint64_t tag, const void* d, std::size_t n) {
    std::lock_guard<std::mutex> l(mu_);
    const char* c = static_cast<const char*>(d);
    box_[{from, to, tag}].assign(c, c + n);
    cv_.notify_all();
  }
  void recv(int from, int to, uint64_t tag, void* d, std::size_t n) {
    std::unique_lock<std::mutex> l(mu_);
    const auto key = std::make_tuple(from, to, tag);
    cv_.wait(l, [&] { return box_.count(key) != 0; });
    REQUIRE(box_[key].size() == n);
    std::memcpy(d, box_[key].data(), n);
    box_.erase(key);
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::tuple<int, int, uint64_t>, std::vector<char>> box_;
};

}  // namespace cohort::test
