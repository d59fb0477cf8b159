// The coordinator's step protocol as tables of events: when a step opens, what commits,
// what aborts, who donates state, when the job ends. Pure: no sockets, no clock.
#include <doctest/doctest.h>

#include "runtime/core/config.hpp"
#include "runtime/step/training_job.hpp"
#include "tests/step/roster_util.hpp"

using namespace cohort;
using namespace cohort::step;

namespace {

// WINDOW: fault_tolerance.commit_window (0: the coordinator commits every step, the
// protocol most tables here spell out; the windows have their own tables below).
config job_config(int workers, int steps = 3, int window = 0) {
  return load_config_text("cluster:\n  workers: " + std::to_string(workers) +
                              "\ntrain:\n  steps: " + std::to_string(steps) +
                              "\n  global_batch: 64\n  micro_batch: 16\n"
                              "fault_tolerance:\n  commit_window: " +
                              std::to_string(window) + "\n",
                          "<test>");
}

using test::roster_of;

template <class T>
std::vector<std::pair<mb::member_id, T>> sent(const job_actions& a) {
  std::vector<std::pair<mb::member_id, T>> out;
  for (const auto& s : a.sends)
    if (const auto* x = std::get_if<T>(&s.m)) out.emplace_back(s.to, *x);
  return out;
}

net::step_vote ok_vote(mb::member_id id, uint64_t g, int64_t s, double loss_rows = 1.0) {
  net::step_vote v;
  v.member_id = id;
  v.generation = g;
  v.step = s;
  v.ok = true;
  v.loss_rows = loss_rows;
  v.rows = 32;
  return v;
}

// Every member of R reports ready at NEXT; returns the actions of the last report.
job_actions all_ready(training_job& job, const mb::roster& r, int64_t next = 0) {
  job_actions last;
  for (const auto& m : r.members)
    last = job.on_ready(r, net::worker_ready{m.id, r.generation, next}, 0);
  return last;
}

// What `ctl inject` does to the job (coordinator_admin): check the fault, then append it.
void add_fault(training_job& job, faults::fault_spec f) {
  job.check_fault(f);
  job.append_fault(std::move(f));
}

}  // namespace

TEST_CASE("training job opens a step only when every configured worker is alive and ready") {
  const config c = job_config(2);
  training_job job(c, dump_config(c));
  CHECK(job.spec().config_yaml == dump_config(c));
  mb::roster r = roster_of(2, 2);
  r.members[1].state = mb::member_state::joining;
  CHECK(job.on_ready(r, net::worker_ready{1, 2, 0}, 0).sends.empty());
  CHECK(job.on_ready(r, net::worker_ready{2, 2, 0}, 0).sends.empty());  // not alive yet
  r.members[1].state = mb::member_state::alive;
  job_actions a = job.on_generation(r, 0);
  auto opens = sent<net::step_open>(a);
  REQUIRE(opens.size() == 2);
  for (const auto& [to, o] : opens) {
    CHECK(o.generation == 2);
    CHECK(o.step == 0);
    CHECK(o.replicas == 2);
    CHECK(o.donor_rank == -1);
  }
  CHECK(job.open_step() == std::make_pair(uint64_t{2}, int64_t{0}));
}

TEST_CASE("training job does not open with fewer members than cluster workers") {
  const config c = job_config(3);
  training_job job(c, dump_config(c));
  const mb::roster r = roster_of(1, 2);
  CHECK(all_ready(job, r).sends.empty());
  CHECK_FALSE(job.open_step().has_value());
}

TEST_CASE("training job commits only after every member voted ok and then opens the next step") {
  const config c = job_config(2);
  training_job job(c, dump_config(c));
  const mb::roster r = roster_of(1, 2);
  all_ready(job, r);
  job_actions a = job.on_vote(r, ok_vote(1, 1, 0, 20.0), 1.0);
  CHECK(sent<net::step_result>(a).empty());
  CHECK_FALSE(a.committed);
  a = job.on_vote(r, ok_vote(2, 1, 0, 44.0), 2.0);
  auto results = sent<net::step_result>(a);
  REQUIRE(results.size() == 2);
  CHECK(results[0].second.commit);
  CHECK(results[0].second.loss == doctest::Approx(64.0 / 64.0));  // (20 + 44) / global_batch
  CHECK(a.committed);
  CHECK(a.step == 1);
  CHECK(job.next_step() == 1);
  auto opens = sent<net::step_open>(a);
  REQUIRE(opens.size() == 2);
  CHECK(opens[0].second.step == 1);
}

TEST_CASE("training job ignores stale duplicate and foreign votes") {
  const config c = job_config(2);
  training_job job(c, dump_config(c));
  const mb::roster r = roster_of(5, 2);
  all_ready(job, r);
  CHECK(job.on_vote(r, ok_vote(1, 4, 0), 0).sends.empty());  // older generation
  CHECK(job.on_vote(r, ok_vote(1, 5, 1), 0).sends.empty());  // another step
  CHECK(job.on_vote(r, ok_vote(9, 5, 0), 0).sends.empty());  // not a member
  CHECK(job.on_vote(r, ok_vote(1, 5, 0), 0).sends.empty());  // first real vote
  CHECK(job.on_vote(r, ok_vote(1, 5, 0), 0).sends.empty());  // duplicate counts once
  CHECK(job.next_step() == 0);
  CHECK_FALSE(job.on_vote(r, ok_vote(2, 5, 0), 0).sends.empty());
  CHECK(job.next_step() == 1);
}

TEST_CASE("a failed vote aborts the step for every member and asks for a new generation") {
  const config c = job_config(3);
  training_job job(c, dump_config(c));
  const mb::roster r = roster_of(1, 3);
  all_ready(job, r);
  job.on_vote(r, ok_vote(1, 1, 0), 0);
  net::step_vote bad = ok_vote(2, 1, 0);
  bad.ok = false;
  bad.reason = "allreduce_sum: peer lost";
  job_actions a = job.on_vote(r, bad, 0);
  auto results = sent<net::step_result>(a);
  REQUIRE(results.size() == 3);
  for (const auto& [to, res] : results) {
    CHECK_FALSE(res.commit);
    CHECK(res.reason.find("peer lost") != std::string::npos);
  }
  CHECK_FALSE(a.bump.empty());
  CHECK(a.failed.empty());
  CHECK(job.report().aborted_steps() == 1);
  CHECK(job.next_step() == 0);
  // A late ok vote of the aborted attempt changes nothing.
  CHECK(job.on_vote(r, ok_vote(3, 1, 0), 0).sends.empty());
  // The same members in generation 2 run step 0 again.
  const mb::roster r2 = roster_of(2, 3);
  a = job.on_generation(r2, 0);
  auto opens = sent<net::step_open>(a);
  REQUIRE(opens.size() == 3);
  CHECK(opens[0].second.generation == 2);
  CHECK(opens[0].second.step == 0);
}

TEST_CASE("a membership change while a step is open aborts it") {
  const config c = job_config(2);
  training_job job(c, dump_config(c));
  const mb::roster r = roster_of(1, 2);
  all_ready(job, r);
  job.on_vote(r, ok_vote(1, 1, 0), 0);
  mb::roster r2 = roster_of(2, 1);  // member 2 died
  job_actions a = job.on_generation(r2, 0);
  auto results = sent<net::step_result>(a);
  REQUIRE(results.size() == 1);  // only survivors are told
  CHECK(results[0].first == 1);
  CHECK_FALSE(results[0].second.commit);
  CHECK(sent<net::step_open>(a).empty());  // one worker short: wait
  CHECK_FALSE(job.open_step().has_value());
}

