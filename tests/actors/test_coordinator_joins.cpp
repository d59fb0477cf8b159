// The coordinator actor at scale, deterministically (CAF's testing scheduler, a manual
// clock, recorded frames): registrations that share a join window share a generation;
// rosters travel as changes; the bridge's heartbeat table keeps members alive without the
// actor; a transport that has not read its socket does not make members look silent.
#include <doctest/doctest.h>

#include "tests/actors/actor_fixture.hpp"
#include "tools/launch_scale_orders.hpp"

using namespace cohort;
using namespace cohort::actors;
using namespace cohort::actors::testing;
using std::chrono::milliseconds;

namespace {

// A coordinator for up to 8 workers with a 50 ms join window.
auto windowed(int window_ms = 50) {
  return [window_ms](coordinator_options& o, coordinator_io&) {
    o.membership.dp = 8;
    o.membership.join_window_ms = window_ms;
  };
}

// A coordinator for 1 to 4 workers with a WINDOW_MS join window and a launcher and a ctl
// attached (scale's requesters); TAKING_OVER: a leader that took over a running job.
std::unique_ptr<coordinator_fixture> scalable(int window_ms, bool taking_over = false) {
  auto f = std::make_unique<coordinator_fixture>(
      [window_ms, taking_over](coordinator_options& o, coordinator_io&) {
        o.membership.dp = 4;
        o.membership.min_workers = 1;
        o.membership.max_workers = 4;
        o.membership.join_window_ms = window_ms;
        if (taking_over) {
          o.term = 2;
          o.taking_over = true;
        }
      });
  f->deliver("launch", net::register_request{net::peer_role::client, "launch", 1});
  f->deliver("ctl", net::register_request{net::peer_role::client, "ctl", 1});
  return f;
}

}  // namespace

TEST_CASE("coordinator: registrations within the join window share one generation") {
  coordinator_fixture f(windowed());
  for (const char* w : {"a", "b", "c"}) {
    f.rec->now += milliseconds(10);
    f.register_worker(std::string("p") + w, w);
  }
  // Nobody is answered while the window is open.
  CHECK(f.rec->to<net::register_ok>().empty());
  f.advance(milliseconds(40));  // 40 ms since c: still open
  CHECK(f.rec->to<net::register_ok>().empty());
  f.advance(milliseconds(10));  // 50 ms quiet: closed
  const auto oks = f.rec->to<net::register_ok>();
  REQUIRE(oks.size() == 3);
  for (int i = 0; i < 3; ++i) {
    CHECK(oks[i].generation == 1);
    CHECK(oks[i].rank == i);
  }
  CHECK(f.rec->admitted == std::vector<std::string>{"pa", "pb", "pc"});
  // One roster each: the full copy of generation 1, after its register_ok.
  for (const char* p : {"pa", "pb", "pc"}) {
    const auto ru = f.rec->to<net::roster_update>(p);
    REQUIRE(ru.size() == 1);
    CHECK(ru[0].generation == 1);
    CHECK(ru[0].base_generation == 0);
    CHECK(ru[0].world_size == 3);
  }
  const auto& frames = f.rec->frames;
  size_t ok_at = 0, roster_at = 0;
  for (size_t i = 0; i < frames.size(); ++i) {
    if (frames[i].peer != "pb") continue;
    if (std::holds_alternative<net::register_ok>(frames[i].msg)) ok_at = i;
    if (std::holds_alternative<net::roster_update>(frames[i].msg)) roster_at = i;
  }
  CHECK(ok_at < roster_at);

  // The next burst is a change for the members already in: who left (nobody), the size.
  f.register_worker("pd", "d");
  f.register_worker("pe", "e");
  f.advance(milliseconds(50));
  const auto ra = f.rec->to<net::roster_update>("pa");
  REQUIRE(ra.size() == 2);
  CHECK(ra[1].generation == 2);
  CHECK(ra[1].base_generation == 1);
  CHECK(ra[1].left.empty());
  CHECK(ra[1].world_size == 5);
  CHECK(f.rec->to<net::roster_update>("pe")[0].rank == 4);
}

