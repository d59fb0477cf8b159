// A data-parallel group of two in one process, its sum done by hand: what the tests of the
// step on a device compare a group's bits against (the transport's part is a plain add).
#pragma once
#include <cstddef>
#include <cstdint>

#include "runtime/train/trainer.hpp"

namespace cohort::test {

/// Step S of replicas A and B: each computes its share with readiness reports, their
/// reduction buffers are summed elementwise into both, and each applies the step.
inline void dp2_step_by_hand(train::trainer& a, train::trainer& b, int64_t s) {
  train::trainer* rep[2] = {&a, &b};
  for (int r = 0; r < 2; ++r) {
    rep[r]->begin_step();
    rep[r]->wire(2, r);
    rep[r]->compute_gradients(s, train::replica_micro_batches(rep[r]->micro_batches(), 2, r),
                              [](std::size_t, std::size_t) {});
  }
  const auto n = static_cast<std::size_t>(a.model().num_params());
  auto add = [n](auto* x, auto* y) {
    for (std::size_t i = 0; i < n; ++i) x[i] = y[i] = x[i] + y[i];
  };
  if (a.reduction_type() == comm::grad_type::i64)
    add(static_cast<int64_t*>(a.reduction_buffer()), static_cast<int64_t*>(b.reduction_buffer()));
  else
    add(static_cast<float*>(a.reduction_buffer()), static_cast<float*>(b.reduction_buffer()));
  a.apply_step(s);
  b.apply_step(s);
}

}  // namespace cohort::test
