// remote_kv: the status -> comm_error mapping and the requests it builds, against a fake
// call (no sockets); then for real through worker_nodes and an in-process coordinator:
// round trips, blocking get and wait satisfied by another thread, timeouts, generation
// scoping, superseded generations, and a Gloo communicator rendezvousing over it.
#include <doctest/doctest.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "actors/coordinator.hpp"
#include "runtime/step/remote_kv.hpp"
#include "actors/worker.hpp"
#include "runtime/comm/comm_error.hpp"
#include "runtime/comm/factory.hpp"
#include "tests/actors/node_util.hpp"

using namespace cohort;
using namespace cohort::actors;
using namespace cohort::step;
using namespace cohort::actors::testing;
using comm::comm_error;
using comm::comm_failure;
using std::chrono::milliseconds;

namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::vector<char> bytes(const std::string& s) { return std::vector<char>(s.begin(), s.end()); }

/// Runs `f`, which must throw comm_error; returns it so the caller can check kind and text.
comm_error thrown_by(const std::function<void()>& f) {
  try {
    f();
  } catch (const comm_error& e) {
    return e;
  }
  FAIL("expected a comm_error");
  return comm_error(comm_failure::invalid, "", "");
}

/// A call_fn that records what it was asked and answers a scripted reply.
struct fake_call {
  std::vector<net::message> requests;
  std::vector<milliseconds> timeouts;
  net::kv_reply answer;
  remote_kv::call_fn fn() {
    return [this](net::message m, milliseconds t) {
      requests.push_back(std::move(m));
      timeouts.push_back(t);
      return answer;
    };
  }
};

net::kv_reply reply(net::kv_status s, std::string reason, std::string value = {}) {
  return net::kv_reply{0, s, std::move(value), std::move(reason)};
}

// Control frames may be larger than the store's 1 MiB value limit, so an oversized value
// reaches the store and is refused there with a reason (not dropped by the bridge).
constexpr size_t max_message_bytes = 4 << 20;

remote_kv::call_fn through(worker_node& w) {
  return [&w](net::message m, milliseconds t) { return w.kv_call(std::move(m), t); };
}

void stop_all(coordinator_node& coord, std::vector<worker_node*> workers) {
  coord.request_stop("test done");
  coord.wait();
  for (worker_node* w : workers) CHECK(w->wait() == 0);
}

}  // namespace

TEST_CASE("remote_kv builds generation-tagged requests with the round-trip slack") {
  fake_call f;
  f.answer = reply(net::kv_status::ok, "");
  remote_kv kv(f.fn(), 7, milliseconds(300));
  CHECK(kv.generation() == 7);
  CHECK(kv.slack() == milliseconds(300));

  const std::vector<char> value{'a', '\0', '\xff', 'b'};  // opaque bytes, zeros included
  kv.set("rank0/addr", value);
  REQUIRE(f.requests.size() == 1);
  const auto* s = std::get_if<net::kv_set>(&f.requests[0]);
  REQUIRE(s != nullptr);
  CHECK(s->generation == 7);
  CHECK(s->key == "rank0/addr");
  CHECK(s->value == std::string("a\0\xff"
                                "b",
                                4));
  CHECK(f.timeouts[0] == milliseconds(300));  // a set waits for nothing but the answer

  f.answer = reply(net::kv_status::ok, "", std::string("x\0y", 3));
  CHECK(kv.get("k", milliseconds(1500)) == std::vector<char>{'x', '\0', 'y'});
  const auto* g = std::get_if<net::kv_get>(&f.requests[1]);
  REQUIRE(g != nullptr);
  CHECK(g->generation == 7);
  CHECK(g->key == "k");
  CHECK(g->timeout_ms == 1500);  // Gloo's blocking get: the coordinator holds it this long
  CHECK(f.timeouts[1] == milliseconds(1800));

  kv.wait({"a", "b", "c"}, milliseconds(40));
  const auto* w = std::get_if<net::kv_wait>(&f.requests[2]);
  REQUIRE(w != nullptr);
  CHECK(w->generation == 7);
  CHECK(w->keys == std::vector<std::string>{"a", "b", "c"});
  CHECK(w->timeout_ms == 40);
  CHECK(f.timeouts[2] == milliseconds(340));

  // Timeouts outside u32 milliseconds: negative is "now", huge is clamped, and the
  // round-trip deadline does not overflow.
  kv.get("k", milliseconds(-5));
  CHECK(std::get<net::kv_get>(f.requests[3]).timeout_ms == 0);
  CHECK(f.timeouts[3] == milliseconds(300));
  kv.wait({"k"}, milliseconds::max());
  CHECK(std::get<net::kv_wait>(f.requests[4]).timeout_ms == std::numeric_limits<uint32_t>::max());
  CHECK(f.timeouts[4] == milliseconds::max());
  kv.get("k", milliseconds(int64_t{1} << 40));
  CHECK(std::get<net::kv_get>(f.requests[5]).timeout_ms == std::numeric_limits<uint32_t>::max());
  CHECK(f.timeouts[5] == milliseconds((int64_t{1} << 40) + 300));
}

