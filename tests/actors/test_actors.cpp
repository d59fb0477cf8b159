// Coordinator and worker actors driven deterministically: CAF's testing scheduler (no
// threads), a manual clock for membership decisions, and io functions that record every
// frame instead of sending it. No sockets, no sleeps.
#include <doctest/doctest.h>
#include <spdlog/spdlog.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "actors/worker.hpp"
#include "runtime/net/relay.hpp"
#include "tests/actors/actor_fixture.hpp"

using namespace cohort;
using namespace cohort::actors;
using std::chrono::milliseconds;
using namespace cohort::actors::testing;

TEST_CASE("coordinator: three registrations give ranks 0..2 and one roster per generation") {
  coordinator_fixture f;
  f.register_worker("pa", "a");
  f.register_worker("pb", "b");
  f.register_worker("pc", "c");
  CHECK(f.rec->admitted == std::vector<std::string>{"pa", "pb", "pc"});
  const auto oks = f.rec->to<net::register_ok>();
  REQUIRE(oks.size() == 3);
  for (int i = 0; i < 3; ++i) {
    CHECK(oks[i].rank == i);
    CHECK(oks[i].generation == static_cast<uint64_t>(i + 1));
    CHECK(oks[i].at == net::coords{i, 0, 0});
    CHECK(oks[i].heartbeat_ms == 50);
    CHECK(oks[i].timeout_ms == 300);
  }
  CHECK(oks[0].member_id != oks[1].member_id);
  // The first member saw generations 1, 2 and 3: a full copy, then two changes from the
  // generation it held, nobody leaving. The last saw only 3, as a full copy, at rank 2.
  const auto ra = f.rec->to<net::roster_update>("pa");
  REQUIRE(ra.size() == 3);
  for (uint64_t g = 1; g <= 3; ++g) {
    CHECK(ra[g - 1].generation == g);
    CHECK(ra[g - 1].base_generation == g - 1);  // generation 0: the full copy
    CHECK(ra[g - 1].world_size == g);
    CHECK(ra[g - 1].rank == 0);
    CHECK(ra[g - 1].left.empty());
  }
  const auto rc = f.rec->to<net::roster_update>("pc");
  REQUIRE(rc.size() == 1);
  CHECK(rc[0].generation == 3);
  CHECK(rc[0].base_generation == 0);
  CHECK(rc[0].rank == 2);
  CHECK(rc[0].at == net::coords{2, 0, 0});
  // A fourth worker does not fit a dp=3 world.
  f.register_worker("pd", "d");
  CHECK(f.rec->to<net::register_reject>("pd").size() == 1);
}

TEST_CASE("coordinator: a silent member is declared dead by the timer and told to rejoin") {
  coordinator_fixture f;
  f.register_worker("pa", "a");
  f.register_worker("pb", "b");
  const uint64_t id_a = f.rec->to<net::register_ok>("pa")[0].member_id;
  const uint64_t id_b = f.rec->to<net::register_ok>("pb")[0].member_id;
  // a keeps beating, b goes silent after its first beat.
  f.deliver("pb", net::heartbeat{id_b, 2, 0});
  for (int i = 0; i < 8; ++i) {
    f.advance(milliseconds(50));
    f.deliver("pa", net::heartbeat{id_a, 2, static_cast<uint64_t>(i)});
  }
  const auto acks = f.rec->to<net::heartbeat_ack>("pa");
  REQUIRE(acks.size() == 8);
  CHECK_FALSE(acks.front().rejoin_required);
  CHECK(acks.front().member_id == id_a);
  // 400 ms without a beat from b (> timeout 300): generation 3 holds only a, at rank 0.
  const auto ra = f.rec->to<net::roster_update>("pa");
  REQUIRE(ra.back().generation == 3);
  CHECK(ra.back().base_generation == 2);
  CHECK(ra.back().world_size == 1);
  CHECK(ra.back().rank == 0);
  CHECK(ra.back().left == std::vector<uint64_t>{id_b});
  CHECK(f.rec->to<net::roster_update>("pb").back().generation == 2);  // b is not told
  // b wakes up: its heartbeat is answered "rejoin required", naming its old id.
  f.deliver("pb", net::heartbeat{id_b, 2, 99});
  const auto ackb = f.rec->to<net::heartbeat_ack>("pb");
  REQUIRE(ackb.size() == 2);  // its first beat, then this one
  CHECK(ackb[1].rejoin_required);
  CHECK(ackb[1].member_id == id_b);
  // It registers again under the same name and gets a new member id and generation.
  f.register_worker("pb", "b");
  const auto okb = f.rec->to<net::register_ok>("pb");
  REQUIRE(okb.size() == 2);
  CHECK(okb[1].member_id != id_b);
  CHECK(okb[1].generation == 4);
}

