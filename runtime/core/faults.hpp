// The fault-injection spec language shared by the YAML `faults:` list, `cohort launch
// --inject SPEC` and `cohort ctl ... inject SPEC`: parsing (errors point at a column;
// fault_parser.cpp), the canonical text, and pure scheduling (which faults act when a step
// opens, seeded random kills; faults.cpp). Executing a fault (signals, dropped frames,
// scaling) belongs to the coordinator and the launcher, not here. Reference: docs/faults.md.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/core/error.hpp"

namespace cohort::faults {

/// What a fault does; docs/faults.md says what the runtime does for each.
enum class fault_kind { kill, hang, slow, drop_control, partition, scale, random_kill };

/// The words of a kind as written in a spec: "kill", ..., "drop control", "random kill".
const char* kind_name(fault_kind k);

/// A worker named by rank (`rank=2`) or by name (`worker=worker-2`); exactly one is set.
/// `worker=` with digits only is refused as ambiguous (it names neither unmistakably).
struct worker_ref {
  int rank = -1;     ///< >= 0 when the spec names a rank
  std::string name;  ///< non-empty when the spec names a worker by name
  bool by_rank() const { return rank >= 0; }
  bool set() const { return rank >= 0 || !name.empty(); }
  /// As written in a spec: "rank=N" or "worker=NAME".
  std::string text() const;
  friend bool operator==(const worker_ref& a, const worker_ref& b) {
    return a.rank == b.rank && a.name == b.name;
  }
  friend bool operator!=(const worker_ref& a, const worker_ref& b) { return !(a == b); }
};

/// One parsed fault. Fields a kind does not use keep their defaults; steps are the
/// 0-based step numbers of the run (the step that opens first is step 0).
struct fault_spec {
  fault_kind kind = fault_kind::kill;
  worker_ref worker;  ///< kill, hang, slow, partition (unset when coordinator)
  /// kill, partition: the victim is the leader coordinator (`kill coordinator at step=N`),
  /// not a worker; needs ha.standbys >= 1, which the config and the runtime check.
  bool coordinator = false;
  int64_t at_step = -1;     ///< kill, hang, partition, scale: acts when this step opens
  int64_t from_step = -1;   ///< slow: first step slowed
  int64_t to_step = -1;     ///< slow: last step slowed (inclusive, >= from_step)
  int64_t duration_ms = 0;  ///< hang, partition: how long (`for=3s`), > 0
  double factor = 1;        ///< slow: compute takes factor x as long, >= 1
  double p = 0;             ///< drop control: probability per frame, in (0, 1]
  uint64_t seed = 0;        ///< drop control, random kill
  int to_workers = 0;       ///< scale: local worker count to reach, >= 1
  double mtbf_steps = 0;    ///< random kill: mean steps between kills, >= 1
  std::string text;         ///< the spec as the user wrote it (not compared by ==)

  /// Equal meaning: every field but `text`, so parse(to_string(x)) == x.
  friend bool operator==(const fault_spec& a, const fault_spec& b);
  friend bool operator!=(const fault_spec& a, const fault_spec& b) { return !(a == b); }
};

/// A spec that does not parse: usage error (exit 2). `column()` is 1-based in the spec
/// (one past its end for a missing field); what() is "column C: reason" followed by the
/// spec and a caret line under the column.
class fault_parse_error : public usage_error {
 public:
  fault_parse_error(std::string spec, int column, std::string reason);
  int column() const { return column_; }
  /// The one-line message without the column and caret: "what is wrong (how to fix)".
  const std::string& reason() const { return reason_; }
  const std::string& spec() const { return spec_; }

 private:
  std::string spec_;
  int column_;
  std::string reason_;
};

/// Parses one spec, e.g. "kill rank=2 at step=30", "kill worker=worker-2 at step=30" or
/// "kill coordinator at step=30". Words are
/// separated by spaces or tabs; fields after the kind may come in any order. Throws
/// fault_parse_error.
fault_spec parse_fault(const std::string& text);

/// The canonical text of a spec: fields in a fixed order, durations in s when whole
/// seconds else ms, numbers in their shortest exact form. parse_fault of it is == spec.
std::string to_string(const fault_spec& spec);
/// A number as the canonical text writes it: the shortest %g form that reads back to V.
std::string number_text(double v);

/// The faults that act when step `step` opens: kill, hang, partition (of a worker or the
/// coordinator) and scale whose at_step is `step`, and slow faults whose [from_step, to_step] holds
/// it. drop control (always on) and random kill (see random_kill_fires) are never listed. Pure: a
/// step that opens again after an abort gets the same answer; firing once is the caller's job.
std::vector<const fault_spec*> due_at(const std::vector<fault_spec>& specs, int64_t step);

/// random kill: whether a kill fires when `step` opens, with probability 1/mtbf_steps,
/// a pure function of (seed, step) through the counter-based RNG.
bool random_kill_fires(const fault_spec& spec, int64_t step);

/// random kill: the rank to kill at `step`, uniform in [0, workers) (workers > 0), a pure
/// function of (seed, step) independent of random_kill_fires' draw.
int random_kill_victim(const fault_spec& spec, int64_t step, int workers);

/// A fault that acted: its place in the job's fault list, and for a random kill the step
/// drawn (each of its steps fires once); -1 for the faults that act once.
struct fault_fired {
  std::size_t index = 0;
  int64_t step = -1;
};

}  // namespace cohort::faults
