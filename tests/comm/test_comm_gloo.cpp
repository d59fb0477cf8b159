// The Gloo communicator with ranks as threads: exact sums with closed-form values (rank r
// contributes r), allgather / broadcast / barrier, and the failure paths: a rank that
// stops participating, abort() of a blocked call, a dead communicator stays dead; the
// traffic counters against the ring allreduce's closed form.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

#include "tests/comm/comm_test_util.hpp"
#include "tests/eventually.hpp"

using namespace cohort::comm;
using namespace cohort::comm::test;
using std::chrono::milliseconds;

using cohort::test::eventually;

namespace {

// Slack for a loaded 2-core machine: failures must come well before this, never a hang.
constexpr double kSlackSeconds = 15.0;

const std::vector<std::size_t> kSizes = {1, 5, 4099, std::size_t(1) << 18,
                                         (std::size_t(1) << 20) + 3};

}  // namespace

TEST_CASE("gloo allreduce_sum(float) is exact for every size and world size 1..4") {
  memory_kv kv;
  for (int n = 1; n <= 4; ++n) {
    CAPTURE(n);
    auto comms = make_gloo_group(kv, n, /*generation=*/n, milliseconds(10000));
    std::vector<std::vector<float>> data(n);
    for (std::size_t count : kSizes) {
      CAPTURE(count);
      auto errors = run_ranks(n, [&](int r) {
        data[r].assign(count, 0.0f);
        // rank r contributes r + (i mod 5): the sum is n(n-1)/2 + n * (i mod 5).
        for (std::size_t i = 0; i < count; ++i) data[r][i] = float(r) + float(i % 5);
        comms[r]->allreduce_sum(data[r].data(), count);
      });
      REQUIRE_NOTHROW(rethrow_first(errors));
      const float base = float(n * (n - 1) / 2);
      for (int r = 0; r < n; ++r) {
        std::size_t bad = 0;
        for (std::size_t i = 0; i < count; ++i)
          if (data[r][i] != base + float(n) * float(i % 5)) ++bad;
        CHECK_MESSAGE(bad == 0, "rank " << r << " has " << bad << " wrong elements");
      }
    }
  }
}