TEST_CASE("coordinator: a tick that comes late reads the heartbeats queued behind it first") {
  // The coordinator itself was stalled 400 ms (> timeout 300): its tick entered the mailbox
  // first, the members' heartbeats of that stretch after it. Blaming the members would
  // evict both; the tick looks again behind the heartbeats and nobody is evicted.
  coordinator_fixture f;
  f.register_worker("pa", "a");
  f.register_worker("pb", "b");
  const uint64_t id_a = f.rec->to<net::register_ok>("pa")[0].member_id;
  const uint64_t id_b = f.rec->to<net::register_ok>("pb")[0].member_id;
  f.advance(milliseconds(20));
  const uint64_t generation = f.rec->to<net::roster_update>("pa").back().generation;
  f.rec->now += milliseconds(400);
  f.sched.trigger_timeouts();  // the tick is queued, not yet handled
  caf::anon_send(f.coord, co_in_atom::value, net::sender{"pa", std::nullopt},
                 net::message(net::heartbeat{id_a, generation, 1}));
  caf::anon_send(f.coord, co_in_atom::value, net::sender{"pb", std::nullopt},
                 net::message(net::heartbeat{id_b, generation, 1}));
  f.sched.run();
  CHECK(f.rec->to<net::roster_update>("pa").back().generation == generation);
  for (const char* p : {"pa", "pb"}) {
    const auto acks = f.rec->to<net::heartbeat_ack>(p);
    REQUIRE(acks.size() == 1);
    CHECK_FALSE(acks[0].rejoin_required);
  }
  // On time again, a member that stays silent is still declared dead: b stops beating.
  for (int i = 0; i < 8; ++i) {
    f.advance(milliseconds(50));
    f.deliver("pa", net::heartbeat{id_a, generation, static_cast<uint64_t>(2 + i)});
  }
  const auto ra = f.rec->to<net::roster_update>("pa");
  CHECK(ra.back().generation == generation + 1);
  CHECK(ra.back().world_size == 1);
  CHECK(ra.back().left == std::vector<uint64_t>{id_b});
}