TEST_CASE("coordinator: a steady trickle of joiners still forms a generation per 30 windows") {
  coordinator_fixture f([](coordinator_options& o, coordinator_io&) {
    o.membership.dp = 64;
    o.membership.join_window_ms = 50;
  });
  // One joiner every 40 ms: never quiet for a whole window. 30 windows (1.5 s) after the
  // first one, everyone who came so far enters together.
  int asked = 0;
  for (; asked < 37; ++asked) {  // the 37th arrives at 1.44 s
    f.register_worker("p" + std::to_string(asked), "w" + std::to_string(asked));
    f.advance(milliseconds(40));
  }
  CHECK(f.rec->to<net::register_ok>().empty());
  f.register_worker("p" + std::to_string(asked), "w" + std::to_string(asked));
  ++asked;
  f.advance(milliseconds(40));  // 1.52 s: closed
  const auto oks = f.rec->to<net::register_ok>();
  REQUIRE(oks.size() == static_cast<size_t>(asked));
  for (const auto& ok : oks) CHECK(ok.generation == 1);
}

TEST_CASE("coordinator: a window fuller than the world keeps the rest as spares") {
  coordinator_fixture f([](coordinator_options& o, coordinator_io&) {
    o.membership.dp = 2;
    o.membership.join_window_ms = 50;
  });
  f.register_worker("pa", "a");
  f.register_worker("pb", "b");
  f.register_worker("pc", "c");  // a and b hold the two seats already
  const auto rej = f.rec->to<net::register_reject>("pc");
  REQUIRE(rej.size() == 1);
  CHECK(rej[0].retry_ms > 0);
  CHECK(rej[0].reason.find("registered or joining") != std::string::npos);
  // A duplicate name in the same window is refused when the window closes, for good.
  coordinator_fixture g(windowed());
  g.register_worker("pa", "same");
  g.register_worker("pb", "same");
  g.advance(milliseconds(50));
  REQUIRE(g.rec->to<net::register_ok>("pa").size() == 1);
  const auto dup = g.rec->to<net::register_reject>("pb");
  REQUIRE(dup.size() == 1);
  CHECK(dup[0].retry_ms == 0);
  CHECK(dup[0].reason.find("registered at the same time") != std::string::npos);
}

TEST_CASE("coordinator: the heartbeat table keeps members alive without the actor") {
  auto beats = std::make_shared<net::heartbeat_table>();
  coordinator_fixture f([beats](coordinator_options&, coordinator_io& io) { io.beats = beats; });
  f.register_worker("pa", "a");
  f.register_worker("pb", "b");
  const uint64_t id_a = f.rec->to<net::register_ok>("pa")[0].member_id;
  const uint64_t id_b = f.rec->to<net::register_ok>("pb")[0].member_id;
  // The first heartbeat goes to the actor (it makes the member alive); after it, the table
  // answers, as the bridge thread does.
  CHECK_FALSE(beats->on_beat("pa", id_a, 2, f.rec->now));
  f.deliver("pa", net::heartbeat{id_a, 2, 1});
  f.deliver("pb", net::heartbeat{id_b, 2, 1});
  // For 1 s, a beats only through the table; b stays silent.
  for (int i = 0; i < 20; ++i) {
    f.advance(milliseconds(50));
    CHECK(beats->on_beat("pa", id_a, 2, f.rec->now).has_value());
  }
  const auto ra = f.rec->to<net::roster_update>("pa");
  REQUIRE(ra.back().generation == 3);
  CHECK(ra.back().left == std::vector<uint64_t>{id_b});
  CHECK(ra.back().world_size == 1);
  // The table learnt the new generation, and b's id is no longer answered there.
  CHECK(beats->on_beat("pa", id_a, 3, f.rec->now) == 3u);
  CHECK_FALSE(beats->on_beat("pb", id_b, 2, f.rec->now));
  // Status shows a's age from the table's beats.
  f.rec->now += milliseconds(20);
  const net::status_reply s = f.status();
  REQUIRE(!s.workers.empty());
  CHECK(s.workers[0].heartbeat_age_ms == 20);
}