TEST_CASE("a member behind the job gets state from the first up-to-date rank") {
  const config c = job_config(3);
  training_job job(c, dump_config(c));
  const mb::roster r = roster_of(1, 3);
  all_ready(job, r);
  for (mb::member_id id = 1; id <= 3; ++id) job.on_vote(r, ok_vote(id, 1, 0), 0);
  REQUIRE(job.next_step() == 1);
  // Member 1 dies; a fresh member 4 (state of step 0) joins in its place.
  mb::roster r2 = roster_of(3, 3, 2);  // ids 2, 3, 4 at ranks 0, 1, 2
  job.on_generation(r2, 0);
  job_actions a = job.on_ready(r2, net::worker_ready{4, 3, 0}, 0);
  auto opens = sent<net::step_open>(a);
  REQUIRE(opens.size() == 3);
  CHECK(opens[0].second.step == 1);
  CHECK(opens[0].second.donor_rank == 0);  // member 2, rank 0, holds step 1
}

TEST_CASE("the job fails when no live member holds the state of the next step") {
  const config c = job_config(2);
  training_job job(c, dump_config(c));
  const mb::roster r = roster_of(1, 2);
  all_ready(job, r);
  for (mb::member_id id = 1; id <= 2; ++id) job.on_vote(r, ok_vote(id, 1, 0), 0);
  const mb::roster r2 = roster_of(2, 2, 10);
  job.on_generation(r2, 0);
  job_actions a = all_ready(job, r2, 0);
  CHECK_FALSE(a.failed.empty());
  CHECK(sent<net::step_open>(a).empty());
}

TEST_CASE("a fatal vote fails the job instead of retrying") {
  const config c = job_config(1);
  training_job job(c, dump_config(c));
  const mb::roster r = roster_of(1, 1);
  all_ready(job, r);
  net::step_vote v = ok_vote(1, 1, 0);
  v.ok = false;
  v.fatal = true;
  v.reason = "gradient element 3 is not finite";
  job_actions a = job.on_vote(r, v, 0);
  CHECK(a.failed.find("not finite") != std::string::npos);
  CHECK(a.bump.empty());
  CHECK(job.finished());
}

TEST_CASE("the job gives up after 50 aborts of the same step in a row") {
  const config c = job_config(1);
  training_job job(c, dump_config(c));
  uint64_t g = 1;
  job_actions a;
  for (int i = 0; i < 51 && a.failed.empty(); ++i, ++g) {
    const mb::roster r = roster_of(g, 1);
    if (i == 0)
      all_ready(job, r);
    else
      job.on_generation(r, 0);
    net::step_vote v = ok_vote(1, g, 0);
    v.ok = false;
    v.reason = "timeout";
    a = job.on_vote(r, v, 0);
  }
  CHECK_FALSE(a.failed.empty());
  CHECK(job.report().aborted_steps() == 51);
}

TEST_CASE("the job finishes when every member reported the last step") {
  const config c = job_config(2, 1);
  training_job job(c, dump_config(c));
  const mb::roster r = roster_of(1, 2);
  all_ready(job, r);
  job.on_vote(r, ok_vote(1, 1, 0, 32.0), 1.0);
  job_actions a = job.on_vote(r, ok_vote(2, 1, 0, 32.0), 3.0);
  CHECK(a.committed);
  CHECK(sent<net::step_open>(a).empty());  // no step after the last
  net::train_report rep;
  rep.member_id = 1;
  rep.next_step = 1;
  rep.params_sha256 = "aa";
  rep.has_eval = true;
  rep.eval_accuracy = 0.5;
  rep.eval_count = 10;
  rep.timing.compute_us = 2000000;
  CHECK_FALSE(job.on_report(r, rep, 4.0).finished);
  rep.member_id = 2;
  rep.has_eval = false;
  rep.params_sha256 = "ab";
  CHECK(job.on_report(r, rep, 4.0).finished);
  const nlohmann::json j = job.report().summary(5.0);
  CHECK(j["steps_completed"] == 1);
  CHECK(j["final_loss"].get<double>() == doctest::Approx(1.0));
  CHECK(j["eval"]["accuracy"].get<double>() == doctest::Approx(0.5));
  CHECK(j["params_consistent"] == false);  // the two reports disagree: shown, not hidden
  CHECK(j["workers"].size() == 2);
  CHECK(j["workers"][0]["compute_s"].get<double>() == doctest::Approx(2.0));
  CHECK(j["dp"] == 2);
  // 64 samples over the 3 s between the first opening (t = 0) and the commit (t = 3).
  CHECK(j["throughput"]["samples_per_s"].get<double>() == doctest::Approx(64.0 / 3.0));
}

TEST_CASE("an injected kill is ordered before its step opens then detected and recovered") {
  const config c = job_config(2, 5);
  training_job job(c, dump_config(c));
  job.set_faults({faults::parse_fault("kill rank=1 at step=1")});
  const mb::roster r = roster_of(1, 2);
  all_ready(job, r);
  job.on_vote(r, ok_vote(1, 1, 0), 0);
  job_actions a = job.on_vote(r, ok_vote(2, 1, 0), 10.0);  // commits 0, opens 1
  auto orders = sent<net::fault_order>(a);
  REQUIRE(orders.size() == 1);
  CHECK(orders[0].first == 2);  // rank 1 is member 2
  CHECK(orders[0].second.action == net::fault_action::kill);
  CHECK(orders[0].second.step == 1);
  // The order goes out before that member's step_open.
  std::size_t order_at = 0, open_at = 0;
  for (std::size_t i = 0; i < a.sends.size(); ++i) {
    if (a.sends[i].to != 2) continue;
    if (std::holds_alternative<net::fault_order>(a.sends[i].m)) order_at = i;
    if (std::holds_alternative<net::step_open>(a.sends[i].m)) open_at = i;
  }
  CHECK(order_at < open_at);
  REQUIRE(job.report().events().size() == 1);
  CHECK(job.report().events()[0].kind == "kill");
  CHECK(job.report().events()[0].worker == "w2");
  // 0.25 s later the member is gone: detection; a replacement joins with step 0 state.
  mb::roster r2 = roster_of(2, 1);
  job.on_generation(r2, 10.25);
  CHECK(job.report().events()[0].detect_ms == doctest::Approx(250.0));
  mb::roster r3 = roster_of(3, 1);
  mb::member m = r3.members[0];
  m.id = 7;
  m.name = "w2";
  m.rank = 1;
  r3.members.push_back(m);
  job.on_generation(r3, 10.5);
  a = job.on_ready(r3, net::worker_ready{7, 3, 0}, 10.6);
  auto opens = sent<net::step_open>(a);
  REQUIRE(opens.size() == 2);
  CHECK(opens[0].second.donor_rank == 0);
  CHECK(sent<net::fault_order>(a).empty());  // a kill fires once, not on the retry
  job.on_vote(r3, ok_vote(1, 3, 1), 10.8);
  job.on_vote(r3, ok_vote(7, 3, 1), 11.0);
  CHECK(job.report().events()[0].recover_ms == doctest::Approx(1000.0));
  const nlohmann::json j = job.report().summary(12.0);
  CHECK(j["events"].size() >= 2);  // the kill and the replacement's join
  CHECK(j["events"][0]["kind"] == "kill");
}