TEST_CASE("coordinator: status and exit notice and a leave from the wrong peer and client stop") {
  coordinator_fixture f;
  f.register_worker("pa", "a");
  f.register_worker("pb", "b");
  f.deliver("ctl", net::register_request{net::peer_role::client, "ctl", 1});
  const auto client_ok = f.rec->to<net::register_ok>("ctl");
  REQUIRE(client_ok.size() == 1);
  CHECK(client_ok[0].member_id == 0);  // clients never become members
  CHECK(client_ok[0].rank == -1);

  f.deliver("ctl", net::status_request{5});
  auto st = f.rec->to<net::status_reply>("ctl");
  REQUIRE(st.size() == 1);
  CHECK(st[0].request_id == 5);
  CHECK(st[0].generation == 2);
  CHECK(st[0].workers.size() == 2);
  REQUIRE(st[0].dropped.size() == 1);
  CHECK(st[0].dropped[0].value == 4);

  // A leave for a's id coming from b's socket is ignored.
  const uint64_t id_a = f.rec->to<net::register_ok>("pa")[0].member_id;
  f.deliver("pb", net::leave{id_a, 2});
  f.deliver("ctl", net::status_request{6});
  st = f.rec->to<net::status_reply>("ctl");
  CHECK(st.back().generation == 2);

  // Bound to the connection that registered: a's heartbeat from b's socket, claiming a
  // generation to come, would evict a; an exit notice from a client that is not the
  // launcher, or one without a pid, would remove b. All ignored.
  f.deliver("pb", net::heartbeat{id_a, 99, 1});
  CHECK(f.rec->to<net::heartbeat_ack>("pb").empty());
  f.deliver("ctl", net::exit_notice{"b", 100, 137});
  f.deliver("launch", net::register_request{net::peer_role::client, "launch", 1});
  f.deliver("launch", net::exit_notice{"b", 0, 137});
  // The store answers live members only: a client gets `invalid`, and nothing is stored.
  f.deliver("ctl", net::kv_set{21, 2, "addr/0", "attacker:1"});
  REQUIRE(f.rec->to<net::kv_reply>("ctl").size() == 1);
  CHECK(f.rec->to<net::kv_reply>("ctl")[0].status == net::kv_status::invalid);
  f.deliver("pa", net::kv_get{22, 2, "addr/0", 0});
  CHECK(f.rec->to<net::kv_reply>("pa").back().status == net::kv_status::not_found);
  // A worker's connection may drain itself, nothing else: no scale, no inject.
  f.deliver("pa", net::admin_request{9, "scale", "1"});
  f.deliver("pa", net::admin_request{10, "inject", "kill rank=1 at step=9"});
  for (const auto& r : f.rec->to<net::admin_reply>("pa")) {
    CHECK_FALSE(r.ok);
    CHECK(r.text == "a worker may only drain itself");
  }
  CHECK(f.rec->to<net::admin_reply>("pa").size() == 2);
  f.deliver("ctl", net::status_request{8});
  st = f.rec->to<net::status_reply>("ctl");
  CHECK(st.back().generation == 2);

  // The launcher's exit notice removes b at once (pid 100 matches its registration).
  f.deliver("launch", net::exit_notice{"b", 100, 137});
  f.deliver("ctl", net::status_request{7});
  st = f.rec->to<net::status_reply>("ctl");
  CHECK(st.back().generation == 3);
  int dead = 0;
  for (const auto& w : st.back().workers) dead += w.member.state == net::member_state::dead;
  CHECK(dead == 1);

  // Stop: every live member and every client hears it, then the actor is gone.
  f.deliver("ctl", net::stop{"test"});
  CHECK(f.rec->to<net::stop>("pa").size() == 1);
  CHECK(f.rec->to<net::stop>("ctl").size() == 1);
  CHECK(f.rec->to<net::stop>("pb").empty());  // b was already gone
  const size_t before = f.rec->frames.size();
  f.deliver("ctl", net::status_request{8});
  CHECK(f.rec->frames.size() == before);  // a quit actor answers nothing
}

