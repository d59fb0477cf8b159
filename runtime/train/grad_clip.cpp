#include "runtime/train/grad_clip.hpp"

#include "runtime/nn/optim.hpp"

namespace cohort::train {

void clip_stage::run(grad_buffers& b, int64_t offset, int64_t count) {
  const float coef = nn::clip_coefficient(b.norm, max_norm_);
  if (coef < 1.0f) b.dev->scale(b.grads + offset, coef, count);
}

}  // namespace cohort::train
