// Pipeline micro-batch schedules (`parallel.schedule: gpipe | 1f1b`): the order in which
// one stage runs its forward and backward passes, and a deterministic discrete-event
// simulation of a whole pipeline that gives the makespan, per-stage bubble and peak held
// activations the runtime's measurements are compared against (docs/pipeline.md).
// Pure functions: no processes, sockets or tensors; the stage workers that follow them
// live elsewhere.
#pragma once
#include <string>
#include <vector>

namespace cohort::train {

/// Which micro-batch schedule a pipeline runs.
///
///   gpipe (Huang et al. 2019): every stage runs all M forwards, then all M backwards.
///     Simple, but every stage holds the activations of all M micro-batches at once.
///   one_f_one_b (PipeDream-Flush, Narayanan et al. 2021; Megatron-LM's non-interleaved
///     schedule): stage s runs min(P - s - 1, M) warm-up forwards, then alternates one
///     forward and one backward, then drains the remaining backwards. Same bubble as
///     GPipe, but stage s holds at most min(P - s, M) micro-batches' activations.
enum class schedule_kind { gpipe, one_f_one_b };

/// "gpipe" or "1f1b": the config's spelling.
const char* schedule_name(schedule_kind k);

/// The schedule named by `name` ("gpipe" | "1f1b"); throws usage_error naming the allowed
/// values (and the closest one, for a typo) otherwise.
schedule_kind parse_schedule(const std::string& name);

/// One pass of one micro-batch on one stage.
struct pipe_op {
  enum kind { forward, backward };
  kind k = forward;
  int micro = 0;  ///< micro-batch index in [0, M)
  bool operator==(const pipe_op& o) const { return k == o.k && micro == o.micro; }
  bool operator!=(const pipe_op& o) const { return !(*this == o); }
};

/// "F3" / "B3": for logs, test messages and docs.
std::string to_string(const pipe_op& op);

/// The order in which stage `stage` of a P-stage pipeline runs the forward and backward
/// passes of M micro-batches: 2M ops, each forward and each backward exactly once, the
/// forward of a micro-batch before its backward. Backwards run in ascending micro-batch
/// order under both schedules (see the .cpp for why GPipe does too). Throws usage_error
/// unless P >= 1, M >= 1 and 0 <= stage < P.
std::vector<pipe_op> stage_ops(schedule_kind kind, int stages, int micro_batches, int stage);

/// Most micro-batches whose activations a stage holds at once when it runs `ops` in
/// order: a micro-batch is held from its forward until its backward completes, so this is
/// the largest (forwards so far - backwards so far) over the prefixes of `ops`.
/// GPipe: M on every stage. 1F1B: min(P - s, M) on stage s.
int peak_held_activations(const std::vector<pipe_op>& ops);

/// When one op ran in a simulation.
struct timed_op {
  pipe_op op;
  double start = 0;
  double end = 0;
};

/// One stage of a simulated pipeline.
struct stage_timeline {
  std::vector<timed_op> ops;  ///< in the order the stage ran them (stage_ops)
  double busy = 0;            ///< time spent computing: M * (t_fwd + t_bwd)
  double bubble = 0;          ///< makespan - busy: time idle within the step
  int peak_held = 0;          ///< peak_held_activations of the stage's ops
};

/// A simulated step of the whole pipeline.
struct pipe_timeline {
  schedule_kind kind = schedule_kind::one_f_one_b;
  int stages = 0;
  int micro_batches = 0;
  std::vector<stage_timeline> stage;  ///< index = stage
  double makespan = 0;                ///< end of the last op on any stage (the step starts at 0)
  /// Idle share of all stages' time: sum of bubbles / (stages * makespan).
  double bubble_fraction = 0;
};

/// Deterministic discrete-event simulation of one step. Each stage runs stage_ops(kind, P,
/// M, s) in order, one op at a time, each op as soon as the stage is free and its inputs
/// exist: forward m on stage s needs forward m on stage s-1 done plus t_p2p (the
/// activation's transfer); backward m on stage s needs backward m on stage s+1 done plus
/// t_p2p (the activation gradient's transfer) and its own forward m. Every forward costs
/// t_fwd and every backward t_bwd on every stage. With t_p2p = 0 both schedules take
/// (M + P - 1) * (t_fwd + t_bwd) and their bubble fraction is theoretical_bubble(P, M);
/// with t_p2p > 0 GPipe takes 2 (P - 1) t_p2p more, while 1F1B's strict alternation
/// exposes the transfers in its steady state too. Throws usage_error unless P >= 1,
/// M >= 1, t_fwd > 0, t_bwd > 0 and t_p2p >= 0 (all finite).
pipe_timeline simulate(schedule_kind kind, int stages, int micro_batches, double t_fwd,
                       double t_bwd, double t_p2p = 0);

/// The same with each stage's own forward and backward cost (fwd[s], bwd[s]; P each, > 0):
/// what a pipeline of unequal stages can reach at best. The uniform version above is this
/// with equal costs. Throws usage_error for sizes or costs out of range.
pipe_timeline simulate(schedule_kind kind, int stages, int micro_batches,
                       const std::vector<double>& fwd, const std::vector<double>& bwd,
                       double t_p2p = 0);
/// (P - 1) / (M + P - 1): the idle share of a step of P stages and M micro-batches under
/// GPipe or 1F1B with uniform costs and free transfers. Throws usage_error unless P >= 1
/// and M >= 1.
double theoretical_bubble(int stages, int micro_batches);

}  // namespace cohort::train
