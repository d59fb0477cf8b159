// Host agents on the wire (runtime/net/relay.*, the coordinator bridge's relayed peers): the
// relayed peers' names, the agent's heartbeat table as tables, and a keyed bridge that lets
// only a registered agent with the launcher key relay, holding each relayed frame to a
// worker's rules under the worker's own name.
#include <doctest/doctest.h>

#include <chrono>
#include <string>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "runtime/net/codec.hpp"
#include "runtime/net/curve.hpp"
#include "runtime/net/relay.hpp"
#include "runtime/net/zmq_bridge.hpp"
#include "tests/data/temp_dir.hpp"
#include "tests/net/bridge_util.hpp"

using namespace cohort;
using namespace cohort::net;
using cohort::test::eventually;
using cohort::test::inbox;
using std::chrono::milliseconds;

TEST_CASE("relayed peers: names no direct routing id can take, split back exactly") {
  const std::string p = relay_peer("agent-h1-42", "w0");
  CHECK(is_relay_peer(p));
  const auto s = split_relay_peer(p);
  REQUIRE(s.has_value());
  CHECK(s->first == "agent-h1-42");
  CHECK(s->second == "w0");
  CHECK(relayed_by(p, "agent-h1-42"));
  CHECK_FALSE(relayed_by(p, "agent-h1-4"));
  CHECK_FALSE(relayed_by(relay_peer("agent-h1-4", "2w0"), "agent-h1-42"));
  // Ids that would run into each other without the length stay apart.
  CHECK(relay_peer("ab", "c") != relay_peer("a", "bc"));
  for (const char* direct : {"worker-1-abc", "launch-7-0011", "", "x"}) {
    CAPTURE(direct);
    CHECK_FALSE(is_relay_peer(direct));
    CHECK_FALSE(split_relay_peer(direct).has_value());
  }
  // Malformed: a length past the end, or no worker id.
  CHECK_FALSE(split_relay_peer(std::string("\x1f\x05" "ab", 4)).has_value());
  CHECK_FALSE(split_relay_peer(std::string("\x1f\x02" "ab", 4)).has_value());
  CHECK(is_agent_name("agent-node7"));
  CHECK_FALSE(is_agent_name("agent-"));
  CHECK_FALSE(is_agent_name("launch"));
  CHECK_FALSE(is_agent_name("worker-agent-1"));
}

TEST_CASE("the agent's heartbeat table: who is vouched for, who is hung, each once") {
  using clock = relay_beats::mono;
  const clock t0{};
  const auto at = [&](int ms) { return t0 + milliseconds(ms); };
  relay_beats b(milliseconds(500));
  b.on_register("w0", register_request{peer_role::worker, "h-0", 100}, at(0));
  b.on_register("w1", register_request{peer_role::worker, "h-1", 101}, at(0));
  // Nothing beat yet: an empty host beat, nobody hung (never past a first beat).
  CHECK(b.take(at(0)).empty());
  CHECK(b.hung(at(10000)).empty());

  struct row {
    int at_ms;
    const char* beats;    // workers that beat at this time ("" none)
    const char* relayed;  // what take() lists after it: heard within the 500 ms
    const char* hung;     // what hung() reports at this time
  };
  const row table[] = {
      {100, "w0 w1", "w0 w1", ""},
      {200, "w0", "w0 w1", ""},     // w1 missed one: still vouched for (heard 100 ms ago)
      {300, "", "w0 w1", ""},       // nobody beat since: both heard within the timeout
      {550, "w0", "w0 w1", ""},     // w1 silent 450 ms since its beat at 100
      {650, "w0", "w0", "h-1"},     // 550 ms, past 500: no longer listed, reported ...
      {800, "w0", "w0", ""},        // ... once
      {900, "w0 w1", "w0 w1", ""},  // it beat again: listed, and may be reported again
      {1500, "w0", "w0", "h-1"},
  };
  for (const row& r : table) {
    CAPTURE(r.at_ms);
    std::string word;
    for (const char* p = r.beats;; ++p) {
      if (*p == ' ' || *p == 0) {
        if (!word.empty()) b.on_beat(word, heartbeat{7, 3, static_cast<uint64_t>(r.at_ms), false}, at(r.at_ms));
        word.clear();
        if (*p == 0) break;
      } else {
        word += *p;
      }
    }
    std::string relayed;
    for (const auto& e : b.take(at(r.at_ms))) relayed += (relayed.empty() ? "" : " ") + e.worker;
    CHECK(relayed == r.relayed);
    std::string hung;
    for (const auto& h : b.hung(at(r.at_ms))) {
      hung += (hung.empty() ? "" : " ") + h.name;
      CHECK(h.pid == 101);
      CHECK(h.for_ms > milliseconds(500));
    }
    CHECK(hung == r.hung);
  }
  // The newest beat's fields travel.
  b.on_beat("w0", heartbeat{9, 4, 77, true}, at(1600));
  const auto e = b.take(at(1600));
  REQUIRE(e.size() == 1);
  CHECK(e[0].member_id == 9);
  CHECK(e[0].generation == 4);
  CHECK(e[0].seq == 77);
  // An exit forgets the worker; a registration starts it over.
  b.forget_name("h-1");
  CHECK(b.size() == 1);
  b.on_register("w0", register_request{peer_role::worker, "h-0", 200}, at(1700));
  CHECK(b.take(at(1700)).empty());
  CHECK(b.hung(at(5000)).empty());
}

