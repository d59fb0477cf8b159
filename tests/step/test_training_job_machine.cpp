// The coordinator's step machine drawn in runtime/step/training_job.hpp, as one table: a
// row per arrow of the diagram (T1..T27): the state a row starts in, the event, the state
// it ends in and what the job told the coordinator to do. Pure: no sockets, no clock.
#include <doctest/doctest.h>

#include <cctype>
#include <fstream>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "runtime/core/config.hpp"
#include "runtime/step/training_job.hpp"
#include "tests/step/roster_util.hpp"

using namespace cohort;
using namespace cohort::step;
using phase = training_job::phase;

namespace {

// A job with its roster: what a row's setup builds and its event acts on.
struct bench {
  config cfg;
  std::unique_ptr<training_job> job;
  mb::roster r;
};

using test::roster_of;

// Two workers (elastic.min_workers 2), STEPS steps, commit_window WINDOW, members 1 and 2 of
// generation 1.
bench make(int steps = 3, int window = 0) {
  bench b;
  b.cfg = load_config_text("cluster:\n  workers: 2\ntrain:\n  steps: " + std::to_string(steps) +
                               "\n  global_batch: 64\n  micro_batch: 16\n"
                               "elastic:\n  pause_timeout_ms: 1000\n"
                               "fault_tolerance:\n  commit_window: " +
                               std::to_string(window) + "\n",
                           "<test>");
  b.job = std::make_unique<training_job>(b.cfg, dump_config(b.cfg));
  b.r = roster_of(1, 2);
  return b;
}

net::step_vote vote(mb::member_id id, uint64_t g, int64_t s, bool ok, bool applied = false) {
  net::step_vote v;
  v.member_id = id;
  v.generation = g;
  v.step = s;
  v.ok = ok;
  v.applied = applied;
  v.loss_rows = 32.0;
  v.rows = 32;
  if (!ok) v.reason = "peer gone";
  return v;
}

net::train_report report(mb::member_id id, int64_t next_step) {
  net::train_report rep;
  rep.member_id = id;
  rep.generation = 1;
  rep.next_step = next_step;
  rep.params_sha256 = "ab";
  return rep;
}

void ready(bench& b, mb::member_id id, int64_t next = 0) {
  b.job->on_ready(b.r, net::worker_ready{id, b.r.generation, next}, 0);
}

// Setups, named after the state (and the place in it) they leave the job in.
bench waiting_one_ready(int steps = 3, int window = 0) {
  bench b = make(steps, window);
  ready(b, 1);
  return b;
}
bench open_step0(int steps = 3) {
  bench b = waiting_one_ready(steps);
  ready(b, 2);
  return b;
}
bench window_0_to_3() {
  bench b = waiting_one_ready(10, 4);
  ready(b, 2);
  return b;
}
// Step 0 committed; the roster moved to new members (ids 10, 11) that have loaded the job but
// hold no state of step 1: each reported ready at step 0, the second is yet to come.
bench waiting_all_behind() {
  bench b = open_step0();
  b.job->on_vote(b.r, vote(1, 1, 0, true), 0);
  b.job->on_vote(b.r, vote(2, 1, 0, true), 0);
  b.r = roster_of(2, 2, 10);
  b.job->on_generation(b.r, 0);
  ready(b, 10, 0);
  return b;
}
bench resync_none_ready(int steps = 3) {
  bench b = make(steps);
  b.job->take_over({});
  return b;
}
bench reporting_none_in() {
  bench b = open_step0(1);
  b.job->on_vote(b.r, vote(1, 1, 0, true), 0);
  b.job->on_vote(b.r, vote(2, 1, 0, true), 0);
  return b;
}
// Step 0 committed at t = 0, then member 2 was lost at t = 1: below min_workers since then.
bench waiting_paused() {
  bench b = open_step0();
  b.job->on_vote(b.r, vote(1, 1, 0, true), 0);
  b.job->on_vote(b.r, vote(2, 1, 0, true), 0);
  b.r = roster_of(2, 1);
  b.job->on_generation(b.r, 1.0);
  return b;
}
bench done_failed() {
  bench b = open_step0();
  net::step_vote v = vote(1, 1, 0, false);
  v.fatal = true;
  b.job->on_vote(b.r, v, 0);
  return b;
}

// What a row observes of the job's answer.
struct seen {
  int opens = 0;    ///< step_open sent
  int commits = 0;  ///< step_result(commit) sent
  int aborts = 0;   ///< step_result(abort) sent
  int leaves = 0;   ///< members to stop at the boundary
  bool bump = false;
  bool committed = false;
  bool finished = false;
  bool failed = false;
};

seen observe(const job_actions& a) {
  seen s;
  for (const auto& x : a.sends) {
    if (std::get_if<net::step_open>(&x.m) != nullptr) ++s.opens;
    if (const auto* res = std::get_if<net::step_result>(&x.m))
      ++(res->commit ? s.commits : s.aborts);
  }
  s.leaves = static_cast<int>(a.leave.size());
  s.bump = !a.bump.empty();
  s.committed = a.committed;
  s.finished = a.finished;
  s.failed = !a.failed.empty();
  return s;
}

const char* name(phase p) {
  switch (p) {
    case phase::waiting:
      return "waiting";
    case phase::open:
      return "open";
    case phase::window:
      return "window";
    case phase::resync:
      return "resync";
    case phase::reporting:
      return "reporting";
    case phase::done:
      return "done";
  }
  return "?";
}

struct row {
  const char* arrow;  ///< the arrow's name in training_job.hpp's diagram
  std::function<bench()> setup;
  phase from;
  std::function<job_actions(bench&)> event;
  phase to;
  seen expect;
  int64_t next_step;  ///< the job's next_step() after the event
};

// The table: one row per arrow (some arrows have several rows, one per way in).
const std::vector<row>& table() {
  // clang-format off
  //  expect: {opens, commits, aborts, leaves, bump, committed, finished, failed}
  static const std::vector<row> rows = {
    {"T1 on_ready: the guard holds", [] { return waiting_one_ready(); }, phase::waiting,
     [](bench& b) { return b.job->on_ready(b.r, net::worker_ready{2, 1, 0}, 0); },
     phase::open, {2, 0, 0, 0, false, false, false, false}, 0},
    {"T1 on_heartbeat: the member became alive", [] {
       bench b = make();
       b.r.members[1].state = mb::member_state::joining;
       ready(b, 1);
       ready(b, 2);
       b.r.members[1].state = mb::member_state::alive;
       return b; }, phase::waiting,
     [](bench& b) { return b.job->on_heartbeat(b.r, 0); },
     phase::open, {2, 0, 0, 0, false, false, false, false}, 0},
    {"T2 windows on: one open for steps 0..3", [] { return waiting_one_ready(10, 4); },
     phase::waiting,
     [](bench& b) { return b.job->on_ready(b.r, net::worker_ready{2, 1, 0}, 0); },
     phase::window, {2, 0, 0, 0, false, false, false, false}, 0},
    {"T3 every member behind the next step", [] { return waiting_all_behind(); },
     phase::waiting,
     [](bench& b) { return b.job->on_ready(b.r, net::worker_ready{11, 2, 0}, 0); },
     phase::done, {0, 0, 0, 0, false, false, false, true}, 1},
    {"T4 an ok vote, the other still out", [] { return open_step0(); }, phase::open,
     [](bench& b) { return b.job->on_vote(b.r, vote(1, 1, 0, true), 0); },
     phase::open, {0, 0, 0, 0, false, false, false, false}, 0},
    {"T5 the last ok vote: commit, then T1 for step 1", [] {
       bench b = open_step0();
       b.job->on_vote(b.r, vote(1, 1, 0, true), 0);
       return b; }, phase::open,
     [](bench& b) { return b.job->on_vote(b.r, vote(2, 1, 0, true), 0); },
     phase::open, {2, 2, 0, 0, false, true, false, false}, 1},
    {"T6 a failed vote: abort, bump", [] { return open_step0(); }, phase::open,
     [](bench& b) { return b.job->on_vote(b.r, vote(2, 1, 0, false), 0); },
     phase::waiting, {0, 0, 2, 0, true, false, false, false}, 0},
    {"T7 a voter lost: abort to the one left", [] { return open_step0(); }, phase::open,
     [](bench& b) { b.r = roster_of(2, 1); return b.job->on_generation(b.r, 0); },
     phase::waiting, {0, 0, 1, 0, false, false, false, false}, 0},
    {"T7 the same members again: abort, then T1 in the new generation",
     [] { return open_step0(); }, phase::open,
     [](bench& b) { b.r = roster_of(2, 2); return b.job->on_generation(b.r, 0); },
     phase::open, {2, 0, 2, 0, false, false, false, false}, 0},
    {"T8 the last step committed", [] {
       bench b = open_step0(1);
       b.job->on_vote(b.r, vote(1, 1, 0, true), 0);
       return b; }, phase::open,
     [](bench& b) { return b.job->on_vote(b.r, vote(2, 1, 0, true), 0); },
     phase::reporting, {0, 2, 0, 0, false, true, false, false}, 1},
    {"T9 both applied step 0 of 0..3", [] {
       bench b = window_0_to_3();
       b.job->on_vote(b.r, vote(1, 1, 0, true, true), 0);
       return b; }, phase::window,
     [](bench& b) { return b.job->on_vote(b.r, vote(2, 1, 0, true, true), 0); },
     phase::window, {0, 0, 0, 0, false, true, false, false}, 1},
    {"T10 both through step 3: commits, then T2 for 4..7", [] {
       bench b = window_0_to_3();
       b.job->on_vote(b.r, vote(1, 1, 3, true, true), 0);
       return b; }, phase::window,
     [](bench& b) { return b.job->on_vote(b.r, vote(2, 1, 3, true, true), 0); },
     phase::window, {2, 0, 0, 0, false, true, false, false}, 4},
    {"T11 a failed vote in a window: abort, bump, resync", [] { return window_0_to_3(); },
     phase::window,
     [](bench& b) { return b.job->on_vote(b.r, vote(2, 1, 1, false), 0); },
     phase::resync, {0, 0, 2, 0, true, false, false, false}, 0},
    {"T11 a voter lost in a window: abort, resync", [] { return window_0_to_3(); },
     phase::window,
     [](bench& b) { b.r = roster_of(2, 1); return b.job->on_generation(b.r, 0); },
     phase::resync, {0, 0, 1, 0, false, false, false, false}, 0},
    {"T12 take_over", [] { return make(); }, phase::waiting,
     [](bench& b) { b.job->take_over({}); return job_actions{}; },
     phase::resync, {0, 0, 0, 0, false, false, false, false}, 0},
    {"T13 one of two ready", [] { return resync_none_ready(); }, phase::resync,
     [](bench& b) { return b.job->on_ready(b.r, net::worker_ready{1, 1, 2}, 0); },
     phase::resync, {0, 0, 0, 0, false, false, false, false}, 0},
    {"T14 the last ready: open at the newest (2), member 2 takes the state", [] {
       bench b = resync_none_ready();
       ready(b, 1, 2);
       return b; }, phase::resync,
     [](bench& b) { return b.job->on_ready(b.r, net::worker_ready{2, 1, 1}, 0); },
     phase::open, {2, 0, 0, 0, false, false, false, false}, 2},
    {"T15 the last ready at the end: the last commit again", [] {
       bench b = resync_none_ready();
       ready(b, 1, 3);
       return b; }, phase::resync,
     [](bench& b) { return b.job->on_ready(b.r, net::worker_ready{2, 1, 3}, 0); },
     phase::reporting, {0, 2, 0, 0, false, false, false, false}, 3},
    {"T16 one report of two", [] { return reporting_none_in(); }, phase::reporting,
     [](bench& b) { return b.job->on_report(b.r, report(1, 1), 0); },
     phase::reporting, {0, 0, 0, 0, false, false, false, false}, 1},
    {"T17 the last report", [] {
       bench b = reporting_none_in();
       b.job->on_report(b.r, report(1, 1), 0);
       return b; }, phase::reporting,
     [](bench& b) { return b.job->on_report(b.r, report(2, 1), 0); },
     phase::done, {0, 0, 0, 0, false, false, true, false}, 1},
    {"T18 below min_workers past the pause timeout", [] { return waiting_paused(); },
     phase::waiting,
     [](bench& b) { return b.job->on_tick(b.r, 2.1); },
     phase::done, {0, 0, 0, 0, false, false, false, true}, 1},
    {"T19 a fatal vote", [] { return open_step0(); }, phase::open,
     [](bench& b) {
       net::step_vote v = vote(2, 1, 0, false);
       v.fatal = true;
       return b.job->on_vote(b.r, v, 0); },
     phase::done, {0, 0, 2, 0, false, false, false, true}, 0},
    {"T19 the third unreachable abort in a row", [] {
       bench b = open_step0();
       for (uint64_t g = 1; g <= 2; ++g) {
         net::step_vote v = vote(2, g, 0, false);
         v.unreachable = true;
         b.job->on_vote(b.r, v, 0);
         b.r = roster_of(g + 1, 2);
         b.job->on_generation(b.r, 0);  // T7: the same members again, T1 at once
       }
       return b; }, phase::open,
     [](bench& b) {
       net::step_vote v = vote(2, 3, 0, false);
       v.unreachable = true;
       return b.job->on_vote(b.r, v, 0); },
     phase::done, {0, 0, 2, 0, false, false, false, true}, 0},
    {"T19 the 51st abort in a row", [] {
       bench b = open_step0();
       for (uint64_t g = 1; g <= 50; ++g) {
         b.job->on_vote(b.r, vote(2, g, 0, false), 0);
         b.r = roster_of(g + 1, 2);
         b.job->on_generation(b.r, 0);
       }
       return b; }, phase::open,
     [](bench& b) { return b.job->on_vote(b.r, vote(2, 51, 0, false), 0); },
     phase::done, {0, 0, 2, 0, false, false, false, true}, 0},
    {"T20 too few ready", [] { return make(); }, phase::waiting,
     [](bench& b) { return b.job->on_ready(b.r, net::worker_ready{1, 1, 0}, 0); },
     phase::waiting, {0, 0, 0, 0, false, false, false, false}, 0},
    {"T21 on_drain at a boundary: leave", [] {
       bench b = waiting_one_ready();
       ready(b, 2);
       b.job->on_vote(b.r, vote(1, 1, 0, true), 0);
       b.job->on_vote(b.r, vote(2, 1, 0, true), 0);  // T5 then T1: step 1 open
       b.job->on_vote(b.r, vote(1, 1, 1, true), 0);
       b.r.members[1].state = mb::member_state::leaving;
       b.job->on_vote(b.r, vote(2, 1, 1, true), 0);  // T5, the guard fails: member 2 leaves
       return b; }, phase::waiting,
     [](bench& b) { return b.job->on_drain(b.r, 2, 0); },
     phase::waiting, {0, 0, 0, 1, false, false, false, false}, 2},
    {"T22 a joiner: the step stays open", [] { return open_step0(); }, phase::open,
     [](bench& b) { b.r = roster_of(2, 3); return b.job->on_generation(b.r, 0); },
     phase::open, {0, 0, 0, 0, false, false, false, false}, 0},
    {"T23 quiet past resend_interval_s: the open again to the member that has not voted", [] {
       bench b = open_step0();
       b.job->on_vote(b.r, vote(1, 1, 0, true), 0);
       return b; }, phase::open,
     [](bench& b) { return b.job->on_tick(b.r, b.job->resend_interval_s()); },
     phase::open, {1, 0, 0, 0, false, false, false, false}, 0},
    {"T24 a vote of an older generation", [] { return open_step0(); }, phase::open,
     [](bench& b) { return b.job->on_vote(b.r, vote(2, 0, 0, false), 0); },
     phase::open, {0, 0, 0, 0, false, false, false, false}, 0},
    {"T25 quiet past resend_interval_s: the last commit again to the silent one", [] {
       bench b = reporting_none_in();
       b.job->on_report(b.r, report(1, 1), 0);
       return b; }, phase::reporting,
     [](bench& b) { return b.job->on_tick(b.r, b.job->resend_interval_s()); },
     phase::reporting, {0, 1, 0, 0, false, false, false, false}, 1},
    {"T26 done ignores a ready", [] { return done_failed(); }, phase::done,
     [](bench& b) { return b.job->on_ready(b.r, net::worker_ready{1, 1, 0}, 0); },
     phase::done, {0, 0, 0, 0, false, false, false, false}, 0},
    {"T26 done ignores a tick", [] { return done_failed(); }, phase::done,
     [](bench& b) { return b.job->on_tick(b.r, 1e6); },
     phase::done, {0, 0, 0, 0, false, false, false, false}, 0},
    {"T27 stop_early in a window: it runs out, the next step opens alone as the last", [] {
       bench b = window_0_to_3();
       b.job->stop_early("test", 0);
       b.job->on_vote(b.r, vote(1, 1, 3, true, true), 0);
       return b; }, phase::window,
     [](bench& b) { return b.job->on_vote(b.r, vote(2, 1, 3, true, true), 0); },
     phase::open, {2, 0, 0, 0, false, true, false, false}, 4},
    {"T27 stop_early while waiting: the first step to open is the last", [] {
       bench b = waiting_one_ready(10);
       b.job->stop_early("test", 0);
       return b; }, phase::waiting,
     [](bench& b) { return b.job->on_ready(b.r, net::worker_ready{2, 1, 0}, 0); },
     phase::open, {2, 0, 0, 0, false, false, false, false}, 0},
  };
  // clang-format on
  return rows;
}

}  // namespace