// The losing order of the spare (issue #12): the spare asked once, was told to wait, and
// will not ask again before the job would run on without it (its retry is far away: the
// clock never moves here). The departure that frees the seat must seat it at once, in the
// same roster the survivors receive, so no step can open with the seat empty.
TEST_CASE("coordinator: a waiting spare takes a freed seat in the departure's own roster") {
  coordinator_fixture f;
  f.register_worker("pa", "a");
  f.register_worker("pb", "b");
  f.register_worker("pc", "c");
  f.register_worker("ps", "spare");
  const auto rej = f.rec->to<net::register_reject>("ps");
  REQUIRE(rej.size() == 1);
  CHECK(rej[0].retry_ms > 0);  // waits as a spare, not refused
  CHECK(f.rec->to<net::register_ok>("ps").empty());
  // A second, later spare queues behind the first.
  f.register_worker("pt", "late");
  REQUIRE(f.rec->to<net::register_reject>("pt").size() == 1);

  f.deliver("launch", net::register_request{net::peer_role::client, "launch", 1});
  const size_t rosters_before = f.rec->to<net::roster_update>("pa").size();
  f.deliver("launch", net::exit_notice{"b", 100, 137});
  const auto ok = f.rec->to<net::register_ok>("ps");
  REQUIRE(ok.size() == 1);
  CHECK(ok[0].name == "spare");
  CHECK(ok[0].rank == 2);                            // ranks stay dense: a, c, spare
  CHECK(f.rec->to<net::register_ok>("pt").empty());  // only one seat was freed
  // The survivors hear one roster for the departure and the replacement together.
  const auto rosters = f.rec->to<net::roster_update>("pa");
  REQUIRE(rosters.size() == rosters_before + 1);
  const uint64_t id_b = f.rec->to<net::register_ok>("pb")[0].member_id;
  CHECK(rosters.back().left == std::vector<uint64_t>{id_b});
  CHECK(rosters.back().world_size == 3);
  CHECK(rosters.back().generation == ok[0].generation);
  // The spare's first roster is a full copy of the same generation.
  const auto spare_roster = f.rec->to<net::roster_update>("ps");
  REQUIRE(spare_roster.size() == 1);
  CHECK(spare_roster[0].base_generation == 0);
  CHECK(spare_roster[0].rank == 2);
  CHECK(spare_roster[0].generation == ok[0].generation);

  // A spare that stopped asking (dead) loses its place: the next free seat stays free
  // until someone asks, and the live spare that keeps asking gets it.
  // 3 retries of max(200, 5 * 50) ms pass without a re-ask from "late"; the members
  // heartbeat meanwhile so only the spare's silence counts.
  const uint64_t id_a = f.rec->to<net::register_ok>("pa")[0].member_id;
  const uint64_t id_c = f.rec->to<net::register_ok>("pc")[0].member_id;
  const uint64_t id_s = ok[0].member_id;
  for (uint64_t i = 0; i < 20; ++i) {
    f.advance(milliseconds(40));
    for (const auto& [peer, id] : {std::pair{"pa", id_a}, {"pc", id_c}, {"ps", id_s}})
      f.deliver(peer, net::heartbeat{id, ok[0].generation, i});
  }
  f.deliver("launch", net::exit_notice{"c", 100, 137});
  CHECK(f.rec->to<net::register_ok>("pt").empty());
  f.register_worker("pt", "late");
  REQUIRE(f.rec->to<net::register_ok>("pt").size() == 1);

  // Spares still waiting when the job ends are stopped with everyone (they exit 0).
  f.register_worker("pu", "third");
  REQUIRE(f.rec->to<net::register_reject>("pu").size() == 1);
  f.deliver("ctl", net::register_request{net::peer_role::client, "ctl", 1});
  f.deliver("ctl", net::stop{"test"});
  CHECK(f.rec->to<net::stop>("pu").size() == 1);
}

TEST_CASE("coordinator: rendezvous store waits and wakes and times out and is superseded") {
  coordinator_fixture f;
  f.register_worker("pa", "a");
  f.register_worker("pb", "b");
  // b waits for a's key in generation 2; a sets it: b is answered ok.
  f.deliver("pb", net::kv_wait{11, 2, {"addr/0"}, 1000});
  CHECK(f.rec->to<net::kv_reply>("pb").empty());
  f.deliver("pa", net::kv_set{12, 2, "addr/0", "10.0.0.1:4000"});
  REQUIRE(f.rec->to<net::kv_reply>("pa").size() == 1);
  CHECK(f.rec->to<net::kv_reply>("pa")[0].status == net::kv_status::ok);
  auto rb = f.rec->to<net::kv_reply>("pb");
  REQUIRE(rb.size() == 1);
  CHECK(rb[0].request_id == 11);
  CHECK(rb[0].status == net::kv_status::ok);
  // A plain get returns the value; a missing key is not_found.
  f.deliver("pb", net::kv_get{13, 2, "addr/0", 0});
  f.deliver("pb", net::kv_get{14, 2, "addr/1", 0});
  rb = f.rec->to<net::kv_reply>("pb");
  REQUIRE(rb.size() == 3);
  CHECK(rb[1].value == "10.0.0.1:4000");
  CHECK(rb[2].status == net::kv_status::not_found);
  // A blocking get that nobody satisfies times out on the timer.
  f.deliver("pb", net::kv_get{15, 2, "never", 100});
  f.advance(milliseconds(150));
  rb = f.rec->to<net::kv_reply>("pb");
  REQUIRE(rb.size() == 4);
  CHECK(rb[3].request_id == 15);
  CHECK(rb[3].status == net::kv_status::timeout);
  // A waiter of generation 2 is superseded when a third worker makes generation 3.
  f.deliver("pa", net::kv_wait{16, 2, {"never"}, 60000});
  f.register_worker("pc", "c");
  const auto ra = f.rec->to<net::kv_reply>("pa");
  REQUIRE(ra.size() == 2);
  CHECK(ra[1].request_id == 16);
  CHECK(ra[1].status == net::kv_status::superseded);
}

