// One stage of the gradient path: a small, elementwise step a gradient range takes between
// backward and the optimizer (grad_pipeline.hpp chooses and orders them). A stage owns no
// gradient buffer, it works on the trainer's through grad_buffers; it knows nothing of the
// config mode that chose it nor of the DP sum (runtime/comm does the sum).
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "runtime/nn/device.hpp"

namespace cohort::train {

/// The buffers and facts of the step in flight a stage works on (views, owned by the trainer).
struct grad_buffers {
  float* grads = nullptr;  ///< the float gradient buffer (model().flat_grads()), on `dev`
  nn::device* dev = &nn::cpu_device();  ///< where grads live
  float* host = nullptr;     ///< a GPU's gradients where the host reads them (null on the CPU)
  int64_t* fixed = nullptr;  ///< bitwise mode's int64 fixed-point sum (null otherwise)
  int64_t size = 0;          ///< elements of each
  int64_t step = 0;          ///< the step in flight (error messages name it)
  int replicas = 1;          ///< the DP group of the step (1 in one process)
  double norm = 0.0;         ///< the gradient norm (known only to before_optimizer stages)
  /// Sharded gradients (train.zero: 2): the element ranges this member holds; the float
  /// gradients are zeroed by giving back the pages outside them (zero_keeping), so that what
  /// it does not hold takes no memory until backward writes it. Null otherwise.
  const std::vector<std::pair<std::size_t, std::size_t>>* held = nullptr;
  /// Zeros the float gradients (on the host, keeping only `held` in RAM when set).
  void zero_grads();

  /// The float gradients where the host reads them, elements [offset, offset + count)
  /// brought there first (copied from a GPU); index the result by the same offsets as grads.
  const float* host_read(int64_t offset, int64_t count) {
    if (host == nullptr) return grads;
    dev->to_host(host + offset, grads + offset, static_cast<std::size_t>(count) * sizeof(float));
    return host;
  }
  /// Where the host writes float gradients (index by offset); call host_written after.
  float* host_write() { return host == nullptr ? grads : host; }
  /// Elements [offset, offset + count) written through host_write() go to the device.
  void host_written(int64_t offset, int64_t count) {
    if (host != nullptr)
      dev->from_host(grads + offset, host + offset,
                     static_cast<std::size_t>(count) * sizeof(float));
  }
};

class grad_stage {
 public:
  virtual ~grad_stage() = default;
  /// The stage's name, as grad_pipeline::names() lists it.
  virtual const char* name() const = 0;
  /// Called before each micro-batch's backward adds into b.grads (most stages: nothing).
  virtual void begin_micro_batch(grad_buffers& b) { (void)b; }
  /// Does the stage's work on elements [offset, offset + count) of the buffers.
  virtual void run(grad_buffers& b, int64_t offset, int64_t count) = 0;
};

}  // namespace cohort::train
