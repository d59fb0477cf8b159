// Table tests of the membership decisions with an injected clock: no sockets, no sleeps.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>

#include "runtime/core/config.hpp"
#include "runtime/core/error.hpp"
#include "runtime/net/membership.hpp"

namespace mb = cohort::net::membership;
using K = mb::decision_kind;

namespace {

const mb::mono_time t0{};
mb::mono_time at(int ms) { return t0 + std::chrono::milliseconds(ms); }

mb::options grid(int dp, int pp, int tp, int heartbeat_ms = 100, int timeout_ms = 500) {
  mb::options o;
  o.dp = dp;
  o.pp = pp;
  o.tp = tp;
  o.heartbeat_ms = heartbeat_ms;
  o.timeout_ms = timeout_ms;
  return o;
}

// The world of the seeded random event tests: a 2 x 2 x 2 grid that admits up to 10 members.
mb::options random_world() {
  mb::options o = grid(2, 2, 2, 100, 500);
  o.max_workers = 10;
  return o;
}

char state_letter(mb::member_state s) {
  switch (s) {
    case mb::member_state::joining:
      return 'J';
    case mb::member_state::alive:
      return 'A';
    case mb::member_state::leaving:
      return 'L';
    case mb::member_state::dead:
      return 'D';
  }
  return '?';
}

// "w0=A w1=J": live members in rank order with their state letter.
std::string live_string(const mb::roster& r) {
  std::string s;
  for (const auto& m : r.members)
    s += (s.empty() ? "" : " ") + m.name + "=" + state_letter(m.state);
  return s;
}

// Invariants every roster must satisfy after any decision, checked independently of the
// implementation: ranks dense and in id (join) order, coordinates from the grid formula
// written out here, ids unique, names unique among live members.
void check_invariants(const mb::roster& r, const mb::options& o) {
  std::set<mb::member_id> ids;
  std::set<std::string> names;
  for (std::size_t i = 0; i < r.members.size(); ++i) {
    const auto& m = r.members[i];
    CHECK(m.rank == static_cast<int>(i));
    if (i > 0) CHECK(r.members[i - 1].id < m.id);
    const int rank = static_cast<int>(i);
    CHECK(m.at.t == rank % o.tp);
    CHECK(m.at.p == (rank / o.tp) % o.pp);
    CHECK(m.at.d == rank / (o.tp * o.pp));
    CHECK(m.id != 0);
    CHECK(m.id < r.next_id);
    CHECK(ids.insert(m.id).second);
    CHECK(names.insert(m.name).second);
    CHECK(m.state != mb::member_state::dead);
  }
  for (const auto& t : r.departed) CHECK(ids.count(t.id) == 0);
}

enum class ev { reg, hb, tick, exit_id, exit_name, intent, leave };

struct row {
  int t;  // injected clock, ms
  ev e;
  std::string who;    // member name (the runner maps it to the latest id with that name)
  std::int64_t arg;   // hb: generation the worker claims (-1: current); exit_name: pid
  K kind;             // expected decision
  std::uint64_t gen;  // expected generation after
  std::string live;   // expected live members in rank order
};

struct runner {
  mb::options opts;
  mb::roster roster;
  std::map<std::string, mb::member_id> ids;  // latest id per name

  mb::decision apply(const row& x) {
    const auto now = at(x.t);
    const auto id = ids.count(x.who) ? ids.at(x.who) : mb::member_id{999};
    switch (x.e) {
      case ev::reg:
        return mb::on_register(roster, now, x.who, 1000 + x.t, opts);
      case ev::hb:
        return mb::on_heartbeat(roster, now, id,
                                x.arg < 0 ? roster.generation : static_cast<std::uint64_t>(x.arg),
                                opts);
      case ev::tick:
        return mb::check_timeouts(roster, now, opts);
      case ev::exit_id:
        return mb::on_exit_notice(roster, now, id, "exit code 137", opts);
      case ev::exit_name:
        return mb::on_exit_notice_by_name(roster, now, x.who, x.arg, "exit code 1", opts);
      case ev::intent:
        return mb::on_leave_intent(roster, now, id, opts);
      case ev::leave:
        return mb::on_leave(roster, now, id, opts);
    }
    FAIL("unknown event");
    return {};
  }