namespace {

struct worker_fixture : testing_system {
  std::shared_ptr<recorder> rec = std::make_shared<recorder>();
  std::shared_ptr<worker_shared> shared = std::make_shared<worker_shared>();
  std::shared_ptr<int> exit_code = std::make_shared<int>(-1);
  /// ha: the endpoints the worker reconnected to, in order, and the term its bridge heard.
  std::shared_ptr<std::vector<std::string>> reconnects =
      std::make_shared<std::vector<std::string>>();
  std::shared_ptr<uint64_t> term = std::make_shared<uint64_t>(0);
  caf::actor worker;

  explicit worker_fixture(std::vector<std::string> candidates = {}) {
    worker_options o;
    o.name = "w";
    o.pid = 42;
    o.candidates = std::move(candidates);
    worker_io io;
    auto r = rec;
    auto code = exit_code;
    io.send = [r](const net::message& m) { r->frames.push_back({"", m}); };
    io.on_exit = [code](int c) { *code = c; };
    if (o.ha()) {
      io.reconnect = [rc = reconnects](const std::string& ep) { rc->push_back(ep); };
      io.term = [t = term] { return *t; };
    }
    worker = sys.spawn(worker_actor, o, io, shared);
    caf::anon_send(worker, co_start_atom::value);
    sched.run();
  }
  ~worker_fixture() {
    caf::anon_send_exit(worker, caf::exit_reason::user_shutdown);
    sched.run();
  }
  void deliver(net::message m) {
    caf::anon_send(worker, co_in_atom::value, std::string(), std::move(m));
    sched.run();
  }
};

}  // namespace

TEST_CASE("worker: registers and follows generations and rejoins once when declared dead") {
  worker_fixture f;
  auto regs = f.rec->to<net::register_request>();
  REQUIRE(regs.size() == 1);
  CHECK(regs[0].name == "w");
  CHECK(regs[0].pid == 42);
  CHECK(f.shared->member_id == 0);  // no heartbeats before register_ok

  f.deliver(net::register_ok{7, "w", 1, net::coords{1, 0, 0}, 4, 50, 300});
  CHECK(f.shared->member_id == 7);
  CHECK(f.shared->generation == 4);
  CHECK(f.shared->heartbeat_ms == 50);

  // A roster update moves it to generation 5 at rank 0.
  net::roster_update ru;
  ru.generation = 5;
  ru.rank = 0;
  ru.world_size = 1;
  f.deliver(ru);
  CHECK(f.shared->generation == 5);

  // An ack for some other incarnation changes nothing.
  f.deliver(net::heartbeat_ack{3, 9, 1, true});
  CHECK(f.rec->to<net::register_request>().size() == 1);
  CHECK(f.shared->member_id == 7);

  // Declared dead: old state dropped, heartbeats paused, one new registration.
  f.deliver(net::heartbeat_ack{7, 6, 2, true});
  CHECK(f.shared->member_id == 0);
  CHECK(f.shared->generation == 0);
  CHECK(f.rec->to<net::register_request>().size() == 2);
  // More "rejoin" acks for the old id, already in flight, do not register again.
  f.deliver(net::heartbeat_ack{7, 6, 3, true});
  CHECK(f.rec->to<net::register_request>().size() == 2);

  f.deliver(net::register_ok{8, "w", 2, net::coords{2, 0, 0}, 7, 50, 300});
  CHECK(f.shared->member_id == 8);
  CHECK(f.shared->generation == 7);

  // Ping is answered with the same fields; stop ends the actor with exit code 0.
  f.deliver(net::ping{5, 1234});
  const auto pongs = f.rec->to<net::pong>();
  REQUIRE(pongs.size() == 1);
  CHECK(pongs[0].seq == 5);
  CHECK(pongs[0].sent_ns == 1234);
  f.deliver(net::stop{"done"});
  CHECK(*f.exit_code == 0);
}

