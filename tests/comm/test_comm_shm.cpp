// The shared-memory communicator with ranks as threads (and one forked process for a peer
// that dies): closed-form sums over chunk boundaries, int64 sums bit-equal to Gloo's,
// allgather / broadcast / barrier, more ranks than cores, abort, timeout, a dead peer, and
// the factory's auto choice.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <random>
#include <vector>

#include "runtime/comm/factory.hpp"
#include "runtime/comm/shm_comm.hpp"
#include "tests/comm/comm_test_util.hpp"

using namespace cohort::comm;
using cohort::comm_backend;
using cohort::comm_transport;
using namespace cohort::comm::test;
using std::chrono::milliseconds;

namespace {

constexpr double kSlackSeconds = 15.0;

// A scratch directory for a file store shared with a forked process.
struct temp_dir_guard {
  std::string path;
  temp_dir_guard() {
    char tmpl[] = "/tmp/cohort-test-shm-XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    path = tmpl;
  }
  ~temp_dir_guard() { std::filesystem::remove_all(path); }
};

std::vector<std::unique_ptr<shm_comm>> make_shm_group(kv_client& kv, int n, std::uint64_t gen,
                                                      milliseconds timeout,
                                                      std::size_t chunk = 4096,
                                                      std::function<void()> rank0_waits = {}) {
  std::vector<std::unique_ptr<shm_comm>> comms(n);
  rethrow_first(run_ranks(n, [&](int r) {
    shm_options o;
    o.timeout = timeout;
    o.rendezvous_timeout = milliseconds(20000);
    o.chunk_bytes = chunk;
    if (r == 0) o.before_wait = rank0_waits;
    comms[r] = std::make_unique<shm_comm>(kv, gen, r, n, o);
  }));
  return comms;
}

}  // namespace

TEST_CASE("shm allreduce sums exactly across chunk boundaries for world sizes 1..4") {
  // 4 KiB chunks: 1024 floats, so the larger sizes take many chunks of both buffer sets.
  for (int n = 1; n <= 4; ++n) {
    memory_kv kv;
    auto comms = make_shm_group(kv, n, 1, milliseconds(20000));
    for (std::size_t count : {std::size_t(1), std::size_t(1023), std::size_t(1024),
                              std::size_t(1025), std::size_t(70000)}) {
      CAPTURE(n);
      CAPTURE(count);
      std::vector<std::vector<float>> f(n);
      std::vector<std::vector<std::int64_t>> q(n);
      REQUIRE_NOTHROW(rethrow_first(run_ranks(n, [&](int r) {
        f[r].resize(count);
        q[r].resize(count);
        for (std::size_t i = 0; i < count; ++i) {
          f[r][i] = float(r + 1) * float(i % 7);
          q[r][i] = (std::int64_t(1) << 40) * (r + 1) + std::int64_t(i);
        }
        comms[r]->allreduce_sum(f[r].data(), count);
        comms[r]->allreduce_sum(q[r].data(), count);
      })));
      const float ranks_sum = float(n * (n + 1) / 2);
      for (int r = 0; r < n; ++r)
        for (std::size_t i = 0; i < count; ++i) {
          REQUIRE(f[r][i] == ranks_sum * float(i % 7));
          REQUIRE(q[r][i] ==
                  (std::int64_t(1) << 40) * (n * (n + 1) / 2) + std::int64_t(n) * std::int64_t(i));
        }
    }
  }
}

TEST_CASE("shm int64 sums are bit-identical to Gloo's, float sums identical on every rank") {
  const int n = 3;
  const std::size_t count = 50000;
  memory_kv kv;
  auto shm = make_shm_group(kv, n, 1, milliseconds(20000));
  auto gloo = make_gloo_group(kv, n, 2, milliseconds(20000));
  std::vector<std::vector<std::int64_t>> a(n), b(n);
  std::vector<std::vector<float>> f(n);
  REQUIRE_NOTHROW(rethrow_first(run_ranks(n, [&](int r) {
    std::mt19937_64 g(100 + r);
    a[r].resize(count);
    f[r].resize(count);
    for (auto& x : a[r]) x = static_cast<std::int64_t>(g() >> 4) - (std::int64_t(1) << 58);
    for (auto& x : f[r]) x = static_cast<float>(static_cast<double>(g() >> 11) / 9e15 - 0.5);
    b[r] = a[r];
    shm[r]->allreduce_sum(a[r].data(), count);
    gloo[r]->allreduce_sum(b[r].data(), count);
    shm[r]->allreduce_sum(f[r].data(), count);
  })));
  for (int r = 0; r < n; ++r) {
    CHECK(a[r] == b[0]);
    CHECK(std::memcmp(f[r].data(), f[0].data(), count * sizeof(float)) == 0);
  }
}

