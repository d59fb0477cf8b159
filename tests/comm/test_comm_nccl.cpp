// The NCCL backend on a real GPU. One process may hold one rank per GPU (NCCL refuses two
// ranks on one device), so data cases use a group of one; the failure cases use a group of
// two whose second rank never arrives: init must time out or abort, never hang.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "gpu/device.hpp"
#include "gpu/nccl_comm.hpp"
#include "runtime/comm/factory.hpp"
#include "runtime/comm/local_kv.hpp"

using namespace cohort;
using namespace cohort::comm;
using cohort::comm_backend;
using std::chrono::milliseconds;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Device buffer holding `host`, freed at scope end.
template <class T>
struct device_vec {
  void* ptr = nullptr;
  std::size_t n = 0;
  explicit device_vec(const std::vector<T>& host) : n(host.size()) {
    REQUIRE(gpu::device_malloc(&ptr, n * sizeof(T)) == gpu::status::ok);
    REQUIRE(gpu::copy_to_device(ptr, host.data(), n * sizeof(T)) == gpu::status::ok);
  }
  std::vector<T> to_host() const {
    std::vector<T> out(n);
    REQUIRE(gpu::copy_to_host(out.data(), ptr, n * sizeof(T)) == gpu::status::ok);
    return out;
  }
  ~device_vec() { gpu::device_free(ptr); }
  T* data() { return static_cast<T*>(ptr); }
};

}  // namespace

TEST_CASE("nccl group of one: allreduce float and int64 and allgather and broadcast and barrier") {
  memory_kv kv;
  auto c = make_communicator(comm_backend::nccl, "cuda:0", kv, 0, 1, 1, 10000);
  CHECK(std::string(c->backend()) == "nccl");
  std::vector<float> f(1 << 20);
  for (std::size_t i = 0; i < f.size(); ++i) f[i] = float(i % 97);
  device_vec<float> df(f);
  c->allreduce_sum(df.data(), f.size());
  CHECK(df.to_host() == f);  // the sum over one rank is the value itself

  std::vector<std::int64_t> g(1000);
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = (std::int64_t(1) << 45) + std::int64_t(i);
  device_vec<std::int64_t> dg(g);
  c->allreduce_sum(dg.data(), g.size());
  CHECK(dg.to_host() == g);

  std::vector<std::uint8_t> bytes(333, 7), out(333, 0);
  device_vec<std::uint8_t> db(bytes), dout(out);
  c->allgather(db.data(), dout.data(), bytes.size());
  CHECK(dout.to_host() == bytes);
  c->broadcast(db.data(), bytes.size(), 0);
  CHECK(db.to_host() == bytes);
  c->barrier();
  CHECK_FALSE(c->dead());
}

TEST_CASE("nccl takes host buffers too (staged through a device scratch), device ones directly") {
  // Where a pointer lives, as cudaPointerGetAttributes says.
  std::vector<float> host(8, 1.0f);
  device_vec<float> dev(host);
  CHECK(gpu::is_device_pointer(dev.data()));
  CHECK_FALSE(gpu::is_device_pointer(host.data()));
  CHECK_FALSE(gpu::is_device_pointer(nullptr));
  int on_stack = 0;
  CHECK_FALSE(gpu::is_device_pointer(&on_stack));

  memory_kv kv;
  auto c = make_communicator(comm_backend::nccl, "cuda:0", kv, 0, 1, 2, 10000);
  REQUIRE(std::string(c->backend()) == "nccl");
  // The step's counters after a state transfer: host int64s.
  std::int64_t counters[2] = {41, (std::int64_t{1} << 53) + 7};
  c->broadcast(counters, sizeof counters, 0);
  CHECK(counters[0] == 41);
  CHECK(counters[1] == (std::int64_t{1} << 53) + 7);
  std::vector<float> f(1000);
  for (std::size_t i = 0; i < f.size(); ++i) f[i] = float(i % 13);
  const std::vector<float> want = f;
  c->allreduce_sum(f.data(), f.size());
  CHECK(f == want);
  std::vector<std::int64_t> q(300, std::int64_t{1} << 45);
  c->allreduce_sum(q.data(), q.size());
  CHECK(q == std::vector<std::int64_t>(300, std::int64_t{1} << 45));
  // Host send, device receive; then both on the host.
  const std::int32_t mine[3] = {5, 6, 7};
  device_vec<std::int32_t> recv(std::vector<std::int32_t>(3, -1));
  c->allgather(mine, recv.data(), sizeof mine);
  CHECK(recv.to_host() == std::vector<std::int32_t>{5, 6, 7});
  std::vector<std::int32_t> back(3, -1);
  c->allgather(mine, back.data(), sizeof mine);
  CHECK(back == std::vector<std::int32_t>{5, 6, 7});
  // A device buffer after the staged calls: still straight through, still right.
  c->allreduce_sum(dev.data(), 8);
  CHECK(dev.to_host() == host);
  CHECK_FALSE(c->dead());
}

