// The role of every request is the role of the key that opened its connection (issue #33):
// a worker key's connection gains no admin power however it churns the roster, and a
// connection whose member's record is pruned is forgotten. First on the testing scheduler
// (recorded frames, manual clock, small tombstone bounds), then through a real CURVE bridge.
#include <doctest/doctest.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "actors/coordinator.hpp"
#include "runtime/net/curve.hpp"
#include "runtime/net/zmq_bridge.hpp"
#include "tests/actors/actor_fixture.hpp"
#include "tests/actors/node_util.hpp"
#include "tests/data/temp_dir.hpp"

using namespace cohort;
using namespace cohort::actors;
using namespace cohort::actors::testing;
using std::chrono::milliseconds;

namespace {

constexpr net::key_role worker_key = net::key_role::worker;
constexpr net::key_role admin_key = net::key_role::admin;

// A coordinator keeping at most TOMBSTONES departed records (three seats, no job).
std::function<void(coordinator_options&, coordinator_io&)> keep_tombstones(std::size_t tombstones) {
  return [tombstones](coordinator_options& o, coordinator_io&) {
    o.membership.max_tombstones = tombstones;
  };
}

// PEER (worker key) registers worker NAME, then leaves; returns the member id it held.
uint64_t join_and_leave(coordinator_fixture& f, const std::string& peer, const std::string& name) {
  f.deliver_as(peer, worker_key, net::register_request{net::peer_role::worker, name, 100});
  const auto oks = f.rec->to<net::register_ok>(peer);
  REQUIRE(!oks.empty());
  const uint64_t id = oks.back().member_id;
  f.deliver_as(peer, worker_key, net::leave{id, oks.back().generation});
  return id;
}

bool forgotten(const coordinator_fixture& f, const std::string& peer) {
  const auto& v = f.rec->forgotten;
  return std::find(v.begin(), v.end(), peer) != v.end();
}

// The state `ctl status` shows for worker NAME, or "" when it shows none.
std::string state_of(coordinator_fixture& f, const std::string& name) {
  for (const auto& w : f.status().workers)
    if (w.member.name == name) return mb::to_string(static_cast<mb::member_state>(w.member.state));
  return "";
}

}  // namespace

TEST_CASE(
    "coordinator: a worker key's connection cannot drain, scale or inject, however it churns") {
  // The attack of issue #33, with 2 tombstones instead of 1024: the attacker's connection
  // registers, leaves, and a second connection with the same key cycles join/leave until
  // the first one's record is pruned. It then asks what only an admin may.
  coordinator_fixture f(keep_tombstones(2));
  f.deliver_as("pv", worker_key, net::register_request{net::peer_role::worker, "victim", 100});
  join_and_leave(f, "pa", "a");
  for (int cycle = 0; cycle < 10; ++cycle) join_and_leave(f, "pb", "b");
  REQUIRE(state_of(f, "a").empty());  // its record is gone
  f.deliver_as("pa", worker_key, net::admin_request{1, "drain", "victim"});
  f.deliver_as("pa", worker_key, net::admin_request{2, "scale", "1"});
  f.deliver_as("pa", worker_key, net::admin_request{3, "inject", "kill rank=0 at step=9"});
  const auto replies = f.rec->to<net::admin_reply>("pa");
  REQUIRE(replies.size() == 3);
  for (const auto& r : replies) CHECK_FALSE(r.ok);
  CHECK(replies[0].text ==
        "a worker may only drain itself, and this connection holds no live worker");
  CHECK(replies[1].text == "a worker may only drain itself");
  CHECK(replies[2].text == "a worker may only drain itself");
  CHECK(f.rec->to<net::stop>("pv").empty());
  CHECK(state_of(f, "victim") == "joining");

  // A worker key's connection that holds a live member drains that member, nothing else.
  f.deliver_as("pb", worker_key, net::register_request{net::peer_role::worker, "b", 100});
  f.deliver_as("pb", worker_key, net::admin_request{4, "drain", "victim"});
  CHECK(f.rec->to<net::admin_reply>("pb").back().text == "a worker may only drain itself");
  f.deliver_as("pb", worker_key, net::admin_request{5, "drain", "b"});
  CHECK(f.rec->to<net::admin_reply>("pb").back().ok);
  // The admin key may: the same drain from its connection succeeds.
  f.deliver_as("ctl", admin_key, net::register_request{net::peer_role::client, "ctl", 1});
  f.deliver_as("ctl", admin_key, net::admin_request{6, "drain", "victim"});
  REQUIRE(!f.rec->to<net::admin_reply>("ctl").empty());
  CHECK(f.rec->to<net::admin_reply>("ctl").back().ok);
  CHECK(f.rec->to<net::stop>("pv").size() == 1);
}

