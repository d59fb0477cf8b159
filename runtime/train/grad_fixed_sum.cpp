#include "runtime/train/grad_fixed_sum.hpp"

#include <algorithm>
#include <string>

#include "runtime/train/fixed_point.hpp"

namespace cohort::train {

void fixed_sum_stage::begin_micro_batch(grad_buffers& b) {
  b.zero_grads();
}

void fixed_sum_stage::run(grad_buffers& b, int64_t offset, int64_t count) {
  accumulate_gradients(b.fixed, b.host_read(offset, count), offset, count,
                       "step " + std::to_string(b.step));
}

}  // namespace cohort::train
