// coordinator_node and worker_node wired for real (actor systems, bridges, heartbeat
// threads, tcp loopback) inside one test process: registration, generations seen by the
// workers, the rendezvous store through a worker's connection, and a clean stop.
#include <doctest/doctest.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <thread>

#include "actors/coordinator.hpp"
#include "actors/worker.hpp"
#include "tests/actors/node_util.hpp"

using namespace cohort;
using namespace cohort::actors;
using namespace cohort::actors::testing;
using std::chrono::milliseconds;

TEST_CASE("nodes: two workers register and rendezvous through the store and stop with code 0") {
  spdlog::set_level(spdlog::level::warn);
  // The store's test seam says when a wait is left pending (on the coordinator's thread).
  std::promise<void> pending;
  std::atomic<int> pendings{0};
  coordinator_options o = two_workers();
  o.kv.on_pending = [&] {
    if (pendings.fetch_add(1) == 0) pending.set_value();
  };
  coordinator_node coord(o, "tcp://127.0.0.1:0", 1 << 20);
  worker_node a(coord.endpoint(), named("a"), 1 << 20);
  worker_node b(coord.endpoint(), named("b"), 1 << 20);
  // Both see generation 2 (one per join) once the second roster reached them.
  REQUIRE(
      eventually(milliseconds(10000), [&] { return a.generation() == 2 && b.generation() == 2; }));
  CHECK(a.member_id() != 0);
  CHECK(b.member_id() != 0);
  CHECK(a.member_id() != b.member_id());

  // b waits for a key that a publishes once b's wait is pending in the store; b's wait
  // completes with ok, answered by the set.
  auto waiting = std::async(std::launch::async, [&] {
    return b.kv_call(net::kv_wait{0, 2, {"rank0/addr"}, 5000}, milliseconds(10000));
  });
  pending.get_future().wait();
  const net::kv_reply set =
      a.kv_call(net::kv_set{0, 2, "rank0/addr", "127.0.0.1:7777"}, milliseconds(5000));
  CHECK(set.status == net::kv_status::ok);
  const net::kv_reply waited = waiting.get();
  CHECK(waited.status == net::kv_status::ok);
  CHECK(pendings.load() == 1);
  const net::kv_reply got = b.kv_call(net::kv_get{0, 2, "rank0/addr", 0}, milliseconds(5000));
  CHECK(got.status == net::kv_status::ok);
  CHECK(got.value == "127.0.0.1:7777");
  // A generation the roster has not reached: refused, so nobody can pre-set it.
  const net::kv_reply other = b.kv_call(net::kv_get{0, 3, "rank0/addr", 0}, milliseconds(5000));
  CHECK(other.status == net::kv_status::invalid);
  CHECK(other.reason.find("does not exist yet") != std::string::npos);

  // The coordinator's status sees both alive: a member is "joining" until its first
  // heartbeat arrives, which on a loaded machine can come after the calls above.
  caf::scoped_actor self{coord.system()};
  auto alive_count = [&] {
    int alive = 0;
    self->request(coord.actor(), caf::infinite, co_status_atom::value)
        .receive(
            [&](const net::status_reply& s) {
              for (const auto& w : s.workers) alive += w.member.state == net::member_state::alive;
            },
            [&](const caf::error&) {});
    return alive;
  };
  CHECK(eventually(milliseconds(10000), [&] { return alive_count() == 2; }));

  coord.request_stop("test done");
  coord.wait();
  CHECK(a.wait() == 0);
  CHECK(b.wait() == 0);
}