TEST_CASE("worker with standbys: follows a standby to the leader, and re-attaches as who it was") {
  worker_fixture f({"tcp://a:1", "tcp://b:2", "tcp://c:3"});
  REQUIRE(f.rec->to<net::register_request>().size() == 1);
  auto standby = [](const std::string& leader, uint64_t term) {
    net::register_reject r("standby");
    r.standby = true;
    r.leader = leader;
    r.leader_term = term;
    return r;
  };
  auto tick = [&f] {
    f.sched.trigger_timeouts();
    f.sched.run();
  };
  // a is a standby: the worker goes to the leader it names and registers there.
  f.deliver(standby("tcp://c:3", 4));
  CHECK(*f.reconnects == std::vector<std::string>{"tcp://c:3"});
  CHECK(*f.exit_code == -1);
  tick();
  REQUIRE(f.rec->to<net::register_request>().size() == 2);
  *f.term = 4;
  f.deliver(net::register_ok{7, "w", 0, net::coords{}, 5, 50, 300});
  CHECK(f.shared->member_id == 7);
  CHECK(f.shared->lost_after_ms == 300);

  // The leader is lost: the model stays, the member id goes, the next candidate (after c:
  // a) is asked, as member 7 of generation 5.
  caf::anon_send(f.worker, co_lost_atom::value);
  f.sched.run();
  CHECK(f.shared->member_id == 0);
  CHECK(f.reconnects->back() == "tcp://a:1");
  auto regs = f.rec->to<net::register_request>();
  REQUIRE(regs.size() == 3);
  CHECK(regs.back().prev_member == 7);
  CHECK(regs.back().prev_generation == 5);
  CHECK(*f.exit_code == -1);  // without standbys a lost coordinator ends the worker

  // A standby still names the lost leader (its lease has not gone): not followed; the next
  // candidate instead. One naming a newer term is followed.
  f.deliver(standby("tcp://c:3", 4));
  CHECK(f.reconnects->back() == "tcp://b:2");
  f.deliver(standby("tcp://b:2", 9));
  CHECK(f.reconnects->back() == "tcp://b:2");
  tick();
  regs = f.rec->to<net::register_request>();
  REQUIRE(regs.size() >= 4);
  CHECK(regs.back().prev_member == 7);
  *f.term = 9;
  f.deliver(net::register_ok{12, "w", 1, net::coords{}, 8, 50, 300});
  CHECK(f.shared->member_id == 12);
  CHECK(f.shared->generation == 8);
  CHECK(*f.exit_code == -1);
}

TEST_CASE("worker: a refused registration exits 1 and a leave request says goodbye") {
  {
    worker_fixture f;
    f.deliver(net::register_reject{"world full"});
    CHECK(*f.exit_code == 1);
  }
  {
    worker_fixture f;
    f.deliver(net::register_ok{3, "w", 0, net::coords{}, 1, 50, 300});
    caf::anon_send(f.worker, co_leave_atom::value);
    f.sched.run();
    const auto leaves = f.rec->to<net::leave>();
    REQUIRE(leaves.size() == 1);
    CHECK(leaves[0].member_id == 3);
    CHECK(leaves[0].generation == 1);
    CHECK(*f.exit_code == 0);
  }
}

TEST_CASE("coordinator: a stream of clients keeps the newest, never the launcher") {
  coordinator_fixture f;
  f.deliver("launch", net::register_request{net::peer_role::client, "launch", 1});
  const size_t n = max_clients + 40;
  for (size_t i = 0; i < n; ++i)
    f.deliver("c" + std::to_string(i), net::register_request{net::peer_role::client, "ctl", 1});
  // The 41 oldest ctl clients are forgotten (back to register-only at the bridge), in order.
  REQUIRE(f.rec->forgotten.size() == 41);
  for (size_t i = 0; i < f.rec->forgotten.size(); ++i)
    CHECK(f.rec->forgotten[i] == "c" + std::to_string(i));
  // A stop reaches the launcher and the clients still remembered, not the forgotten.
  f.deliver("c" + std::to_string(n - 1), net::stop{"test"});
  CHECK(f.rec->to<net::stop>("launch").size() == 1);
  CHECK(f.rec->to<net::stop>("c" + std::to_string(n - 1)).size() == 1);
  CHECK(f.rec->to<net::stop>("c0").empty());
}