TEST_CASE("every arrow of training_job's diagram, as a table row") {
  for (const row& t : table()) {
    const std::string arrow = t.arrow;
    CAPTURE(arrow);
    bench b = t.setup();
    REQUIRE(std::string(name(b.job->state())) == name(t.from));
    const seen s = observe(t.event(b));
    CHECK(std::string(name(b.job->state())) == name(t.to));
    CHECK(s.opens == t.expect.opens);
    CHECK(s.commits == t.expect.commits);
    CHECK(s.aborts == t.expect.aborts);
    CHECK(s.leaves == t.expect.leaves);
    CHECK(s.bump == t.expect.bump);
    CHECK(s.committed == t.expect.committed);
    CHECK(s.finished == t.expect.finished);
    CHECK(s.failed == t.expect.failed);
    CHECK(b.job->next_step() == t.next_step);
  }
}

TEST_CASE("every arrow the diagram's legend names has a row") {
  // Read from the header itself, so that an arrow drawn without a row fails here.
  std::ifstream in(COHORT_SOURCE_DIR "/runtime/step/training_job.hpp");
  REQUIRE(in.good());
  std::set<std::string> legend;
  for (std::string line; std::getline(in, line);) {
    // A legend line: "//   T<n> <state> ...".
    if (line.rfind("//   T", 0) != 0) continue;
    const std::size_t end = line.find(' ', 6);
    const std::string arrow = line.substr(5, end - 5);
    if (arrow.size() > 1 && std::isdigit(static_cast<unsigned char>(arrow[1])))
      legend.insert(arrow);
  }
  CHECK(legend.size() == 27);
  std::set<std::string> covered;
  for (const row& t : table()) {
    const std::string a = t.arrow;
    covered.insert(a.substr(0, a.find(' ')));
  }
  for (const std::string& arrow : legend) {
    CAPTURE(arrow);
    CHECK(covered.count(arrow) == 1);
  }
  CHECK(covered.size() == legend.size());  // no row for an arrow the legend lacks
}

