// The run report's views for seeing a run (docs/observability.md): the loss curve (every
// commit, its time since the first open, its own time and a rate over the last 10 steps),
// the evaluations, what `ctl status` shows live, and the order in which a watch sees a
// fault, its detection and its recovery. Pure: times are given, closed-form expectations.
#include <doctest/doctest.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "runtime/core/config.hpp"
#include "runtime/step/run_report.hpp"

using namespace cohort;
using namespace cohort::step;

namespace {

config report_config() {
  return load_config_text("train:\n  steps: 40\n  global_batch: 64\n  micro_batch: 16\n", "<test>");
}

mb::roster roster_of(uint64_t generation, const std::vector<mb::member_id>& ids) {
  mb::roster r;
  r.generation = generation;
  for (mb::member_id id : ids) {
    mb::member m;
    m.id = id;
    m.name = "w" + std::to_string(id);
    m.state = mb::member_state::alive;
    r.members.push_back(m);
  }
  return r;
}

// w1..w3 commit step 0 (9.0 -> 9.1); step 1 opens at 10.0 and a kill of w2 is ordered in it,
// aborting it (at 10.0, the latest time seen).
void kill_w2_in_step_1(run_report& rep, std::vector<std::string>& notes) {
  const mb::roster r1 = roster_of(1, {1, 2, 3});
  rep.roster_seen(r1, {0, 1, 9.0}, false, {}, notes);
  rep.step_opened(3, 9.0);
  rep.step_committed(1, 1.0, r1, {1, 2, 3}, 9.1, notes);
  rep.step_opened(3, 10.0);
  rep.fault_ordered("kill", "w2", "kill worker=w2 at step=1", {1, 1, 10.0});
  rep.step_aborted();
}

// Records what it is shown, one line each.
struct recording_watch : job_watch {
  std::vector<std::string> seen;
  void step_committed(const curve_point& p, double opened_s, double now_s) override {
    seen.push_back("commit " + std::to_string(p.step));
  }
  void event(const std::string& what, const job_event& e, double now_s) override {
    // The event as the watch gets it: whole, its spec already set.
    seen.push_back(what + " " + e.kind + " " + e.worker +
                   (e.detail.empty() ? std::string() : " (" + e.detail + ")"));
  }
  void step_aborted(double) override { seen.push_back("abort"); }
  void eval(const eval_point& e) override { seen.push_back("eval " + std::to_string(e.step)); }
};

}  // namespace

TEST_CASE("run report: the curve holds every commit, its time, and a rate over the last 10 steps") {
  run_report rep(report_config(), 0);
  const mb::roster r = roster_of(1, {1, 2});
  const std::set<mb::member_id> voters{1, 2};
  std::vector<std::string> notes;
  // Step s opens at 10 + s and commits 0.25 s later.
  for (int s = 0; s < 12; ++s) {
    rep.step_opened(2, 10.0 + s);
    rep.step_committed(s + 1, 1.0 / (s + 1), r, voters, 10.25 + s, notes);
  }
  const auto& c = rep.curve();
  REQUIRE(c.size() == 12);
  CHECK(c[0].step == 1);
  CHECK(c[0].t_s == doctest::Approx(0.25));
  CHECK(c[0].step_s == doctest::Approx(0.25));
  CHECK(c[0].loss == doctest::Approx(1.0));
  CHECK(c[0].replicas == 2);
  // The first step alone: 64 samples in 0.25 s.
  CHECK(c[0].samples_per_s == doctest::Approx(256.0));
  // Step 12: the last 10 steps ran from step 3's open (12 s) to 21.25 s: 640 samples.
  CHECK(c[11].t_s == doctest::Approx(11.25));
  CHECK(c[11].samples_per_s == doctest::Approx(640.0 / 9.25));
  const nlohmann::json j = rep.summary(12.0);
  REQUIRE(j["curve"].size() == 12);
  CHECK(j["curve"][11]["step"] == 12);
  CHECK(j["evals"].empty());
  // Live: 20 steps are not there yet; the rate over what there is (steps 1..12: 11 steps in
  // 11 s between the first and the last commit).
  const nlohmann::json live = rep.live();
  CHECK(live["steps_per_s"].get<double>() == doctest::Approx(1.0));
  CHECK(live["samples_per_s"].get<double>() == doctest::Approx(64.0));
  CHECK(live["loss"].get<double>() == doctest::Approx(1.0 / 12));
  CHECK(live["events"].empty());
  CHECK_FALSE(live.contains("split_ms"));  // no vote counted yet
}

