// Optimizer updates (AdamW, SGD with momentum) and the two passes of gradient-norm clipping
// (sum of squares, scale), each a portable body plus an AVX2/FMA build (simd.hpp).
#include <cmath>

#include "runtime/cpu/kernels.hpp"
#include "runtime/cpu/matmul_bf16.hpp"
#include "runtime/cpu/simd.hpp"

namespace cohort::cpu {

namespace {

using detail::use_avx2;

COHORT_INLINE void scale_body(float* x, float s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}
COHORT_TWO_BUILDS(void, scale, (float* x, float s, int64_t n), (x, s, n))

// Eight double lanes so the compiler can keep them in vector registers without
// reassociating a single running sum.
COHORT_INLINE double sum_squares_body(const float* x, int64_t n) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += static_cast<double>(x[i + k]) * x[i + k];
  for (; i < n; ++i) acc[0] += static_cast<double>(x[i]) * x[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}
COHORT_TWO_BUILDS(double, sum_squares, (const float* x, int64_t n), (x, n))

COHORT_INLINE void adamw_body(float* p, const float* g, float* m, float* v, int64_t n, float lr,
                              float beta1, float beta2, float eps, float decay, float step_size,
                              float sqrt_bc2) {
  // Same order of operations as torch.optim.AdamW (non-fused, PyTorch 1.13).
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i];
    const float mi = m[i] * beta1 + (1.0f - beta1) * gi;
    const float vi = v[i] * beta2 + (1.0f - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) / sqrt_bc2 + eps;
    p[i] = p[i] * decay - step_size * (mi / denom);
  }
}
void adamw_generic(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1,
                   float beta2, float eps, float decay, float step_size, float sqrt_bc2) {
  adamw_body(p, g, m, v, n, lr, beta1, beta2, eps, decay, step_size, sqrt_bc2);
}

#if COHORT_X86
// Hand-written because std::sqrt keeps the compiler from vectorising the loop (errno).
COHORT_AVX2 void adamw_avx2(float* p, const float* g, float* m, float* v, int64_t n, float lr,
                            float beta1, float beta2, float eps, float decay, float step_size,
                            float sqrt_bc2) {
  const __m256 b1 = _mm256_set1_ps(beta1), b2 = _mm256_set1_ps(beta2);
  const __m256 c1 = _mm256_set1_ps(1.0f - beta1), c2 = _mm256_set1_ps(1.0f - beta2);
  const __m256 ve = _mm256_set1_ps(eps), vd = _mm256_set1_ps(decay);
  const __m256 vs = _mm256_set1_ps(step_size), vb = _mm256_set1_ps(sqrt_bc2);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 gi = _mm256_loadu_ps(g + i);
    const __m256 mi = _mm256_fmadd_ps(_mm256_loadu_ps(m + i), b1, _mm256_mul_ps(c1, gi));
    const __m256 vi =
        _mm256_fmadd_ps(_mm256_loadu_ps(v + i), b2, _mm256_mul_ps(_mm256_mul_ps(c2, gi), gi));
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
    const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), vb), ve);
    const __m256 pi = _mm256_loadu_ps(p + i);
    _mm256_storeu_ps(p + i, _mm256_fnmadd_ps(vs, _mm256_div_ps(mi, denom), _mm256_mul_ps(pi, vd)));
  }
  adamw_body(p + i, g + i, m + i, v + i, n - i, lr, beta1, beta2, eps, decay, step_size, sqrt_bc2);
}
#endif

void adamw_dispatch(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1,
                    float beta2, float eps, float decay, float step_size, float sqrt_bc2) {
#if COHORT_X86
  if (use_avx2())
    return adamw_avx2(p, g, m, v, n, lr, beta1, beta2, eps, decay, step_size, sqrt_bc2);
#endif
  adamw_generic(p, g, m, v, n, lr, beta1, beta2, eps, decay, step_size, sqrt_bc2);
}

COHORT_INLINE void sgd_body(float* p, const float* g, float* buf, int64_t n, float lr,
                            float momentum, float weight_decay) {
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] + weight_decay * p[i];
    const float bi = momentum * buf[i] + gi;
    buf[i] = bi;
    p[i] -= lr * bi;
  }
}
COHORT_TWO_BUILDS(void, sgd,
                  (float* p, const float* g, float* buf, int64_t n, float lr, float momentum,
                   float weight_decay),
                  (p, g, buf, n, lr, momentum, weight_decay))

}  // namespace

void adamw_step(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1,
                float beta2, float eps, float weight_decay, int t) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), t);
  const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), t);
  const float decay = 1.0f - lr * weight_decay;
  const float step_size = static_cast<float>(lr / bc1);
  const float sqrt_bc2 = static_cast<float>(std::sqrt(bc2));
  adamw_dispatch(p, g, m, v, n, lr, beta1, beta2, eps, decay, step_size, sqrt_bc2);
  detail::params_changed();
}

void onebit_adam_frozen_step(float* p, const float* momentum, float* m, const float* v, int64_t n,
                             float lr, float beta1, float beta2, float eps, float weight_decay,
                             int t, int frozen_t) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), t);
  const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), frozen_t);
  const float decay = 1.0f - lr * weight_decay;
  const float step_size = static_cast<float>(lr / bc1);
  const float sqrt_bc2 = static_cast<float>(std::sqrt(bc2));
  // One portable body: the same bits on every machine (the update is not the hot loop).
  // A variance of exactly 0 at the freeze: the element never had a gradient (an input that
  // was always 0). Its momentum is 0 and stays 0: the signs would otherwise hand it +-scale,
  // divided by eps alone (the mask DeepSpeed's users must write by hand). Selects rather
  // than branches, so that the loop vectorizes; sqrt and division are exact either way.
  for (int64_t i = 0; i < n; ++i) {
    const float sent = momentum[i];  // read unconditionally: a select, not a branch
    const float mi = v[i] == 0.0f ? 0.0f : sent;
    m[i] = mi;
    const float denom = std::sqrt(v[i]) / sqrt_bc2 + eps;
    p[i] = p[i] * decay - step_size * (mi / denom);
  }
  detail::params_changed();
}

void onebit_momentum_share(float* g, const float* m, int64_t n, float a, float b) {
  for (int64_t i = 0; i < n; ++i) g[i] = a * m[i] + b * g[i];
}

void onebit_scale_by_denominator(float* g, const float* v, int64_t n, float sqrt_bc2, float eps,
                                 bool divide) {
  // Why it divides: runtime/train/onebit.cpp. Selects rather than branches, the direction
  // chosen outside the loop: the loops vectorize, and sqrt and division are exact in SIMD
  // too, so the bits are the scalar loop's.
  auto scaled = [&](auto apply) {
    for (int64_t i = 0; i < n; ++i) {
      const float gi = v[i] == 0.0f ? 0.0f : g[i];
      g[i] = apply(gi, std::sqrt(v[i]) / sqrt_bc2 + eps);
    }
  };
  if (divide)
    scaled([](float x, float d) { return x / d; });
  else
    scaled([](float x, float d) { return x * d; });
}

void sgd_step(float* p, const float* g, float* buf, int64_t n, float lr, float momentum,
              float weight_decay) {
  sgd_dispatch(p, g, buf, n, lr, momentum, weight_decay);
  detail::params_changed();
}

double sum_squares(const float* x, int64_t n) { return sum_squares_dispatch(x, n); }
void scale(float* x, float s, int64_t n) { scale_dispatch(x, s, n); }

}  // namespace cohort::cpu
