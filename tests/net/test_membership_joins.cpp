// Registrations that share a generation (on_register_batch), when a join window closes, and
// the change log a member's roster_update is cut from, as tables: no sockets, no sleeps.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "runtime/net/membership.hpp"
#include "runtime/net/roster_changes.hpp"

namespace mb = cohort::net::membership;

namespace {

const mb::mono_time t0{};
mb::mono_time at(int ms) { return t0 + std::chrono::milliseconds(ms); }

mb::options world(int max_workers, int join_window_ms = 50) {
  mb::options o;
  o.dp = max_workers;
  o.join_window_ms = join_window_ms;
  return o;
}

std::vector<mb::candidate> named(std::initializer_list<const char*> names) {
  std::vector<mb::candidate> c;
  for (const char* n : names) c.push_back(mb::candidate{n, 100});
  return c;
}

}  // namespace

TEST_CASE("a batch of registrations enters one generation, ranks in arrival order") {
  const mb::options o = world(4);
  mb::roster r = mb::on_register(mb::roster{}, at(0), "w0", 1, o).next;
  REQUIRE(r.generation == 1);
  const mb::batch_decision b = mb::on_register_batch(r, at(10), named({"w1", "w2", "w3"}), o);
  CHECK(b.new_generation);
  CHECK(b.next.generation == 2);
  REQUIRE(b.each.size() == 3);
  for (int i = 0; i < 3; ++i) {
    CAPTURE(i);
    const mb::member* m = b.next.find(b.each[i].id);
    REQUIRE(m != nullptr);
    CHECK(m->name == "w" + std::to_string(i + 1));
    CHECK(m->rank == i + 1);
    CHECK(m->state == mb::member_state::joining);
    CHECK(m->last_heartbeat == at(10));
    CHECK(b.each[i].reason.find("joined as rank " + std::to_string(i + 1)) != std::string::npos);
  }
  CHECK(b.reason.find("3 joined together") != std::string::npos);
  CHECK(b.reason.find("generation 1 -> 2, 4 live") != std::string::npos);
}

TEST_CASE("a batch refuses each candidate as a lone registration would be refused") {
  const mb::options o = world(3);
  mb::roster r = mb::on_register(mb::roster{}, at(0), "w0", 1, o).next;
  // A held name, a bad name, a name taken earlier in the same batch, then the world is full
  // (w0, w1, w2): the last two are refused as full, and may wait as spares.
  const mb::batch_decision b =
      mb::on_register_batch(r, at(5), named({"w0", "bad name", "w1", "w1", "w2", "w3", "w4"}), o);
  REQUIRE(b.each.size() == 7);
  CHECK(b.each[0].id == 0);
  CHECK(b.each[0].reason.find("held by live member") != std::string::npos);
  CHECK(b.each[1].id == 0);
  CHECK(b.each[1].reason.find("character other than") != std::string::npos);
  CHECK(b.each[2].id != 0);
  CHECK(b.each[3].id == 0);
  CHECK(b.each[3].reason.find("registered at the same time") != std::string::npos);
  CHECK(b.each[4].id != 0);
  CHECK(b.each[5].id == 0);
  CHECK(b.each[5].full);
  CHECK(b.each[6].full);
  CHECK_FALSE(b.each[0].full);
  CHECK(b.next.members.size() == 3);
  CHECK(b.next.generation == 2);
  // Nobody admitted: the roster and its generation stay.
  const mb::batch_decision none = mb::on_register_batch(b.next, at(6), named({"w5"}), o);
  CHECK_FALSE(none.new_generation);
  CHECK(none.next.generation == 2);
  CHECK(none.each[0].full);
}

