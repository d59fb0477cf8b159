// Stage fixed_to_float (bitwise mode): the step's int64 fixed-point sum becomes the float
// gradient, rounded once. Before the DP sum when the sum travels as floats (compression,
// 1-bit Adam), after it when the int64 sum itself travels. Does not accumulate.
#pragma once
#include "runtime/train/grad_stage.hpp"

namespace cohort::train {

class fixed_to_float_stage final : public grad_stage {
 public:
  const char* name() const override { return "fixed_to_float"; }
  /// b.grads = float(b.fixed) on the range.
  void run(grad_buffers& b, int64_t offset, int64_t count) override;
};

}  // namespace cohort::train