  void run(const std::vector<row>& table) {
    for (std::size_t i = 0; i < table.size(); ++i) {
      const row& x = table[i];
      const std::uint64_t before = roster.generation;
      mb::decision d = apply(x);
      INFO("row " << i << " t=" << x.t << " who=" << x.who << ": " << mb::to_string(d.kind) << ": "
                  << d.reason);
      CHECK(d.kind == x.kind);
      CHECK(d.next.generation == x.gen);
      CHECK(live_string(d.next) == x.live);
      CHECK(!d.reason.empty());
      // The generation rule: +1 exactly when the decision says so, never by more.
      CHECK(d.new_generation == (d.next.generation == before + 1));
      CHECK((d.next.generation == before || d.next.generation == before + 1));
      check_invariants(d.next, opts);
      if (d.kind == K::accepted) ids[d.next.find(d.member)->name] = d.member;
      roster = std::move(d.next);
    }
  }
};

}  // namespace

TEST_CASE("coordinates: 2x2x1 grid, closed form") {
  const auto o = grid(2, 2, 1);
  // (d, p, t) for ranks 0..3 written out by hand.
  const std::vector<mb::grid_coord> want{{0, 0, 0}, {0, 1, 0}, {1, 0, 0}, {1, 1, 0}};
  for (int r = 0; r < 4; ++r) CHECK(mb::coord_of(r, o) == want[static_cast<std::size_t>(r)]);
}

TEST_CASE("coordinates: every rank of a 3x2x2 grid is the inverse of the nested loop") {
  const auto o = grid(3, 2, 2);
  int rank = 0;
  for (int d = 0; d < 3; ++d)
    for (int p = 0; p < 2; ++p)
      for (int t = 0; t < 2; ++t) {
        const auto c = mb::coord_of(rank++, o);
        CHECK(c == mb::grid_coord{d, p, t});
      }
}

TEST_CASE("table: join, heartbeat, timeout at the boundary, batch death, rejoin") {
  runner r;
  r.opts = grid(2, 2, 1, 100, 500);  // 4 workers
  r.run({
      // t     event      who   arg  decision             gen  live after (rank order)
      {0, ev::reg, "w0", 0, K::accepted, 1, "w0=J"},
      {10, ev::reg, "w1", 0, K::accepted, 2, "w0=J w1=J"},
      {20, ev::reg, "w2", 0, K::accepted, 3, "w0=J w1=J w2=J"},
      {30, ev::reg, "w3", 0, K::accepted, 4, "w0=J w1=J w2=J w3=J"},
      {40, ev::reg, "w4", 0, K::rejected, 4, "w0=J w1=J w2=J w3=J"},  // full (4 of 4)
      {50, ev::reg, "w1", 0, K::rejected, 4, "w0=J w1=J w2=J w3=J"},  // duplicate live name
      {100, ev::hb, "w0", -1, K::refreshed, 4, "w0=A w1=J w2=J w3=J"},
      {100, ev::hb, "w1", 2, K::refreshed, 4, "w0=A w1=A w2=J w3=J"},  // behind: fine
      {100, ev::hb, "w2", -1, K::refreshed, 4, "w0=A w1=A w2=A w3=J"},
      {100, ev::hb, "w3", -1, K::refreshed, 4, "w0=A w1=A w2=A w3=A"},
      // w0, w1 keep beating; w2, w3 fall silent after t=100.
      {400, ev::hb, "w0", -1, K::refreshed, 4, "w0=A w1=A w2=A w3=A"},
      {400, ev::hb, "w1", -1, K::refreshed, 4, "w0=A w1=A w2=A w3=A"},
      {599, ev::tick, "", 0, K::unchanged, 4, "w0=A w1=A w2=A w3=A"},  // 499 ms: alive
      {600, ev::tick, "", 0, K::removed, 5, "w0=A w1=A"},           // 500 ms: both dead, one bump
      {601, ev::hb, "w2", -1, K::rejoin_required, 5, "w0=A w1=A"},  // dead: start over
      {610, ev::reg, "w2", 0, K::accepted, 6, "w0=A w1=A w2=J"},    // new id, rank 2
      {620, ev::hb, "w2", -1, K::refreshed, 6, "w0=A w1=A w2=A"},
      {899, ev::tick, "", 0, K::unchanged, 6, "w0=A w1=A w2=A"},  // w0,w1 silent 499 ms
      {900, ev::tick, "", 0, K::removed, 7, "w2=A"},              // w0,w1 silent 500 ms
  });
  // The rejoined w2 holds a new id and rank 0 now that it is alone.
  const auto* w2 = r.roster.find_name("w2");
  REQUIRE(w2 != nullptr);
  CHECK(w2->id == 5);
  CHECK(w2->rank == 0);
  CHECK(r.roster.next_id == 6);
}

