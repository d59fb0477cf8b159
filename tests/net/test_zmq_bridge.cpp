// zmq_bridge over real loopback sockets: binding reports the real port, frames flow both
// ways between a ROUTER and a DEALER bridge, and every kind of bad inbound frame is dropped
// and counted under its own reason while good traffic keeps flowing.
#include <doctest/doctest.h>
#include <pthread.h>
#include <sys/time.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include <zmq_addon.hpp>

#include "runtime/core/error.hpp"
#include "runtime/net/codec.hpp"
#include "runtime/net/zmq_bridge.hpp"
#include "tests/net/bridge_util.hpp"

using namespace cohort;
using namespace cohort::net;
using cohort::test::eventually;
using cohort::test::inbox;
using std::chrono::milliseconds;

namespace {

bridge_options router_opts(size_t max_bytes = 1 << 16) {
  bridge_options o;
  o.kind = bridge_options::socket_kind::router;
  o.endpoint = "tcp://127.0.0.1:0";
  o.max_message_bytes = max_bytes;
  return o;
}

}  // namespace

TEST_CASE("bridge: binds port 0 to a real port and reports it") {
  inbox in;
  zmq_bridge b(router_opts(), in.fn());
  const std::string ep = b.endpoint();
  CHECK(ep.rfind("tcp://127.0.0.1:", 0) == 0);
  CHECK(ep != "tcp://127.0.0.1:0");
  // The port is taken now: a second bind of exactly it fails with a runtime error.
  bridge_options again = router_opts();
  again.endpoint = ep;
  CHECK_THROWS_AS(zmq_bridge(again, in.fn()), io_error);
  // A malformed endpoint is a usage error.
  again.endpoint = "not-an-endpoint";
  CHECK_THROWS_AS(zmq_bridge(again, in.fn()), usage_error);
}

TEST_CASE("bridge: register is admitted from anyone and the rest only from admitted peers") {
  inbox at_router, at_dealer;
  zmq_bridge router(router_opts(), at_router.fn());
  bridge_options d;
  d.kind = bridge_options::socket_kind::dealer;
  d.endpoint = router.endpoint();
  d.identity = make_identity("test");
  zmq_bridge dealer(d, at_dealer.fn());

  // Before admission: the heartbeat is dropped as unknown_peer, the register passes.
  dealer.send("", heartbeat{1, 1, 1});
  REQUIRE(eventually(milliseconds(5000),
                     [&] { return router.dropped(drop_reason::unknown_peer) == 1; }));
  dealer.send("", register_request{peer_role::worker, "w", 7});
  REQUIRE(at_router.wait_for(1));
  const std::string peer = at_router.at(0).first;
  CHECK(peer == d.identity);  // the fixed routing id survives as the ROUTER's peer name
  CHECK(std::get<register_request>(at_router.at(0).second).name == "w");

  // Admitted: the heartbeat passes, and the ROUTER can answer that peer.
  router.admit(peer);
  dealer.send("", heartbeat{1, 1, 2});
  REQUIRE(at_router.wait_for(2));
  CHECK(std::get<heartbeat>(at_router.at(1).second).seq == 2);
  router.send(peer, heartbeat_ack{1, 1, 2, false});
  REQUIRE(at_dealer.wait_for(1));
  CHECK(at_dealer.at(0).first.empty());
  CHECK(std::get<heartbeat_ack>(at_dealer.at(0).second).seq == 2);

  // Forgotten: back to register only.
  router.forget(peer);
  dealer.send("", heartbeat{1, 1, 3});
  REQUIRE(eventually(milliseconds(5000),
                     [&] { return router.dropped(drop_reason::unknown_peer) == 2; }));
  CHECK(router.delivered() == 2);
}