TEST_CASE(
    "coordinator: a key's role holds where the coordinator decides, whatever passed the wire") {
  // The bridge drops what a role may not send; the coordinator, fed by any transport, holds
  // to the same rule: a worker key's stop or status request does nothing, a launcher key's
  // admin request is not obeyed.
  coordinator_fixture f;
  f.deliver_as("pv", worker_key, net::register_request{net::peer_role::worker, "victim", 100});
  f.deliver_as("pv", worker_key, net::status_request{1});
  CHECK(f.rec->to<net::status_reply>("pv").empty());
  f.deliver_as("launch", net::key_role::launcher,
               net::register_request{net::peer_role::client, "launch", 1});
  f.deliver_as("launch", net::key_role::launcher, net::admin_request{2, "drain", "victim"});
  CHECK(f.rec->to<net::admin_reply>("launch").empty());
  // A worker key registers workers only; refused with the reason the bridge gives.
  f.deliver_as("pw", worker_key, net::register_request{net::peer_role::client, "ctl", 1});
  const auto rejects = f.rec->to<net::register_reject>("pw");
  CHECK(rejects.size() == 1);
  if (!rejects.empty())
    CHECK(rejects[0].reason ==
          "refused: a worker key registers workers only, not the client 'ctl'");
  CHECK(f.rec->admitted.end() == std::find(f.rec->admitted.begin(), f.rec->admitted.end(), "pw"));
  // Last, as obeying it would end the coordinator: a worker key's stop.
  f.deliver_as("pv", worker_key, net::stop{"not a worker's to send"});
  CHECK(f.rec->to<net::stop>().empty());
  CHECK(state_of(f, "victim") == "joining");
}

TEST_CASE("coordinator: a connection whose member's record is pruned is forgotten, no other") {
  coordinator_fixture f(keep_tombstones(1));
  f.register_worker("pv", "victim");
  join_and_leave(f, "pa", "a");
  // Still a tombstone: the connection is kept (a late heartbeat is told to rejoin).
  CHECK_FALSE(forgotten(f, "pa"));
  // The same connection registering twice: its first incarnation leaves, the second is
  // live; pruning the first's record must not forget the connection of the second.
  f.register_worker("pc", "c");
  f.register_worker("pc", "c");
  REQUIRE(f.rec->to<net::register_ok>("pc").size() == 2);
  join_and_leave(f, "pb", "b");
  CHECK(state_of(f, "a").empty());
  CHECK(forgotten(f, "pa"));
  CHECK_FALSE(forgotten(f, "pc"));
  CHECK_FALSE(forgotten(f, "pv"));
  CHECK(state_of(f, "c") == "joining");
}

