// The heartbeat table: which heartbeats the bridge thread may answer itself, and how their
// times reach the actor's roster; then the bridge and the actor at once (threads, no sleeps).
#include <doctest/doctest.h>

#include <atomic>
#include <thread>
#include <unordered_map>

#include "runtime/net/heartbeat_table.hpp"
#include "runtime/net/membership.hpp"

namespace mb = cohort::net::membership;
using cohort::net::heartbeat_table;

namespace {

const mb::mono_time t0{};
mb::mono_time at(int ms) { return t0 + std::chrono::milliseconds(ms); }

// Two members registered at 0 ms from peers "p1" and "p2"; member 1 is alive, 2 joining.
struct two_members {
  mb::options o;
  mb::roster r;
  std::unordered_map<mb::member_id, std::string> peer_of{{1, "p1"}, {2, "p2"}};
  two_members() {
    o.dp = 2;
    r = mb::on_register(r, at(0), "a", 1, o).next;
    r = mb::on_register(r, at(0), "b", 2, o).next;
    mb::refresh_member(r, at(0), 1, r.generation);  // a's first beat: alive
  }
};

}  // namespace

TEST_CASE("the table answers live members' beats from their own peer, and no others") {
  two_members w;
  heartbeat_table t;
  CHECK_FALSE(t.on_beat("p1", 1, 1, at(10)));  // nothing published yet
  t.publish(w.r, w.peer_of);
  REQUIRE(w.r.generation == 2);
  CHECK(t.on_beat("p1", 1, 2, at(10)) == 2u);
  CHECK(t.on_beat("p1", 1, 1, at(10)) == 2u);  // behind: answered, and told generation 2
  CHECK_FALSE(t.on_beat("p1", 1, 3, at(10)));  // ahead of the roster: the actor's case
  CHECK_FALSE(t.on_beat("px", 1, 2, at(10)));  // another peer naming member 1
  CHECK_FALSE(t.on_beat("p2", 2, 2, at(10)));  // b's first beat makes it alive: the actor's
  CHECK_FALSE(t.on_beat("p1", 9, 2, at(10)));  // unknown
  CHECK(t.answered() == 2);
  t.mark_alive(2);
  CHECK(t.on_beat("p2", 2, 2, at(20)) == 2u);
  // The roster takes the newest beat of each member, never an older one.
  w.r.members[1].last_heartbeat = at(30);
  t.refresh(w.r);
  CHECK(w.r.members[0].last_heartbeat == at(10));
  CHECK(w.r.members[1].last_heartbeat == at(30));
  // A new roster without member 2: its beats go to the actor (which answers rejoin).
  mb::roster next = mb::on_leave(w.r, at(40), 2, w.o).next;
  t.publish(next, w.peer_of);
  CHECK_FALSE(t.on_beat("p2", 2, 2, at(50)));
  CHECK(t.on_beat("p1", 1, 2, at(50)) == 3u);
  t.refresh(next);
  CHECK(next.members[0].last_heartbeat == at(50));  // kept across the publish
}

TEST_CASE("beats recorded on one thread while another publishes and refreshes") {
  two_members w;
  heartbeat_table t;
  t.publish(w.r, w.peer_of);
  std::atomic<bool> go{false};
  std::atomic<int> answered{0};
  std::thread bridge([&] {
    while (!go) std::this_thread::yield();
    for (int i = 1; i <= 20000; ++i)
      if (t.on_beat("p1", 1, 1, at(i))) ++answered;
  });
  mb::roster r = w.r;
  go = true;
  for (int i = 0; i < 2000; ++i) {  // however the two threads interleave
    t.publish(r, w.peer_of);
    t.refresh(r);
  }
  bridge.join();
  t.refresh(r);
  CHECK(answered == 20000);  // member 1 never left the table
  CHECK(t.answered() == 20000);
  CHECK(r.members[0].last_heartbeat == at(20000));
}

TEST_CASE("late beats of several members are the coordinator's lag, for a window or two") {
  two_members w;
  // Period 100 ms, window 500 ms, lag at most 1 s.
  heartbeat_table t(std::chrono::milliseconds(100), std::chrono::milliseconds(500),
                    std::chrono::milliseconds(1000));
  t.publish(w.r, w.peer_of);
  t.mark_alive(2);
  REQUIRE(t.late_quorum() == 2);  // two members: two late beats make a lag
  auto beat = [&](const char* peer, mb::member_id id, int ms) {
    REQUIRE(t.on_beat(peer, id, 2, at(ms)));
  };
  beat("p1", 1, 1000);  // the first beats recorded here: no gap to judge
  beat("p2", 2, 1000);
  CHECK(t.lag(at(1000)).count() == 0);
  beat("p1", 1, 1100);                  // on time
  beat("p1", 1, 1550);                  // 450 ms after its last: 350 ms late, but alone
  CHECK(t.lag(at(1550)).count() == 0);  // one member's own stall moves nothing
  beat("p2", 2, 1600);                  // 600 ms after its last: 500 ms late
  CHECK(t.lag(at(1600)).count() == 350);  // both were at least 350 ms late
  beat("p1", 1, 1650);                    // on time again: the window remembers
  CHECK(t.lag(at(1900)).count() == 350);
  CHECK(t.lag(at(2500)).count() == 350);  // still the window before
  CHECK(t.lag(at(2550)).count() == 0);    // two windows on: forgotten
  beat("p1", 1, 5000);                    // 3.35 s late ...
  beat("p2", 2, 5000);                    // ... and 3.4 s: capped
  CHECK(t.lag(at(5000)).count() == 1000);
  // Members that beat on time keep the lag at zero whatever a silent one does (it died).
  heartbeat_table quiet;
  quiet.publish(w.r, w.peer_of);
  for (int ms = 0; ms <= 3000; ms += 100) REQUIRE(quiet.on_beat("p1", 1, 2, at(ms)));
  CHECK(quiet.lag(at(3000)).count() == 0);
}