TEST_CASE("bridge: bad frames are dropped and counted per reason while good ones still flow") {
  inbox in;
  zmq_bridge router(router_opts(1024), in.fn());
  sync_client raw(router.endpoint());
  std::string truncated = encode(register_request{peer_role::worker, "abc", 1});
  truncated.resize(truncated.size() - 1);
  std::string bad_version = encode(register_request{});
  bad_version[4] = static_cast<char>(protocol_version + 1);
  std::string bad_value = encode(register_request{});
  bad_value[envelope_header_bytes] = 9;  // role out of range
  REQUIRE(raw.send_frame("garbage frame here, longer than an envelope"));
  REQUIRE(raw.send_frame(truncated));
  REQUIRE(raw.send_frame(bad_version));
  REQUIRE(raw.send_frame(bad_value));
  REQUIRE(raw.send_frame(std::string(1025, 'x')));
  REQUIRE(raw.send_frame("CH"));
  REQUIRE(raw.send(register_request{peer_role::client, "ok", 2}));
  REQUIRE(in.wait_for(1));
  // Frames of one connection arrive in order, so the counters are final once the good one is in.
  CHECK(router.dropped(drop_reason::bad_magic) == 1);
  CHECK(router.dropped(drop_reason::length_mismatch) == 1);
  CHECK(router.dropped(drop_reason::bad_version) == 1);
  CHECK(router.dropped(drop_reason::bad_value) == 1);
  CHECK(router.dropped(drop_reason::too_large) == 1);
  CHECK(router.dropped(drop_reason::too_short) == 1);
  CHECK(router.delivered() == 1);
  const auto counts = router.drop_counts();
  CHECK(counts.size() == 6);
  for (const auto& [name, n] : counts) CHECK(n == 1);
}

TEST_CASE("bridge: sends from many threads all arrive and stop is prompt and idempotent") {
  inbox at_router;
  zmq_bridge router(router_opts(), at_router.fn());
  bridge_options d;
  d.kind = bridge_options::socket_kind::dealer;
  d.endpoint = router.endpoint();
  d.identity = make_identity("many");
  inbox at_dealer;
  zmq_bridge dealer(d, at_dealer.fn());
  dealer.send("", register_request{});
  REQUIRE(at_router.wait_for(1));
  router.admit(at_router.at(0).first);
  constexpr int threads = 4, per_thread = 250;
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&dealer, t] {
      for (int i = 0; i < per_thread; ++i) {
        dealer.send("", ping{static_cast<uint64_t>(t * per_thread + i), 0});
      }
    });
  }
  for (auto& t : ts) t.join();
  REQUIRE_MESSAGE(at_router.wait_for(1 + threads * per_thread),
                  "send_failed " << dealer.dropped(drop_reason::send_failed));
  std::vector<bool> seen(threads * per_thread, false);
  for (size_t i = 1; i < at_router.size(); ++i) {
    seen[std::get<ping>(at_router.at(i).second).seq] = true;
  }
  for (bool s : seen) CHECK(s);
  dealer.stop();
  dealer.stop();
  dealer.send("", ping{});  // after stop: silently dropped, no crash
}

