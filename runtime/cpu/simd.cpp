// The run-time choice between the portable and the AVX2/FMA builds, the calling thread's
// flush-to-zero mode, and the softmax row helpers (max, shifted exp and sum) that attention
// and the cross-entropy loss share.
#include "runtime/cpu/simd.hpp"

#include <algorithm>
#include <cmath>

#include "runtime/cpu/kernels.hpp"

namespace cohort::cpu {

namespace detail {

#if COHORT_X86
bool cpu_has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}
#else
bool cpu_has_avx2() { return false; }
#endif

std::atomic<int> g_simd{-1};

bool use_avx2() {
  int v = g_simd.load(std::memory_order_relaxed);
  if (v < 0) {
    v = cpu_has_avx2() ? 1 : 0;
    g_simd.store(v, std::memory_order_relaxed);
  }
  return v == 1;
}

namespace {

float row_max_generic(const float* x, int n) {
  float m = -INFINITY;
  for (int i = 0; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

float exp_shift_sum_generic(float* y, const float* x, int n, float shift) {
  float s = 0.0f;
  for (int i = 0; i < n; ++i) {
    y[i] = std::exp(x[i] - shift);
    s += y[i];
  }
  return s;
}

#if COHORT_X86
COHORT_AVX2 COHORT_INLINE float hmax8(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

COHORT_AVX2 float row_max_avx2(const float* x, int n) {
  int i = 0;
  float m = -INFINITY;
  if (n >= 8) {
    __m256 vm = _mm256_loadu_ps(x);
    for (i = 8; i + 8 <= n; i += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(x + i));
    m = hmax8(vm);
  }
  for (; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

COHORT_AVX2 float exp_shift_sum_avx2(float* y, const float* x, int n, float shift) {
  const __m256 vs = _mm256_set1_ps(shift);
  __m256 acc = _mm256_setzero_ps();
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vs));
    _mm256_storeu_ps(y + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  if (i < n) {
    // The tail goes through the same 8-wide exp so every element is computed alike.
    alignas(32) float buf[8];
    for (int k = 0; k < 8; ++k) buf[k] = i + k < n ? x[i + k] - shift : -INFINITY;
    const __m256 e = exp8(_mm256_load_ps(buf));
    _mm256_store_ps(buf, e);
    for (int k = 0; i + k < n; ++k) y[i + k] = buf[k];
    acc = _mm256_add_ps(acc, e);  // -inf lanes contribute exp(-87) ~ 1e-38: negligible
  }
  return hsum8(acc);
}
#endif

}  // namespace

float row_max(const float* x, int n) {
#if COHORT_X86
  if (use_avx2()) return row_max_avx2(x, n);
#endif
  return row_max_generic(x, n);
}

float exp_shift_sum(float* y, const float* x, int n, float shift) {
#if COHORT_X86
  if (use_avx2()) return exp_shift_sum_avx2(y, x, n, shift);
#endif
  return exp_shift_sum_generic(y, x, n, shift);
}

}  // namespace detail

void set_flush_denormals(bool on) {
#if COHORT_X86
  // MXCSR bit 15 = flush to zero, bit 6 = denormals are zero.
  const unsigned bits = 0x8040u;
  _mm_setcsr(on ? (_mm_getcsr() | bits) : (_mm_getcsr() & ~bits));
#else
  (void)on;
#endif
}

bool flush_denormals() {
#if COHORT_X86
  return (_mm_getcsr() & 0x8000u) != 0;
#else
  return false;
#endif
}

void set_portable_kernels(bool on) {
  detail::g_simd.store(on ? 0 : (detail::cpu_has_avx2() ? 1 : 0));
}
bool simd_kernels() { return detail::use_avx2(); }

}  // namespace cohort::cpu