TEST_CASE(
    "run report: the live split is the mean of the last votes, evaluations join the summary") {
  run_report rep(report_config(), 0);
  net::step_timing t;
  t.compute_us = 4000;
  t.comm_wait_us = 2000;
  t.idle_us = 1000;
  for (int i = 0; i < 70; ++i) rep.vote_counted("w1", t);  // only the last 64 count
  t.compute_us = 8000;
  rep.vote_counted("w2", t);
  const nlohmann::json live = rep.live();
  REQUIRE(live.contains("split_ms"));
  CHECK(live["split_ms"]["votes"] == 64);
  CHECK(live["split_ms"]["compute"].get<double>() == doctest::Approx((63 * 4.0 + 8.0) / 64));
  CHECK(live["split_ms"]["comm_wait"].get<double>() == doctest::Approx(2.0));
  CHECK(live["split_ms"]["idle"].get<double>() == doctest::Approx(1.0));
  rep.step_opened(1, 5.0);
  net::telemetry tm;
  tm.eval_step = 10;
  tm.eval_loss = 0.5;
  tm.eval_accuracy = 0.75;
  rep.telemetry_seen("w1", tm, 7.0);
  tm.eval_step = -1;  // spans only: no evaluation
  rep.telemetry_seen("w1", tm, 8.0);
  REQUIRE(rep.evals().size() == 1);
  CHECK(rep.evals()[0].step == 10);
  CHECK(rep.evals()[0].t_s == doctest::Approx(2.0));
  const nlohmann::json j = rep.summary(9.0);
  REQUIRE(j["evals"].size() == 1);
  CHECK(j["evals"][0]["accuracy"].get<double>() == doctest::Approx(0.75));
}

TEST_CASE("run report: a watch sees the fault, its detection, then its recovery, in order") {
  run_report rep(report_config(), 0);
  auto w = std::make_shared<recording_watch>();
  rep.set_watch(w);
  const mb::roster three = roster_of(1, {1, 2, 3});
  const mb::roster two = roster_of(2, {1, 2});
  std::vector<std::string> notes;
  rep.roster_seen(three, {0, 1, 9.0}, false, {}, notes);  // before the first step: no joins
  rep.step_opened(3, 9.5);
  rep.fault_ordered("kill", "w3", "kill worker=w3 at step=5", {5, 1, 10.0});
  rep.step_aborted();
  rep.roster_seen(two, {5, 2, 10.2}, true, {}, notes);
  rep.step_opened(2, 10.3);
  rep.step_committed(6, 0.5, two, {1, 2}, 10.5, notes);
  CHECK(w->seen == std::vector<std::string>{"fault kill w3 (kill worker=w3 at step=5)", "abort",
                                            "detected kill w3 (kill worker=w3 at step=5)",
                                            "commit 6",
                                            "recovered kill w3 (kill worker=w3 at step=5)"});
  REQUIRE(rep.events().size() == 1);
  CHECK(rep.events()[0].detect_ms == doctest::Approx(200.0));
  CHECK(rep.events()[0].recover_ms == doctest::Approx(500.0));
  // The event's time on the curve's clock: 10.0 - the first open (9.5).
  CHECK(rep.summary(11.0)["events"][0]["t_s"].get<double>() == doctest::Approx(0.5));
  // A scale request reaches the watch with its spec and target.
  rep.scale_asked(3, "scale to=3", {6, 2, 11.0});
  CHECK(w->seen.back() == "scale scale  (scale to=3)");
  CHECK(rep.events().back().target == 3);
}