TEST_CASE("bridge: a peer of another protocol version is told which one this side speaks") {
  // ROUTER side: a frame of version v+1 is dropped (counted), and its sender gets one
  // register_reject in this build's version that names both versions, however often it
  // sends.
  std::atomic<int> seen_version{-2};
  bridge_options ro = router_opts();
  ro.on_version_mismatch = [&](int v) { seen_version = v; };
  inbox in;
  zmq_bridge router(ro, in.fn());
  sync_client old_peer(router.endpoint());
  std::string other = encode(register_request{peer_role::worker, "w", 1});
  other[4] = static_cast<char>(protocol_version + 1);
  REQUIRE(old_peer.send_frame(other));
  REQUIRE(old_peer.send_frame(other));
  const auto reply = old_peer.recv(milliseconds(5000));
  REQUIRE(reply.has_value());
  const auto* reject = std::get_if<register_reject>(&*reply);
  REQUIRE(reject != nullptr);
  CHECK(reject->reason.find("protocol v" + std::to_string(protocol_version)) != std::string::npos);
  CHECK(reject->reason.find("the peer v" + std::to_string(protocol_version + 1)) !=
        std::string::npos);
  CHECK_FALSE(old_peer.recv(milliseconds(300)).has_value());  // told once
  CHECK(router.dropped(drop_reason::bad_version) == 2);
  CHECK(router.delivered() == 0);
  CHECK(seen_version.load() == protocol_version + 1);
  CHECK(frame_version(other) == protocol_version + 1);
  CHECK(frame_version("CH") == -1);
  CHECK(frame_version(std::string(12, 'x')) == -1);

  // DEALER side: a frame of another version from the coordinator reaches the callback
  // (once) with that version, and a sync_client throws naming both versions.
  zmq::context_t ctx(1);
  zmq::socket_t raw_router(ctx, zmq::socket_type::router);
  raw_router.set(zmq::sockopt::linger, 0);
  raw_router.bind("tcp://127.0.0.1:0");
  const std::string ep = raw_router.get(zmq::sockopt::last_endpoint);
  std::atomic<int> dealer_saw{-2};
  std::atomic<int> calls{0};
  bridge_options d;
  d.kind = bridge_options::socket_kind::dealer;
  d.endpoint = ep;
  d.identity = make_identity("w");
  d.on_version_mismatch = [&](int v) {
    dealer_saw = v;
    ++calls;
  };
  inbox at_dealer;
  zmq_bridge dealer(d, at_dealer.fn());
  dealer.send("", register_request{peer_role::worker, "w", 1});
  std::vector<zmq::message_t> got;
  REQUIRE(zmq::recv_multipart(raw_router, std::back_inserter(got)));
  std::string newer = encode(register_ok{});
  newer[4] = static_cast<char>(protocol_version + 2);
  for (int i = 0; i < 2; ++i) {
    raw_router.send(zmq::buffer(got[0].to_string()), zmq::send_flags::sndmore);
    raw_router.send(zmq::buffer(newer));
  }
  CHECK(eventually(milliseconds(5000),
                   [&] { return dealer.dropped(drop_reason::bad_version) == 2; }));
  CHECK(dealer_saw.load() == protocol_version + 2);
  CHECK(calls.load() == 1);
  CHECK(at_dealer.size() == 0);

  sync_client client(ep);
  REQUIRE(client.send(register_request{peer_role::client, "ctl", 1}));
  got.clear();
  REQUIRE(zmq::recv_multipart(raw_router, std::back_inserter(got)));
  raw_router.send(zmq::buffer(got[0].to_string()), zmq::send_flags::sndmore);
  raw_router.send(zmq::buffer(newer));
  try {
    client.recv(milliseconds(5000));
    FAIL("a frame of another version was not reported");
  } catch (const cohort::io_error& e) {
    const std::string what = e.what();
    CHECK(what.find("v" + std::to_string(protocol_version + 2)) != std::string::npos);
    CHECK(what.find("this build v" + std::to_string(protocol_version)) != std::string::npos);
  }
}

TEST_CASE(
    "bridge: a peer that has not registered gets no payload decoded beyond a small register") {
  inbox in;
  zmq_bridge router(router_opts(1 << 20), in.fn());
  sync_client stranger(router.endpoint());
  // A ping whose payload is garbage: refused on its envelope (unknown_peer), so the payload
  // is never read (decoding it would have counted truncated).
  std::string ping_frame = encode(ping{1, 2});
  ping_frame.resize(envelope_header_bytes + 3);
  ping_frame[8] = 3;  // the length field matches the garbage
  ping_frame[9] = ping_frame[10] = ping_frame[11] = 0;
  REQUIRE(stranger.send_frame(ping_frame));
  // A register_request over max_unregistered_bytes (a 5000-byte name), well under the
  // bridge's max_message_bytes: too_large, unread.
  REQUIRE(stranger.send(register_request{peer_role::worker, std::string(5000, 'n'), 1}));
  REQUIRE(stranger.send(register_request{peer_role::worker, "w", 1}));
  REQUIRE(in.wait_for(1));
  CHECK(router.dropped(drop_reason::unknown_peer) == 1);
  CHECK(router.dropped(drop_reason::truncated) == 0);
  CHECK(router.dropped(drop_reason::too_large) == 1);
  CHECK(router.delivered() == 1);
  // Once admitted, the same peer may send large messages up to max_message_bytes.
  router.admit(in.at(0).first);
  REQUIRE(stranger.send(kv_set{1, 1, "k", std::string(100000, 'v')}));
  REQUIRE(in.wait_for(2));
  CHECK(router.dropped(drop_reason::too_large) == 1);
}