TEST_CASE("table: exit notices, graceful leave and protocol faults") {
  runner r;
  r.opts = grid(2, 1, 2, 100, 1000);
  r.run({
      {0, ev::reg, "a", 0, K::accepted, 1, "a=J"},
      {0, ev::reg, "b", 0, K::accepted, 2, "a=J b=J"},
      {0, ev::reg, "c", 0, K::accepted, 3, "a=J b=J c=J"},
      {0, ev::reg, "d", 0, K::accepted, 4, "a=J b=J c=J d=J"},
      {10, ev::exit_id, "b", 0, K::removed, 5, "a=J c=J d=J"},    // fast path
      {11, ev::exit_id, "b", 0, K::unchanged, 5, "a=J c=J d=J"},  // idempotent
      {12, ev::hb, "b", -1, K::rejoin_required, 5, "a=J c=J d=J"},
      // The launcher restarts "b"; a late notice about the old pid must not kill it.
      {20, ev::reg, "b", 0, K::accepted, 6, "a=J c=J d=J b=J"},
      {21, ev::exit_name, "b", 1000, K::unchanged, 6, "a=J c=J d=J b=J"},  // old pid 1000
      {22, ev::exit_name, "b", 1020, K::removed, 7, "a=J c=J d=J"},        // its real pid
      {23, ev::exit_name, "zz", 0, K::unchanged, 7, "a=J c=J d=J"},        // never existed
      {30, ev::hb, "c", -1, K::refreshed, 7, "a=J c=A d=J"},
      {40, ev::intent, "c", 0, K::leaving, 7, "a=J c=L d=J"},  // keeps its rank, same gen
      {50, ev::hb, "c", -1, K::refreshed, 7, "a=J c=L d=J"},   // still leaving
      {60, ev::leave, "c", 0, K::removed, 8, "a=J d=J"},
      {61, ev::leave, "c", 0, K::unchanged, 8, "a=J d=J"},
      {62, ev::intent, "c", 0, K::unchanged, 8, "a=J d=J"},
      {70, ev::hb, "d", 99, K::rejoin_required, 9, "a=J"},       // claims a future generation
      {80, ev::hb, "nobody", -1, K::rejoin_required, 9, "a=J"},  // id never issued
  });
}

TEST_CASE("timeout boundary is exact for any timeout, and a heartbeat moves it") {
  for (int timeout : {1, 2, 150, 500, 3000}) {
    auto o = grid(1, 1, 1, 1, timeout + 1);
    o.timeout_ms = timeout;
    o.heartbeat_ms = timeout > 1 ? timeout - 1 : 1;
    const auto reg = mb::on_register({}, at(1000), "w", 1, o);
    REQUIRE(reg.kind == K::accepted);
    // Before its first heartbeat a member may be silent for twice the timeout.
    CHECK(mb::check_timeouts(reg.next, at(1000 + 2 * timeout - 1), o).kind == K::unchanged);
    const auto gone = mb::check_timeouts(reg.next, at(1000 + 2 * timeout), o);
    CHECK(gone.kind == K::removed);
    CHECK(gone.reason.find("twice timeout_ms before a first heartbeat") != std::string::npos);
    CHECK(*mb::next_timeout(reg.next, o) == at(1000 + 2 * timeout));
    const auto hb = mb::on_heartbeat(reg.next, at(1000 + timeout - 1), 1, 1, o);
    CHECK(mb::check_timeouts(hb.next, at(1000 + 2 * timeout - 2), o).kind == K::unchanged);
    CHECK(mb::check_timeouts(hb.next, at(1000 + 2 * timeout - 1), o).kind == K::removed);
  }
}

