// device_staged_comm (runtime/comm/device_staged_comm.hpp) over the CPU fake of the NCCL
// communicator: a host buffer goes through the device scratch (copied in before, out after,
// exactly), a device buffer passes straight through, and the communicator underneath only
// ever sees device memory. "Device memory" is a fake arena: what it allocated is device.
#include <doctest/doctest.h>

#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/comm/device_staged_comm.hpp"
#include "tests/comm/fake_device_comm.hpp"

using namespace cohort::comm;
using namespace cohort::comm::testing;

namespace {

// Device memory of a pretend GPU: blocks it allocated are "device", everything else host.
class fake_arena {
 public:
  bool is_device(const void* p) const {
    std::lock_guard<std::mutex> lock(mu_);
    const char* c = static_cast<const char*>(p);
    auto it = blocks_.upper_bound(c);
    if (it == blocks_.begin()) return false;
    --it;
    return c >= it->first && c < it->first + it->second.size();
  }
  char* allocate(std::size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<char> block(bytes, '\x7f');  // not zero: a missing copy shows
    char* p = block.data();
    blocks_.emplace(p, std::move(block));
    ++allocations_;
    return p;
  }
  void release(void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    blocks_.erase(static_cast<char*>(p));
  }
  staging_memory memory() {
    staging_memory m;
    m.is_device = [this](const void* p) { return is_device(p); };
    m.allocate = [this](std::size_t n) { return static_cast<void*>(allocate(n)); };
    m.release = [this](void* p) { release(p); };
    m.to_device = [this](void* d, const void* h, std::size_t n) {
      REQUIRE(is_device(d));
      REQUIRE_FALSE(is_device(h));
      std::memcpy(d, h, n);
    };
    m.to_host = [this](void* h, const void* d, std::size_t n) {
      REQUIRE(is_device(d));
      REQUIRE_FALSE(is_device(h));
      std::memcpy(h, d, n);
    };
    return m;
  }
  int allocations() const { return allocations_; }
  std::size_t live_blocks() const { return blocks_.size(); }

 private:
  mutable std::mutex mu_;
  std::map<const char*, std::vector<char>> blocks_;
  int allocations_ = 0;
};

// NCCL's rule as a wrapper: a host pointer given to a collective is an error (on a GPU it
// would be an illegal address inside the kernel).
class device_only : public communicator {
 public:
  device_only(std::shared_ptr<fake_device_comm> inner, const fake_arena& arena)
      : inner_(std::move(inner)), arena_(arena) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const char* backend() const override { return "nccl"; }
  void allreduce_sum(float* d, std::size_t n) override { inner_->allreduce_sum(need(d), n); }
  void allreduce_sum(std::int64_t* d, std::size_t n) override { inner_->allreduce_sum(need(d), n); }
  void allgather(const void* s, void* r, std::size_t b) override {
    inner_->allgather(need(s), need(r), b);
  }
  void alltoall(const void* s, void* r, std::size_t b) override {
    inner_->alltoall(need(s), need(r), b);
  }
  void broadcast(void* d, std::size_t b, int root) override { inner_->broadcast(need(d), b, root); }
  void barrier() override { inner_->barrier(); }
  void abort() override { inner_->abort(); }
  bool dead() const override { return inner_->dead(); }
  comm_traffic traffic() const override { return {}; }
  int host_pointers = 0;  ///< host pointers the caller let through

 private:
  template <class T>
  T* need(T* p) {
    if (!arena_.is_device(p)) ++host_pointers;
    return p;
  }
  std::shared_ptr<fake_device_comm> inner_;
  const fake_arena& arena_;
};

void on_ranks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r) ts.emplace_back(fn, r);
  for (auto& t : ts) t.join();
}

}  // namespace

