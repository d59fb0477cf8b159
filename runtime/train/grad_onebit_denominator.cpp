#include "runtime/train/grad_onebit_denominator.hpp"

#include "runtime/train/onebit.hpp"

namespace cohort::train {

void denominator_stage::run(grad_buffers& b, int64_t offset, int64_t count) {
  scale_by_denominator(opt_, b.grads, offset, count, dir_ == direction::divide);
}

}  // namespace cohort::train