TEST_CASE("stop_early: the step that opens next carries the end, its commit ends the run, and "
          "the job says it stopped early") {
  bench b = window_0_to_3();  // 10 steps, windows of 4: steps 0..3 open
  CHECK(b.job->stop_early("SIGTERM", 0));
  CHECK_FALSE(b.job->stop_early("SIGTERM", 0));  // the same stop
  CHECK(b.job->stopping_early());
  b.job->on_vote(b.r, vote(1, 1, 3, true, true), 0);
  const job_actions a = b.job->on_vote(b.r, vote(2, 1, 3, true, true), 0);
  int opens = 0;
  for (const auto& x : a.sends)
    if (const auto* o = std::get_if<net::step_open>(&x.m)) {
      ++opens;
      CHECK(o->step == 4);
      CHECK(o->through == -1);  // by result: every member applies it before the reports
      CHECK(o->end == 5);
    }
  CHECK(opens == 2);
  CHECK(b.job->steps() == 5);
  b.job->on_vote(b.r, vote(1, 1, 4, true), 0);
  b.job->on_vote(b.r, vote(2, 1, 4, true), 0);
  CHECK(name(b.job->state()) == std::string("reporting"));
  b.job->on_report(b.r, report(1, 5), 1.0);
  const job_actions end = b.job->on_report(b.r, report(2, 5), 1.5);
  CHECK(end.finished);
  CHECK(end.failed.empty());
  CHECK(b.job->stopped_early());
  const nlohmann::json j = b.job->report().summary(2.0);
  REQUIRE(j.contains("stopped_early"));
  CHECK(j["stopped_early"]["end_step"] == 5);
  CHECK(j["stopped_early"]["asked_by"] == "SIGTERM");
  CHECK(j["stopped_early"]["ms"].get<double>() == doctest::Approx(1500.0));
}

TEST_CASE("stop_early at the last step, or once done, changes nothing, and a normal end is no "
          "early stop") {
  bench b = open_step0(1);  // the one step is the last
  CHECK_FALSE(b.job->stop_early("ctl", 0));
  bench w = window_0_to_3();
  // Every step opens with the run's end, train.steps, when nobody asked to stop.
  CHECK(w.job->steps() == 10);
  bench d = done_failed();
  CHECK_FALSE(d.job->stop_early("ctl", 0));
  CHECK_FALSE(d.job->stopped_early());
}