TEST_CASE("slow acts on every step of its range and random kill is a pure function of its seed") {
  const config c = job_config(2, 8);
  training_job job(c, dump_config(c));
  job.set_faults({faults::parse_fault("slow rank=0 factor=3 from step=1 to step=2")});
  const mb::roster r = roster_of(1, 2);
  int slow_orders = 0;
  job_actions a = all_ready(job, r);
  for (int64_t s = 0; s < 4; ++s) {
    for (const auto& [to, o] : sent<net::fault_order>(a)) {
      CHECK(to == 1);
      CHECK(o.action == net::fault_action::slow);
      CHECK(o.factor == doctest::Approx(3.0));
      CHECK((o.step == 1 || o.step == 2));
      ++slow_orders;
    }
    job.on_vote(r, ok_vote(1, 1, s), 0);
    a = job.on_vote(r, ok_vote(2, 1, s), 0);
  }
  CHECK(slow_orders == 2);
  CHECK(job.report().events().size() == 1);  // one event for the range

  // Random kills: the same seed picks the same steps and victims in two jobs.
  auto kills = [&](const std::string& spec) {
    training_job j2(c, dump_config(c));
    j2.set_faults({faults::parse_fault(spec)});
    std::vector<std::pair<int64_t, mb::member_id>> out;
    job_actions b = all_ready(j2, r);
    for (int64_t s = 0; s < 8; ++s) {
      for (const auto& [to, o] : sent<net::fault_order>(b)) out.emplace_back(o.step, to);
      j2.on_vote(r, ok_vote(1, 1, s), 0);
      b = j2.on_vote(r, ok_vote(2, 1, s), 0);
    }
    return out;
  };
  const auto k1 = kills("random kill mtbf=2steps seed=11");
  CHECK(k1 == kills("random kill mtbf=2steps seed=11"));
  CHECK_FALSE(k1.empty());  // with p = 1/2 over 8 steps (and this seed) some step fires
}

TEST_CASE("a second drop control is refused up front and one is kept by the job") {
  const config c = job_config(2);
  training_job job(c, dump_config(c));
  CHECK_THROWS_AS(job.set_faults({faults::parse_fault("drop control p=0.05 seed=7"),
                                  faults::parse_fault("drop control p=0.1 seed=8")}),
                  usage_error);
  CHECK(job.drop_control() == nullptr);
  CHECK_NOTHROW(job.set_faults({faults::parse_fault("hang rank=1 at step=3 for=2s"),
                                faults::parse_fault("drop control p=0.05 seed=7")}));
  REQUIRE(job.drop_control() != nullptr);
  CHECK(job.drop_control()->p == doctest::Approx(0.05));
  CHECK(job.resend_interval_s() == doctest::Approx(0.15));  // 1.5 heartbeats of 100 ms
}

TEST_CASE("below elastic.min_workers the job waits then fails after the pause timeout") {
  config c = job_config(3, 10);
  c.elastic.min_workers = 2;
  c.elastic.pause_timeout_ms = 1000;
  training_job job(c, dump_config(c));
  const mb::roster r = roster_of(1, 3);
  all_ready(job, r);
  for (mb::member_id id = 1; id <= 3; ++id) job.on_vote(r, ok_vote(id, 1, 0), 0);
  // Two survivors are enough: step 1 opens with 2 replicas.
  const mb::roster r2 = roster_of(2, 2);
  job_actions a = job.on_generation(r2, 1.0);
  auto opens = sent<net::step_open>(a);
  REQUIRE(opens.size() == 2);
  CHECK(opens[0].second.replicas == 2);
  job.on_vote(r2, ok_vote(1, 2, 1), 1.1);
  job.on_vote(r2, ok_vote(2, 2, 1), 1.2);
  // One left: below the minimum, training pauses; within the timeout nothing fails.
  const mb::roster r3 = roster_of(3, 1);
  job.on_generation(r3, 2.0);
  CHECK(job.on_tick(r3, 2.9).failed.empty());
  CHECK(job.on_tick(r3, 3.1).failed.find("elastic.min_workers") != std::string::npos);
  CHECK(job.finished());
}

// A leader that took over a running job (ha) never opened a step itself: a wait for
// workers there is still a pause, bounded by elastic.pause_timeout_ms (CI once saw a new
// leader wait without end for a worker a lost scale order never started). A fresh run's
// first formation is not one.
TEST_CASE("a job taken over below elastic.min_workers fails after the pause timeout") {
  config c = job_config(3, 10);
  c.elastic.min_workers = 2;
  c.elastic.pause_timeout_ms = 1000;
  const mb::roster r = roster_of(2, 1);
  training_job fresh(c, dump_config(c));
  fresh.on_generation(r, 0.0);
  CHECK(fresh.on_tick(r, 0.5).failed.empty());
  CHECK(fresh.on_tick(r, 60.0).failed.empty());  // still forming: no pause yet
  training_job taken(c, dump_config(c));
  taken.take_over({});
  taken.on_generation(r, 0.0);
  CHECK(taken.on_ready(r, net::worker_ready{1, 2, 4}, 0.1).sends.empty());
  CHECK(taken.on_tick(r, 0.9).failed.empty());
  CHECK(taken.on_tick(r, 1.2).failed.find("elastic.min_workers") != std::string::npos);
  CHECK(taken.finished());
}

TEST_CASE("a joiner arriving while a step is open waits for the next step instead of aborting") {
  const config c = job_config(2, 5);
  training_job job(c, dump_config(c));
  const mb::roster r = roster_of(1, 2);
  all_ready(job, r);
  REQUIRE(job.open_step() == std::make_pair(uint64_t{1}, int64_t{0}));
  mb::roster r2 = roster_of(2, 3);  // member 3 joined
  r2.members[2].state = mb::member_state::joining;
  job_actions a = job.on_generation(r2, 1.0);
  CHECK(sent<net::step_result>(a).empty());  // nothing aborted
  CHECK(job.open_step() == std::make_pair(uint64_t{1}, int64_t{0}));
  CHECK(job.on_ready(r2, net::worker_ready{3, 2, 0}, 1.0).sends.empty());  // step still open
  job.on_vote(r2, ok_vote(1, 1, 0), 1.5);
  a = job.on_vote(r2, ok_vote(2, 1, 0), 2.0);
  CHECK(a.committed);
  CHECK(sent<net::step_open>(a).empty());  // the joiner is not alive yet
  r2.members[2].state = mb::member_state::alive;
  a = job.on_heartbeat(r2, 2.5);
  auto opens = sent<net::step_open>(a);
  REQUIRE(opens.size() == 3);
  for (const auto& [to, o] : opens) {
    CHECK(o.generation == 2);
    CHECK(o.step == 1);
    CHECK(o.replicas == 3);
    CHECK(o.donor_rank == 0);  // the joiner holds step 0's state: it gets step 1's
  }
  // Its first committed step closes the "joined" event, with the transfer rate it saw.
  for (mb::member_id id : {1, 2, 3}) {
    net::step_vote v = ok_vote(id, 2, 1);
    if (id == 3) {
      v.timing.state_bytes = 4'000'000;
      v.timing.state_us = 20'000;
    }
    a = job.on_vote(r2, v, 3.0);
  }
  CHECK(a.committed);
  bool joined = false;
  for (const auto& e : job.report().events()) {
    if (e.kind != "joined") continue;
    joined = true;
    CHECK(e.worker == "w3");
    CHECK(e.transfer_mb_s == doctest::Approx(200.0));  // 4 MB in 20 ms
    CHECK(e.recover_ms == doctest::Approx(2000.0));    // joined at 1.0, first commit at 3.0
  }
  CHECK(joined);
}