TEST_CASE("a kill's cost: each part from the coordinator's stamps, summing to order -> whole") {
  run_report rep(report_config(), 0);
  std::vector<std::string> notes;
  const std::set<mb::member_id> none;
  kill_w2_in_step_1(rep, notes);
  const mb::roster r2 = roster_of(2, {1, 3});
  rep.roster_seen(r2, {1, 2, 10.010}, true, none, notes);  // detected: 10 ms
  rep.step_opened(2, 10.012);
  rep.step_members({"w1", "w3"}, 10.012);
  rep.step_committed(2, 1.0, r2, {1, 3}, 10.050, notes);  // rerun: 40 ms
  rep.step_opened(2, 10.050);
  rep.step_committed(3, 1.0, r2, {1, 3}, 10.100, notes);
  mb::roster r3 = roster_of(3, {1, 3, 4});
  r3.members[2].name = "w2";                               // the respawn, under the victim's name
  rep.roster_seen(r3, {3, 3, 10.200}, true, none, notes);  // registered: 150 ms
  rep.step_opened(2, 10.210);
  rep.step_committed(4, 1.0, r3, {1, 3}, 10.260, notes);
  rep.step_opened(2, 10.300);
  rep.member_ready("w2", 10.600);  // loaded the job: 400 ms
  rep.step_committed(5, 1.0, r3, {1, 3}, 10.620, notes);
  rep.step_opened(3, 10.640);
  rep.step_members({"w1", "w2", "w3"}, 10.640);  // entered: 40 ms after ready
  net::step_timing t;
  t.state_bytes = 1'000'000;
  t.state_us = 5'000;
  rep.vote_counted("w2", t);
  rep.step_committed(6, 1.0, r3, {1, 3, 4}, 10.680, notes);  // whole: 40 ms after entering

  const nlohmann::json ev = rep.events_json();
  REQUIRE(ev[0]["kind"] == "kill");
  const nlohmann::json& c = ev[0]["cost"];
  CHECK(c["detect_ms"].get<double>() == doctest::Approx(10.0));
  CHECK(c["rerun_ms"].get<double>() == doctest::Approx(40.0));
  CHECK(c["respawn_ms"].get<double>() == doctest::Approx(150.0));
  CHECK(c["load_ms"].get<double>() == doctest::Approx(400.0));
  CHECK(c["admit_ms"].get<double>() == doctest::Approx(40.0));
  CHECK(c["enter_ms"].get<double>() == doctest::Approx(40.0));
  CHECK(c["whole_ms"].get<double>() == doctest::Approx(680.0));
  CHECK(ev[0]["recover_ms"].get<double>() == doctest::Approx(50.0));  // detect + rerun
  CHECK(c["reduced_ms"].get<double>() == doctest::Approx(590.0));     // 10.050 -> 10.640
  // No step open: 10.0 -> 10.012, 10.100 -> 10.210, 10.260 -> 10.300, 10.620 -> 10.640.
  CHECK(c["stalled_ms"].get<double>() == doctest::Approx(182.0));
  CHECK(c["transfer_ms"].get<double>() == doctest::Approx(5.0));
  CHECK(c["aborted_steps"] == 1);
  CHECK(c["steps"] == 5);
  // The median step of 0.1, 0.038, 0.05, 0.05, 0.32, 0.04 s (the upper middle of six).
  CHECK(c["step_ms"].get<double>() == doctest::Approx(50.0));
  CHECK(c["lost_ms"].get<double>() == doctest::Approx(680.0 - 5 * 50.0));
  // The running ETTR: the committed steps' 0.598 s over 9.0 -> 10.68.
  CHECK(rep.ettr() == doctest::Approx(0.598 / 1.68));
  CHECK(rep.live()["ettr"].get<double>() == doctest::Approx(0.598 / 1.68));
  CHECK(rep.summary(2.0)["ettr"].get<double>() == doctest::Approx(0.598 / 1.68));
}