TEST_CASE("the coordinator's own lag extends the silence allowed, and says so") {
  const auto o = grid(2, 1, 1, 100, 500);
  mb::roster r = mb::on_register({}, at(0), "a", 1, o).next;
  r = mb::on_heartbeat(r, at(0), 1, 1, o).next;
  const auto lag = std::chrono::milliseconds(300);
  CHECK(mb::check_timeouts(r, at(799), o, lag).kind == K::unchanged);
  const auto d = mb::check_timeouts(r, at(800), o, lag);
  CHECK(d.kind == K::removed);
  CHECK(d.reason.find("silent for 800 ms (timeout 500 ms, + 300 ms of the coordinator's lag)") !=
        std::string::npos);
  CHECK(mb::check_timeouts(r, at(500), o).kind == K::removed);  // no lag: the timeout
}

TEST_CASE("batch of deaths: one generation, removed in rank order, reason names each") {
  const auto o = grid(4, 1, 1, 100, 500);
  mb::roster r;
  for (int i = 0; i < 4; ++i) r = mb::on_register(r, at(0), "w" + std::to_string(i), i, o).next;
  REQUIRE(r.generation == 4);
  for (int i = 0; i < 4; ++i) r = mb::on_heartbeat(r, at(0), r.members[i].id, 4, o).next;
  r = mb::on_heartbeat(r, at(300), r.members[1].id, 4, o).next;  // then only w1 beats
  const auto d = mb::check_timeouts(r, at(700), o);
  CHECK(d.kind == K::removed);
  CHECK(d.next.generation == 5);
  CHECK(d.removed == std::vector<mb::member_id>{1, 3, 4});
  CHECK(live_string(d.next) == "w1=A");
  CHECK(d.next.members[0].rank == 0);
  for (const char* name : {"'w0' (member 1) silent for 700 ms", "'w2' (member 3) silent for 700 ms",
                           "'w3' (member 4) silent for 700 ms", "generation 4 -> 5"}) {
    INFO(d.reason);
    CHECK(d.reason.find(name) != std::string::npos);
  }
  REQUIRE(d.next.departed.size() == 3);
  for (const auto& t : d.next.departed) {
    CHECK(t.cause == mb::departure::timeout);
    CHECK(t.removed_in == 5);
    CHECK(t.removed_at == at(700));
  }
  CHECK(d.next.departed[1].last_rank == 2);
  // A dead member's heartbeat names its death.
  const auto hb = mb::on_heartbeat(d.next, at(701), 3, 4, o);
  CHECK(hb.kind == K::rejoin_required);
  CHECK(!hb.new_generation);
  CHECK(hb.reason.find("'w2' (member 3) departed in generation 5") != std::string::npos);
}

TEST_CASE("stale generation in a heartbeat is fine for a live member and says so") {
  const auto o = grid(2, 1, 1);
  mb::roster r = mb::on_register({}, at(0), "a", 1, o).next;
  r = mb::on_register(r, at(0), "b", 2, o).next;
  const auto d = mb::on_heartbeat(r, at(50), 1, 1, o);
  CHECK(d.kind == K::refreshed);
  CHECK(d.next.generation == 2);  // what the ack carries
  CHECK(d.reason.find("behind (generation 1 < 2)") != std::string::npos);
  CHECK(d.next.find(1)->last_heartbeat == at(50));
  // A heartbeat that arrives out of order (older timestamp) never moves the clock back.
  const auto late = mb::on_heartbeat(d.next, at(40), 1, 2, o);
  CHECK(late.next.find(1)->last_heartbeat == at(50));
}

