// The hierarchical communicator (shared memory inside a host, Gloo among host leaders) with
// ranks as threads whose host is set by transport_options::host_id: the host layout and its
// text form, closed-form sums for even, uneven and interleaved layouts, broadcast from every
// root, allgather, alltoall, barrier, the factory's choice per comm.hierarchy, and a failure on one
// host ending every rank's call promptly.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "runtime/comm/factory.hpp"
#include "runtime/comm/hier_comm.hpp"
#include "tests/comm/comm_test_util.hpp"

using namespace cohort::comm;
using cohort::comm_backend;
using cohort::comm_hierarchy;
using cohort::comm_transport;
using cohort::parse_choice;
using namespace cohort::comm::test;

namespace {

constexpr double kSlackSeconds = 15.0;

// Builds one group over the factory: rank r on host `hosts[r]` (any text), transport auto.
std::vector<std::unique_ptr<communicator>> make_group(kv_client& kv,
                                                      const std::vector<std::string>& hosts,
                                                      std::uint64_t gen,
                                                      const std::string& hierarchy,
                                                      int timeout_ms = 20000) {
  const int n = static_cast<int>(hosts.size());
  std::vector<std::unique_ptr<communicator>> comms(n);
  rethrow_first(run_ranks(n, [&](int r) {
    transport_options t;
    t.group = "dp";
    t.transport = comm_transport::automatic;
    t.hierarchy = parse_choice<comm_hierarchy>(hierarchy).value();
    t.host_id = hosts[r];
    t.rendezvous_timeout_ms = 20000;
    comms[r] = make_communicator(comm_backend::gloo, "cpu", kv, r, n, gen, timeout_ms, t);
  }));
  return comms;
}

}  // namespace