TEST_CASE("ha: ctl inject records a fault for the next leader before adding it, or refuses it") {
  const config c = load_config_text(
      "cluster:\n  workers: 2\ntrain:\n  steps: 50\n  global_batch: 64\n  micro_batch: 16\n"
      "ha:\n  standbys: 1\n",
      "<test>");
  auto recorded = std::make_shared<std::vector<std::string>>();
  auto answer = std::make_shared<std::string>();
  coordinator_fixture f([&](coordinator_options& o, coordinator_io&) {
    o.job = std::make_shared<training_job>(c, dump_config(c));
    o.job->set_faults({});  // with ha.standbys 1: coordinator faults are allowed
    o.record_added_fault = [recorded, answer](const std::string& spec) {
      recorded->push_back(spec);
      return *answer;
    };
  });
  f.deliver("ctl", net::register_request{net::peer_role::client, "ctl", 1});
  auto last_reply = [&] { return f.rec->to<net::admin_reply>("ctl").back(); };
  // Recorded (as the canonical text the next leader parses), then added.
  f.deliver("ctl", net::admin_request{1, "inject", "kill rank=1 at step=9"});
  CHECK(last_reply().ok);
  REQUIRE(recorded->size() == 1);
  CHECK(recorded->back() == "kill rank=1 at step=9");
  // etcd cannot take it: refused, with why, and not added.
  *answer = "etcd unreachable";
  f.deliver("ctl", net::admin_request{2, "inject", "kill coordinator at step=20"});
  CHECK_FALSE(last_reply().ok);
  CHECK(last_reply().text == "fault 'kill coordinator at step=20' not added: etcd unreachable");
  CHECK(recorded->size() == 2);
  // A fault the job refuses is never recorded: a second drop control.
  *answer = "";
  f.deliver("ctl", net::admin_request{3, "inject", "drop control p=0.1 seed=1"});
  CHECK(last_reply().ok);
  f.deliver("ctl", net::admin_request{4, "inject", "drop control p=0.2 seed=1"});
  CHECK_FALSE(last_reply().ok);
  CHECK(recorded->size() == 3);
}

TEST_CASE("ha: ctl scale acts only once etcd confirms this coordinator leads, else it is refused") {
  auto recorded = std::make_shared<std::vector<std::string>>();
  auto answer = std::make_shared<std::string>();
  coordinator_fixture f([&](coordinator_options& o, coordinator_io&) {
    o.membership.dp = 2;
    o.membership.min_workers = 1;
    o.membership.max_workers = 4;
    o.confirm_scale = [recorded, answer](const std::string& spec) {
      recorded->push_back(spec);
      return *answer;
    };
  });
  f.register_worker("pa", "a");
  f.register_worker("pb", "b");
  f.deliver("launch", net::register_request{net::peer_role::client, "launch", 1});
  f.deliver("ctl", net::register_request{net::peer_role::client, "ctl", 1});
  auto last_reply = [&] { return f.rec->to<net::admin_reply>("ctl").back(); };
  // A deposed leader (the fenced write fails): refused with why, and no order goes out.
  *answer = "this coordinator no longer leads the run";
  f.deliver("ctl", net::admin_request{1, "scale", "3"});
  CHECK_FALSE(last_reply().ok);
  CHECK(last_reply().text == "scale 3 not done: this coordinator no longer leads the run");
  CHECK(f.rec->to<net::scale_order>("launch").empty());
  REQUIRE(recorded->size() == 1);
  CHECK(recorded->back() == "scale to=3");
  // The leader: confirmed, then the launcher is asked for the one worker more.
  *answer = "";
  f.deliver("ctl", net::admin_request{2, "scale", "3"});
  CHECK(last_reply().ok);
  REQUIRE(f.rec->to<net::scale_order>("launch").size() == 1);
  CHECK(f.rec->to<net::scale_order>("launch").back().start_workers == 1);
  // A request refused before it could act (outside the bounds) asks etcd nothing.
  f.deliver("ctl", net::admin_request{3, "scale", "9"});
  CHECK_FALSE(last_reply().ok);
  CHECK(recorded->size() == 2);
}