TEST_CASE("bridge: a dealer moves between leaders and drops what a lower term says") {
  inbox at_a, at_b, at_dealer;
  bridge_options ao = router_opts();
  ao.term = 2;
  zmq_bridge a(ao, at_a.fn());
  bridge_options bo = router_opts();
  bo.term = 1;  // a deposed leader: a lower term than a's
  zmq_bridge b(bo, at_b.fn());
  bridge_options d;
  d.kind = bridge_options::socket_kind::dealer;
  d.endpoint = a.endpoint();
  d.identity = make_identity("test");
  zmq_bridge dealer(d, at_dealer.fn());

  dealer.send("", register_request{peer_role::worker, "w", 7});
  REQUIRE(at_a.wait_for(1));
  a.admit(at_a.at(0).first);
  a.send(at_a.at(0).first, stop{"from term 2"});
  REQUIRE(at_dealer.wait_for(1));
  CHECK(dealer.term_floor() == 2);

  // To b, with the same routing id: b hears the registration; what b says in term 1 is
  // dropped, except a refusal, which commands nothing.
  dealer.reconnect(b.endpoint());
  REQUIRE(eventually(milliseconds(5000), [&] {
    dealer.send("", register_request{peer_role::worker, "w", 7});
    return at_b.wait_for(1, milliseconds(50));
  }));
  CHECK(at_b.at(0).first == d.identity);
  b.admit(d.identity);
  b.send(d.identity, stop{"from term 1"});
  REQUIRE(eventually(milliseconds(5000),
                     [&] { return dealer.dropped(drop_reason::stale_term) == 1; }));
  b.send(d.identity, register_reject{"standby"});
  REQUIRE(at_dealer.wait_for(2));
  CHECK(std::get<register_reject>(at_dealer.at(1).second).reason == "standby");
  CHECK(dealer.term_floor() == 2);

  // A higher term raises the floor.
  b.set_term(3);
  b.send(d.identity, stop{"from term 3"});
  REQUIRE(at_dealer.wait_for(3));
  CHECK(std::get<stop>(at_dealer.at(2).second).reason == "from term 3");
  CHECK(dealer.term_floor() == 3);
}

namespace {
std::atomic<int> alarms{0};
void count_alarm(int) { alarms.fetch_add(1, std::memory_order_relaxed); }
}  // namespace

TEST_CASE("sync_client: signals arriving all the time cut no send and no receive") {
  // SIGALRM blocked in every thread the bridge and ZeroMQ start, so that only this one takes
  // it; a handler without SA_RESTART, as the launcher's SIGCHLD cuts its calls.
  sigset_t alrm;
  sigemptyset(&alrm);
  sigaddset(&alrm, SIGALRM);
  pthread_sigmask(SIG_BLOCK, &alrm, nullptr);
  inbox in;
  zmq_bridge router(router_opts(), in.fn());
  sync_client client(router.endpoint());
  struct sigaction sa {};
  sa.sa_handler = count_alarm;
  sigaction(SIGALRM, &sa, nullptr);
  pthread_sigmask(SIG_UNBLOCK, &alrm, nullptr);
  itimerval every{{0, 50}, {0, 50}};  // every 50 us
  setitimer(ITIMER_REAL, &every, nullptr);
  int sent = 0;
  std::string error;
  const auto until = std::chrono::steady_clock::now() + milliseconds(500);
  try {
    while (std::chrono::steady_clock::now() < until) {
      if (client.send(heartbeat{1, 1})) ++sent;
      client.recv(milliseconds(0));
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  itimerval off{};
  setitimer(ITIMER_REAL, &off, nullptr);
  signal(SIGALRM, SIG_DFL);
  CHECK_MESSAGE(error.empty(), error);
  CHECK(alarms.load() > 10);  // slack for a loaded machine
  CHECK(sent > 10);
}