TEST_CASE("node with keys: a worker key's pruned connection gets nothing past the bridge") {
  spdlog::set_level(spdlog::level::warn);
  cohort::test::temp_dir tmp;
  const std::string dir = tmp.file("keys");
  net::write_job_keys(dir);
  coordinator_options o = two_workers();
  o.membership.dp = 3;
  o.membership.timeout_ms = 60000;  // the raw clients here send no heartbeats
  o.membership.max_tombstones = 2;
  coordinator_node coord(o, "tcp://127.0.0.1:0", 1 << 20,
                         std::make_shared<const net::server_keys>(net::load_server_keys(dir)));
  const net::client_keys worker = net::load_client_keys(dir, net::key_role::worker);
  const net::client_keys admin = net::load_client_keys(dir, net::key_role::admin);
  const milliseconds patience(20000);
  auto register_worker = [&](net::sync_client& c, const std::string& name) {
    const auto reply =
        c.register_as(net::register_request{net::peer_role::worker, name, 1}, patience);
    REQUIRE(reply.has_value());
    REQUIRE(net::type_of(*reply) == net::msg_type::register_ok);
    return std::get<net::register_ok>(*reply);
  };
  net::sync_client ctl(coord.endpoint(), 1 << 20, "ctl", &admin);
  auto workers = [&] {
    const auto reply = ctl.request(net::status_request{1}, net::msg_type::status_reply, patience);
    std::vector<std::string> names;
    for (const auto& w : std::get<net::status_reply>(reply).workers) names.push_back(w.member.name);
    return names;
  };
  auto shows = [&](const std::string& name) {
    const auto names = workers();
    return std::find(names.begin(), names.end(), name) != names.end();
  };

  net::sync_client victim(coord.endpoint(), 1 << 20, "victim", &worker);
  register_worker(victim, "victim");
  net::sync_client attacker(coord.endpoint(), 1 << 20, "attacker", &worker);
  const net::register_ok a = register_worker(attacker, "a");
  REQUIRE(attacker.send(net::leave{a.member_id, a.generation}));
  net::sync_client churn(coord.endpoint(), 1 << 20, "churn", &worker);
  for (int cycle = 0; cycle < 5; ++cycle) {
    const net::register_ok b = register_worker(churn, "b");
    REQUIRE(churn.send(net::leave{b.member_id, b.generation}));
  }
  // Once a's record is pruned, so is its connection, at the bridge, in the same step.
  REQUIRE(eventually(patience, [&] { return !shows("a"); }));
  const uint64_t before = coord.bridge().dropped(net::drop_reason::unknown_peer);
  REQUIRE(attacker.send(net::admin_request{1, "drain", "victim"}));
  REQUIRE(attacker.send(net::admin_request{2, "scale", "1"}));
  REQUIRE(attacker.send(net::admin_request{3, "inject", "kill rank=0 at step=9"}));
  CHECK(eventually(patience, [&] {
    return coord.bridge().dropped(net::drop_reason::unknown_peer) >= before + 3;
  }));
  const net::message after =
      ctl.request(net::status_request{2}, net::msg_type::status_reply, patience);
  bool victim_joining = false;
  for (const auto& w : std::get<net::status_reply>(after).workers)
    victim_joining |= w.member.name == "victim" && w.member.state == net::member_state::joining;
  CHECK(victim_joining);  // neither drained nor gone

  // Registered again (its key is a worker's), it is a worker: it drains itself only.
  register_worker(attacker, "a2");
  REQUIRE(attacker.send(net::admin_request{4, "drain", "victim"}));
  REQUIRE(attacker.send(net::admin_request{5, "scale", "1"}));
  std::vector<net::admin_reply> replies;
  while (replies.size() < 2) {
    const auto m = attacker.recv(patience);
    REQUIRE(m.has_value());
    if (const auto* r = std::get_if<net::admin_reply>(&*m)) replies.push_back(*r);
  }
  for (const auto& r : replies) {
    CHECK_FALSE(r.ok);
    CHECK(r.text == "a worker may only drain itself");
  }
  // The admin key may.
  const auto drained =
      ctl.request(net::admin_request{6, "drain", "victim"}, net::msg_type::admin_reply, patience);
  CHECK(std::get<net::admin_reply>(drained).ok);
  coord.request_stop("test done");
  coord.wait();
}