TEST_CASE("registration: empty name, duplicate names, reuse of a dead member's name") {
  auto o = grid(2, 1, 1);
  const auto a = mb::on_register({}, at(0), "", 7, o);
  CHECK(a.kind == K::accepted);
  CHECK(a.next.members[0].name == "worker-1");
  CHECK(a.next.members[0].pid == 7);
  CHECK(a.next.members[0].joined_at == at(0));
  const auto dup = mb::on_register(a.next, at(5), "worker-1", 8, o);
  CHECK(dup.kind == K::rejected);
  CHECK(dup.reason.find("name 'worker-1' is held by live member 1") != std::string::npos);
  CHECK(dup.next.generation == a.next.generation);
  CHECK(dup.next.next_id == a.next.next_id);  // a rejection burns no id
  const auto dead = mb::on_exit_notice(a.next, at(6), 1, "signal 9", o);
  const auto again = mb::on_register(dead.next, at(7), "worker-1", 9, o);
  CHECK(again.kind == K::accepted);
  CHECK(again.member == 2);  // never reused
  // Elastic room: max_workers above dp*pp*tp admits more.
  o.max_workers = 3;
  auto r = mb::on_register(again.next, at(8), "x", 0, o).next;
  r = mb::on_register(r, at(8), "y", 0, o).next;
  CHECK(r.members.size() == 3);
  const auto full = mb::on_register(r, at(8), "z", 0, o);
  CHECK(full.kind == K::rejected);
  CHECK(full.reason.find("roster full: 3 of 3") != std::string::npos);
}

TEST_CASE("readiness counts alive members against min_workers") {
  auto o = grid(2, 1, 1);
  mb::roster r = mb::on_register({}, at(0), "a", 1, o).next;
  r = mb::on_register(r, at(0), "b", 2, o).next;
  auto ready = mb::check_ready(r, o);
  CHECK(!ready.ready);
  CHECK(ready.reason == "waiting for 2 more alive worker(s): 0 alive, 2 joining, 2 needed");
  r = mb::on_heartbeat(r, at(1), 1, 2, o).next;
  CHECK(!mb::check_ready(r, o).ready);
  r = mb::on_heartbeat(r, at(1), 2, 2, o).next;
  CHECK(mb::check_ready(r, o).ready);
  o.min_workers = 3;
  o.max_workers = 4;
  CHECK(!mb::check_ready(r, o).ready);
}

TEST_CASE("next_timeout is the earliest last heartbeat plus the silence allowed") {
  const auto o = grid(3, 1, 1, 100, 500);
  CHECK(!mb::next_timeout({}, o).has_value());
  mb::roster r = mb::on_register({}, at(0), "a", 1, o).next;
  r = mb::on_register(r, at(100), "b", 2, o).next;
  r = mb::on_heartbeat(r, at(200), 1, 2, o).next;
  CHECK(*mb::next_timeout(r, o) == at(700));  // a: beat at 200 (b, joining: 100 + 2 x 500)
  r = mb::on_heartbeat(r, at(150), 2, 2, o).next;
  CHECK(*mb::next_timeout(r, o) == at(650));  // b: alive, beat at 150
}

TEST_CASE("status view and its JSON") {
  const auto o = grid(2, 2, 1, 100, 500);
  mb::roster r;
  for (const char* n : {"a", "b", "c"}) r = mb::on_register(r, at(0), n, 40, o).next;
  r = mb::on_heartbeat(r, at(100), 1, 3, o).next;
  r = mb::on_heartbeat(r, at(100), 3, 3, o).next;
  r = mb::on_exit_notice(r, at(150), 2, "exit code 3", o).next;
  const auto s = mb::status(r, at(250), o);
  CHECK(s.generation == 4);
  CHECK(s.expected == 4);
  CHECK(s.alive == 2);
  CHECK(!s.ready.ready);
  REQUIRE(s.members.size() == 3);
  CHECK(s.members[0].name == "a");
  CHECK(s.members[0].heartbeat_age_ms == 150);
  CHECK(s.members[1].name == "c");
  CHECK(s.members[1].rank == 1);
  CHECK(s.members[1].at == mb::grid_coord{0, 1, 0});
  CHECK(s.members[2].name == "b");
  CHECK(s.members[2].state == mb::member_state::dead);
  CHECK(s.members[2].rank == -1);
  CHECK(s.members[2].heartbeat_age_ms == 250);  // silent since it registered
  CHECK(s.members[2].reason == "exited: process exited: exit code 3");

  const nlohmann::json j = s;
  const auto round = nlohmann::json::parse(j.dump());
  CHECK(round["generation"] == 4);
  CHECK(round["ready"] == false);
  CHECK(round["members"].size() == 3);
  CHECK(round["members"][1]["coords"]["p"] == 1);
  CHECK(round["members"][1]["state"] == "alive");
  CHECK(round["members"][2]["state"] == "dead");
  CHECK(round["members"][2]["heartbeat_age_ms"] == 250);
}