TEST_CASE("coordinator: silence counts only up to where the transport has read") {
  auto caught_up = std::make_shared<mb::mono_time>();
  coordinator_fixture f([caught_up](coordinator_options&, coordinator_io& io) {
    io.caught_up = [caught_up] { return *caught_up; };
  });
  f.register_worker("pa", "a");
  const uint64_t id_a = f.rec->to<net::register_ok>("pa")[0].member_id;
  f.deliver("pa", net::heartbeat{id_a, 1, 1});
  // The transport stalls at 0 ms: a second of silence it never read is not a's.
  for (int i = 0; i < 20; ++i) f.advance(milliseconds(50));
  CHECK(f.rec->to<net::roster_update>("pa").size() == 1);
  // It reads again (nothing from a in it): a is silent for real and removed.
  *caught_up = f.rec->now;
  f.advance(milliseconds(25));
  CHECK(f.rec->to<net::heartbeat_ack>("pa").size() == 1);
  CHECK(f.rec->to<net::register_ok>("pa").size() == 1);
  const net::status_reply s = f.status();
  REQUIRE(s.workers.size() == 1);
  CHECK(s.workers[0].member.state == net::member_state::dead);
}

// A leader that took over a running job (ha) cannot count its workers until they re-attach:
// `ctl scale` is refused until they form its first generation (CI once saw a new leader ask
// the launcher for 4 workers while 3 were on their way back). Then, and in any window, the
// registrations still waiting in the join window count as workers.
TEST_CASE("coordinator: scale waits for a new leader's workers, and counts the join window") {
  auto fp = scalable(50, true);
  coordinator_fixture& f = *fp;
  auto last_reply = [&] { return f.rec->to<net::admin_reply>("ctl").back(); };
  f.register_worker("pa", "a");
  f.register_worker("pb", "b");
  f.deliver("ctl", net::admin_request{1, "scale", "4"});
  CHECK_FALSE(last_reply().ok);
  CHECK(last_reply().text.find("still re-attaching (2 so far)") != std::string::npos);
  CHECK(f.rec->to<net::scale_order>("launch").empty());
  f.advance(milliseconds(50));  // a and b form the first generation
  REQUIRE(f.rec->to<net::register_ok>("pa").size() == 1);
  REQUIRE(f.rec->to<net::register_ok>("pb").size() == 1);
  f.register_worker("pc", "c");  // c re-attaches late: waiting in the next window
  f.deliver("ctl", net::admin_request{2, "scale", "4"});
  CHECK(last_reply().ok);
  const auto orders = f.rec->to<net::scale_order>("launch");
  REQUIRE(orders.size() == 1);
  CHECK(orders[0].start_workers == 1);
}

TEST_CASE("coordinator: the worker a scale awaits, or the last free seat, enters at once") {
  auto fp = scalable(300);
  coordinator_fixture& f = *fp;
  f.register_worker("pa", "a");
  f.advance(milliseconds(300));  // nothing awaited, a seat left: a waits out the window
  REQUIRE(f.rec->to<net::register_ok>("pa").size() == 1);
  f.deliver("ctl", net::admin_request{1, "scale", "3"});
  REQUIRE(f.rec->to<net::admin_reply>("ctl").back().ok);
  REQUIRE(f.rec->to<net::scale_order>("launch").size() == 1);
  f.register_worker("pb", "b");
  CHECK(f.rec->to<net::register_ok>("pb").empty());  // one of the two the scale awaits
  f.register_worker("pc", "c");  // the second: no window to wait out
  REQUIRE(f.rec->to<net::register_ok>("pb").size() == 1);
  REQUIRE(f.rec->to<net::register_ok>("pc").size() == 1);
  CHECK(f.rec->to<net::register_ok>("pc")[0].generation == 2);
  // The scale is done: the next registration waits its window again, unless it fills the
  // roster, as here (3 of 4 seated).
  f.register_worker("pd", "d");
  REQUIRE(f.rec->to<net::register_ok>("pd").size() == 1);
  CHECK(f.rec->to<net::register_ok>("pd")[0].generation == 3);
}

