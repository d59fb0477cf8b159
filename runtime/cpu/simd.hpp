// Internal to runtime/cpu: how a kernel gets a portable body and an AVX2/FMA build of the same
// body, chosen once at run time (the project compiles for x86-64-v2, and GELU / softmax spend
// most of their time in exp, which the compiler will not vectorise on its own), plus the
// 8-wide helpers and the softmax row helpers more than one kernel file uses. Not a public
// header: callers use runtime/cpu/kernels.hpp.
#pragma once
#include <atomic>
#include <cstdint>

#if defined(__x86_64__)
#include <immintrin.h>
#define COHORT_X86 1
#else
#define COHORT_X86 0
#endif

#define COHORT_INLINE inline __attribute__((always_inline))

#if COHORT_X86
#define COHORT_AVX2 __attribute__((target("avx2,fma")))
#endif

// Builds NAME_avx2 (AVX2/FMA code generation) and NAME_generic from one inline NAME_body and
// a dispatcher NAME_dispatch that picks one; the body is written once, so both paths compute the
// same thing in the same order. Use inside an anonymous namespace of a kernel file.
#if COHORT_X86
#define COHORT_TWO_BUILDS(ret, name, params, args)                                     \
  COHORT_AVX2 ret name##_avx2 params { return name##_body args; }                      \
  ret name##_generic params { return name##_body args; }                               \
  ret name##_dispatch params {                                                         \
    return ::cohort::cpu::detail::use_avx2() ? name##_avx2 args : name##_generic args; \
  }
#else
#define COHORT_TWO_BUILDS(ret, name, params, args) \
  ret name##_dispatch params { return name##_body args; }
#endif

namespace cohort::cpu::detail {

/// -1: not decided yet (first use picks what the CPU supports); 0: portable; 1: AVX2.
extern std::atomic<int> g_simd;
/// Whether this CPU has AVX2 and FMA (asked once).
bool cpu_has_avx2();
/// Whether kernels take their AVX2 build now (set_portable_kernels can turn it off).
bool use_avx2();

/// max of x[0..n).
float row_max(const float* x, int n);
/// y[i] = exp(x[i] - shift); returns the sum (y may alias x).
float exp_shift_sum(float* y, const float* x, int n, float shift);

#if COHORT_X86
// exp(x) by range reduction x = n*ln2 + r, |r| <= ln2/2, and a degree-7 Taylor polynomial
// in r (truncation error < 1e-8 relative, below float rounding), then 2^n through the
// exponent bits. Inputs are clamped so 2^n stays a normal float.
COHORT_AVX2 COHORT_INLINE __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.4426950408889634f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // ln2 split in two so n*ln2_hi is exact in float.
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

COHORT_AVX2 COHORT_INLINE float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

}  // namespace cohort::cpu::detail