TEST_CASE("remote_kv maps every reply status to its comm_error kind") {
  fake_call f;
  remote_kv kv(f.fn(), 12);

  f.answer = reply(net::kv_status::timeout, "timed out after 100 ms with 1 of 1 key(s) unset");
  comm_error e = thrown_by([&] { kv.get("rank1/addr", milliseconds(100)); });
  CHECK(e.kind() == comm_failure::timeout);
  CHECK(e.op() == "rendezvous get 'rank1/addr'");
  CHECK(contains(e.what(), "timed out after 100 ms"));
  e = thrown_by([&] { kv.wait({"a", "b"}, milliseconds(100)); });
  CHECK(e.kind() == comm_failure::timeout);
  CHECK(e.op() == "rendezvous wait 'a', 'b'");
  // A set times out only when the coordinator never answered: say what can cause that.
  f.answer = reply(net::kv_status::timeout, "no answer from the coordinator within 2000 ms");
  e = thrown_by([&] { kv.set("big", std::vector<char>(10)); });
  CHECK(e.kind() == comm_failure::timeout);
  CHECK(contains(e.what(), "no answer from the coordinator"));
  CHECK(contains(e.what(), "control.max_message_bytes"));

  // not_found: a get answered at once for a key nobody set is a rendezvous timeout.
  f.answer = reply(net::kv_status::not_found, "key 'k' is not set in generation 12");
  e = thrown_by([&] { kv.get("k", milliseconds(0)); });
  CHECK(e.kind() == comm_failure::timeout);
  CHECK(contains(e.what(), "key 'k' is not set in generation 12"));

  f.answer = reply(net::kv_status::superseded, "the roster moved to 13");
  for (const auto& op : std::vector<std::function<void()>>{
           [&] { kv.set("k", bytes("v")); }, [&] { kv.get("k", milliseconds(10)); },
           [&] { kv.wait({"k"}, milliseconds(10)); }}) {
    e = thrown_by(op);
    CHECK(e.kind() == comm_failure::rendezvous);
    CHECK(contains(e.what(), "generation 12 was superseded: rebuild for the current generation"));
    CHECK(contains(e.what(), "the roster moved to 13"));
  }

  f.answer = reply(net::kv_status::invalid, "value for 'k' is 2000000 bytes; the limit is 1048576");
  e = thrown_by([&] { kv.set("k", bytes("v")); });
  CHECK(e.kind() == comm_failure::invalid);
  CHECK(e.op() == "rendezvous set 'k'");
  CHECK(contains(e.what(), "the limit is 1048576"));

  // A status the protocol does not answer with (pending never crosses the wire).
  f.answer = reply(static_cast<net::kv_status>(1), "");
  e = thrown_by([&] { kv.wait({"k"}, milliseconds(10)); });
  CHECK(e.kind() == comm_failure::rendezvous);
  CHECK(contains(e.what(), "unexpected answer (status 1)"));

  // ok answers return normally, whatever the call.
  f.answer = reply(net::kv_status::ok, "", "value");
  kv.set("k", bytes("value"));
  kv.wait({"k"}, milliseconds(10));
  CHECK(kv.get("k", milliseconds(10)) == bytes("value"));
}