TEST_CASE("device_staged_comm: host buffers are staged through the device, exactly") {
  constexpr int n = 3;
  auto group = std::make_shared<fake_nccl_group>(n);
  fake_arena arena[n];
  std::vector<device_only*> checkers(n);
  std::vector<std::unique_ptr<device_staged_comm>> comms;
  for (int r = 0; r < n; ++r) {
    auto inner = std::make_unique<device_only>(
        std::make_shared<fake_device_comm>(group, r, std::chrono::milliseconds(60000)), arena[r]);
    checkers[r] = inner.get();
    comms.push_back(std::make_unique<device_staged_comm>(std::move(inner), arena[r].memory()));
  }
  on_ranks(n, [&](int r) {
    device_staged_comm& c = *comms[r];
    // The step's counters after a state transfer: host int64s from the donor (rank 1).
    std::int64_t counters[2] = {r == 1 ? 41 : -1, r == 1 ? (std::int64_t{1} << 53) + 7 : -1};
    c.broadcast(counters, sizeof counters, 1);
    CHECK(counters[0] == 41);
    CHECK(counters[1] == (std::int64_t{1} << 53) + 7);
    // Sums in host memory: rank r gives r + 1 (float) and 2^40 + r (int64, exact).
    std::vector<float> f(5, static_cast<float>(r + 1));
    c.allreduce_sum(f.data(), f.size());
    for (float x : f) CHECK(x == 6.0f);
    std::vector<std::int64_t> q(4, (std::int64_t{1} << 40) + r);
    c.allreduce_sum(q.data(), q.size());
    for (std::int64_t x : q) CHECK(x == 3 * (std::int64_t{1} << 40) + 3);
    // Gathers with host memory on either side or both.
    const std::int32_t mine[2] = {10 * r, 10 * r + 1};
    std::vector<std::int32_t> all(2 * n, -7);
    c.allgather(mine, all.data(), sizeof mine);
    for (int k = 0; k < n; ++k) {
      CHECK(all[2 * k] == 10 * k);
      CHECK(all[2 * k + 1] == 10 * k + 1);
    }
    auto* dev_recv =
        reinterpret_cast<std::int32_t*>(arena[r].allocate(sizeof(std::int32_t) * 2 * n));
    c.allgather(mine, dev_recv, sizeof mine);  // host send, device receive
    for (int k = 0; k < 2 * n; ++k) CHECK(dev_recv[k] == all[k]);
    // Personalised exchange from host to host: block j to rank j is 100 r + j.
    std::vector<std::int32_t> send(n), recv(n, -7);
    for (int j = 0; j < n; ++j) send[j] = 100 * r + j;
    c.alltoall(send.data(), recv.data(), sizeof(std::int32_t));
    for (int k = 0; k < n; ++k) CHECK(recv[k] == 100 * k + r);
    // Device memory passes straight through: no copy, no scratch.
    const std::size_t staged = c.staged_calls();
    auto* dev = reinterpret_cast<float*>(arena[r].allocate(3 * sizeof(float)));
    for (int k = 0; k < 3; ++k) dev[k] = static_cast<float>(r);
    c.allreduce_sum(dev, 3);
    for (int k = 0; k < 3; ++k) CHECK(dev[k] == 3.0f);
    CHECK(c.staged_calls() == staged);
    c.barrier();
  });
  for (int r = 0; r < n; ++r) {
    CHECK(checkers[r]->host_pointers == 0);  // NCCL never saw host memory
    CHECK(comms[r]->staged_calls() == 6);
    // Grown as needed: one scratch per growth, not one per call (plus the test's two blocks).
    CHECK(arena[r].allocations() - 2 <= 4);
  }
  comms.clear();
  for (int r = 0; r < n; ++r) CHECK(arena[r].live_blocks() == 2);  // the scratch is released
}

TEST_CASE("device_staged_comm: a failed scratch allocation is a comm_error and ends the group") {
  auto group = std::make_shared<fake_nccl_group>(1);
  fake_arena arena;
  staging_memory m = arena.memory();
  m.allocate = [](std::size_t) -> void* {
    throw comm_error(comm_failure::unavailable, "nccl staging: allocate", "out of device memory");
  };
  device_staged_comm c(
      std::make_unique<device_only>(
          std::make_shared<fake_device_comm>(group, 0, std::chrono::milliseconds(60000)), arena),
      m);
  // Device memory needs no scratch: it still works.
  auto* dev = reinterpret_cast<float*>(arena.allocate(sizeof(float)));
  *dev = 2.0f;
  c.allreduce_sum(dev, 1);
  CHECK(*dev == 2.0f);
  std::int64_t host[2] = {1, 2};
  CHECK_THROWS_WITH_AS(c.broadcast(host, sizeof host, 0), doctest::Contains("out of device memory"),
                       comm_error);
  CHECK(c.dead());  // like any communicator after a comm_error
}