TEST_CASE(
    "a drained member leaves at the step boundary: no abort, the next step opens without it") {
  const config c = load_config_text(
      "cluster:\n  workers: 3\nelastic:\n  min_workers: 2\ntrain:\n  steps: 5\n"
      "  global_batch: 64\n  micro_batch: 16\nfault_tolerance:\n  commit_window: 0\n",
      "<test>");
  training_job job(c, dump_config(c));
  mb::roster r = roster_of(1, 3);
  all_ready(job, r);
  r.members[2].state = mb::member_state::leaving;  // the coordinator's on_leave_intent
  job_actions a = job.on_drain(r, 3, 1.0);
  CHECK(a.leave.empty());  // step 0 is open: it finishes first
  CHECK(sent<net::step_result>(a).empty());
  job.on_vote(r, ok_vote(1, 1, 0), 1.1);
  job.on_vote(r, ok_vote(2, 1, 0), 1.2);
  a = job.on_vote(r, ok_vote(3, 1, 0), 1.3);
  CHECK(a.committed);
  REQUIRE(a.leave == std::vector<mb::member_id>{3});
  CHECK(sent<net::step_open>(a).empty());  // not with the leaving member
  const mb::roster r2 = roster_of(2, 2);   // after on_leave
  a = job.on_generation(r2, 1.4);
  CHECK(sent<net::step_result>(a).empty());
  auto opens = sent<net::step_open>(a);
  REQUIRE(opens.size() == 2);
  CHECK(opens[0].second.step == 1);
  CHECK(opens[0].second.donor_rank == -1);
  job.on_vote(r2, ok_vote(1, 2, 1), 1.5);
  job.on_vote(r2, ok_vote(2, 2, 1), 1.6);
  CHECK(job.report().aborted_steps() == 0);
  int drained = 0;
  for (const auto& e : job.report().events()) {
    CHECK(e.kind != "departed");  // a drain is not a failure
    if (e.kind == "drained") {
      ++drained;
      CHECK(e.worker == "w3");
      CHECK(e.recover_ms == doctest::Approx(600.0));  // the first step without it
    }
  }
  CHECK(drained == 1);
}

TEST_CASE("a joiner still loading the job does not hold the group up: it enters once ready") {
  const config c = job_config(2, 6);
  training_job job(c, dump_config(c));
  const mb::roster r = roster_of(1, 2);
  all_ready(job, r);
  job.on_vote(r, ok_vote(1, 1, 0), 0.1);
  job.on_vote(r, ok_vote(2, 1, 0), 0.2);  // step 1 opens on generation 1
  const mb::roster r2 = roster_of(2, 3);  // member 3 registered; it has not loaded the job
  job_actions a = job.on_generation(r2, 0.3);
  CHECK(sent<net::step_result>(a).empty());  // the open step goes on
  job.on_vote(r2, ok_vote(1, 1, 1), 0.4);
  a = job.on_vote(r2, ok_vote(2, 1, 1), 0.5);
  CHECK(a.committed);
  // Step 2 opens at once for the two, over generation 1's links: same ranks, no donor.
  auto opens = sent<net::step_open>(a);
  REQUIRE(opens.size() == 2);
  for (const auto& [to, o] : opens) {
    CHECK(to != 3);
    CHECK(o.generation == 1);
    CHECK(o.step == 2);
    CHECK(o.replicas == 2);
    CHECK(o.rank == static_cast<int>(to) - 1);
    CHECK(o.donor_rank == -1);
  }
  // Ready mid-step: it waits for the boundary, then enters on generation 2 with step 3's
  // state from rank 0.
  CHECK(job.on_ready(r2, net::worker_ready{3, 2, 0}, 0.6).sends.empty());
  job.on_vote(r2, ok_vote(1, 1, 2), 0.7);
  a = job.on_vote(r2, ok_vote(2, 1, 2), 0.8);
  opens = sent<net::step_open>(a);
  REQUIRE(opens.size() == 3);
  for (const auto& [to, o] : opens) {
    CHECK(o.generation == 2);
    CHECK(o.step == 3);
    CHECK(o.replicas == 3);
    CHECK(o.donor_rank == 0);
  }
  for (mb::member_id id : {1, 2, 3}) job.on_vote(r2, ok_vote(id, 2, 3), 1.0);
  CHECK(job.next_step() == 4);
  CHECK(job.report().aborted_steps() == 0);
}

TEST_CASE("scale and partition faults: the order, the scale request and the scale event") {
  const config c = job_config(2, 10);
  training_job job(c, dump_config(c));
  job.set_faults({faults::parse_fault("scale to=3 at step=1"),
                  faults::parse_fault("partition rank=1 at step=2 for=2s")});
  const mb::roster r = roster_of(1, 2);
  job_actions a = all_ready(job, r);
  CHECK(a.scale_to == 0);
  job.on_vote(r, ok_vote(1, 1, 0), 0.1);
  a = job.on_vote(r, ok_vote(2, 1, 0), 0.2);  // step 1 opens: the scale fault is due
  CHECK(a.scale_to == 3);
  CHECK(a.scale_spec == "scale to=3 at step=1");
  job.on_scale(r, 3, a.scale_spec, 0.2);
  job.on_vote(r, ok_vote(1, 1, 1), 0.3);
  a = job.on_vote(r, ok_vote(2, 1, 1), 0.4);  // step 2 opens: partition of rank 1
  auto orders = sent<net::fault_order>(a);
  REQUIRE(orders.size() == 1);
  CHECK(orders[0].first == 2);
  CHECK(orders[0].second.action == net::fault_action::partition);
  CHECK(orders[0].second.duration_ms == 2000);
  // The scale event waits for a step on three members; two-member commits do not close it.
  for (const auto& e : job.report().events())
    if (e.kind == "scale") CHECK(e.recover_ms < 0);
}

TEST_CASE("ctl inject adds a fault for a later step and refuses one already past") {
  const config c = job_config(2, 10);
  training_job job(c, dump_config(c));
  const mb::roster r = roster_of(1, 2);
  all_ready(job, r);
  job.on_vote(r, ok_vote(1, 1, 0), 0.1);
  job.on_vote(r, ok_vote(2, 1, 0), 0.2);  // step 1 open
  CHECK_THROWS_AS(add_fault(job, faults::parse_fault("kill rank=0 at step=1")), usage_error);
  add_fault(job, faults::parse_fault("drop control p=0.1 seed=1"));
  CHECK_THROWS_AS(add_fault(job, faults::parse_fault("drop control p=0.2 seed=1")), usage_error);
  add_fault(job, faults::parse_fault("kill rank=0 at step=2"));
  job.on_vote(r, ok_vote(1, 1, 1), 0.3);
  job_actions a = job.on_vote(r, ok_vote(2, 1, 1), 0.4);
  auto orders = sent<net::fault_order>(a);
  REQUIRE(orders.size() == 1);
  CHECK(orders[0].first == 1);
  CHECK(orders[0].second.action == net::fault_action::kill);
  CHECK(orders[0].second.step == 2);
}

TEST_CASE("the timer sends again what lost frames left unanswered") {
  const config c = job_config(2, 2);
  training_job job(c, dump_config(c));
  job.set_faults({faults::parse_fault("drop control p=0.5 seed=1")});
  const double every = job.resend_interval_s();
  const mb::roster r = roster_of(1, 2);
  // Member 2's worker_ready was lost: the job goes to it again after a quiet interval.
  job.on_ready(r, net::worker_ready{1, 1, 0}, 0);
  CHECK(sent<net::job_spec>(job.on_tick(r, 0.0)).empty());
  auto specs = sent<net::job_spec>(job.on_tick(r, every + 0.01));
  REQUIRE(specs.size() == 1);
  CHECK(specs[0].first == 2);
  job_actions a = job.on_ready(r, net::worker_ready{2, 1, 0}, 1.0);
  REQUIRE(sent<net::step_open>(a).size() == 2);
  // Member 1 voted, member 2's open (or vote) was lost: only member 2 hears it again,
  // with its own rank.
  job.on_vote(r, ok_vote(1, 1, 0), 1.0);
  CHECK(sent<net::step_open>(job.on_tick(r, 1.0 + every / 2)).empty());
  auto opens = sent<net::step_open>(job.on_tick(r, 1.0 + every + 0.01));
  REQUIRE(opens.size() == 1);
  CHECK(opens[0].first == 2);
  CHECK(opens[0].second.step == 0);
  CHECK(opens[0].second.rank == 1);
  job.on_vote(r, ok_vote(2, 1, 0), 2.0);
  job.on_vote(r, ok_vote(1, 1, 1), 2.1);
  a = job.on_vote(r, ok_vote(2, 1, 1), 2.2);  // the last step commits
  REQUIRE(a.committed);
  // Member 1's report came, member 2's did not: the last commit goes to member 2 again.
  net::train_report rep;
  rep.member_id = 1;
  rep.next_step = 2;
  job.on_report(r, rep, 2.3);
  auto results = sent<net::step_result>(job.on_tick(r, 2.2 + every + 0.01));
  REQUIRE(results.size() == 1);
  CHECK(results[0].first == 2);
  CHECK(results[0].second.commit);
  CHECK(results[0].second.step == 1);
}

