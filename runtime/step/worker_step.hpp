// The worker's side of the step protocol (docs/protocol.md, "Training") as a pure state
// machine: what a DP group member does with each step_open and step_result it receives,
// including the repeats a lost frame causes. No sockets, no clock, no model: the group actor
// (actors/dp_group.cpp) carries out the actions it returns; the coordinator's side is
// runtime/step/training_job.hpp.
//
//            open(g, s): run            vote ok                 result(g, s, commit)
//   [ready] ────────────────► [step] ────────────► [voted g,s] ─────────────────────► [ready]
//      ▲                        │                     │   │        apply s, next = s + 1
//      │      vote failed       │                     │   │
//      └────────────────────────┘                     │   └─ result(g, s, abort) ─► [ready]
//      ▲                                              │         drop the gradients
//      └──── open(g', s + 1): the commit of s was lost: apply s first, then run s + 1
//
//   open(g, s) equal to the last vote's (g, s)        → send that vote again (it was lost)
//   any abort                                          → drop the pending step it names;
//                                                        say where this member stands
//                                                        (worker_ready: after a window,
//                                                        members may stand apart)
//   commit for no pending step: the commit of the last
//   step (s + 1 == the report's next step)            → send the final report again
//   any other stray commit                             → ignore
//
// In a commit window (open(g, s, through) with through >= s) the vote travels with the
// data: a step whose DP sum completed (every member's gradients are in) is applied at once
// (applied(g, s)) and the next step of the window runs without an open:
//
//            open(g, s, t)         applied(g, s), s < t: continue(g, s + 1)
//   [ready] ──────────────► [window g..t] ◄──────────────┐
//      ▲                        │   │ └──────────────────┘
//      │  applied(g, t)         │   │  vote failed: wait for the abort
//      └────────────────────────┘   └─ result(g, _, abort) ─► [ready], say where it stands
//
//   open(g, s') of the window with s' <= the last applied step → send the last vote again
//   (the coordinator missed it; it says where this member stands)
#pragma once
#include <cstdint>
#include <optional>

namespace cohort::step {

class worker_step {
 public:
  /// A step this member voted ok for, waiting for the coordinator's decision.
  struct pending_step {
    uint64_t generation = 0;
    int64_t step = 0;
    int rank = 0;  ///< this member's DP rank in that generation
    uint64_t member_id = 0;
  };

  /// What to do with step_open(generation, step), in order.
  struct open_plan {
    bool resend_vote = false;  ///< a repeat: send the last vote again, nothing else
    /// Apply this step before running the new one (its step_result was lost).
    std::optional<pending_step> commit_first;
    bool run = false;  ///< run the step and vote (call voted() with the outcome)
  };
  /// THROUGH >= STEP: the open starts a commit window that ends at THROUGH.
  open_plan on_open(uint64_t generation, int64_t step, int64_t through = -1);

  /// The vote for (generation, step) went out; `ok`: the gradients are reduced and wait for
  /// the decision as P.
  void voted(uint64_t generation, int64_t step, bool ok, const pending_step& p);
  /// In a window: the DP sum of (generation, step) completed, the step is applied and its
  /// vote (marked applied) went out.
  void applied(uint64_t generation, int64_t step);
  /// The window's next step after an applied one, if the window goes on.
  std::optional<int64_t> next_in_window() const;
  /// True while step STEP of GENERATION is still the window's next (no abort came between).
  bool continues(uint64_t generation, int64_t step) const {
    return next_in_window() == step && window_->generation == generation;
  }

  enum class result_action {
    ignore,         ///< not for a pending step
    resend_report,  ///< the last step's commit again: the final report was lost
    commit,         ///< apply the pending step (take_pending())
    /// A step was aborted: its pending gradients and any window of its generation are
    /// dropped (begin_step clears the gradients on the retry); say where this member
    /// stands (worker_ready), since after a window members may stand at different steps.
    aborted,
  };
  /// What to do with step_result(generation, step, commit). REPORT_NEXT_STEP: the next_step
  /// of the final report already sent, or -1 when none was.
  result_action on_result(uint64_t generation, int64_t step, bool commit, int64_t report_next_step);
  /// The coordinator asked where this member stands again (a repeated job): any window it
  /// ran is over for it.
  void forget_window() { window_.reset(); }
  /// The pending step, consumed by its commit.
  pending_step take_pending();

  const std::optional<pending_step>& pending() const { return pending_; }

 private:
  struct window {
    uint64_t generation = 0;
    int64_t through = 0;
    int64_t applied = -1;  ///< last step applied in this generation's windows
  };
  std::optional<pending_step> pending_;
  std::optional<window> window_;
  bool vote_applied_ = false;  ///< the last vote was applied(): the window may go on
  bool have_vote_ = false;
  uint64_t vote_generation_ = 0;
  int64_t vote_step_ = 0;
};

}  // namespace cohort::step
