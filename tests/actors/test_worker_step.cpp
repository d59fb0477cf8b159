// worker_step (actors/worker_step.hpp): the worker's side of the step protocol, as tables of
// (message in -> action out), including the repeats lost frames cause.
#include <doctest/doctest.h>

#include "actors/worker_step.hpp"

using cohort::actors::worker_step;
using action = worker_step::result_action;

namespace {

worker_step::pending_step p(uint64_t g, int64_t s, int rank = 0) { return {g, s, rank, 7}; }

}  // namespace

TEST_CASE("worker_step: open, vote, commit, next open") {
  worker_step w;
  auto plan = w.on_open(1, 0);
  CHECK(plan.run);
  CHECK(!plan.resend_vote);
  CHECK(!plan.commit_first);
  w.voted(1, 0, true, p(1, 0));
  REQUIRE(w.pending());
  CHECK(w.on_result(1, 0, true, -1) == action::commit);
  CHECK(w.take_pending().step == 0);
  CHECK(!w.pending());
  plan = w.on_open(1, 1);
  CHECK(plan.run);
  CHECK(!plan.commit_first);
}

TEST_CASE("worker_step: a repeated open gets the same vote again, and nothing runs") {
  worker_step w;
  w.on_open(3, 5);
  w.voted(3, 5, true, p(3, 5));
  const auto plan = w.on_open(3, 5);
  CHECK(plan.resend_vote);
  CHECK(!plan.run);
  CHECK(w.pending());  // still waiting for the decision
  // A failed vote is repeated too (the coordinator may not have seen it).
  worker_step f;
  f.on_open(3, 6);
  f.voted(3, 6, false, p(3, 6));
  CHECK(!f.pending());
  CHECK(f.on_open(3, 6).resend_vote);
}

TEST_CASE("worker_step: the next step's open applies a step whose commit was lost") {
  worker_step w;
  w.on_open(2, 9);
  w.voted(2, 9, true, p(2, 9, 1));
  const auto plan = w.on_open(2, 10);
  REQUIRE(plan.commit_first);
  CHECK(plan.commit_first->step == 9);
  CHECK(plan.commit_first->rank == 1);
  CHECK(plan.run);
  CHECK(!w.pending());
  // ... also when the next step opens in a newer generation (the roster changed meanwhile).
  worker_step x;
  x.on_open(2, 9);
  x.voted(2, 9, true, p(2, 9));
  CHECK(x.on_open(3, 10).commit_first);
}

TEST_CASE("worker_step: the same step opened again in a newer generation drops the old attempt") {
  worker_step w;
  w.on_open(2, 4);
  w.voted(2, 4, true, p(2, 4));
  const auto plan = w.on_open(3, 4);  // step 4 was aborted: a retry
  CHECK(plan.run);
  CHECK(!plan.commit_first);
  CHECK(!w.pending());
  // A late result for the aborted attempt finds nothing pending.
  CHECK(w.on_result(2, 4, true, -1) == action::ignore);
}

TEST_CASE("worker_step: results as a table") {
  struct row {
    uint64_t generation;
    int64_t step;
    bool commit;
    int64_t report_next;
    action want;
  };
  // Pending: (generation 5, step 20).
  const row rows[] = {
      {5, 20, true, -1, action::commit},
      {5, 20, false, -1, action::drop},
      {4, 20, true, -1, action::ignore},  // another generation's decision
      {5, 19, true, -1, action::ignore},  // an older step's, repeated
      {5, 21, true, -1, action::ignore},
  };
  for (const row& r : rows) {
    worker_step w;
    w.on_open(5, 20);
    w.voted(5, 20, true, p(5, 20));
    CAPTURE(r.generation);
    CAPTURE(r.step);
    CAPTURE(r.commit);
    CHECK(w.on_result(r.generation, r.step, r.commit, r.report_next) == r.want);
  }
  // Nothing pending: only the last step's commit again gets the report again.
  const row done[] = {
      {5, 99, true, 100, action::resend_report},
      {5, 99, false, 100, action::ignore},
      {5, 98, true, 100, action::ignore},
      {5, 99, true, -1, action::ignore},  // no report sent yet
  };
  for (const row& r : done) {
    worker_step w;
    CAPTURE(r.step);
    CAPTURE(r.commit);
    CAPTURE(r.report_next);
    CHECK(w.on_result(r.generation, r.step, r.commit, r.report_next) == r.want);
  }
}