// ---- commit windows (fault_tolerance.commit_window; docs/protocol.md, "Commit windows") ----

namespace {

net::step_vote applied_vote(mb::member_id id, uint64_t g, int64_t s, double loss_rows = 64.0) {
  net::step_vote v = ok_vote(id, g, s, loss_rows);
  v.applied = true;  // its DP sum completed: it applied the step
  return v;
}

net::step_vote failed_vote(mb::member_id id, uint64_t g, int64_t s) {
  net::step_vote v = ok_vote(id, g, s);
  v.ok = false;
  v.reason = "allreduce_sum: peer lost";
  return v;
}

}  // namespace

TEST_CASE(
    "a commit window: one open for several steps, each committed once every member applied it") {
  const config c = job_config(2, 10, 4);
  training_job job(c, dump_config(c));
  const mb::roster r = roster_of(1, 2);
  job_actions a = all_ready(job, r);
  auto opens = sent<net::step_open>(a);
  REQUIRE(opens.size() == 2);
  CHECK(opens[0].second.step == 0);
  CHECK(opens[0].second.through == 3);  // steps 0..3: window of 4
  // Each member applies on its own; the coordinator commits once both said so, with the
  // loss of both halves of the batch, and sends nothing.
  a = job.on_vote(r, applied_vote(1, 1, 0, 40.0), 1.0);
  CHECK_FALSE(a.committed);
  a = job.on_vote(r, applied_vote(2, 1, 0, 56.0), 1.1);
  CHECK(a.committed);
  CHECK(a.step == 1);
  CHECK(a.loss == doctest::Approx(1.5));  // (40 + 56) / global_batch 64
  CHECK(a.sends.empty());
  CHECK(job.on_vote(r, applied_vote(2, 1, 0), 1.1).sends.empty());  // a repeat
  // A vote for a later step counts the steps before it too (a lost frame overtaken).
  CHECK_FALSE(job.on_vote(r, applied_vote(2, 1, 2), 1.2).committed);
  a = job.on_vote(r, applied_vote(1, 1, 2), 1.25);
  CHECK(a.committed);
  CHECK(job.next_step() == 3);
  CHECK(job.open_step() == std::make_pair(uint64_t{1}, int64_t{3}));
  // The next window opens once every member is through with this one.
  CHECK(sent<net::step_open>(job.on_vote(r, applied_vote(1, 1, 3), 1.3)).empty());
  a = job.on_vote(r, applied_vote(2, 1, 3), 1.35);
  CHECK(a.committed);
  opens = sent<net::step_open>(a);
  REQUIRE(opens.size() == 2);
  CHECK(opens[0].second.step == 4);
  CHECK(opens[0].second.through == 7);
  job.on_vote(r, applied_vote(1, 1, 7), 1.4);
  // Step 8 ends its window at 8: the job's last step (9) commits by result.
  opens = sent<net::step_open>(job.on_vote(r, applied_vote(2, 1, 7), 1.5));
  REQUIRE(opens.size() == 2);
  CHECK(opens[0].second.through == 8);
  job.on_vote(r, applied_vote(1, 1, 8), 1.6);
  a = job.on_vote(r, applied_vote(2, 1, 8), 1.65);
  opens = sent<net::step_open>(a);
  REQUIRE(opens.size() == 2);
  CHECK(opens[0].second.step == 9);
  CHECK(opens[0].second.through == -1);
  job.on_vote(r, ok_vote(1, 1, 9), 1.7);
  a = job.on_vote(r, ok_vote(2, 1, 9), 1.8);
  auto results = sent<net::step_result>(a);
  REQUIRE(results.size() == 2);
  CHECK(results[0].second.commit);
  CHECK(job.next_step() == 10);
}

TEST_CASE("an aborted window asks every member where it stands and goes on from the newest") {
  const config c = job_config(2, 10, 4);
  training_job job(c, dump_config(c));
  const mb::roster r = roster_of(1, 2);
  all_ready(job, r);
  job.on_vote(r, applied_vote(1, 1, 0), 1.0);
  job.on_vote(r, applied_vote(2, 1, 0), 1.0);
  job.on_vote(r, applied_vote(1, 1, 1), 1.1);  // member 1 applied step 1 ...
  // ... member 2's last collective of step 1 broke: it stands at step 1, one behind.
  job_actions a = job.on_vote(r, failed_vote(2, 1, 1), 1.2);
  auto results = sent<net::step_result>(a);
  REQUIRE(results.size() == 2);
  CHECK_FALSE(results[0].second.commit);
  CHECK_FALSE(a.bump.empty());
  CHECK(job.next_step() == 1);
  // The new generation opens nothing until both said where they stand.
  const mb::roster r2 = roster_of(2, 2);
  CHECK(sent<net::step_open>(job.on_generation(r2, 1.3)).empty());
  CHECK(sent<net::step_open>(job.on_ready(r2, net::worker_ready{2, 2, 1}, 1.4)).empty());
  a = job.on_ready(r2, net::worker_ready{1, 2, 2}, 1.5);
  auto opens = sent<net::step_open>(a);
  REQUIRE(opens.size() == 2);
  for (const auto& [to, o] : opens) {
    CHECK(o.generation == 2);
    CHECK(o.step == 2);
    CHECK(o.donor_rank == 0);  // member 1 (rank 0) holds step 2's state; member 2 takes it
    CHECK(o.through == 5);
  }
  CHECK(job.next_step() == 2);
}

TEST_CASE(
    "a window failure vote for any of its steps aborts, one of an older generation does not") {
  const config c = job_config(2, 10, 4);
  training_job job(c, dump_config(c));
  const mb::roster r = roster_of(3, 2);
  all_ready(job, r);
  CHECK(job.on_vote(r, failed_vote(1, 2, 0), 1.0).bump.empty());  // older generation
  CHECK(job.on_vote(r, failed_vote(1, 3, 4), 1.0).bump.empty());  // beyond the window
  CHECK(job.on_vote(r, ok_vote(1, 3, 0), 1.0).sends.empty());     // ok, not applied: nothing
  CHECK_FALSE(job.on_vote(r, failed_vote(2, 3, 2), 1.0).bump.empty());
}

TEST_CASE("a step applied only by a member that is gone runs again on the survivors") {
  const config c = load_config_text(
      "cluster:\n  workers: 3\nelastic:\n  min_workers: 2\ntrain:\n  steps: 10\n"
      "  global_batch: 64\n  micro_batch: 16\nfault_tolerance:\n  commit_window: 4\n",
      "<test>");
  training_job job(c, dump_config(c));
  const mb::roster r = roster_of(1, 3);
  all_ready(job, r);
  job.on_vote(r, applied_vote(3, 1, 0), 1.0);  // member 3 applied step 0, then died
  CHECK(job.next_step() == 0);                 // not every member's vote: not counted
  const mb::roster r2 = roster_of(2, 2);
  job_actions a = job.on_generation(r2, 1.1);
  CHECK(sent<net::step_result>(a).size() == 2);  // the window is aborted for the survivors
  job.on_ready(r2, net::worker_ready{1, 2, 0}, 1.2);
  a = job.on_ready(r2, net::worker_ready{2, 2, 0}, 1.3);
  auto opens = sent<net::step_open>(a);
  REQUIRE(opens.size() == 2);
  CHECK(opens[0].second.step == 0);
  CHECK(opens[0].second.donor_rank == -1);
}

