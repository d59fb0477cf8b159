// One stage of the gradient path: a small, elementwise step a gradient range takes between
// backward and the optimizer (grad_pipeline.hpp chooses and orders them). A stage owns no
// gradient buffer, it works on the trainer's through grad_buffers; it knows nothing of the
// config mode that chose it nor of the DP sum (runtime/comm does the sum).
#pragma once
#include <cstdint>

namespace cohort::train {

/// The buffers and facts of the step in flight a stage works on (views, owned by the trainer).
struct grad_buffers {
  float* grads = nullptr;    ///< the float gradient buffer (model().flat_grads())
  int64_t* fixed = nullptr;  ///< bitwise mode's int64 fixed-point sum (null otherwise)
  int64_t size = 0;          ///< elements of each
  int64_t step = 0;          ///< the step in flight (error messages name it)
  int replicas = 1;          ///< the DP group of the step (1 in one process)
  double norm = 0.0;         ///< the gradient norm (known only to before_optimizer stages)
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