TEST_CASE("the agent's table is bounded: the longest quiet routing id goes first") {
  relay_beats b(milliseconds(500), 3);
  const relay_beats::mono t0{};
  for (int i = 0; i < 5; ++i)
    b.on_beat("w" + std::to_string(i), heartbeat{}, t0 + milliseconds(i));
  CHECK(b.size() == 3);
  std::string relayed;
  for (const auto& e : b.take(t0 + milliseconds(5))) relayed += e.worker;
  CHECK(relayed == "w2w3w4");
}

TEST_CASE("roles: host beats are the launcher key's, agents register with it only") {
  CHECK(role_may_send(key_role::launcher, static_cast<int>(msg_type::host_beat)));
  CHECK_FALSE(role_may_send(key_role::worker, static_cast<int>(msg_type::host_beat)));
  CHECK_FALSE(role_may_send(key_role::admin, static_cast<int>(msg_type::host_beat)));
  CHECK_FALSE(role_may_send(key_role::launcher, static_cast<int>(msg_type::host_beat_ack)));
  const register_request agent{peer_role::client, "agent-node3", 1};
  CHECK(registration_problem(key_role::launcher, agent).empty());
  CHECK_FALSE(registration_problem(key_role::admin, agent).empty());
  CHECK_FALSE(registration_problem(key_role::worker, agent).empty());
}

namespace {

// A raw DEALER with KEYS (as the agent's relay is): frames of one or two parts.
struct raw_dealer {
  zmq::context_t ctx{1};
  zmq::socket_t s{ctx, zmq::socket_type::dealer};
  raw_dealer(const std::string& ep, const std::string& id, const client_keys& k) {
    s.set(zmq::sockopt::linger, 0);
    s.set(zmq::sockopt::routing_id, id);
    s.set(zmq::sockopt::curve_serverkey, k.server_public);
    s.set(zmq::sockopt::curve_publickey, k.self.public_key);
    s.set(zmq::sockopt::curve_secretkey, k.self.secret_key);
    s.connect(ep);
  }
  void send(const message& m) { s.send(zmq::buffer(encode(m)), zmq::send_flags::none); }
  void relay(const std::string& worker, const message& m) {
    const std::string f = encode(m);
    s.send(zmq::buffer(worker), zmq::send_flags::sndmore);
    s.send(zmq::buffer(f), zmq::send_flags::none);
  }
  // The next multipart message within TIMEOUT (empty when none).
  std::vector<std::string> recv(milliseconds timeout) {
    zmq::pollitem_t item{s.handle(), 0, ZMQ_POLLIN, 0};
    std::vector<std::string> out;
    if (zmq::poll(&item, 1, timeout) <= 0) return out;
    std::vector<zmq::message_t> parts;
    if (!zmq::recv_multipart(s, std::back_inserter(parts))) return out;
    for (auto& p : parts) out.push_back(p.to_string());
    return out;
  }
};

}  // namespace

