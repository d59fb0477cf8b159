// Stage momentum_share (1-bit Adam, frozen phase, before the sum): on the compressed ranges
// the buffer stops carrying this replica's gradient and carries its share of the new momentum,
// beta1 / replicas * m + (1 - beta1) * g, so that the DP sum is the momentum itself
// (onebit.hpp). Uncompressed ranges keep their gradient.
#pragma once
#include "runtime/nn/optim.hpp"
#include "runtime/train/grad_stage.hpp"

namespace cohort::train {

class momentum_share_stage final : public grad_stage {
 public:
  /// OPT: the frozen optimizer whose momentum is read (outlives the stage).
  explicit momentum_share_stage(const nn::onebit_adam& opt) : opt_(opt) {}
  const char* name() const override { return "momentum_share"; }
  /// add_momentum_share over the range, with b.replicas shares.
  void run(grad_buffers& b, int64_t offset, int64_t count) override;

 private:
  const nn::onebit_adam& opt_;
};

}  // namespace cohort::train
