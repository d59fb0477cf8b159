// Elementwise kernels of the forward and backward passes: ReLU, GELU (tanh form) and the
// residual add, each a portable body plus an AVX2/FMA build (simd.hpp).
#include <cmath>

#include "runtime/cpu/kernels.hpp"
#include "runtime/cpu/simd.hpp"

namespace cohort::cpu {

namespace {

using detail::use_avx2;
#if COHORT_X86
using detail::exp8;
#endif

constexpr float k_gelu_c = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float k_gelu_a = 0.044715f;

COHORT_INLINE void relu_fwd_body(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}
COHORT_TWO_BUILDS(void, relu_fwd, (float* y, const float* x, int64_t n), (y, x, n))

COHORT_INLINE void relu_bwd_body(float* dx, const float* dy, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
}
COHORT_TWO_BUILDS(void, relu_bwd, (float* dx, const float* dy, const float* x, int64_t n),
                  (dx, dy, x, n))

COHORT_INLINE void add_body(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}
COHORT_TWO_BUILDS(void, add, (float* y, const float* x, int64_t n), (y, x, n))

// ---- GELU (tanh form) ------------------------------------------------------------------------
// 0.5 x (1 + tanh(u)) == x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3): one exp per
// element and no tanh call. d/dx = s + 2 x s (1 - s) u', s = sigmoid(2u).

void gelu_fwd_generic(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float xi = x[i];
    const float u = k_gelu_c * (xi + k_gelu_a * xi * xi * xi);
    y[i] = xi / (1.0f + std::exp(-2.0f * u));
  }
}

void gelu_bwd_generic(float* dx, const float* dy, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float xi = x[i];
    const float u = k_gelu_c * (xi + k_gelu_a * xi * xi * xi);
    const float s = 1.0f / (1.0f + std::exp(-2.0f * u));
    const float du = k_gelu_c * (1.0f + 3.0f * k_gelu_a * xi * xi);
    dx[i] = dy[i] * (s + 2.0f * xi * s * (1.0f - s) * du);
  }
}

#if COHORT_X86
COHORT_AVX2 COHORT_INLINE __m256 sigmoid2u8(__m256 x, __m256* du_out) {
  const __m256 x2 = _mm256_mul_ps(x, x);
  const __m256 inner = _mm256_fmadd_ps(_mm256_set1_ps(k_gelu_a), x2, _mm256_set1_ps(1.0f));
  const __m256 u = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(k_gelu_c), x), inner);
  if (du_out)
    *du_out =
        _mm256_mul_ps(_mm256_set1_ps(k_gelu_c),
                      _mm256_fmadd_ps(_mm256_set1_ps(3.0f * k_gelu_a), x2, _mm256_set1_ps(1.0f)));
  const __m256 e = exp8(_mm256_mul_ps(_mm256_set1_ps(-2.0f), u));
  return _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

COHORT_AVX2 void gelu_fwd_avx2(float* y, const float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 xv = _mm256_loadu_ps(x + i);
    _mm256_storeu_ps(y + i, _mm256_mul_ps(xv, sigmoid2u8(xv, nullptr)));
  }
  for (; i < n; ++i) {
    alignas(32) float buf[8] = {x[i], 0, 0, 0, 0, 0, 0, 0};
    const __m256 xv = _mm256_load_ps(buf);
    _mm256_store_ps(buf, _mm256_mul_ps(xv, sigmoid2u8(xv, nullptr)));
    y[i] = buf[0];
  }
}

COHORT_AVX2 COHORT_INLINE __m256 gelu_grad8(__m256 xv, __m256 dyv) {
  const __m256 one = _mm256_set1_ps(1.0f), two = _mm256_set1_ps(2.0f);
  __m256 du;
  const __m256 s = sigmoid2u8(xv, &du);
  const __m256 t = _mm256_mul_ps(_mm256_mul_ps(two, xv), _mm256_mul_ps(s, _mm256_sub_ps(one, s)));
  return _mm256_mul_ps(dyv, _mm256_fmadd_ps(t, du, s));
}

COHORT_AVX2 void gelu_bwd_avx2(float* dx, const float* dy, const float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dx + i, gelu_grad8(_mm256_loadu_ps(x + i), _mm256_loadu_ps(dy + i)));
  for (; i < n; ++i) {
    alignas(32) float bx[8] = {x[i], 0, 0, 0, 0, 0, 0, 0};
    alignas(32) float bd[8] = {dy[i], 0, 0, 0, 0, 0, 0, 0};
    _mm256_store_ps(bx, gelu_grad8(_mm256_load_ps(bx), _mm256_load_ps(bd)));
    dx[i] = bx[0];
  }
}
#endif

}  // namespace

void relu_fwd(float* y, const float* x, int64_t n) { relu_fwd_dispatch(y, x, n); }
void relu_bwd(float* dx, const float* dy, const float* x, int64_t n) {
  relu_bwd_dispatch(dx, dy, x, n);
}

void gelu_fwd(float* y, const float* x, int64_t n) {
#if COHORT_X86
  if (use_avx2()) return gelu_fwd_avx2(y, x, n);
#endif
  gelu_fwd_generic(y, x, n);
}

void gelu_bwd(float* dx, const float* dy, const float* x, int64_t n) {
#if COHORT_X86
  if (use_avx2()) return gelu_bwd_avx2(dx, dy, x, n);
#endif
  gelu_bwd_generic(dx, dy, x, n);
}

void add_inplace(float* y, const float* x, int64_t n) { add_dispatch(y, x, n); }

}  // namespace cohort::cpu
