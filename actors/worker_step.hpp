// The worker's side of the step protocol (docs/protocol.md, "Training") as a pure state
// machine: what a DP group member does with each step_open and step_result it receives,
// including the repeats a lost frame causes. No sockets, no clock, no model: the group actor
// (actors/dp_group.cpp) carries out the actions it returns; the coordinator's side is
// actors/training_job.hpp.
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
//   result for no pending step: the commit of the last
//   step (s + 1 == the report's next step)            → send the final report again
//   any other stray result                             → ignore
#pragma once
#include <cstdint>
#include <optional>

namespace cohort::actors {

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
  open_plan on_open(uint64_t generation, int64_t step);

  /// The vote for (generation, step) went out; `ok`: the gradients are reduced and wait for
  /// the decision as P.
  void voted(uint64_t generation, int64_t step, bool ok, const pending_step& p);

  enum class result_action {
    ignore,         ///< not for a pending step
    resend_report,  ///< the last step's commit again: the final report was lost
    drop,           ///< aborted: drop the gradients (begin_step clears them on the retry)
    commit,         ///< apply the pending step (committed())
  };
  /// What to do with step_result(generation, step, commit). REPORT_NEXT_STEP: the next_step
  /// of the final report already sent, or -1 when none was.
  result_action on_result(uint64_t generation, int64_t step, bool commit,
                          int64_t report_next_step) const;
  /// The pending step, consumed by a commit or a drop (on_result said which).
  pending_step take_pending();

  const std::optional<pending_step>& pending() const { return pending_; }

 private:
  std::optional<pending_step> pending_;
  bool have_vote_ = false;
  uint64_t vote_generation_ = 0;
  int64_t vote_step_ = 0;
};

}  // namespace cohort::actors
