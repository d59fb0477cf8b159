#include "runtime/train/grad_fixed_to_float.hpp"

#include "runtime/train/fixed_point.hpp"

namespace cohort::train {

void fixed_to_float_stage::run(grad_buffers& b, int64_t offset, int64_t count) {
  fixed_to_float(b.host_write() + offset, b.fixed + offset, count);
  b.host_written(offset, count);
}

}  // namespace cohort::train