TEST_CASE("remote_kv through two workers: round trips, blocking calls, timeouts, generations") {
  spdlog::set_level(spdlog::level::warn);
  coordinator_node coord(two_workers(), "tcp://127.0.0.1:0", max_message_bytes);
  worker_node a(coord.endpoint(), named("a"), max_message_bytes);
  worker_node b(coord.endpoint(), named("b"), max_message_bytes);
  // Two joins: generation 2 once both have seen the second roster.
  REQUIRE(
      eventually(milliseconds(10000), [&] { return a.generation() == 2 && b.generation() == 2; }));
  const uint64_t gen = a.generation();
  remote_kv ka(through(a), gen), kb(through(b), gen);

  {  // set on one worker, get on the other; values are opaque bytes
    ka.set("rank0/addr", bytes("127.0.0.1:7777"));
    CHECK(kb.get("rank0/addr", milliseconds(0)) == bytes("127.0.0.1:7777"));
    CHECK(kb.get("rank0/addr", milliseconds(5000)) == bytes("127.0.0.1:7777"));
    // Every byte value, zeros included, in a value of 256 KiB.
    std::vector<char> big(256 << 10);
    for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>((i * 7 + i / 256) & 0xff);
    kb.set("blob", big);
    CHECK(ka.get("blob", milliseconds(0)) == big);
    // A second set overwrites.
    ka.set("rank0/addr", bytes("127.0.0.1:8888"));
    CHECK(kb.get("rank0/addr", milliseconds(0)) == bytes("127.0.0.1:8888"));
    // Over the store's value limit (1 MiB): refused with the store's reason.
    const comm_error e = thrown_by([&] { ka.set("huge", std::vector<char>(2 << 20, 'x')); });
    CHECK(e.kind() == comm_failure::invalid);
    CHECK(contains(e.what(), "the limit is 1048576"));
  }

  {  // a blocking get returns once another thread sets the key
    auto got = std::async(std::launch::async, [&] { return kb.get("late", milliseconds(10000)); });
    // It cannot be ready: nobody set the key, and an early answer would be a bug.
    CHECK(got.wait_for(milliseconds(100)) == std::future_status::timeout);
    ka.set("late", bytes("here"));
    CHECK(got.get() == bytes("here"));
  }

  {  // wait on several keys returns once the last one is set
    auto waited = std::async(std::launch::async, [&] {
      kb.wait({"w/0", "w/1", "w/2"}, milliseconds(10000));
      return true;
    });
    ka.set("w/0", bytes("0"));
    kb.set("w/2", bytes("2"));
    CHECK(waited.wait_for(milliseconds(100)) == std::future_status::timeout);
    ka.set("w/1", bytes("1"));
    CHECK(waited.get());
    // Keys already set: returns at once, even with a zero timeout.
    ka.wait({"w/0", "w/1", "w/2"}, milliseconds(0));
    // One missing key with a zero timeout: timeout, naming it.
    const comm_error e = thrown_by([&] { ka.wait({"w/0", "w/3"}, milliseconds(0)); });
    CHECK(e.kind() == comm_failure::timeout);
  }

  {  // get and wait of keys nobody sets time out with comm_error(timeout)
    const auto start = std::chrono::steady_clock::now();
    comm_error e = thrown_by([&] { kb.get("never", milliseconds(300)); });
    const auto waited = std::chrono::steady_clock::now() - start;
    CHECK(e.kind() == comm_failure::timeout);
    CHECK(contains(e.what(), "'never'"));
    // It did wait (the coordinator held the request), and did not hang: a bound far above
    // timeout + slack, not a speed figure.
    CHECK(waited >= milliseconds(300));
    CHECK(waited < milliseconds(30000));

    e = thrown_by([&] { ka.wait({"never/1", "never/2"}, milliseconds(200)); });
    CHECK(e.kind() == comm_failure::timeout);
    CHECK(contains(e.what(), "2 of 2 key(s)"));
    e = thrown_by([&] { ka.get("never", milliseconds(0)); });
    CHECK(e.kind() == comm_failure::timeout);
  }

  {  // a generation the roster has not reached is refused: nobody can fill or pre-set it
    // (keys of different generations are different entries: tests/net/test_kv_store.cpp)
    ka.set("scoped", bytes("g"));
    remote_kv next(through(b), gen + 1);
    comm_error e = thrown_by([&] { next.get("scoped", milliseconds(0)); });
    CHECK(e.kind() == comm_failure::invalid);
    CHECK(contains(e.what(), "does not exist yet"));
    e = thrown_by([&] { next.get("scoped", milliseconds(200)); });
    CHECK(e.kind() == comm_failure::invalid);
    e = thrown_by([&] { next.set("scoped", bytes("g+1")); });
    CHECK(e.kind() == comm_failure::invalid);
    CHECK(kb.get("scoped", milliseconds(0)) == bytes("g"));  // the current one is untouched
  }

  stop_all(coord, {&a, &b});
}

