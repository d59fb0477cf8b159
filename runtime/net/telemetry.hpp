// Worker to coordinator, after each step's vote: what the coordinator needs to see the run
// but not to decide it. Trace spans (only with job_spec.trace) with the worker's clock
// offset to the coordinator's, the held-out evaluation when one ran, and the peak of the
// worker's memory pool. Losing one costs a gap in a trace or a plot, never a step.
#pragma once
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "runtime/net/msg_types.hpp"

namespace cohort::net {

/// One trace event as it travels (runtime/core/trace.hpp's event). ph: 'X' span, 'i' instant.
struct trace_span {
  std::string name;
  std::string cat;
  uint8_t ph = 'X';
  int64_t ts_ns = 0;  ///< the worker's steady clock
  int64_t dur_ns = 0;
  uint32_t tid = 0;
  std::string args;  ///< JSON object members without braces, or empty
  template <class S>
  static auto fields(S& s) {
    return std::tie(s.name, s.cat, s.ph, s.ts_ns, s.dur_ns, s.tid, s.args);
  }
};

struct telemetry {
  static constexpr msg_type type = msg_type::telemetry;
  uint64_t member_id = 0;
  uint64_t generation = 0;
  int64_t step = 0;  ///< the step whose vote this follows
  /// Add to the worker's clock to get the coordinator's; error: its bound, half the round
  /// trip of the best probe (-1: no probe answered yet).
  int64_t clock_offset_ns = 0;
  int64_t clock_error_ns = -1;
  uint64_t dropped_spans = 0;  ///< spans this worker lost to its buffer's bound, so far
  int64_t eval_step = -1;      ///< >= 0: a held-out evaluation after this many steps
  double eval_loss = 0;
  double eval_accuracy = -1;    ///< -1: none (a language model)
  int64_t peak_pool_bytes = 0;  ///< the most the worker's memory pool has held so far
  /// The worker's model state now (parameters, gradients, optimizer state and its replica;
  /// runtime/train/trainer.hpp, model_state_bytes); 0: not known (a pipeline stage)
  int64_t model_state_bytes = 0;
  std::vector<trace_span> spans;
  template <class S>
  static auto fields(S& s) {
    return std::tie(s.member_id, s.generation, s.step, s.clock_offset_ns, s.clock_error_ns,
                    s.dropped_spans, s.eval_step, s.eval_loss, s.eval_accuracy, s.peak_pool_bytes,
                    s.model_state_bytes, s.spans);
  }
};

}  // namespace cohort::net
