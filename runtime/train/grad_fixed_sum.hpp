// Stage fixed_point_sum (train.determinism: bitwise): each micro-batch's float gradient,
// computed from zero, is converted to int64 fixed point and added into the step's sum, whose
// integer additions do not depend on order. Does not convert back (grad_fixed_to_float.hpp).
#pragma once
#include "runtime/train/grad_stage.hpp"

namespace cohort::train {

class fixed_sum_stage final : public grad_stage {
 public:
  const char* name() const override { return "fixed_point_sum"; }
  /// Zeroes b.grads: each micro-batch's gradient is converted on its own.
  void begin_micro_batch(grad_buffers& b) override;
  /// b.fixed += fixed(b.grads) on the range; throws cohort::error naming the step on overflow.
  void run(grad_buffers& b, int64_t offset, int64_t count) override;
};

}  // namespace cohort::train