// elastic.spares (docs/faults.md, "Spares"): a spare waiting in a full world gets the job at
// once and loads it, so that the seat it takes later costs a round trip, not a load; a
// re-ask does not send it again, and the seat sends it once more (the worker's cue to say
// it is ready).
TEST_CASE("coordinator: a spare is sent the job while it waits, once, and again when seated") {
  const config c = load_config_text(
      "cluster:\n  workers: 2\ntrain:\n  steps: 50\n  global_batch: 64\n  micro_batch: 16\n",
      "<test>");
  coordinator_fixture f([&](coordinator_options& o, coordinator_io&) {
    o.membership.dp = 2;
    o.job = std::make_shared<training_job>(c, dump_config(c));
  });
  f.register_worker("pa", "a");
  f.register_worker("pb", "b");
  CHECK(f.rec->to<net::job_spec>("pa").size() == 1);
  f.register_worker("ps", "spare");
  REQUIRE(f.rec->to<net::register_reject>("ps").size() == 1);
  const auto spec = f.rec->to<net::job_spec>("ps");
  REQUIRE(spec.size() == 1);
  CHECK(spec[0].config_yaml == f.rec->to<net::job_spec>("pa")[0].config_yaml);
  f.register_worker("ps", "spare");  // the spare asks again: still waiting, no second copy
  CHECK(f.rec->to<net::register_reject>("ps").size() == 2);
  CHECK(f.rec->to<net::job_spec>("ps").size() == 1);
  f.deliver("launch", net::register_request{net::peer_role::client, "launch", 1});
  f.deliver("launch", net::exit_notice{"a", 100, 137});
  REQUIRE(f.rec->to<net::register_ok>("ps").size() == 1);
  CHECK(f.rec->to<net::job_spec>("ps").size() == 2);
}

TEST_CASE("coordinator: a host agent reports the exits of the workers it relays, and only "
          "theirs") {
  coordinator_fixture f;
  const std::string a0 = net::relay_peer("agent-h0-1", "w0");
  const std::string b0 = net::relay_peer("agent-h1-1", "w0");
  f.deliver("agent-h0-1", net::register_request{net::peer_role::client, "agent-h0", 7});
  f.deliver("agent-h1-1", net::register_request{net::peer_role::client, "agent-h1", 8});
  REQUIRE(f.rec->to<net::register_ok>("agent-h0-1").size() == 1);
  f.register_worker(a0, "a");
  f.register_worker(b0, "b");
  REQUIRE(f.status().workers.size() == 2);
  const uint64_t g = f.status().generation;
  // Another host's agent may not speak for a; a's own may, with a's pid.
  f.deliver("agent-h1-1", net::exit_notice{"a", 100, 137});
  f.deliver("agent-h0-1", net::exit_notice{"b", 100, 137});
  f.deliver("agent-h0-1", net::exit_notice{"a", 0, 137});
  CHECK(f.status().generation == g);
  f.deliver("agent-h0-1", net::exit_notice{"a", 100, net::exit_code_hung});
  const auto s = f.status();
  CHECK(s.generation == g + 1);
  int alive = 0;
  for (const auto& w : s.workers) alive += w.member.state == net::member_state::alive ||
                                           w.member.state == net::member_state::joining;
  CHECK(alive == 1);
  // Agents are kept past the clients' bound: a flood of ctl clients forgets none of them.
  for (int i = 0; i < 300; ++i)
    f.deliver("ctl-" + std::to_string(i), net::register_request{net::peer_role::client, "ctl", 1});
  CHECK(std::count(f.rec->forgotten.begin(), f.rec->forgotten.end(), "agent-h0-1") == 0);
  f.deliver("agent-h1-1", net::exit_notice{"b", 100, 1});
  CHECK(f.status().generation == g + 2);
}