TEST_CASE("shm allgather and broadcast place every rank's bytes, barrier waits for all") {
  const int n = 3;
  memory_kv kv;
  auto comms = make_shm_group(kv, n, 1, milliseconds(20000), 64);
  const std::size_t bytes = 1000;  // 16 chunks of 64 bytes
  std::vector<std::vector<unsigned char>> got(n), bc(n);
  std::atomic<int> entered{0};
  std::vector<int> seen(n, -1);
  REQUIRE_NOTHROW(rethrow_first(run_ranks(n, [&](int r) {
    std::vector<unsigned char> mine(bytes);
    for (std::size_t i = 0; i < bytes; ++i) mine[i] = static_cast<unsigned char>(r * 31 + i);
    got[r].resize(bytes * n);
    comms[r]->allgather(mine.data(), got[r].data(), bytes);
    bc[r].assign(bytes, 0);
    if (r == 2) bc[r] = mine;
    comms[r]->broadcast(bc[r].data(), bytes, 2);
    ++entered;
    comms[r]->barrier();
    seen[r] = entered.load();
  })));
  for (int r = 0; r < n; ++r) {
    for (int s = 0; s < n; ++s)
      for (std::size_t i = 0; i < bytes; ++i)
        REQUIRE(got[r][s * bytes + i] == static_cast<unsigned char>(s * 31 + i));
    for (std::size_t i = 0; i < bytes; ++i)
      REQUIRE(bc[r][i] == static_cast<unsigned char>(2 * 31 + i));
    CHECK(seen[r] == n);  // nobody left the barrier before everyone entered it
  }
}

TEST_CASE("shm with more ranks than cores: every allreduce completes and sums right") {
  const int n = 6;  // CI has 2 cores: waits must sleep, not only spin
  memory_kv kv;
  auto comms = make_shm_group(kv, n, 1, milliseconds(60000), 1 << 16);
  std::vector<std::int64_t> last(n);
  REQUIRE_NOTHROW(rethrow_first(run_ranks(n, [&](int r) {
    std::vector<std::int64_t> v(20000);
    for (int it = 0; it < 200; ++it) {
      std::fill(v.begin(), v.end(), std::int64_t(r + it));
      comms[r]->allreduce_sum(v.data(), v.size());
    }
    last[r] = v[19999];
  })));
  for (int r = 0; r < n; ++r) CHECK(last[r] == 15 + 6 * 199);
}

TEST_CASE("shm abort() wakes a rank blocked on a silent peer, and the peer fails too") {
  memory_kv kv;
  // Rank 0's before_wait seam: abort() comes once its allreduce sleeps waiting for rank 1.
  std::promise<void> sleeping;
  std::atomic<int> waits{0};
  auto comms = make_shm_group(kv, 2, 1, milliseconds(60000), 4096, [&] {
    if (waits.fetch_add(1) == 0) sleeping.set_value();
  });
  std::vector<float> buf(100, 1.0f);
  comm_failure kind = comm_failure::invalid;
  double took = -1;
  std::thread blocked([&] {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      comms[0]->allreduce_sum(buf.data(), buf.size());  // rank 1 never calls
    } catch (const comm_error& e) {
      kind = e.kind();
    }
    took = seconds_since(t0);
  });
  sleeping.get_future().wait();
  comms[0]->abort();
  blocked.join();
  CHECK(waits.load() >= 1);
  CHECK(kind == comm_failure::aborted);
  CHECK(took < kSlackSeconds);  // the timeout is 60 s
  CHECK(comms[0]->dead());
  try {
    comms[1]->allreduce_sum(buf.data(), buf.size());
    FAIL("the peer's call passed after the group was aborted");
  } catch (const comm_error& e) {
    CHECK(e.kind() == comm_failure::aborted);
  }
}

