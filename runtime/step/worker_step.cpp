#include "runtime/step/worker_step.hpp"

namespace cohort::step {

worker_step::open_plan worker_step::on_open(uint64_t generation, int64_t step, int64_t through) {
  open_plan p;
  if (have_vote_ && vote_generation_ == generation && vote_step_ == step) {
    p.resend_vote = true;  // the vote (or this open) was lost on the way
    return p;
  }
  if (window_ && window_->generation == generation && step <= window_->applied) {
    p.resend_vote = true;  // the window went past this step: the last vote says how far
    return p;
  }
  const int64_t applied = window_ && window_->generation == generation ? window_->applied : -1;
  if (through >= step)
    window_ = window{generation, through, applied};
  else
    window_.reset();
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
  vote_applied_ = false;
  if (ok && !window_)
    pending_ = p;
  else
    pending_.reset();  // in a window an ok vote is applied(); a failure waits for the abort
}

void worker_step::applied(uint64_t generation, int64_t step) {
  have_vote_ = true;
  vote_generation_ = generation;
  vote_step_ = step;
  vote_applied_ = true;
  pending_.reset();
  if (window_ && window_->generation == generation) window_->applied = step;
}

std::optional<int64_t> worker_step::next_in_window() const {
  if (!window_ || !vote_applied_ || vote_generation_ != window_->generation ||
      vote_step_ >= window_->through)
    return std::nullopt;
  return vote_step_ + 1;
}

worker_step::result_action worker_step::on_result(uint64_t generation, int64_t step, bool commit,
                                                  int64_t report_next_step) {
  if (!commit) {
    if (pending_ && pending_->generation == generation && pending_->step == step) pending_.reset();
    if (window_ && window_->generation == generation) window_.reset();
    return result_action::aborted;
  }
  if (!pending_ || pending_->generation != generation || pending_->step != step)
    return commit && report_next_step >= 0 && step + 1 == report_next_step
               ? result_action::resend_report
               : result_action::ignore;
  return result_action::commit;
}

worker_step::pending_step worker_step::take_pending() {
  pending_step p = pending_.value_or(pending_step{});
  pending_.reset();
  return p;
}

}  // namespace cohort::step