TEST_CASE("tombstones are capped, oldest first out, and old ids still need a rejoin") {
  auto o = grid(1, 1, 1);
  o.max_tombstones = 2;
  mb::roster r;
  for (int i = 0; i < 4; ++i) {
    r = mb::on_register(r, at(i), "w", i, o).next;
    r = mb::on_leave(r, at(i), r.members[0].id, o).next;
  }
  REQUIRE(r.departed.size() == 2);
  CHECK(r.departed[0].id == 3);
  CHECK(r.departed[1].id == 4);
  const auto d = mb::on_heartbeat(r, at(10), 1, r.generation, o);
  CHECK(d.kind == K::rejoin_required);
  CHECK(d.reason.find("record forgotten") != std::string::npos);
}

TEST_CASE("options: validation errors a user can act on, and from a config") {
  CHECK_NOTHROW(mb::validate(grid(2, 2, 1)));
  CHECK_THROWS_AS(mb::validate(grid(2, 2, 1, 500, 500)), cohort::usage_error);
  CHECK_THROWS_AS(mb::validate(grid(0, 1, 1)), cohort::usage_error);
  CHECK_THROWS_AS(mb::validate(grid(1, 1, 1, 0, 10)), cohort::usage_error);
  auto o = grid(2, 1, 1);
  o.min_workers = 5;  // above max (2)
  CHECK_THROWS_WITH_AS(mb::validate(o),
                       doctest::Contains("min_workers (5) exceeds max_workers (2)"),
                       cohort::usage_error);

  cohort::config cfg;
  cfg.cluster.workers = 8;
  cfg.parallel.dp = 0;  // resolved from workers / (pp * tp)
  cfg.parallel.pp = 2;
  cfg.parallel.tp = 2;
  cfg.fault_tolerance.heartbeat_ms = 50;
  cfg.fault_tolerance.timeout_ms = 400;
  const auto from = mb::options_from(cfg);
  CHECK(from.dp == 2);
  CHECK(from.expected() == 8);
  CHECK(from.heartbeat_ms == 50);
  CHECK(from.timeout_ms == 400);
  cfg.fault_tolerance.timeout_ms = 50;
  CHECK_THROWS_AS(mb::options_from(cfg), cohort::usage_error);
}

TEST_CASE("generation rule holds over a long seeded random event sequence") {
  // Random events from a fixed seed; after each decision the generation grows by one exactly
  // when the set of live ids changed, and the roster invariants hold.
  const mb::options o = random_world();
  std::mt19937 gen(12345);
  mb::roster r;
  int now = 0;
  int changes = 0;
  for (int i = 0; i < 3000; ++i) {
    now += static_cast<int>(gen() % 60);
    const auto pick = [&]() -> mb::member_id {
      return r.next_id == 1 ? 0 : 1 + gen() % r.next_id;  // includes never-issued ids
    };
    mb::decision d;
    switch (gen() % 7) {
      case 0:
        d = mb::on_register(r, at(now), "n" + std::to_string(gen() % 14), 0, o);
        break;
      case 1:
      case 2:
        d = mb::on_heartbeat(r, at(now), pick(), gen() % (r.generation + 2), o);
        break;
      case 3:
        d = mb::check_timeouts(r, at(now), o);
        break;
      case 4:
        d = mb::on_exit_notice(r, at(now), pick(), "x", o);
        break;
      case 5:
        d = mb::on_leave_intent(r, at(now), pick(), o);
        break;
      case 6:
        d = mb::on_leave(r, at(now), pick(), o);
        break;
    }
    std::set<mb::member_id> before, after;
    for (const auto& m : r.members) before.insert(m.id);
    for (const auto& m : d.next.members) after.insert(m.id);
    const bool changed = before != after;
    INFO("step " << i << ": " << mb::to_string(d.kind) << ": " << d.reason);
    CHECK(d.next.generation == r.generation + (changed ? 1 : 0));
    CHECK(d.new_generation == changed);
    CHECK(static_cast<int>(d.next.members.size()) <= o.max());
    check_invariants(d.next, o);
    changes += changed;
    r = std::move(d.next);
  }
  CHECK(changes > 100);  // the sequence exercised many membership changes
}

