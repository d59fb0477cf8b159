#include "actors/worker_step.hpp"

namespace cohort::actors {

worker_step::open_plan worker_step::on_open(uint64_t generation, int64_t step) {
  open_plan p;
  if (have_vote_ && vote_generation_ == generation && vote_step_ == step) {
    p.resend_vote = true;  // the vote (or this open) was lost on the way
    return p;
  }
  // Step s + 1 opens only after step s committed: its step_result was lost.
  if (pending_ && step == pending_->step + 1) p.commit_first = pending_;
  pending_.reset();  // step == pending's step: that attempt was aborted
  p.run = true;
  return p;
}

void worker_step::voted(uint64_t generation, int64_t step, bool ok, const pending_step& p) {
  have_vote_ = true;
  vote_generation_ = generation;
  vote_step_ = step;
  if (ok)
    pending_ = p;
  else
    pending_.reset();
}

worker_step::result_action worker_step::on_result(uint64_t generation, int64_t step, bool commit,
                                                  int64_t report_next_step) const {
  if (!pending_ || pending_->generation != generation || pending_->step != step)
    return commit && report_next_step >= 0 && step + 1 == report_next_step
               ? result_action::resend_report
               : result_action::ignore;
  return commit ? result_action::commit : result_action::drop;
}

worker_step::pending_step worker_step::take_pending() {
  pending_step p = pending_.value_or(pending_step{});
  pending_.reset();
  return p;
}

}  // namespace cohort::actors