TEST_CASE("a kill's cost: stamps out of the usual order still split the total") {
  // The respawn registered (10.03) before the survivors' rerun committed (10.05).
  fault_cost f;
  f.removed_s = 10.01;
  f.recovered_s = 10.05;
  f.registered_s = 10.03;
  f.ready_s = 10.4;
  f.entered_s = 10.45;
  f.whole_s = 10.5;
  const nlohmann::json c = cost_json(f, 10.0);
  CHECK(c["respawn_ms"].get<double>() == doctest::Approx(20.0));  // from the detection
  CHECK(c["rerun_ms"].get<double>() == doctest::Approx(20.0));    // from the registration
  CHECK(c["load_ms"].get<double>() == doctest::Approx(350.0));    // from the rerun's commit
  double sum = 0;
  for (const char* k : {"detect_ms", "rerun_ms", "respawn_ms", "load_ms", "admit_ms", "enter_ms"})
    sum += c[k].get<double>();
  CHECK(sum == doctest::Approx(c["whole_ms"].get<double>()));
  // The survivors waited for the respawn: the first commit is its entry, counted as such.
  fault_cost w = f;
  w.registered_s = 10.1;
  w.recovered_s = w.whole_s;
  const nlohmann::json cw = cost_json(w, 10.0);
  CHECK(cw["rerun_ms"].get<double>() == doctest::Approx(0.0));
  CHECK(cw["enter_ms"].get<double>() == doctest::Approx(50.0));
  CHECK(cw["respawn_ms"].get<double>() == doctest::Approx(90.0));
  // Not reached yet: null parts, no total.
  const nlohmann::json open = cost_json(fault_cost{}, 10.0);
  CHECK(open["detect_ms"].is_null());
  CHECK(open["whole_ms"].is_null());
}

TEST_CASE("a kill's cost: a spare seated in the departure's own roster replaces the victim") {
  // w4 (a spare, loaded) takes w2's seat in the roster that removes w2; the rerun is its
  // entry. A later newcomer (w5) is not a replacement: no victim waits for one.
  run_report rep(report_config(), 0);
  std::vector<std::string> notes;
  const std::set<mb::member_id> none;
  kill_w2_in_step_1(rep, notes);
  const mb::roster r2 = roster_of(3, {1, 3, 4});
  rep.roster_seen(r2, {1, 3, 10.010}, true, none, notes);  // removed and replaced: 10 ms
  rep.member_ready("w4", 10.012);                          // a round trip: it was loaded
  rep.step_opened(3, 10.015);
  rep.step_members({"w1", "w3", "w4"}, 10.015);
  rep.step_committed(2, 1.0, r2, {1, 3, 4}, 10.045, notes);  // the rerun, whole at once
  rep.roster_seen(roster_of(4, {1, 3, 4, 5}), {2, 4, 10.1}, true, none, notes);

  const nlohmann::json ev = rep.events_json();
  REQUIRE(ev[0]["kind"] == "kill");
  const nlohmann::json& c = ev[0]["cost"];
  CHECK(c["replacement"] == "w4");
  CHECK(c["detect_ms"].get<double>() == doctest::Approx(10.0));
  CHECK(c["respawn_ms"].get<double>() == doctest::Approx(0.0));
  CHECK(c["load_ms"].get<double>() == doctest::Approx(2.0));
  CHECK(c["admit_ms"].get<double>() == doctest::Approx(3.0));
  CHECK(c["enter_ms"].get<double>() == doctest::Approx(30.0));
  CHECK(c["rerun_ms"].get<double>() == doctest::Approx(0.0));
  CHECK(c["whole_ms"].get<double>() == doctest::Approx(45.0));
  CHECK(c["reduced_ms"].get<double>() == doctest::Approx(0.0));
  CHECK(c["steps"] == 1);
  CHECK(ev[0]["recover_ms"].get<double>() == doctest::Approx(45.0));
}