TEST_CASE("a window ends before a step a fault acts on, and ctl inject cannot name its steps") {
  const config c = job_config(2, 40, 16);
  training_job job(c, dump_config(c));
  job.set_faults({faults::parse_fault("kill rank=1 at step=5"),
                  faults::parse_fault("slow rank=0 factor=2 from step=8 to step=9")});
  const mb::roster r = roster_of(1, 2);
  auto opens = sent<net::step_open>(all_ready(job, r));
  REQUIRE(!opens.empty());
  CHECK(opens[0].second.through == 4);
  // Steps 0..4 are open (the window): a fault can only name step 5 or later.
  CHECK_THROWS_AS(add_fault(job, faults::parse_fault("hang rank=0 at step=3 for=1s")), usage_error);
  add_fault(job, faults::parse_fault("hang rank=0 at step=7 for=1s"));
  // Step 5 opens by itself with the kill's order; its window ends before the hang at 7.
  // Both members vote the window's last step: the next one opens after the second.
  const auto through = [&](int64_t s, double t) {
    job.on_vote(r, applied_vote(1, 1, s), t);
    return job.on_vote(r, applied_vote(2, 1, s), t);
  };
  job_actions a = through(4, 1.0);
  const auto orders = sent<net::fault_order>(a);
  REQUIRE(orders.size() == 1);
  CHECK(orders[0].second.step == 5);
  opens = sent<net::step_open>(a);
  REQUIRE(opens.size() == 2);
  CHECK(opens[0].second.step == 5);
  CHECK(opens[0].second.through == 6);
  through(6, 1.1);
  CHECK(job.open_step() == std::make_pair(uint64_t{1}, int64_t{7}));
  // The slow range acts on steps 8 and 9: windows of one step each.
  through(7, 1.2);
  CHECK(job.open_step() == std::make_pair(uint64_t{1}, int64_t{8}));
  a = through(8, 1.3);
  opens = sent<net::step_open>(a);
  REQUIRE(opens.size() == 2);
  CHECK(opens[0].second.step == 9);
  CHECK(opens[0].second.through == 24);  // the range's last step, no fault after: 16 steps
}

TEST_CASE(
    "a lost member's error memory: the whole group rolls back to the checkpoint that holds it") {
  // onebit_adam in bitwise mode with checkpoints: member 2 of 3 dies after step 5 committed;
  // its replacement (member 4) joins and reports ready at step 0. The next step opens at the
  // newest checkpoint the lookup finds (4), every member told to load it and no donor named.
  // A drained member's memory is rolled back for too; a job without checkpoints rolls
  // nothing back: the replacement takes a donor's state.
  auto onebit = [](int every) {
    return load_config_text(
        "cluster: {workers: 3}\n"
        "train: {steps: 20, global_batch: 64, micro_batch: 16, optimizer: onebit_adam, "
        "determinism: bitwise}\n"
        "fault_tolerance: {commit_window: 0, checkpoint_every: " +
            std::to_string(every) + "}\n",
        "<test>");
  };
  std::vector<int64_t> asked;
  auto lookup = [&asked](int64_t at_most) -> std::optional<int64_t> {
    asked.push_back(at_most);
    return at_most >= 4 ? std::optional<int64_t>(4) : std::nullopt;
  };
  auto run_to_6 = [](training_job& job, const mb::roster& r) {
    all_ready(job, r);
    for (int64_t s = 0; s < 6; ++s)
      for (const auto& m : r.members) job.on_vote(r, ok_vote(m.id, r.generation, s), 0);
    REQUIRE(job.next_step() == 6);
  };
  // Member 2 dies after step 5 and member 4 takes its rank, ready at step 0 (the others at
  // 6): every step_open that follows.
  auto replace_member_2 = [](training_job& job) {
    mb::roster r2 = roster_of(2, 3);
    r2.members[1].id = 4;
    r2.members[1].name = "w4";
    job.on_generation(r2, 0);
    std::vector<std::pair<mb::member_id, net::step_open>> opens;
    for (const auto& m : r2.members) {
      const job_actions a = job.on_ready(r2, net::worker_ready{m.id, 2, m.id == 4 ? 0 : 6}, 0);
      for (const auto& o : sent<net::step_open>(a)) opens.push_back(o);
    }
    return std::make_pair(r2, opens);
  };
  {
    const config c = onebit(4);
    training_job job(c, dump_config(c));
    job.set_checkpoints(lookup);
    const mb::roster r = roster_of(1, 3);
    run_to_6(job, r);
    const auto [r2, opens] = replace_member_2(job);
    REQUIRE(opens.size() == 3);
    for (const auto& [to, o] : opens) {
      CHECK(o.step == 4);
      CHECK(o.restore == 4);
      CHECK(o.donor_rank == -1);
    }
    CHECK(asked == std::vector<int64_t>{6});
    CHECK(job.next_step() == 4);
    // Once replayed, steps open as usual: no second rollback.
    job_actions a;
    for (int64_t s = 4; s < 6; ++s)
      for (const auto& m : r2.members) a = job.on_vote(r2, ok_vote(m.id, 2, s), 0);
    const auto next = sent<net::step_open>(a);
    REQUIRE(next.size() == 3);
    CHECK(next[0].second.step == 6);
    CHECK(next[0].second.restore == -1);
  }
  {
    // A scale-down drains member 3: its memory goes too, so the two left roll back to the
    // checkpoint (where its part regroups into theirs).
    config c = onebit(4);
    c.elastic.min_workers = 2;
    training_job job(c, dump_config(c));
    job.set_checkpoints(lookup);
    const mb::roster r = roster_of(1, 3);
    run_to_6(job, r);
    mb::roster leaving = r;
    leaving.members[2].state = mb::member_state::leaving;
    job.on_drain(leaving, 3, 0);
    std::vector<std::pair<mb::member_id, net::step_open>> opens;
    for (const auto& o : sent<net::step_open>(job.on_generation(roster_of(2, 2), 0)))
      opens.push_back(o);
    REQUIRE(opens.size() == 2);
    CHECK(opens[0].second.restore == 4);
    CHECK(opens[0].second.replicas == 2);
  }
  {
    // Without checkpoints the replacement takes a donor's state, as in any job.
    const config c = onebit(0);
    training_job job(c, dump_config(c));
    job.set_checkpoints(lookup);
    asked.clear();
    const mb::roster r = roster_of(1, 3);
    run_to_6(job, r);
    const auto opens = replace_member_2(job).second;
    REQUIRE(opens.size() == 3);
    CHECK(opens[0].second.step == 6);
    CHECK(opens[0].second.restore == -1);
    CHECK(opens[0].second.donor_rank >= 0);
    CHECK(asked.empty());
  }
}

