#include "runtime/train/grad_onebit_momentum.hpp"

#include "runtime/train/onebit.hpp"

namespace cohort::train {

void momentum_share_stage::run(grad_buffers& b, int64_t offset, int64_t count) {
  add_momentum_share(opt_, b.grads, b.replicas, offset, count);
}

}  // namespace cohort::train