TEST_CASE("remote_kv of a generation the roster has left: superseded, even for a pending get") {
  spdlog::set_level(spdlog::level::warn);
  coordinator_node coord(two_workers(), "tcp://127.0.0.1:0", max_message_bytes);
  worker_node a(coord.endpoint(), named("a"), max_message_bytes);
  REQUIRE(eventually(milliseconds(10000), [&] { return a.generation() == 1; }));
  remote_kv old(through(a), a.generation());
  old.set("rank0/addr", bytes("x"));
  CHECK(old.get("rank0/addr", milliseconds(0)) == bytes("x"));
  // A get pending in generation 1 when the second join moves the roster to 2.
  auto pending =
      std::async(std::launch::async, [&] { return old.get("rank1/addr", milliseconds(20000)); });
  CHECK(pending.wait_for(milliseconds(100)) == std::future_status::timeout);

  worker_node b(coord.endpoint(), named("b"), max_message_bytes);
  REQUIRE(
      eventually(milliseconds(10000), [&] { return a.generation() == 2 && b.generation() == 2; }));
  comm_error e = thrown_by([&] { pending.get(); });
  CHECK(e.kind() == comm_failure::rendezvous);
  CHECK(contains(e.what(), "generation 1 was superseded: rebuild for the current generation"));
  // Every later request of generation 1 too; the current generation works.
  e = thrown_by([&] { old.set("rank0/addr", bytes("y")); });
  CHECK(e.kind() == comm_failure::rendezvous);
  CHECK(contains(e.what(), "generation 1 was superseded"));
  remote_kv current(through(a), a.generation());
  current.set("rank0/addr", bytes("z"));
  CHECK(current.get("rank0/addr", milliseconds(0)) == bytes("z"));

  stop_all(coord, {&a, &b});
}

TEST_CASE("two ranks rendezvous a Gloo communicator over remote_kv and allreduce") {
  spdlog::set_level(spdlog::level::warn);
  coordinator_node coord(two_workers(), "tcp://127.0.0.1:0", max_message_bytes);
  worker_node a(coord.endpoint(), named("a"), max_message_bytes);
  worker_node b(coord.endpoint(), named("b"), max_message_bytes);
  REQUIRE(
      eventually(milliseconds(10000), [&] { return a.generation() == 2 && b.generation() == 2; }));
  const uint64_t gen = a.generation();

  // Count what each rank sent through its worker, to see that Gloo used this path.
  std::atomic<int> calls[2] = {{0}, {0}};
  worker_node* nodes[2] = {&a, &b};
  constexpr size_t n = 1000;
  auto rank_main = [&](int rank) {
    remote_kv kv(
        [&, rank](net::message m, milliseconds t) {
          ++calls[rank];
          return nodes[rank]->kv_call(std::move(m), t);
        },
        gen);
    auto c = comm::make_communicator(comm_backend::gloo, "cpu", kv, rank, 2, gen, 10000);
    CHECK(std::string(c->backend()) == "gloo");
    CHECK(c->rank() == rank);
    CHECK(c->size() == 2);
    // Rank r contributes i + 1000 r: the sum is 2 i + 1000, exact in float.
    std::vector<float> x(n);
    for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>(i + 1000 * rank);
    c->allreduce_sum(x.data(), n);
    return x;
  };
  auto r0 = std::async(std::launch::async, rank_main, 0);
  auto r1 = std::async(std::launch::async, rank_main, 1);
  const std::vector<float> x0 = r0.get(), x1 = r1.get();
  for (size_t i = 0; i < n; ++i) {
    const float want = static_cast<float>(2 * i + 1000);
    if (x0[i] != want || x1[i] != want) {
      CHECK(x0[i] == want);
      CHECK(x1[i] == want);
      break;
    }
  }
  CHECK(x0 == x1);
  CHECK(calls[0].load() > 0);
  CHECK(calls[1].load() > 0);

  stop_all(coord, {&a, &b});
}