TEST_CASE(
    "rollback points in memory: the group rolls back to the newest point whose parts live on") {
  // onebit_adam in bitwise mode with fault_tolerance.memory_every: 4 (no checkpoints): each
  // member keeps a point at steps 0 and 4 and its predecessor's error memory. Member 2 (rank
  // 1) dies after step 5: its part is its successor's (member 3, rank 2) copy; the
  // replacement is behind and takes a donor's state. Two neighbours lost together leave a
  // part with no holder: a checkpoint, if any, or no rollback. A newer checkpoint wins.
  auto onebit = [](int points, int checkpoints, int window) {
    return load_config_text(
        "cluster: {workers: 3}\n"
        "train: {steps: 20, global_batch: 64, micro_batch: 16, optimizer: onebit_adam, "
        "determinism: bitwise}\n"
        "fault_tolerance: {commit_window: " +
            std::to_string(window) + ", memory_every: " + std::to_string(points) +
            ", checkpoint_every: " + std::to_string(checkpoints) + "}\n",
        "<test>");
  };
  // The votes of a point's step say its ring: on one host, the ranks' order.
  auto run_to_6 = [](training_job& job, const mb::roster& r) {
    all_ready(job, r);
    job_actions a;
    for (int64_t s = 0; s < 6; ++s)
      for (const auto& m : r.members) {
        net::step_vote v = ok_vote(m.id, r.generation, s);
        if (s % 4 == 0) v.point_ring = {0, 1, 2};
        a = job.on_vote(r, v, 0);
      }
    REQUIRE(job.next_step() == 6);
    // Step 6's opening says which point is good: step 4's, every member having taken it.
    const auto opens = sent<net::step_open>(a);
    REQUIRE(opens.size() == 3);
    CHECK(opens[0].second.point == 4);
  };
  // Members NEW replace the members of the same rank (ids 4, 5, ...), ready at step 0.
  auto replace = [](training_job& job, const std::vector<int>& ranks) {
    mb::roster r2 = roster_of(2, 3);
    mb::member_id id = 4;
    for (const int k : ranks) {
      r2.members[static_cast<std::size_t>(k)].id = id;
      r2.members[static_cast<std::size_t>(k)].name = "w" + std::to_string(id++);
    }
    std::vector<std::string> notes = job.on_generation(r2, 0).notes;
    std::vector<std::pair<mb::member_id, net::step_open>> opens;
    for (const auto& m : r2.members) {
      const job_actions a = job.on_ready(r2, net::worker_ready{m.id, 2, m.id >= 4 ? 0 : 6}, 0);
      for (const auto& o : sent<net::step_open>(a)) opens.push_back(o);
      notes.insert(notes.end(), a.notes.begin(), a.notes.end());
    }
    return std::make_tuple(r2, opens, notes);
  };
  {
    const config c = onebit(4, 0, 0);
    training_job job(c, dump_config(c));
    const mb::roster r = roster_of(1, 3);
    run_to_6(job, r);
    const auto [r2, opens, notes] = replace(job, {1});
    REQUIRE(opens.size() == 3);
    for (const auto& [to, o] : opens) {
      CHECK(o.step == 4);
      CHECK(o.restore == 4);
      CHECK(o.restore_parts == std::vector<int32_t>{0, 2, 2});  // part 1 from rank 2's copy
      CHECK(o.donor_rank == 0);  // for the replacement, which kept no point
      CHECK(o.point == 4);       // so no member takes step 4's point again
    }
    CHECK(job.next_step() == 4);
    bool said = false;
    for (const auto& n : notes) said = said || n.find("rollback point of step 4 in memory") != std::string::npos;
    CHECK(said);
    // Replayed, steps open as usual; the point stays the one of the first group.
    job_actions a;
    for (int64_t s = 4; s < 6; ++s)
      for (const auto& m : r2.members) a = job.on_vote(r2, ok_vote(m.id, 2, s), 0);
    const auto next = sent<net::step_open>(a);
    REQUIRE(next.size() == 3);
    CHECK(next[0].second.step == 6);
    CHECK(next[0].second.restore == -1);
    CHECK(next[0].second.restore_parts.empty());
  }
  {
    // Ranks 1 and 2 lost together: part 1's copy was on rank 2. No checkpoint: training
    // goes on from a donor, not bit-identically, and says so.
    const config c = onebit(4, 0, 0);
    training_job job(c, dump_config(c));
    run_to_6(job, roster_of(1, 3));
    const auto [r2, opens, notes] = replace(job, {1, 2});
    REQUIRE(opens.size() == 3);
    CHECK(opens[0].second.step == 6);
    CHECK(opens[0].second.restore == -1);
    CHECK(opens[0].second.donor_rank == 0);
    bool said = false;
    for (const auto& n : notes) said = said || n.find("not bit-identical") != std::string::npos;
    CHECK(said);
    // That point belongs to a run that went otherwise: the next opening names none, so the
    // members take the point of step 8 afresh.
    CHECK(opens[0].second.point == -1);
  }
  {
    // The same with checkpoints: the checkpoint (of step 4) is the rollback.
    const config c = onebit(4, 4, 0);
    training_job job(c, dump_config(c));
    job.set_checkpoints([](int64_t) { return std::optional<int64_t>(4); });
    run_to_6(job, roster_of(1, 3));
    const auto opens = std::get<1>(replace(job, {1, 2}));
    REQUIRE(opens.size() == 3);
    CHECK(opens[0].second.restore == 4);
    CHECK(opens[0].second.restore_parts.empty());
    CHECK(opens[0].second.donor_rank == -1);
    CHECK(opens[0].second.point == -1);  // that point lost a part: the replay takes it again
  }
  {
    // A point's step whose votes said no ring (a window whose point-step votes were all
    // lost) is not counted: who holds which copy is not known. The good point stays none.
    const config c = onebit(4, 0, 0);
    training_job job(c, dump_config(c));
    const mb::roster r = roster_of(1, 3);
    all_ready(job, r);
    job_actions a;
    for (int64_t s = 0; s < 6; ++s)
      for (const auto& m : r.members) a = job.on_vote(r, ok_vote(m.id, r.generation, s), 0);
    const auto opens = sent<net::step_open>(a);
    REQUIRE(opens.size() == 3);
    CHECK(opens[0].second.point == -1);
  }
  {
    // A checkpoint newer than the point is taken instead; one as old, not.
    for (const int64_t newest : {5, 4}) {
      const config c = onebit(4, 1, 0);
      training_job job(c, dump_config(c));
      job.set_checkpoints([newest](int64_t) { return std::optional<int64_t>(newest); });
      run_to_6(job, roster_of(1, 3));
      const auto opens = std::get<1>(replace(job, {1}));
      REQUIRE(opens.size() == 3);
      CHECK(opens[0].second.restore == newest);
      CHECK(opens[0].second.restore_parts.empty() == (newest == 5));
    }
  }
  {
    // The points' votes say their ring (the hosts take turns: ranks 0, 2, 1): the copy of
    // rank 1's part is at rank 0, its successor on that ring.
    const config c = onebit(4, 0, 0);
    training_job job(c, dump_config(c));
    const mb::roster r = roster_of(1, 3);
    all_ready(job, r);
    for (int64_t s = 0; s < 6; ++s)
      for (const auto& m : r.members) {
        net::step_vote v = ok_vote(m.id, r.generation, s);
        if (s % 4 == 0) v.point_ring = {0, 2, 1};
        job.on_vote(r, v, 0);
      }
    const auto opens = std::get<1>(replace(job, {1}));
    REQUIRE(opens.size() == 3);
    CHECK(opens[0].second.restore == 4);
    CHECK(opens[0].second.restore_parts == std::vector<int32_t>{0, 0, 2});
  }
  {
    // Commit windows end before each point's step: its opening says which point is good.
    const config c = onebit(4, 0, 16);
    training_job job(c, dump_config(c));
    const mb::roster r = roster_of(1, 3);
    const auto opens = sent<net::step_open>(all_ready(job, r));
    REQUIRE(opens.size() == 3);
    CHECK(opens[0].second.through == 3);
  }
}

TEST_CASE("a new leader takes a running job over at the newest state its members hold") {
  const config c = job_config(3, 10);
  training_job job(c, dump_config(c));
  job.take_over({});
  const mb::roster r = roster_of(8, 3);
  // Members re-attached after a leader change stand apart (a commit window's last step
  // applied by some): nothing opens until each has said where it stands.
  CHECK(sent<net::step_open>(job.on_ready(r, net::worker_ready{1, 8, 5}, 0.0)).empty());
  CHECK(sent<net::step_open>(job.on_ready(r, net::worker_ready{2, 8, 6}, 0.1)).empty());
  // While it waits, status shows the newest state reported so far, not step 0.
  CHECK(job.progress() == 6);
  const job_actions a = job.on_ready(r, net::worker_ready{3, 8, 5}, 0.2);
  const auto opens = sent<net::step_open>(a);
  REQUIRE(opens.size() == 3);
  for (const auto& [id, o] : opens) {
    CHECK(o.step == 6);        // the newest state: member 2's
    CHECK(o.donor_rank == 1);  // member 2 is rank 1: the others take its state
    CHECK(o.generation == 8);
  }
  CHECK(job.next_step() == 6);
  CHECK(job.progress() == 6);
}