TEST_CASE("on_register is a batch of one") {
  const mb::options o = world(2);
  const mb::roster empty;
  const mb::decision d = mb::on_register(empty, at(0), "", 7, o);
  const mb::batch_decision b = mb::on_register_batch(empty, at(0), {mb::candidate{"", 7}}, o);
  CHECK(d.kind == mb::decision_kind::accepted);
  CHECK(d.member == b.each[0].id);
  CHECK(d.next.members[0].name == "worker-1");
  CHECK(d.reason == b.reason);
  CHECK(d.reason.find("joined as rank 0 at (0, 0, 0); generation 0 -> 1, 1 live") !=
        std::string::npos);
}

TEST_CASE("a join window closes after a quiet window, or 30 windows after it opened") {
  const mb::options o = world(8, 50);
  struct row {
    int first, last, now;
    bool closed;
  };
  const row rows[] = {
      {0, 0, 49, false},       // still within the window of the only registration
      {0, 0, 50, true},        // a quiet window
      {0, 40, 80, false},      // the latest registration renewed it
      {0, 40, 90, true},       //
      {0, 1495, 1499, false},  // a steady trickle ...
      {0, 1495, 1500, true},   // ... still closes at 30 windows
  };
  for (const row& x : rows) {
    CAPTURE(x.first);
    CAPTURE(x.last);
    CAPTURE(x.now);
    CHECK(mb::join_window_closed(at(x.first), at(x.last), at(x.now), o) == x.closed);
    const auto closes = mb::join_window_closes(at(x.first), at(x.last), o);
    CHECK(mb::join_window_closed(at(x.first), at(x.last), closes, o));
    CHECK_FALSE(
        mb::join_window_closed(at(x.first), at(x.last), closes - std::chrono::milliseconds(1), o));
  }
  CHECK(mb::join_window_closed(at(0), at(0), at(0), world(8, 0)));  // no window: at once
}

TEST_CASE("a join window is complete before its time when nobody else could enter with it") {
  const mb::options o = world(4, 50);
  struct row {
    int seated, live, joining, awaited;
    bool complete;
  };
  const row rows[] = {
      {3, 3, 0, 0, false},  // nobody in the window
      {3, 3, 1, 0, true},   // the last free seat (a respawn, the quickstart's scale to 4)
      {2, 2, 1, 0, false},  // a seat left, nothing awaited: the window runs its time
      {2, 2, 1, 3, true},   // a scale to 3 has its worker
      {1, 1, 1, 3, false},  // ... not yet both of a scale to 3 from 1
      {1, 1, 2, 3, true},   //
      {3, 2, 1, 0, true},   // a leaving member holds its seat: the roster is full
      {2, 1, 1, 3, false},  // the scale counts live members only
      {2, 1, 1, 2, true},   // a scale to 2 has its worker
      {0, 0, 4, 0, true},   // a job's start: the roster full at once
  };
  for (const row& x : rows) {
    CAPTURE(x.seated);
    CAPTURE(x.joining);
    CAPTURE(x.awaited);
    CHECK(mb::join_window_complete(x.seated, x.live, x.joining, x.awaited, o) == x.complete);
  }
}

TEST_CASE("left_between lists who left, in the old order") {
  using V = std::vector<mb::member_id>;
  CHECK(mb::left_between(V{1, 2, 3, 5}, V{2, 5, 6}) == V{1, 3});
  CHECK(mb::left_between(V{}, V{1}).empty());
  CHECK(mb::left_between(V{4}, V{}) == V{4});
  CHECK(mb::left_between(V{1, 2}, V{1, 2, 3}).empty());
}