TEST_CASE("refresh_member does in place what adopting on_heartbeat does, or defers to it") {
  // The same seeded random events as above; at every heartbeat both paths run on copies of
  // the roster: wherever refresh_member handles the heartbeat, the roster it leaves equals
  // on_heartbeat's next, member by member; where it does not, it left the roster untouched
  // and on_heartbeat decides something other than a plain refresh.
  const mb::options o = random_world();
  std::mt19937 gen(777);
  mb::roster r;
  int now = 0, fast = 0, deferred = 0;
  auto same = [](const mb::roster& a, const mb::roster& b) {
    if (a.generation != b.generation || a.members.size() != b.members.size()) return false;
    for (std::size_t i = 0; i < a.members.size(); ++i) {
      const auto &x = a.members[i], &y = b.members[i];
      if (x.id != y.id || x.rank != y.rank || x.state != y.state ||
          x.last_heartbeat != y.last_heartbeat || x.at != y.at)
        return false;
    }
    return a.departed.size() == b.departed.size();
  };
  for (int i = 0; i < 3000; ++i) {
    now += static_cast<int>(gen() % 60);
    // Half the heartbeats from a live member, half from any id ever issued (or never).
    const mb::member_id id = !r.members.empty() && gen() % 2 == 0
                                 ? r.members[gen() % r.members.size()].id
                                 : (r.next_id == 1 ? 0 : 1 + gen() % r.next_id);
    const std::uint64_t g = gen() % (r.generation + 2);
    INFO("step " << i);
    switch (gen() % 4) {
      case 0:
        r = mb::on_register(r, at(now), "n" + std::to_string(gen() % 14), 0, o).next;
        break;
      case 1:
        r = mb::check_timeouts(r, at(now), o).next;
        break;
      default: {
        const mb::decision d = mb::on_heartbeat(r, at(now), id, g, o);
        mb::roster in_place = r;
        const auto res = mb::refresh_member(in_place, at(now), id, g);
        if (res == mb::refresh_result::other) {
          ++deferred;
          CHECK(same(in_place, r));
          CHECK(d.kind != mb::decision_kind::refreshed);
        } else {
          ++fast;
          CHECK(d.kind == mb::decision_kind::refreshed);
          CHECK(same(in_place, d.next));
          const mb::member* before = r.find(id);
          REQUIRE(before != nullptr);
          CHECK((res == mb::refresh_result::became_alive) ==
                (before->state == mb::member_state::joining));
        }
        r = d.next;
      }
    }
  }
  CHECK(fast > 200);  // both paths were exercised many times
  CHECK(deferred > 200);
}

TEST_CASE("names a peer supplies: valid ones pass, forged and oversized ones are refused") {
  for (const std::string& ok : {std::string("w"), std::string("worker-3"),
                               std::string("node7.gpu_0"), std::string(64, 'a')}) {
    CAPTURE(ok);
    CHECK(mb::name_problem(ok).empty());
  }
  const std::string forged = "w1\n[info] coordinator: all good";
  const std::string huge(1 << 20, 'x');
  for (const std::string& bad : {forged, huge, std::string("a b"), std::string("w/1"),
                                 std::string("\xc3\xa9t\xc3\xa9"), std::string(65, 'a')}) {
    CAPTURE(bad.substr(0, 40));
    const std::string why = mb::name_problem(bad);
    CHECK_FALSE(why.empty());
    // The reason quotes the name without control characters and at most 32 of its bytes.
    CHECK(why.find('\n') == std::string::npos);
    CHECK(why.size() < 200);
    // Registration refuses it and leaves the roster as it was.
    mb::roster r;
    const mb::decision d = mb::on_register(r, at(0), bad, 1, grid(2, 1, 1));
    CHECK(d.kind == K::rejected);
    CHECK(d.next.members.empty());
    CHECK(d.next.generation == r.generation);
    CHECK(d.reason == why);
  }
  CHECK(mb::name_problem("").size() > 0);  // the CLI's empty default never reaches here
  const mb::decision d = mb::on_register(mb::roster{}, at(0), "", 1, grid(2, 1, 1));
  CHECK(d.kind == K::accepted);  // an empty name is the coordinator's to pick
}
