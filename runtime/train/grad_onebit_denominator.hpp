// Stages divide_by_denominator (before the sum) and multiply_by_denominator (after it):
// 1-bit Adam's frozen phase sends its momentum shares divided by the frozen Adam denominator
// and multiplies the sum back, so the signs carry the update direction (onebit.hpp says
// why). One class, two directions: the same map and its inverse.
#pragma once
#include "runtime/nn/optim.hpp"
#include "runtime/train/grad_stage.hpp"

namespace cohort::train {

class denominator_stage final : public grad_stage {
 public:
  enum class direction { divide, multiply };
  /// OPT: the frozen optimizer whose v is read (outlives the stage).
  denominator_stage(nn::onebit_adam& opt, direction d) : opt_(opt), dir_(d) {}
  const char* name() const override {
    return dir_ == direction::divide ? "divide_by_denominator" : "multiply_by_denominator";
  }
  /// scale_by_denominator over the range, in this stage's direction.
  void run(grad_buffers& b, int64_t offset, int64_t count) override;

 private:
  nn::onebit_adam& opt_;
  direction dir_;
};

}  // namespace cohort::train