TEST_CASE("bridge with keys: only a registered agent with the launcher key relays, and a relayed "
          "frame is its worker's, under the worker's name, answered through the agent") {
  cohort::test::temp_dir tmp;
  const std::string dir = tmp.file("keys");
  write_job_keys(dir);
  bridge_options o;
  o.kind = bridge_options::socket_kind::router;
  o.max_message_bytes = 1 << 16;
  o.curve_server = std::make_shared<const server_keys>(load_server_keys(dir));
  inbox in;
  zmq_bridge router(o, in.fn());
  const client_keys launcher = load_client_keys(dir, key_role::launcher);
  const client_keys worker = load_client_keys(dir, key_role::worker);

  raw_dealer agent(router.endpoint(), "agent-h-1", launcher);
  agent.send(register_request{peer_role::client, "agent-h", 1});
  REQUIRE(in.wait_for(1));
  CHECK(in.at(0).first == "agent-h-1");
  CHECK(in.role_at(0) == key_role::launcher);
  router.admit("agent-h-1");
  // Before the coordinator makes it a relay, its relayed frames and host beats are dropped.
  agent.relay("w0", register_request{peer_role::worker, "h-0", 5});
  agent.send(host_beat{1, false, {}});
  REQUIRE(eventually(milliseconds(10000),
                     [&] { return router.dropped(drop_reason::unknown_peer) == 2; }));
  router.allow_relay("agent-h-1");
  agent.relay("w0", register_request{peer_role::worker, "h-0", 5});
  REQUIRE(in.wait_for(2));
  const std::string w0 = relay_peer("agent-h-1", "w0");
  CHECK(in.at(1).first == w0);
  CHECK(in.role_at(1) == key_role::worker);  // the worker's frame, held to its rules
  // A relayed frame a worker may not send is dropped as the worker's would be.
  agent.relay("w0", stop{"not a worker's"});
  REQUIRE(eventually(milliseconds(10000),
                     [&] { return router.dropped(drop_reason::wrong_role) == 1; }));
  // A relayed worker not admitted yet: only its registration passes.
  agent.relay("w0", heartbeat{1, 1, 1, false});
  REQUIRE(eventually(milliseconds(10000),
                     [&] { return router.dropped(drop_reason::unknown_peer) == 3; }));
  router.admit(w0);
  agent.relay("w0", heartbeat{1, 1, 2, false});
  agent.send(host_beat{2, true, {relayed_beat{"w0", 1, 1, 3}}});
  REQUIRE(in.wait_for(4));
  CHECK(type_of(in.at(2).second) == msg_type::heartbeat);
  CHECK(in.at(2).first == w0);
  CHECK(type_of(in.at(3).second) == msg_type::host_beat);
  CHECK(in.at(3).first == "agent-h-1");
  // An answer to the relayed worker reaches the agent as [worker, frame].
  router.send(w0, heartbeat_ack{1, 1, 2, true});
  const auto got = agent.recv(milliseconds(10000));
  REQUIRE(got.size() == 2);
  CHECK(got[0] == "w0");
  const decoded d = decode(got[1], 1 << 16);
  REQUIRE(d.ok());
  CHECK(std::get<heartbeat_ack>(d.msg).rejoin_required);

  // A worker key's connection relays nothing, even when its routing id is a registered
  // agent's; and a direct routing id shaped like a relayed name is refused.
  raw_dealer impostor(router.endpoint(), "w-impostor", worker);
  impostor.send(register_request{peer_role::worker, "imp", 9});
  REQUIRE(in.wait_for(5));
  router.admit("w-impostor");
  impostor.relay("w9", register_request{peer_role::worker, "x", 1});
  impostor.send(host_beat{1, false, {}});
  REQUIRE(eventually(milliseconds(10000),
                     [&] { return router.dropped(drop_reason::unknown_peer) == 5; }));
  raw_dealer shaped(router.endpoint(), relay_peer("agent-h-1", "w0"), worker);
  shaped.send(register_request{peer_role::worker, "shaped", 1});
  REQUIRE(eventually(milliseconds(10000),
                     [&] { return router.dropped(drop_reason::bad_parts) == 1; }));
  CHECK(in.size() == 5);
}