TEST_CASE("gloo allreduce_sum(int64) is exact beyond float precision") {
  memory_kv kv;
  for (int n = 1; n <= 4; ++n) {
    CAPTURE(n);
    auto comms = make_gloo_group(kv, n, n, milliseconds(10000));
    const std::size_t count = (std::size_t(1) << 17) + 11;  // ~1 MiB of int64
    std::vector<std::vector<std::int64_t>> data(n, std::vector<std::int64_t>(count));
    const std::int64_t big = std::int64_t(1) << 40;
    REQUIRE_NOTHROW(rethrow_first(run_ranks(n, [&](int r) {
      for (std::size_t i = 0; i < count; ++i) data[r][i] = r * big + std::int64_t(i) - 3;
      comms[r]->allreduce_sum(data[r].data(), count);
    })));
    for (int r = 0; r < n; ++r) {
      std::size_t bad = 0;
      for (std::size_t i = 0; i < count; ++i)
        if (data[r][i] != big * (n * (n - 1) / 2) + n * (std::int64_t(i) - 3)) ++bad;
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("gloo allgather puts rank r's block at offset r on every rank") {
  memory_kv kv;
  for (int n = 1; n <= 4; ++n) {
    CAPTURE(n);
    auto comms = make_gloo_group(kv, n, n, milliseconds(10000));
    const std::size_t bytes = 1003;
    std::vector<std::vector<unsigned char>> out(n, std::vector<unsigned char>(bytes * n));
    REQUIRE_NOTHROW(rethrow_first(run_ranks(n, [&](int r) {
      std::vector<unsigned char> mine(bytes);
      for (std::size_t i = 0; i < bytes; ++i) mine[i] = static_cast<unsigned char>(r * 31 + i);
      comms[r]->allgather(mine.data(), out[r].data(), bytes);
    })));
    for (int r = 0; r < n; ++r)
      for (int src = 0; src < n; ++src)
        for (std::size_t i = 0; i < bytes; ++i)
          REQUIRE(out[r][src * bytes + i] == static_cast<unsigned char>(src * 31 + i));
  }
}

TEST_CASE("gloo broadcast copies the root's bytes to every rank for every root") {
  memory_kv kv;
  const int n = 3;
  auto comms = make_gloo_group(kv, n, 1, milliseconds(10000));
  for (int root = 0; root < n; ++root) {
    CAPTURE(root);
    std::vector<std::vector<std::int32_t>> data(n, std::vector<std::int32_t>(5000));
    REQUIRE_NOTHROW(rethrow_first(run_ranks(n, [&](int r) {
      for (std::size_t i = 0; i < data[r].size(); ++i) data[r][i] = r * 100000 + int(i);
      comms[r]->broadcast(data[r].data(), data[r].size() * sizeof(std::int32_t), root);
    })));
    for (int r = 0; r < n; ++r)
      for (std::size_t i = 0; i < data[r].size(); ++i)
        REQUIRE(data[r][i] == root * 100000 + int(i));
  }
  CHECK_THROWS_AS(comms[0]->broadcast(nullptr, 0, n), comm_error);
}

TEST_CASE("gloo traffic counts what the algorithms hand to the transport, per rank") {
  memory_kv kv;
  // A ring allreduce moves 2(n-1)/n of the buffer out of and into every rank (reduce-scatter
  // then allgather); Gloo's segment rounding may add a little, never more than 5% here.
  const std::size_t elems = std::size_t(1) << 18;  // 1 MiB of floats
  for (int n = 1; n <= 4; ++n) {
    CAPTURE(n);
    auto comms = make_gloo_group(kv, n, 10 + n, milliseconds(10000));
    std::vector<comm_traffic> before(n), after(n);
    REQUIRE_NOTHROW(rethrow_first(run_ranks(n, [&](int r) {
      std::vector<float> v(elems, 1.0f);
      before[r] = comms[r]->traffic();
      comms[r]->allreduce_sum(v.data(), v.size());
      after[r] = comms[r]->traffic();
    })));
    const double ring = 2.0 * (n - 1) / n * double(elems * sizeof(float));
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      CHECK(after[r].measured);
      const double sent = double(after[r].sent - before[r].sent);
      const double received = double(after[r].received - before[r].received);
      if (n == 1) {
        CHECK(sent == 0.0);
        CHECK(received == 0.0);
      } else {
        CHECK(sent == doctest::Approx(ring).epsilon(0.05));
        CHECK(received == doctest::Approx(ring).epsilon(0.05));
      }
    }
  }
  // A broadcast is not symmetric: the root sends the payload to each other rank (or into
  // a tree), the others each receive it once. Sent and received are counted apart.
  const int n = 3;
  auto comms = make_gloo_group(kv, n, 20, milliseconds(10000));
  const std::size_t bytes = 40000;
  std::vector<comm_traffic> before(n), after(n);
  REQUIRE_NOTHROW(rethrow_first(run_ranks(n, [&](int r) {
    std::vector<char> d(bytes, char(r));
    before[r] = comms[r]->traffic();
    comms[r]->broadcast(d.data(), bytes, 0);
    after[r] = comms[r]->traffic();
  })));
  uint64_t sent = 0, received = 0;
  for (int r = 0; r < n; ++r) {
    sent += after[r].sent - before[r].sent;
    received += after[r].received - before[r].received;
    if (r > 0) CHECK(after[r].received - before[r].received == bytes);
  }
  // Every byte sent is received by someone: the group's totals agree.
  CHECK(sent == received);
  CHECK(received == (n - 1) * bytes);
}

TEST_CASE("gloo barrier returns on no rank before the last rank has entered") {
  memory_kv kv;
  const int n = 4;
  auto comms = make_gloo_group(kv, n, 1, milliseconds(10000));
  std::atomic<int> entered{0};
  std::vector<int> seen(n, -1);
  REQUIRE_NOTHROW(rethrow_first(run_ranks(n, [&](int r) {
    if (r == n - 1) std::this_thread::sleep_for(milliseconds(100));  // the late rank
    entered.fetch_add(1);
    comms[r]->barrier();
    seen[r] = entered.load();
  })));
  for (int r = 0; r < n; ++r) CHECK(seen[r] == n);
}

TEST_CASE("a rank that stops participating makes the others fail within the timeout") {
  memory_kv kv;
  const int n = 3;
  auto comms = make_gloo_group(kv, n, 1, milliseconds(300));
  std::vector<float> buf(1000, 1.0f);
  std::vector<double> took(n, 0.0);
  std::vector<comm_failure> kinds(n, comm_failure::invalid);
  const auto t0 = std::chrono::steady_clock::now();
  auto errors = run_ranks(n, [&](int r) {
    if (r == 2) return;  // stops participating: alive, connected, silent
    std::vector<float> mine(buf);
    try {
      comms[r]->allreduce_sum(mine.data(), mine.size());
    } catch (const comm_error& e) {
      took[r] = seconds_since(t0);
      kinds[r] = e.kind();
      throw;
    }
  });
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    REQUIRE(errors[r] != nullptr);
    CHECK(took[r] < kSlackSeconds);
    CHECK((kinds[r] == comm_failure::timeout || kinds[r] == comm_failure::peer_lost));
    CHECK(comms[r]->dead());
  }
  // The silent rank finds its pairs closed by the others: it fails too, without waiting.
  CHECK_THROWS_AS(comms[2]->allreduce_sum(buf.data(), buf.size()), comm_error);
  CHECK(comms[2]->dead());
  // A dead communicator stays dead: the next call throws at once, kind invalid.
  try {
    comms[0]->barrier();
    FAIL("a dead communicator accepted a call");
  } catch (const comm_error& e) {
    CHECK(e.kind() == comm_failure::invalid);
  }
}

TEST_CASE("abort() makes a blocked collective return promptly and far before the timeout") {
  memory_kv kv;
  auto comms = make_gloo_group(kv, 2, 1, milliseconds(60000));
  std::vector<float> buf(1000, 1.0f);
  double took = -1;
  comm_failure kind = comm_failure::invalid;
  std::string what;
  std::thread blocked([&] {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      comms[0]->allreduce_sum(buf.data(), buf.size());  // rank 1 never joins
    } catch (const comm_error& e) {
      kind = e.kind();
      what = e.what();
    }
    took = seconds_since(t0);
  });
  // The abort comes once the call is inside the collective: it has posted its first send
  // (counted as it is handed to the transport), so from here it waits for rank 1.
  REQUIRE(eventually(milliseconds(30000), [&] { return comms[0]->traffic().sent > 0; }));
  comms[0]->abort();
  blocked.join();
  CHECK(took >= 0.0);
  CHECK(took < kSlackSeconds);  // the timeout is 60 s
  CHECK(kind == comm_failure::aborted);
  // Cut short inside the call, not refused at its start as a dead communicator's would be.
  CHECK(what.find("is dead") == std::string::npos);
  CHECK(comms[0]->dead());
  // The peer's pairs were closed by the abort: its next collective fails, not hangs.
  const auto t1 = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(comms[1]->allreduce_sum(buf.data(), buf.size()), comm_error);
  CHECK(seconds_since(t1) < kSlackSeconds);
  comms[0]->abort();  // idempotent
}