TEST_CASE("a coordinator fault goes to the leader once, and not again after a takeover") {
  config c = load_config_text(
      "cluster:\n  workers: 2\ntrain:\n  steps: 5\n  global_batch: 64\n  micro_batch: 16\n"
      "fault_tolerance:\n  commit_window: 0\nha:\n  standbys: 1\n",
      "<test>");
  training_job job(c, dump_config(c));
  job.set_faults({faults::parse_fault("kill rank=0 at step=3"),
                  faults::parse_fault("kill coordinator at step=1")});
  const mb::roster r = roster_of(1, 2);
  all_ready(job, r);
  job.on_vote(r, ok_vote(1, 1, 0), 1.0);
  const job_actions a = job.on_vote(r, ok_vote(2, 1, 0), 2.0);  // commits 0, opens 1
  REQUIRE(a.coordinator_fault.has_value());
  CHECK(a.coordinator_fault->coordinator);
  CHECK(a.coordinator_fault_index == 1);
  CHECK(sent<net::fault_order>(a).empty());  // no worker is ordered anything
  CHECK(sent<net::step_open>(a).size() == 2);
  REQUIRE(job.report().events().size() == 1);
  CHECK(job.report().events()[0].worker == "coordinator");

  // The next leader, told the fault fired (etcd's record), opens step 1 without it.
  training_job next(c, dump_config(c));
  next.set_faults({faults::parse_fault("kill rank=0 at step=3"),
                   faults::parse_fault("kill coordinator at step=1")});
  next.take_over({{1, -1}});
  const mb::roster r2 = roster_of(3, 2);
  next.on_ready(r2, net::worker_ready{1, 3, 1}, 0.0);
  const job_actions b = next.on_ready(r2, net::worker_ready{2, 3, 1}, 0.1);
  CHECK_FALSE(b.coordinator_fault.has_value());
  CHECK(sent<net::step_open>(b).size() == 2);

  // Without a standby the fault is refused: losing the coordinator would end the run.
  const config solo = job_config(2, 5);
  training_job alone(solo, dump_config(solo));
  CHECK_THROWS_AS(alone.set_faults({faults::parse_fault("kill coordinator at step=1")}),
                  usage_error);
}

TEST_CASE(
    "a worker fault that acted is reported once, and a next leader re-running its step skips it") {
  config c = load_config_text(
      "cluster:\n  workers: 2\ntrain:\n  steps: 5\n  global_batch: 64\n  micro_batch: 16\n"
      "fault_tolerance:\n  commit_window: 0\nha:\n  standbys: 1\n",
      "<test>");
  const std::vector<faults::fault_spec> specs{
      faults::parse_fault("slow rank=1 factor=2 from step=0 to step=4"),
      faults::parse_fault("kill rank=0 at step=1")};
  training_job job(c, dump_config(c));
  job.set_faults(specs);
  const mb::roster r = roster_of(1, 2);
  all_ready(job, r);
  job.on_vote(r, ok_vote(1, 1, 0), 1.0);
  const job_actions a = job.on_vote(r, ok_vote(2, 1, 0), 2.0);  // commits 0, opens 1
  // The kill acted (a place to record); the slow range acts on every step and is not one.
  REQUIRE(a.fired_faults.size() == 1);
  CHECK(a.fired_faults[0].index == 1);
  CHECK(a.fired_faults[0].step == -1);
  CHECK(sent<net::fault_order>(a).size() == 2);  // the kill, and the slow order

  // The leader dies before step 1 commits: the next one opens step 1 again, without the kill.
  training_job next(c, dump_config(c));
  next.set_faults(specs);
  next.take_over(a.fired_faults);
  const mb::roster r2 = roster_of(3, 2);
  next.on_ready(r2, net::worker_ready{1, 3, 1}, 0.0);
  const job_actions b = next.on_ready(r2, net::worker_ready{2, 3, 1}, 0.1);
  CHECK(sent<net::step_open>(b).size() == 2);
  const auto orders = sent<net::fault_order>(b);
  REQUIRE(orders.size() == 1);
  CHECK(orders[0].second.action == net::fault_action::slow);
  CHECK(b.fired_faults.empty());
}

TEST_CASE("faults ctl added under an earlier leader keep their places: a fired one stays fired") {
  config c = load_config_text(
      "cluster:\n  workers: 2\ntrain:\n  steps: 5\n  global_batch: 64\n  micro_batch: 16\n"
      "fault_tolerance:\n  commit_window: 0\nha:\n  standbys: 1\n",
      "<test>");
  // The config's fault is place 0; ctl added 'kill coordinator at step=1' (place 1, fired
  // by the old leader) and 'kill coordinator at step=2' (place 2, not yet).
  training_job next(c, dump_config(c));
  next.set_faults({faults::parse_fault("kill rank=0 at step=4")});
  next.append_fault(faults::parse_fault("kill coordinator at step=1"));
  next.append_fault(faults::parse_fault("kill coordinator at step=2"));
  next.take_over({{1, -1}});
  const mb::roster r = roster_of(3, 2);
  next.on_ready(r, net::worker_ready{1, 3, 1}, 0.0);
  const job_actions a = next.on_ready(r, net::worker_ready{2, 3, 1}, 0.1);  // opens step 1
  CHECK_FALSE(a.coordinator_fault.has_value());
  next.on_vote(r, ok_vote(1, 3, 1), 1.0);
  const job_actions b = next.on_vote(r, ok_vote(2, 3, 1), 2.0);  // commits 1, opens 2
  REQUIRE(b.coordinator_fault.has_value());
  CHECK(b.coordinator_fault_index == 2);
}

TEST_CASE("a job taken over after its last step asks every member for its report again") {
  const config c = job_config(2, 4);
  training_job job(c, dump_config(c));
  job.take_over({});
  const mb::roster r = roster_of(6, 2);
  job.on_ready(r, net::worker_ready{1, 6, 4}, 0.0);
  const job_actions a = job.on_ready(r, net::worker_ready{2, 6, 4}, 0.1);
  CHECK(sent<net::step_open>(a).empty());  // nothing is left to run
  const auto commits = sent<net::step_result>(a);
  REQUIRE(commits.size() == 2);
  for (const auto& [id, res] : commits) {
    CHECK(res.commit);
    CHECK(res.step == 3);  // the last step: its commit makes a worker send its report again
  }
  net::train_report rep;
  rep.member_id = 1;
  rep.generation = 6;
  rep.next_step = 4;
  rep.params_sha256 = "ab";
  CHECK_FALSE(job.on_report(r, rep, 0.2).finished);  // both members' reports are needed
  rep.member_id = 2;
  CHECK(job.on_report(r, rep, 0.3).finished);
}

TEST_CASE("ctl status lists a joiner as loading until it says it is ready") {
  const config c = job_config(2, 6);
  training_job job(c, dump_config(c));
  const mb::roster r = roster_of(1, 2);
  CHECK(job.live(r)["loading"] == nlohmann::json::array({"w1", "w2"}));  // at the start: all
  all_ready(job, r);
  CHECK_FALSE(job.live(r).contains("loading"));
  const mb::roster r2 = roster_of(2, 3);  // member 3 registered
  job.on_generation(r2, 0.3);
  const nlohmann::json j = job.live(r2);
  REQUIRE(j.contains("loading"));
  CHECK(j["loading"] == nlohmann::json::array({"w3"}));
  job.on_ready(r2, net::worker_ready{3, 2, 0}, 0.6);
  CHECK_FALSE(job.live(r2).contains("loading"));
}
