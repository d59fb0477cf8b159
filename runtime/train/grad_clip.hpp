// Stage clip: scales the whole summed gradient down to train.grad_clip when its norm is
// larger (the last stage before the optimizer). Does not compute the norm: the trainer does,
// in parameter order (param_stats.hpp), and hands it in grad_buffers::norm.
#pragma once
#include "runtime/train/grad_stage.hpp"

namespace cohort::train {

class clip_stage final : public grad_stage {
 public:
  /// MAX_NORM: train.grad_clip (0: never clips).
  explicit clip_stage(float max_norm) : max_norm_(max_norm) {}
  const char* name() const override { return "clip"; }
  /// b.grads *= clip_coefficient(b.norm, max_norm) on the range when that is below 1.
  void run(grad_buffers& b, int64_t offset, int64_t count) override;

 private:
  float max_norm_;
};

}  // namespace cohort::train
