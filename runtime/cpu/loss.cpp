// Softmax cross-entropy over the vocabulary (or classes), forward and backward.
#include <cmath>

#include "runtime/cpu/kernels.hpp"
#include "runtime/cpu/simd.hpp"

namespace cohort::cpu {

using detail::exp_shift_sum;
using detail::row_max;

float softmax_xent_fwd(float* probs, float* losses, const float* logits, const int32_t* targets,
                       int n, int v) {
  double total = 0.0;
  for (int r = 0; r < n; ++r) {
    const float* lr = logits + static_cast<int64_t>(r) * v;
    float* pr = probs + static_cast<int64_t>(r) * v;
    const float m = row_max(lr, v);
    const float s = exp_shift_sum(pr, lr, v, m);
    const float inv = 1.0f / s;
    for (int j = 0; j < v; ++j) pr[j] *= inv;
    // log-sum-exp form: exact even when probs[target] underflows to 0.
    const float loss = std::log(s) + m - lr[targets[r]];
    losses[r] = loss;
    total += loss;
  }
  return n > 0 ? static_cast<float>(total / n) : 0.0f;
}

void softmax_xent_bwd(float* dlogits, const float* probs, const int32_t* targets, int n, int v,
                      float scale) {
  for (int r = 0; r < n; ++r) {
    const float* pr = probs + static_cast<int64_t>(r) * v;
    float* dr = dlogits + static_cast<int64_t>(r) * v;
    for (int j = 0; j < v; ++j) dr[j] = pr[j] * scale;
    dr[targets[r]] -= scale;
  }
}

}  // namespace cohort::cpu