TEST_CASE("the change log answers from any announced generation it remembers") {
  mb::change_log log(3);
  using V = std::vector<mb::member_id>;
  CHECK_FALSE(log.left_since(1).has_value());  // nothing recorded
  log.record(2, {});                           // where the log starts
  CHECK(log.left_since(2) == V{});
  log.record(3, {7});
  log.record(5, {8, 9});  // two generations in one announcement (a restart and a join)
  CHECK(log.left_since(2) == V{7, 8, 9});
  CHECK(log.left_since(3) == V{8, 9});
  CHECK(log.left_since(4) == V{8, 9});  // between two announcements: the covering superset
  CHECK(log.left_since(5) == V{});
  CHECK_FALSE(log.left_since(0).has_value());  // a new member: full copy
  CHECK_FALSE(log.left_since(6).has_value());  // newer than the log: full copy
  log.record(6, {});
  log.record(7, {1});  // four entries kept at most three: generation 2 is forgotten
  CHECK_FALSE(log.left_since(2).has_value());
  CHECK(log.left_since(3) == V{8, 9, 1});
  CHECK(log.oldest_base() == 3);
  // The id bound drops the oldest entries too (always keeping the newest).
  mb::change_log small(100, 2);
  small.record(1, {});
  small.record(2, {1, 2});
  small.record(3, {3});
  CHECK_FALSE(small.left_since(1).has_value());
  CHECK(small.left_since(2) == V{3});
}

TEST_CASE("a member applying its changes always knows its world: seeded random churn") {
  // Members join (in batches) and leave at random; each generation is announced to every
  // live member as a change from the generation it was last told, or as a full copy. A
  // member's view then holds exactly the live ids: what left since its base is gone.
  std::mt19937_64 rng(20261202);
  const mb::options o = world(64, 50);
  mb::roster r;
  mb::change_log log(8);
  std::vector<mb::member_id> announced;
  std::map<mb::member_id, std::pair<uint64_t, std::set<mb::member_id>>> views;
  int full_copies = 0, changes = 0;
  for (int round = 0; round < 400; ++round) {
    if (rng() % 2 == 0 || r.members.size() < 2) {
      std::vector<mb::candidate> c(1 + rng() % 4);
      r = mb::on_register_batch(r, at(round), c, o).next;
    } else {
      const mb::member& m = r.members[rng() % r.members.size()];
      r = mb::on_leave(r, at(round), m.id, o).next;
    }
    if (rng() % 3 == 0) continue;  // a member is told only some generations (it may lag)
    const std::vector<mb::member_id> ids = mb::ids_of(r);
    if (r.generation > log.newest()) log.record(r.generation, mb::left_between(announced, ids));
    announced = ids;
    const std::set<mb::member_id> live(ids.begin(), ids.end());
    for (const mb::member_id id : ids) {
      auto& [held, view] = views[id];
      const auto left = log.left_since(held);
      if (!left) {
        view = live;  // what a full copy gives: the world as it is now
        ++full_copies;
      } else {
        for (const mb::member_id gone : *left) view.erase(gone);
        ++changes;
      }
      held = r.generation;
      // Joiners are counted by world_size, not listed: the view holds no one who left.
      for (const mb::member_id x : view) CHECK(live.count(x) == 1);
    }
    for (auto it = views.begin(); it != views.end();)
      it = live.count(it->first) ? std::next(it) : views.erase(it);
  }
  CHECK(full_copies > 0);
  CHECK(changes > full_copies);
}

TEST_CASE("a new leader continues member ids and generations above an earlier leader's") {
  mb::roster r;
  r.generation = 3;
  r.next_id = 5;
  // Above the roster's own counters: both move past the earlier leader's.
  mb::roster next = r;
  mb::continue_after(next, 11, 7);
  CHECK(next.next_id == 12);
  CHECK(next.generation == 7);
  // Below them: nothing moves back.
  mb::continue_after(next, 2, 1);
  CHECK(next.next_id == 12);
  CHECK(next.generation == 7);
  // A first registration (zeros) changes nothing; a value with no room left is ignored.
  next = r;
  mb::continue_after(next, 0, 0);
  CHECK(next.next_id == 5);
  next = r;
  mb::continue_after(next, mb::max_continued, mb::max_continued);
  CHECK(next.next_id == 5);
  CHECK(next.generation == 3);
  next = r;
  mb::continue_after(next, mb::max_continued - 1, 0);
  CHECK(next.next_id == mb::max_continued);
}