// A scale order can go to a connection launch has closed: an attempt to register with a
// new leader that launch gave up on and whose registration came late names the launcher
// until the next one registers (CI once saw a job wait for a worker no one started). The
// launcher that registers next gets the newest order again, for the workers still missing,
// under the same number (launch carries each out once: tools/launch_scale_orders.hpp);
// once they are all here, a registration gets none.
TEST_CASE("coordinator: a launcher that registers again gets the scale order still missing") {
  auto fp = scalable(50, true);
  coordinator_fixture& f = *fp;
  f.register_worker("pa", "a");
  f.register_worker("pb", "b");
  f.advance(milliseconds(50));
  f.deliver("ctl", net::admin_request{1, "scale", "4"});
  REQUIRE(f.rec->to<net::admin_reply>("ctl").back().ok);
  const auto first = f.rec->to<net::scale_order>("launch");
  REQUIRE(first.size() == 1);
  CHECK(first[0].start_workers == 2);
  CHECK(first[0].term == 2);
  CHECK(first[0].seq == 1);
  // The order's connection is gone; launch registers from a new one, and one of the two
  // workers turns up (started by someone else) before it does.
  f.register_worker("pc", "c");
  f.deliver("launch-2", net::register_request{net::peer_role::client, "launch", 1});
  REQUIRE(f.rec->to<net::register_ok>("launch-2").size() == 1);
  const auto again = f.rec->to<net::scale_order>("launch-2");
  REQUIRE(again.size() == 1);
  CHECK(again[0].start_workers == 1);
  CHECK(again[0].seq == 1);
  CHECK(again[0].reason == "scale to=4");
  // A second scale has the next number.
  f.deliver("ctl", net::admin_request{2, "scale", "4"});
  REQUIRE(f.rec->to<net::admin_reply>("ctl").back().ok);
  const auto second = f.rec->to<net::scale_order>("launch-2");
  REQUIRE(second.size() == 2);
  CHECK(second[1].seq == 2);
  f.register_worker("pd", "d");
  f.advance(milliseconds(50));
  f.deliver("launch-3", net::register_request{net::peer_role::client, "launch", 1});
  REQUIRE(f.rec->to<net::register_ok>("launch-3").size() == 1);
  CHECK(f.rec->to<net::scale_order>("launch-3").empty());  // every worker is here
}

// The registration of an attempt launch gave up on can come in after the one of the
// connection it uses: the launcher is whichever of them asked for a status last, and the
// order that went to the other goes out again to it.
TEST_CASE("coordinator: the launcher is the launch connection heard from last") {
  auto fp = scalable(50, true);
  coordinator_fixture& f = *fp;
  f.register_worker("pa", "a");
  f.advance(milliseconds(50));
  f.deliver("launch-2", net::register_request{net::peer_role::client, "launch", 1});
  // The late registration of the closed attempt ("launch", from the fixture) again.
  f.deliver("launch", net::register_request{net::peer_role::client, "launch", 1});
  f.deliver("ctl", net::admin_request{1, "scale", "3"});
  REQUIRE(f.rec->to<net::admin_reply>("ctl").back().ok);
  REQUIRE(f.rec->to<net::scale_order>("launch").size() == 1);  // the closed one
  CHECK(f.rec->to<net::scale_order>("launch-2").empty());
  f.deliver("launch-2", net::status_request{7});
  const auto again = f.rec->to<net::scale_order>("launch-2");
  REQUIRE(again.size() == 1);
  CHECK(again[0].start_workers == 2);
  CHECK(again[0].seq == 1);
  f.deliver("launch-2", net::status_request{8});  // the launcher already: nothing more
  CHECK(f.rec->to<net::scale_order>("launch-2").size() == 1);
  f.deliver("ctl", net::status_request{9});  // not a launch connection
  CHECK(f.rec->to<net::scale_order>("ctl").empty());
}

// The launcher's side of the same: each (term, number) carried out once, whichever
// connection brought it; a new leader's numbers are its own.
TEST_CASE("launch carries out each scale order once per coordinator term") {
  cli::scale_orders once;
  CHECK(once.take(net::scale_order{2, "scale to=4", 2, 1}));
  CHECK_FALSE(once.take(net::scale_order{1, "scale to=4", 2, 1}));  // sent again
  CHECK(once.take(net::scale_order{1, "scale to=5", 2, 2}));
  CHECK_FALSE(once.take(net::scale_order{1, "scale to=4", 2, 1}));  // an older one, late
  CHECK(once.take(net::scale_order{1, "scale to=4", 5, 1}));        // the next leader's
  CHECK(once.take(net::scale_order{1, "scale to=4", 0, 0}));        // unnumbered: always
  CHECK(once.take(net::scale_order{1, "scale to=4", 0, 0}));
}
