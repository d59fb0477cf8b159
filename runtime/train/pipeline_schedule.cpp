// Pipeline schedules and their simulation (see the header for the model).
#include "runtime/train/pipeline_schedule.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include "runtime/core/config.hpp"
#include "runtime/core/error.hpp"

namespace cohort::train {
namespace {

void check_grid(const char* what, int stages, int micro_batches) {
  if (stages < 1) {
    throw usage_error(std::string(what) + ": pipeline stages must be >= 1 (got " +
                      std::to_string(stages) + "; set parallel.pp to 1 or more)");
  }
  if (micro_batches < 1) {
    throw usage_error(std::string(what) + ": micro-batches per step must be >= 1 (got " +
                      std::to_string(micro_batches) +
                      "; micro-batches = train.global_batch / train.micro_batch)");
  }
}

void check_cost(const char* name, double v, bool zero_ok) {
  if (!std::isfinite(v) || v < 0 || (!zero_ok && v == 0)) {
    throw usage_error(std::string("simulate: ") + name + " must be " + (zero_ok ? ">= 0" : "> 0") +
                      " and finite (got " + std::to_string(v) + ")");
  }
}

}  // namespace

const char* schedule_name(schedule_kind k) { return k == schedule_kind::gpipe ? "gpipe" : "1f1b"; }

schedule_kind parse_schedule(const std::string& name) {
  if (name == "gpipe") return schedule_kind::gpipe;
  if (name == "1f1b") return schedule_kind::one_f_one_b;
  std::string msg = "unknown pipeline schedule '" + name + "' (expected gpipe or 1f1b";
  const std::string near = closest_name(name, {"gpipe", "1f1b"});
  if (!near.empty()) msg += "; did you mean " + near + "?";
  throw usage_error(msg + ")");
}

std::string to_string(const pipe_op& op) {
  return (op.k == pipe_op::forward ? "F" : "B") + std::to_string(op.micro);
}

std::vector<pipe_op> stage_ops(schedule_kind kind, int stages, int micro_batches, int stage) {
  check_grid("stage_ops", stages, micro_batches);
  if (stage < 0 || stage >= stages) {
    throw usage_error("stage_ops: stage " + std::to_string(stage) + " is outside [0, " +
                      std::to_string(stages) + ") for a pipeline of " + std::to_string(stages) +
                      " stages");
  }
  const int m_total = micro_batches;
  std::vector<pipe_op> ops;
  ops.reserve(2 * static_cast<std::size_t>(m_total));
  if (kind == schedule_kind::gpipe) {
    // The GPipe paper (Huang et al. 2019, Fig. 2c) draws the backwards in descending
    // micro-batch order, which is what autograd over one concatenated graph does. The
    // order does not change the makespan or the peak (M) under uniform costs, so cohort
    // runs them ascending, as torch.distributed.pipelining's ScheduleGPipe does: it is
    // the order of 1F1B's backwards and the order in which the one-process trainer
    // accumulates micro-batch gradients (trainer::compute_gradients takes ascending
    // lists), so float gradient sums per stage happen in the same order under either
    // schedule and in `cohort train`.
    for (int m = 0; m < m_total; ++m) ops.push_back({pipe_op::forward, m});
    for (int m = 0; m < m_total; ++m) ops.push_back({pipe_op::backward, m});
    return ops;
  }
  // 1F1B as in Megatron-LM's non-interleaved schedule: stage s must have P - s - 1
  // forwards in flight before the first gradient can come back from the last stage, so it
  // runs that many warm-up forwards, then one forward and one backward in turn (each
  // backward frees what a forward took: at most min(P - s, M) held), then the backwards
  // of the warm-up micro-batches.
  const int warmup = std::min(stages - stage - 1, m_total);
  const int steady = m_total - warmup;
  for (int m = 0; m < warmup; ++m) ops.push_back({pipe_op::forward, m});
  for (int i = 0; i < steady; ++i) {
    ops.push_back({pipe_op::forward, warmup + i});
    ops.push_back({pipe_op::backward, i});
  }
  for (int m = steady; m < m_total; ++m) ops.push_back({pipe_op::backward, m});
  return ops;
}

int peak_held_activations(const std::vector<pipe_op>& ops) {
  int held = 0, peak = 0;
  for (const pipe_op& op : ops) {
    held += op.k == pipe_op::forward ? 1 : -1;
    peak = std::max(peak, held);
  }
  return peak;
}

pipe_timeline simulate(schedule_kind kind, int stages, int micro_batches, double t_fwd,
                       double t_bwd, double t_p2p) {
  check_grid("simulate", stages, micro_batches);
  check_cost("t_fwd", t_fwd, false);
  check_cost("t_bwd", t_bwd, false);
  return simulate(kind, stages, micro_batches, std::vector<double>(stages, t_fwd),
                  std::vector<double>(stages, t_bwd), t_p2p);
}

pipe_timeline simulate(schedule_kind kind, int stages, int micro_batches,
                       const std::vector<double>& fwd, const std::vector<double>& bwd,
                       double t_p2p) {
  check_grid("simulate", stages, micro_batches);
  if (static_cast<int>(fwd.size()) != stages || static_cast<int>(bwd.size()) != stages)
    throw usage_error("simulate: one forward and one backward cost per stage (" +
                      std::to_string(stages) + " stages, got " + std::to_string(fwd.size()) +
                      " and " + std::to_string(bwd.size()) + ")");
  for (double x : fwd) check_cost("t_fwd", x, false);
  for (double x : bwd) check_cost("t_bwd", x, false);
  check_cost("t_p2p", t_p2p, true);
  const int P = stages, M = micro_batches;

  pipe_timeline tl;
  tl.kind = kind;
  tl.stages = P;
  tl.micro_batches = M;
  tl.stage.resize(P);
  std::vector<std::vector<pipe_op>> ops(P);
  for (int s = 0; s < P; ++s) ops[s] = stage_ops(kind, P, M, s);

  // end time of forward / backward m on stage s; < 0 while not yet run (times are >= 0).
  const auto at = [M](int s, int m) { return static_cast<std::size_t>(s) * M + m; };
  std::vector<double> fwd_end(static_cast<std::size_t>(P) * M, -1.0);
  std::vector<double> bwd_end(fwd_end.size(), -1.0);
  std::vector<std::size_t> next(P, 0);  // next op of each stage
  std::vector<double> free_at(P, 0.0);  // when each stage finished its last op

  // Every op's start is max(stage free, inputs ready), a function of earlier ops' ends
  // only, so sweeping the stages in any order gives the same times; a sweep that runs
  // nothing while ops remain would be a schedule waiting on itself.
  std::size_t remaining = 2 * static_cast<std::size_t>(P) * M;
  while (remaining > 0) {
    std::size_t ran = 0;
    for (int s = 0; s < P; ++s) {
      while (next[s] < ops[s].size()) {
        const pipe_op op = ops[s][next[s]];
        double ready = free_at[s];
        if (op.k == pipe_op::forward) {
          if (s > 0) {
            const double in = fwd_end[at(s - 1, op.micro)];
            if (in < 0) break;
            ready = std::max(ready, in + t_p2p);
          }
        } else {
          const double own = fwd_end[at(s, op.micro)];
          if (own < 0) break;
          ready = std::max(ready, own);
          if (s + 1 < P) {
            const double grad = bwd_end[at(s + 1, op.micro)];
            if (grad < 0) break;
            ready = std::max(ready, grad + t_p2p);
          }
        }
        const double cost = op.k == pipe_op::forward ? fwd[s] : bwd[s];
        const double end = ready + cost;
        (op.k == pipe_op::forward ? fwd_end : bwd_end)[at(s, op.micro)] = end;
        free_at[s] = end;
        tl.stage[s].ops.push_back({op, ready, end});
        tl.stage[s].busy += cost;
        ++next[s];
        ++ran;
      }
    }
    COHORT_CHECK(ran > 0);  // stage_ops never makes a stage wait on itself
    remaining -= ran;
  }

  for (int s = 0; s < P; ++s) tl.makespan = std::max(tl.makespan, free_at[s]);
  double idle = 0;
  for (int s = 0; s < P; ++s) {
    stage_timeline& st = tl.stage[s];
    st.bubble = tl.makespan - st.busy;
    st.peak_held = peak_held_activations(ops[s]);
    idle += st.bubble;
  }
  tl.bubble_fraction = idle / (static_cast<double>(P) * tl.makespan);
  return tl;
}

double theoretical_bubble(int stages, int micro_batches) {
  check_grid("theoretical_bubble", stages, micro_batches);
  return static_cast<double>(stages - 1) / static_cast<double>(micro_batches + stages - 1);
}

}  // namespace cohort::train