TEST_CASE("nccl init with a missing peer times out and aborts within the deadline") {
  std::vector<char> id;
  REQUIRE(gpu::nccl_make_unique_id(&id) == gpu::nccl_status::ok);
  gpu::nccl_comm comm;
  const auto t0 = std::chrono::steady_clock::now();
  const gpu::nccl_status s = comm.init(id, 0, 2, 0, 1500);  // rank 1 never comes
  const double took = seconds_since(t0);
  CHECK(s == gpu::nccl_status::timeout);
  CHECK(comm.dead());
  CHECK(took >= 1.0);
  CHECK(took < 30.0);
  MESSAGE("init timed out after " << took << " s: " << comm.last_error());
}

TEST_CASE("nccl abort() from another thread ends a pending init promptly") {
  std::vector<char> id;
  REQUIRE(gpu::nccl_make_unique_id(&id) == gpu::nccl_status::ok);
  gpu::nccl_comm comm;
  std::thread aborter([&] {
    std::this_thread::sleep_for(milliseconds(300));
    comm.abort();
  });
  const auto t0 = std::chrono::steady_clock::now();
  const gpu::nccl_status s = comm.init(id, 0, 2, 0, 60000);
  aborter.join();
  CHECK(s == gpu::nccl_status::aborted);
  CHECK(seconds_since(t0) < 30.0);  // the timeout is 60 s
  CHECK(comm.allreduce_sum(nullptr, 0, gpu::nccl_dtype::f32) == gpu::nccl_status::aborted);
}

TEST_CASE("nccl shrink refuses what no generation change asks, and leaves the parent working") {
  // One GPU holds one rank, so no shrink can exclude anybody here: a real shrink (and its time
  // against a new init) needs two GPUs. What runs: the refusals, before any NCCL call, and the
  // parent still summing after them.
  std::vector<char> id;
  REQUIRE(gpu::nccl_make_unique_id(&id) == gpu::nccl_status::ok);
  gpu::nccl_comm parent;
  REQUIRE(parent.init(id, 0, 1, 0, 20000) == gpu::nccl_status::ok);
  gpu::nccl_comm child;
  CHECK(parent.shrink({0}, false, 20000, &child) == gpu::nccl_status::invalid_argument);  // self
  CHECK(parent.shrink({}, false, 20000, &child) == gpu::nccl_status::invalid_argument);   // nobody
  CHECK(parent.last_error().find("nothing to exclude") != std::string::npos);
  CHECK(parent.shrink({1}, false, 20000, &child) ==
        gpu::nccl_status::invalid_argument);  // no rank 1
  CHECK(parent.shrink({0}, false, 20000, &parent) == gpu::nccl_status::invalid_argument);
  std::vector<float> f(4096, 1.5f);
  device_vec<float> df(f);
  CHECK(parent.allreduce_sum(df.data(), f.size(), gpu::nccl_dtype::f32) == gpu::nccl_status::ok);
  CHECK(df.to_host() == f);
  CHECK_FALSE(parent.dead());
}

TEST_CASE("nccl interrupt ends the calls but keeps the communicator for a shrink, an abort does not") {
  // What the step does at a newer generation (dp_group_shared::abort_below): the calls end
  // at once, and the communicator stays un-aborted, so that the survivors can shrink it.
  std::vector<char> id;
  REQUIRE(gpu::nccl_make_unique_id(&id) == gpu::nccl_status::ok);
  gpu::nccl_comm comm;
  REQUIRE(comm.init(id, 0, 1, 0, 20000) == gpu::nccl_status::ok);
  CHECK(comm.shrinkable() == (gpu::nccl_version() >= 22700));
  comm.interrupt();
  CHECK(comm.dead());
  CHECK(comm.allreduce_sum(nullptr, 0, gpu::nccl_dtype::f32) == gpu::nccl_status::aborted);
  CHECK(comm.barrier() == gpu::nccl_status::aborted);
  CHECK(comm.shrinkable() == (gpu::nccl_version() >= 22700));  // still: no ncclCommAbort ran
  // An interrupted parent passes the liveness check; the shrink refuses only what it must
  // (here: nobody to exclude in a group of one).
  gpu::nccl_comm child;
  CHECK(comm.shrink({}, false, 20000, &child) == gpu::nccl_status::invalid_argument);
  CHECK(comm.last_error().find("nothing to exclude") != std::string::npos);
  comm.abort();
  CHECK_FALSE(comm.shrinkable());
  CHECK(comm.shrink({}, false, 20000, &child) == gpu::nccl_status::invalid_argument);
  CHECK(comm.last_error().find("not live") != std::string::npos);
}
