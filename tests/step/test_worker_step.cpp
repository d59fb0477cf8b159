// worker_step (runtime/step/worker_step.hpp): the worker's side of the step protocol, as tables of
// (message in -> action out), including the repeats lost frames cause.
#include <doctest/doctest.h>

#include "runtime/step/worker_step.hpp"

using cohort::step::worker_step;
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
      {5, 20, true, -1, action::commit},   {5, 20, false, -1, action::aborted},
      {4, 20, false, -1, action::aborted},  // says where it stands, keeps what is pending
      {4, 20, true, -1, action::ignore},    // another generation's decision
      {5, 19, true, -1, action::ignore},    // an older step's, repeated
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
    CHECK(w.pending().has_value() == (r.want != action::aborted || r.generation != 5));
  }
  // Nothing pending: only the last step's commit again gets the report again.
  const row done[] = {
      {5, 99, true, 100, action::resend_report},
      {5, 99, false, 100, action::aborted},
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

TEST_CASE("worker_step: a commit window runs its steps back to back and stops at its end") {
  worker_step w;
  auto plan = w.on_open(4, 10, 12);
  CHECK(plan.run);
  CHECK(!w.next_in_window());  // nothing applied yet
  w.applied(4, 10);
  CHECK(!w.pending());  // applied at once: nothing waits for a result
  CHECK(w.next_in_window() == 11);
  CHECK(w.continues(4, 11));
  CHECK(!w.continues(4, 12));
  CHECK(!w.continues(5, 11));
  CHECK(w.on_open(4, 11, 12).run);  // the queued next step runs as an open of its own
  w.applied(4, 11);
  w.on_open(4, 12, 12);
  w.applied(4, 12);
  CHECK(!w.next_in_window());  // the window's end: wait for the coordinator
  // The next window of the same generation.
  CHECK(w.on_open(4, 13, 20).run);
}

TEST_CASE("worker_step: in a window a repeated open of a passed step gets the last vote again") {
  worker_step w;
  w.on_open(4, 10, 15);
  w.applied(4, 10);
  w.on_open(4, 11, 15);
  w.applied(4, 11);
  CHECK(w.on_open(4, 10, 15).resend_vote);  // the coordinator missed the votes: say how far
  CHECK(w.on_open(4, 11, 15).resend_vote);
  CHECK(w.next_in_window() == 12);  // a repeat does not end the window
}

TEST_CASE("worker_step: an abort of the window stops it (the worker then says where it stands)") {
  worker_step w;
  w.on_open(4, 10, 15);
  w.applied(4, 10);
  CHECK(w.on_result(3, 10, false, -1) == action::aborted);  // another generation's abort:
  CHECK(w.continues(4, 11));                                // the window goes on
  CHECK(w.on_result(4, 10, false, -1) == action::aborted);
  CHECK(!w.continues(4, 11));  // the queued next step is dropped
  // A failed vote in a window waits for the abort, holding nothing.
  worker_step f;
  f.on_open(4, 10, 15);
  f.voted(4, 10, false, p(4, 10));
  CHECK(!f.pending());
  CHECK(!f.next_in_window());
  CHECK(f.on_result(4, 10, false, -1) == action::aborted);
  // The reopened step of a new generation runs (the abort named where the window began).
  CHECK(f.on_open(5, 10, 15).run);
  // A repeated job forgets a window too.
  worker_step j;
  j.on_open(4, 10, 15);
  j.applied(4, 10);
  j.forget_window();
  CHECK(!j.continues(4, 11));
}