TEST_CASE("an NCCL group's rebuild is one regroup event: how, the members, the longest time") {
  run_report rep(report_config(), 0);
  std::vector<std::string> notes;
  kill_w2_in_step_1(rep, notes);
  const mb::roster r2 = roster_of(2, {1, 3});
  rep.roster_seen(r2, {1, 2, 10.010}, false, {}, notes);
  rep.step_opened(2, 10.012);
  net::step_timing a, b, host;
  a.regroup_path = 2;  // shrink
  a.regroup_us = 12'500;
  b.regroup_path = 2;
  b.regroup_us = 48'000;
  rep.vote_counted("w1", a);
  rep.vote_counted("w3", b);
  rep.vote_counted("w4", host);  // a host backend reports no rebuild: not counted
  rep.step_committed(2, 1.0, r2, {1, 3}, 10.100, notes);
  const std::vector<job_event>& ev = rep.events();
  int regroups = 0;
  for (const job_event& e : ev) {
    if (e.kind != "regroup") continue;
    ++regroups;
    CHECK(e.target == 2);
    CHECK(e.recover_ms == doctest::Approx(48.0));
    CHECK(e.detail == "shrink (ncclCommShrink) of the DP group's communicators: 2 members, the "
                      "longest 48.0 ms");
  }
  CHECK(regroups == 1);
  // The next commit without a rebuild adds none; a failed shrink says so.
  rep.step_opened(2, 10.100);
  rep.step_committed(3, 1.0, r2, {1, 3}, 10.150, notes);
  net::step_timing c;
  c.regroup_path = 3;
  c.regroup_us = 900'000;
  rep.step_opened(2, 10.200);
  rep.vote_counted("w1", c);
  rep.step_committed(4, 1.0, r2, {1, 3}, 11.200, notes);
  regroups = 0;
  for (const job_event& e : rep.events())
    if (e.kind == "regroup") {
      ++regroups;
      if (regroups == 2)
        CHECK(e.detail.rfind("new init after a failed shrink", 0) == 0);
    }
  CHECK(regroups == 2);
}

TEST_CASE("a rebuild in a step that was aborted is its own regroup event") {
  run_report rep(report_config(), 0);
  std::vector<std::string> notes;
  const mb::roster r1 = roster_of(1, {1, 2, 3});
  rep.roster_seen(r1, {0, 1, 9.0}, false, {}, notes);
  rep.step_opened(3, 9.0);
  net::step_timing shrunk;
  shrunk.regroup_path = 2;
  shrunk.regroup_us = 5'000;
  rep.vote_counted("w1", shrunk);
  rep.vote_counted("w2", shrunk);
  rep.step_aborted();  // w3's vote failed: the next generation rebuilds again
  net::step_timing fresh;
  fresh.regroup_path = 1;
  fresh.regroup_us = 700'000;
  rep.step_opened(2, 9.5);
  rep.vote_counted("w1", fresh);
  rep.vote_counted("w2", fresh);
  rep.step_committed(1, 1.0, r1, {1, 2}, 10.5, notes);
  std::vector<std::string> seen;
  for (const job_event& e : rep.events())
    if (e.kind == "regroup") seen.push_back(e.detail);
  REQUIRE(seen.size() == 2);
  CHECK(seen[0].rfind("shrink (ncclCommShrink) of the DP group's communicators: 2 members", 0) == 0);
  CHECK(seen[1].rfind("new init (a unique id) of the DP group's communicators: 2 members, the "
                      "longest 700.0 ms", 0) == 0);
}
