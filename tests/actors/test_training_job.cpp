// The coordinator's step protocol as tables of events: when a step opens, what commits,
// what aborts, who donates state, when the job ends. Pure: no sockets, no clock.
#include <doctest/doctest.h>

#include "actors/training_job.hpp"
#include "runtime/core/config.hpp"

using namespace cohort;
using namespace cohort::actors;

namespace {

config job_config(int workers, int steps = 3) {
  return load_config_text("cluster:\n  workers: " + std::to_string(workers) +
                              "\ntrain:\n  steps: " + std::to_string(steps) +
                              "\n  global_batch: 64\n  micro_batch: 16\n",
                          "<test>");
}

mb::roster roster_of(uint64_t generation, int n, mb::member_id first_id = 1) {
  mb::roster r;
  r.generation = generation;
  for (int i = 0; i < n; ++i) {
    mb::member m;
    m.id = first_id + static_cast<mb::member_id>(i);
    m.name = "w" + std::to_string(m.id);
    m.rank = i;
    m.at.d = i;
    m.state = mb::member_state::alive;
    r.members.push_back(m);
  }
  return r;
}

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
  CHECK(job.aborted_steps() == 1);
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
  CHECK(job.aborted_steps() == 51);
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
  const nlohmann::json j = job.summary(5.0);
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