TEST_CASE("host_layout groups ranks by first appearance and round-trips as text") {
  const host_layout l = host_layout::from_identities({"b", "a", "b", "c", "a"});
  CHECK(l.host_of == std::vector<int>{0, 1, 0, 2, 1});
  CHECK(l.hosts() == 3);
  CHECK(l.ranks_of(0) == std::vector<int>{0, 2});
  CHECK(l.ranks_of(1) == std::vector<int>{1, 4});
  CHECK(l.local_rank(4) == 1);
  CHECK(l.local_rank(3) == 0);
  CHECK(l.leader_of(1) == 1);
  CHECK(l.max_per_host() == 2);
  CHECK(l.to_text() == "0,1,0,2,1");
  CHECK(host_layout::parse("0,1,0,2,1", 5).host_of == l.host_of);
  // Malformed plans (a hostile or corrupt store value) are refused, never trusted.
  for (const char* bad : {"", "0,1", "0,1,0,2,1,0", "0,,1,0,2", "0,2,1,0,1", "1,0,0,0,0",
                          "0,1,x,0,1", "0,1,0,2,-1", "0,1,0,2,1,"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(host_layout::parse(bad, 5), comm_error);
  }
}

TEST_CASE("hierarchical allreduce sums exactly for even, uneven and interleaved hosts") {
  const std::vector<std::vector<std::string>> layouts = {{"h0", "h0", "h1", "h1"},
                                                         {"h0", "h1", "h0", "h1"},
                                                         {"h0", "h0", "h0", "h1"},
                                                         {"x", "y", "z"},
                                                         {"h0", "h0", "h1", "h1", "h2"}};
  std::uint64_t gen = 1;
  for (const auto& hosts : layouts) {
    const int n = static_cast<int>(hosts.size());
    CAPTURE(n);
    CAPTURE(hosts[1]);
    memory_kv kv;
    auto comms = make_group(kv, hosts, gen++, "hierarchical");
    for (int r = 0; r < n; ++r) CHECK(std::string(comms[r]->backend()) == "hierarchical");
    // Counts across the shm chunk (256 KiB = 65536 floats / 32768 int64).
    for (std::size_t count : {std::size_t(1), std::size_t(1000), std::size_t(70000)}) {
      CAPTURE(count);
      std::vector<std::vector<float>> f(n);
      std::vector<std::vector<std::int64_t>> q(n);
      REQUIRE_NOTHROW(rethrow_first(run_ranks(n, [&](int r) {
        f[r].resize(count);
        q[r].resize(count);
        for (std::size_t i = 0; i < count; ++i) {
          f[r][i] = float(r + 1) * float(i % 5);
          q[r][i] = (std::int64_t(1) << 41) * (r + 1) - std::int64_t(i) * (r + 3);
        }
        comms[r]->allreduce_sum(f[r].data(), count);
        comms[r]->allreduce_sum(q[r].data(), count);
      })));
      const int tri = n * (n + 1) / 2;
      for (int r = 0; r < n; ++r)
        for (std::size_t i = 0; i < count; ++i) {
          REQUIRE(f[r][i] == float(tri) * float(i % 5));
          REQUIRE(q[r][i] ==
                  (std::int64_t(1) << 41) * tri - std::int64_t(i) * (n * (n - 1) / 2 + 3 * n));
        }
    }
  }
}

TEST_CASE("hierarchical broadcast from every root, allgather, alltoall and barrier") {
  const std::vector<std::string> hosts = {"h0", "h1", "h0", "h1", "h1"};
  const int n = 5;
  memory_kv kv;
  auto comms = make_group(kv, hosts, 7, "hierarchical");
  for (int root = 0; root < n; ++root) {
    CAPTURE(root);
    std::vector<std::vector<std::uint8_t>> data(n, std::vector<std::uint8_t>(1001));
    REQUIRE_NOTHROW(rethrow_first(run_ranks(n, [&](int r) {
      for (std::size_t i = 0; i < data[r].size(); ++i)
        data[r][i] = static_cast<std::uint8_t>(r == root ? (i * 7 + root) : 0xEE);
      comms[r]->broadcast(data[r].data(), data[r].size(), root);
    })));
    for (int r = 0; r < n; ++r)
      for (std::size_t i = 0; i < data[r].size(); ++i)
        REQUIRE(data[r][i] == static_cast<std::uint8_t>(i * 7 + root));
  }
  // allgather of 3-byte blocks (not a multiple of the int64 words it travels in).
  std::vector<std::vector<std::uint8_t>> all(n, std::vector<std::uint8_t>(3 * n, 0xAA));
  REQUIRE_NOTHROW(rethrow_first(run_ranks(n, [&](int r) {
    const std::uint8_t mine[3] = {std::uint8_t(r), std::uint8_t(200 + r), std::uint8_t(255)};
    comms[r]->allgather(mine, all[r].data(), 3);
    comms[r]->barrier();
  })));
  for (int r = 0; r < n; ++r)
    for (int b = 0; b < n; ++b) {
      CHECK(all[r][3 * b] == b);
      CHECK(all[r][3 * b + 1] == 200 + b);
      CHECK(all[r][3 * b + 2] == 255);
    }
  // alltoall: rank r's block j lands at rank j's block r, across and inside the hosts.
  const std::size_t bytes = 5;
  std::vector<std::vector<std::uint8_t>> got(n, std::vector<std::uint8_t>(bytes * n, 0xAA));
  REQUIRE_NOTHROW(rethrow_first(run_ranks(n, [&](int r) {
    std::vector<std::uint8_t> send(bytes * n);
    for (int j = 0; j < n; ++j)
      for (std::size_t b = 0; b < bytes; ++b)
        send[j * bytes + b] = std::uint8_t(r * 40 + j * 7 + b);
    comms[r]->alltoall(send.data(), got[r].data(), bytes);
  })));
  for (int j = 0; j < n; ++j)
    for (int r = 0; r < n; ++r)
      for (std::size_t b = 0; b < bytes; ++b)
        REQUIRE(got[j][r * bytes + b] == std::uint8_t(r * 40 + j * 7 + b));
  CHECK_THROWS_AS(comms[0]->broadcast(all[0].data(), 1, n), comm_error);
}

TEST_CASE("the factory follows comm.hierarchy across hosts and refuses hierarchical without auto") {
  const auto kinds = [](const std::vector<std::string>& hosts, const std::string& hierarchy,
                        std::uint64_t gen) {
    memory_kv kv;
    auto comms = make_group(kv, hosts, gen, hierarchy);
    std::vector<std::string> out;
    for (auto& c : comms) out.emplace_back(c->backend());
    return out;
  };
  const std::vector<std::string> two_by_two = {"a", "a", "b", "b"};
  CHECK(kinds(two_by_two, "auto", 1) == std::vector<std::string>(4, "hierarchical"));
  CHECK(kinds(two_by_two, "flat", 2) == std::vector<std::string>(4, "gloo"));
  // One rank per host: nothing to share, so auto stays flat; hierarchical is obeyed.
  CHECK(kinds({"a", "b", "c"}, "auto", 3) == std::vector<std::string>(3, "gloo"));
  CHECK(kinds({"a", "b", "c"}, "hierarchical", 4) == std::vector<std::string>(3, "hierarchical"));
  // One host: shared memory whatever the hierarchy.
  CHECK(kinds({"a", "a", "a"}, "hierarchical", 5) == std::vector<std::string>(3, "shm"));

  memory_kv kv;
  transport_options t;
  t.transport = comm_transport::gloo;
  t.hierarchy = comm_hierarchy::hierarchical;
  CHECK_THROWS_WITH_AS(make_communicator(comm_backend::gloo, "cpu", kv, 0, 1, 1, 1000, t),
                       doctest::Contains("needs comm.transport: auto (it is 'gloo')"),
                       cohort::usage_error);
}

TEST_CASE("a failure on one host ends every rank's hierarchical call promptly") {
  // Hosts {0,0,1,1}; rank 2 (host 1's leader) never enters the allreduce and aborts. Its
  // local peer fails through the segment; rank 0 through Gloo; rank 1 because rank 0's
  // failure aborts host 0's segment. The collective timeout is 60 s.
  memory_kv kv;
  auto comms = make_group(kv, {"h0", "h0", "h1", "h1"}, 3, "hierarchical", 60000);
  std::vector<comm_failure> kinds(4, comm_failure::invalid);
  std::vector<char> threw(4, 0);  // not vector<bool>: ranks write their own element at once
  std::vector<double> took(4, 0);
  rethrow_first(run_ranks(4, [&](int r) {
    const auto t0 = std::chrono::steady_clock::now();
    if (r == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      comms[r]->abort();
      return;
    }
    std::vector<float> v(100000, 1.0f);
    try {
      comms[r]->allreduce_sum(v.data(), v.size());
    } catch (const comm_error& e) {
      threw[r] = 1;
      kinds[r] = e.kind();
    }
    took[r] = seconds_since(t0);
  }));
  for (int r : {0, 1, 3}) {
    CAPTURE(r);
    CHECK(threw[r]);
    CHECK(took[r] < kSlackSeconds);
    CHECK(comms[r]->dead());
  }
  CHECK(kinds[3] == comm_failure::aborted);
  CHECK(comms[2]->dead());
}