// Rank 0 aborts in the middle of back-to-back 4 MiB allreduces (often mid-read, the case
// Gloo's own signal does not wake: gloo_comm.cpp, buffer_registry) once both ranks have
// moved more than one whole buffer, and rank 1 is aborted after rank 0's call has returned,
// as the coordinator's new roster aborts every member. Each must return long before the
// 60 s collective timeout. (A peer that is never aborted is failed by the closed socket,
// which test_comm_mp checks with a killed process.)
TEST_CASE("abort() during large transfers unblocks both ranks long before the timeout") {
  memory_kv kv;
  auto comms = make_gloo_group(kv, 2, 1, milliseconds(60000));
  constexpr std::uint64_t kBytes = std::uint64_t(4) << 20;
  std::vector<double> took(2, -1.0);
  std::atomic<bool> rank0_returned{false};
  bool in_flight = false, rank0_first = false;  // the order the aborter saw
  std::vector<std::string> what(2);
  const auto t0 = std::chrono::steady_clock::now();
  std::thread aborter([&] {
    // Transfers in flight on both ranks: each has received more than one whole buffer.
    in_flight = eventually(milliseconds(30000), [&] {
      return comms[0]->traffic().received > kBytes && comms[1]->traffic().received > kBytes;
    });
    comms[0]->abort();
    rank0_first = eventually(milliseconds(30000), [&] { return rank0_returned.load(); });
    comms[1]->abort();
  });
  auto errors = run_ranks(2, [&](int r) {
    std::vector<float> buf(std::size_t(1) << 20, 1.0f);  // 4 MiB: segments are always in flight
    try {
      for (int it = 0; it < 100000; ++it) comms[r]->allreduce_sum(buf.data(), buf.size());
    } catch (const comm_error& e) {
      took[r] = seconds_since(t0);
      what[r] = e.what();
      if (r == 0) rank0_returned = true;
      throw;
    }
  });
  aborter.join();
  CHECK(in_flight);
  CHECK(rank0_first);
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    CAPTURE(what[r]);
    CHECK(errors[r] != nullptr);
    CHECK(took[r] >= 0.0);
    CHECK(took[r] < kSlackSeconds);
  }
}

TEST_CASE("rendezvous with a missing rank fails after the rendezvous timeout") {
  memory_kv kv;
  kv_gloo_store store(kv, 7, milliseconds(300));
  gloo_options o;
  o.timeout = milliseconds(300);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    gloo_comm lonely(store, 0, 2, o);
    FAIL("rendezvous succeeded without rank 1");
  } catch (const comm_error& e) {
    CHECK(e.kind() == comm_failure::timeout);
    CHECK(std::string(e.what()).find("rank 0 of 2") != std::string::npos);
  }
  CHECK(seconds_since(t0) < kSlackSeconds);
}

TEST_CASE("groups of different generations and prefixes share one store without mixing") {
  memory_kv kv;
  auto g1 = make_gloo_group(kv, 2, 1, milliseconds(10000), "dp");
  auto g2 = make_gloo_group(kv, 2, 2, milliseconds(10000), "dp");
  auto g2tp = make_gloo_group(kv, 2, 2, milliseconds(10000), "tp");
  for (auto* group : {&g1, &g2, &g2tp}) {
    std::vector<std::int64_t> v(2);
    REQUIRE_NOTHROW(rethrow_first(run_ranks(2, [&](int r) {
      std::int64_t x = 10 + r;
      (*group)[r]->allreduce_sum(&x, 1);
      v[r] = x;
    })));
    CHECK(v[0] == 21);
    CHECK(v[1] == 21);
  }
  bool saw_gen1 = false, saw_gen2_tp = false;
  for (const auto& k : kv.keys()) {
    saw_gen1 |= k.rfind("gen/1/dp/", 0) == 0;
    saw_gen2_tp |= k.rfind("gen/2/tp/", 0) == 0;
  }
  CHECK(saw_gen1);
  CHECK(saw_gen2_tp);
}
