// The training job's faults (docs/faults.md) as the coordinator carries them out: which act
// when a step opens (kill, hang and partition once; slow on every step of its range; random
// kill on the steps its seed picks; scale), whom each is ordered to, and faults added while
// the job runs. Pure. The language and its arithmetic are runtime/core/faults.hpp; carrying
// an order out is the worker's, dropping frames the coordinator actor's.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "runtime/step/job_actions.hpp"
#include "runtime/step/run_report.hpp"
#include "runtime/core/faults.hpp"

namespace cohort::step {

/// Throws usage_error for a fault list the runtime cannot carry out as written: every kind
/// is carried out, but at most one `drop control`, and a coordinator fault only with
/// STANDBYS >= 1 (ha.standbys: without a standby, killing the coordinator ends the run).
void require_supported(const std::vector<faults::fault_spec>& specs, int standbys);

class fault_schedule {
 public:
  /// The job's faults, with STANDBYS coordinator standbys. Throws usage_error
  /// (require_supported).
  void set(std::vector<faults::fault_spec> f, int standbys);
  /// Fault F.index (of the list given to set) already fired under an earlier leader (ha),
  /// at step F.step for a random kill: it does not fire there again.
  void mark_fired(const faults::fault_fired& f) {
    if (f.index >= fired_.size()) return;
    if (f.step < 0)
      fired_[f.index] = true;
    else
      random_fired_.insert({f.index, f.step});
  }
  /// Whether F may join the job running at NEXT_STEP; steps before FIRST_UNOPENED are open
  /// (their faults already ordered: the open step, or the rest of a commit window). Throws
  /// usage_error for an unsupported kind, a step already opened, a second drop control.
  void check(const faults::fault_spec& f, int64_t next_step, int64_t first_unopened) const;
  /// A checked fault (check, now or under an earlier leader) at the next place in the
  /// list. Its step may have passed since (an earlier leader's): it never fires then.
  void append(faults::fault_spec f) {
    if (f.kind == faults::fault_kind::drop_control && !drop_) drop_ = f;
    faults_.push_back(std::move(f));
    fired_.push_back(false);
  }
  /// The first step in [FROM, LIMIT] on which a fault acts (orders something or scales),
  /// LIMIT + 1 when none does: a commit window ends before it, so that the step's opening
  /// carries the fault.
  int64_t next_acting_step(int64_t from, int64_t limit) const;
  /// The `drop control` fault, if the job has one.
  const faults::fault_spec* drop_control() const { return drop_ ? &*drop_ : nullptr; }
  /// Step STEP opens on roster R: the orders due go into OUT.sends (before the step's
  /// opens), a line each into OUT.notes, a due scale into OUT.scale_to; the first step a
  /// fault acts on is an event of REPORT.
  void inject_due(const mb::roster& r, int64_t step, double now_s, job_actions& out,
                  run_report& report);

 private:
  std::vector<faults::fault_spec> faults_;
  std::vector<bool> fired_;
  std::set<std::pair<std::size_t, int64_t>> random_fired_;  ///< (fault, step) drawn
  std::optional<faults::fault_spec> drop_;                  ///< drop control, if any
  int standbys_ = 0;
};

}  // namespace cohort::step