TEST_CASE("shm: a peer that never arrives times out, a peer whose process died is seen gone") {
  {
    memory_kv kv;
    auto comms = make_shm_group(kv, 2, 1, milliseconds(300));
    std::int64_t x = 1;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      comms[0]->allreduce_sum(&x, 1);
      FAIL("allreduce passed without rank 1");
    } catch (const comm_error& e) {
      CHECK(e.kind() == comm_failure::timeout);
      CHECK(std::string(e.what()).find("rank 1 did not arrive") != std::string::npos);
    }
    CHECK(seconds_since(t0) < kSlackSeconds);
  }
  temp_dir_guard dir;
  file_kv kv(dir.path);
  std::fflush(nullptr);
  const pid_t child = ::fork();
  if (child == 0) {
    try {
      shm_options o;
      shm_comm c(kv, 1, 1, 2, o);  // joins, then dies without ever calling a collective
    } catch (...) {
    }
    ::_exit(0);
  }
  shm_options o;
  o.timeout = milliseconds(60000);
  comm_failure kind = comm_failure::invalid;
  double took = -1;
  {
    shm_comm c(kv, 1, 0, 2, o);
    const auto t0 = std::chrono::steady_clock::now();
    ::waitpid(child, nullptr, 0);  // gone for good (reaped: kill(pid, 0) says ESRCH)
    try {
      std::int64_t x = 1;
      c.allreduce_sum(&x, 1);
    } catch (const comm_error& e) {
      kind = e.kind();
    }
    took = seconds_since(t0);
  }
  CHECK(kind == comm_failure::peer_lost);
  CHECK(took < kSlackSeconds);  // the timeout is 60 s
}

TEST_CASE("the factory's auto transport picks shm for ranks of one host, gloo when asked") {
  memory_kv kv;
  std::vector<std::string> kinds(2), forced(2);
  // Kept until both ranks are done: a rank that dropped its end of a Gloo pair at once could
  // close it while the other rank is still connecting (seen under load).
  std::vector<std::unique_ptr<communicator>> keep(4);
  REQUIRE_NOTHROW(rethrow_first(run_ranks(2, [&](int r) {
    transport_options t;
    t.group = "dp";
    t.transport = comm_transport::automatic;
    keep[r] = make_communicator(comm_backend::gloo, "cpu", kv, r, 2, 1, 20000, t);
    kinds[r] = keep[r]->backend();
    t.transport = comm_transport::gloo;
    keep[2 + r] = make_communicator(comm_backend::gloo, "cpu", kv, r, 2, 2, 20000, t);
    forced[r] = keep[2 + r]->backend();
  })));
  CHECK(kinds == std::vector<std::string>{"shm", "shm"});
  CHECK(forced == std::vector<std::string>{"gloo", "gloo"});
  CHECK(host_identity() == host_identity());
  CHECK(host_identity().find('|') != std::string::npos);
}

// A peer that completed the group's last collective and then tears the group down (its
// generation is over) must not fail a slower rank whose phase is complete too: that rank
// returns with the data, where it used to see the abort first and fail a finished collective
// (a sharded-state gather after a commit, docs/sharding.md).
TEST_CASE("shm: a peer's abort after a completed broadcast does not fail the slower rank") {
  memory_kv kv;
  std::promise<void> waiting;
  std::atomic<bool> told{false};
  auto comms = make_shm_group(kv, 2, 1, milliseconds(20000), 4096, [&] {
    if (!told.exchange(true)) waiting.set_value();  // rank 0 is about to sleep in its wait
  });
  std::vector<float> got(100, 0.0f);
  auto slow = std::async(std::launch::async, [&] { comms[0]->broadcast(got.data(), 400, 1); });
  waiting.get_future().wait();  // rank 0 has arrived and waits for rank 1
  std::vector<float> sent(100);
  for (int i = 0; i < 100; ++i) sent[static_cast<std::size_t>(i)] = 0.5f * static_cast<float>(i);
  comms[1]->broadcast(sent.data(), 400, 1);  // completes the phase
  comms[1]->abort();                         // and leaves at once
  REQUIRE_NOTHROW(slow.get());
  CHECK(got == sent);
  CHECK_THROWS_AS(comms[0]->barrier(), comm_error);  // the next collective sees the abort
}
