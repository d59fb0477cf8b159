// The gradient path of a whole-model trainer as an ordered list of stages, chosen once from
// the config (and again when 1-bit Adam's phase changes): what each micro-batch's gradient
// goes through, what a final range goes through before the DP sum, how the sum travels, and
// what the summed buffer goes through before the optimizer. The trainer runs it without
// asking which mode chose it; a new mode is a new stage here (docs/architecture.md, "The
// gradient pipeline"). The sum itself is runtime/comm's; the error memory the trainer's.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/buckets.hpp"
#include "runtime/comm/compress.hpp"
#include "runtime/nn/optim.hpp"
#include "runtime/train/grad_stage.hpp"
#include "runtime/train/onebit.hpp"

namespace cohort::train {

/// The config's gradient-path choices, read once by the trainer.
struct grad_mode {
  bool bitwise = false;                                    ///< train.determinism: bitwise
  comm::wire_format compression = comm::wire_format::f32;  ///< comm.compression (f32: none)
  bool error_feedback = false;                             ///< keeps_error_feedback(config)
  onebit_phase onebit = onebit_phase::off;
  float grad_clip = 0.0f;  ///< train.grad_clip
};

/// How the DP sum between the before-sum and after-sum stages travels.
struct grad_sum {
  comm::grad_type type = comm::grad_type::f32;  ///< int64 fixed point or floats
  comm::plain_sum plain = comm::plain_sum::transport;
  std::vector<comm::wire_segment> compressed;  ///< the stretches sent compressed
  bool error_feedback = false;  ///< the compressed stretches carry this worker's error memory
  /// "sum_i64", "sum_f32" or "compressed_sum_<format>", with "_rank_order" for rank order.
  std::string name() const;
};

struct grad_pipeline {
  using stages = std::vector<std::unique_ptr<grad_stage>>;
  stages micro_batch;                      ///< each micro-batch's ranges, as backward finishes them
  stages before_sum;                       ///< the step's final ranges, before the DP sum
  grad_sum sum;                            ///< the DP sum (runtime/comm)
  stages after_sum;                        ///< the summed buffer, before the norm is taken
  stages before_optimizer;                 ///< the summed buffer, once its norm is known
  onebit_phase phase = onebit_phase::off;  ///< the 1-bit phase it was chosen for

  /// Every stage's name in the order a gradient meets them, the sum (and "error_feedback"
  /// when memory rides along) in its place.
  std::vector<std::string> names() const;
};

/// Runs each of STAGES, in order, on [offset, offset + count) of B.
void run_stages(const grad_pipeline::stages& stages, grad_buffers& b, int64_t offset,
                int64_t count);

/// The pipeline for MODE over a buffer of ELEMENTS. OPT: the trainer's optimizer (1-bit
/// Adam's stages read its state; it must outlive the pipeline). The one place that asks
/// which mode the config chose.
grad_pipeline choose_grad_pipeline(const grad_mode& mode, int64_t elements, nn::optimizer& opt);

}  // namespace cohort::train
