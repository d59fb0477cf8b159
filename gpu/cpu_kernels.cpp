// CPU twins of gpu/kernels.hpp: the reference every CUDA kernel is checked against and
// the CPU training path. Matrix products go to OpenBLAS; the elementwise and row-wise
// loops have a portable body plus an AVX2/FMA build of the same body chosen once at run
// time, because the project compiles for x86-64-v2 and GELU / softmax spend most of their
// time in exp, which the compiler will not vectorise on its own.
#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#define COHORT_X86 1
#else
#define COHORT_X86 0
#endif

#include "gpu/kernels.hpp"

namespace cohort::gpu::cpu {

namespace {

#define COHORT_INLINE inline __attribute__((always_inline))

#if COHORT_X86
#define COHORT_AVX2 __attribute__((target("avx2,fma")))
bool cpu_has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}
#else
bool cpu_has_avx2() { return false; }
#endif

// -1: not decided yet (first use picks what the CPU supports); 0: portable; 1: AVX2.
std::atomic<int> g_simd{-1};

bool use_avx2() {
  int v = g_simd.load(std::memory_order_relaxed);
  if (v < 0) {
    v = cpu_has_avx2() ? 1 : 0;
    g_simd.store(v, std::memory_order_relaxed);
  }
  return v == 1;
}

// Builds NAME_avx2 (AVX2/FMA code generation) and NAME_generic from one inline NAME_body and
// a dispatcher NAME_dispatch that picks one; the body is written once, so both paths compute the
// same thing in the same order.
#if COHORT_X86
#define COHORT_TWO_BUILDS(ret, name, params, args)                \
  COHORT_AVX2 ret name##_avx2 params { return name##_body args; } \
  ret name##_generic params { return name##_body args; }          \
  ret name##_dispatch params { return use_avx2() ? name##_avx2 args : name##_generic args; }
#else
#define COHORT_TWO_BUILDS(ret, name, params, args) \
  ret name##_dispatch params { return name##_body args; }
#endif

constexpr float k_gelu_c = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float k_gelu_a = 0.044715f;

// ---- exp: scalar and 8-wide ------------------------------------------------------------

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

COHORT_AVX2 COHORT_INLINE float hmax8(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

// ---- row helpers used by the softmaxes ---------------------------------------------------

float row_max_generic(const float* x, int n) {
  float m = -INFINITY;
  for (int i = 0; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

/// y[i] = exp(x[i] - shift); returns the sum (y may alias x).
float exp_shift_sum_generic(float* y, const float* x, int n, float shift) {
  float s = 0.0f;
  for (int i = 0; i < n; ++i) {
    y[i] = std::exp(x[i] - shift);
    s += y[i];
  }
  return s;
}

#if COHORT_X86
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

// ---- elementwise bodies (one source, two code generations) --------------------------------

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

// LayerNorm forward of one row: two passes (mean, then centred variance) as PyTorch does,
// which keeps the variance accurate when |mean| >> std.
COHORT_INLINE void layernorm_fwd_body(float* y, float* mean, float* rstd, const float* x,
                                      const float* w, const float* b, int rows, int c, float eps) {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<int64_t>(r) * c;
    float* yr = y + static_cast<int64_t>(r) * c;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= c; i += 8)
      for (int k = 0; k < 8; ++k) acc[k] += xr[i + k];
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < c; ++i) s += xr[i];
    const float mu = s / c;
    float vacc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    i = 0;
    for (; i + 8 <= c; i += 8)
      for (int k = 0; k < 8; ++k) {
        const float d = xr[i + k] - mu;
        vacc[k] += d * d;
      }
    float var =
        ((vacc[0] + vacc[1]) + (vacc[2] + vacc[3])) + ((vacc[4] + vacc[5]) + (vacc[6] + vacc[7]));
    for (; i < c; ++i) var += (xr[i] - mu) * (xr[i] - mu);
    var /= c;
    const float rs = 1.0f / std::sqrt(var + eps);
    for (i = 0; i < c; ++i) yr[i] = (xr[i] - mu) * rs * w[i] + b[i];
    mean[r] = mu;
    rstd[r] = rs;
  }
}
void layernorm_fwd_generic(float* y, float* mean, float* rstd, const float* x, const float* w,
                           const float* b, int rows, int c, float eps) {
  layernorm_fwd_body(y, mean, rstd, x, w, b, rows, c, eps);
}

#if COHORT_X86
// Rows whose width is a multiple of 8 (every model here) take the intrinsics; others the
// shared body. Same two-pass formulas as the body.
COHORT_AVX2 void layernorm_fwd_avx2(float* y, float* mean, float* rstd, const float* x,
                                    const float* w, const float* b, int rows, int c, float eps) {
  if (c % 8 != 0) return layernorm_fwd_body(y, mean, rstd, x, w, b, rows, c, eps);
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<int64_t>(r) * c;
    float* yr = y + static_cast<int64_t>(r) * c;
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < c; i += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(xr + i));
    const float mu = hsum8(acc) / c;
    const __m256 vmu = _mm256_set1_ps(mu);
    __m256 vacc = _mm256_setzero_ps();
    for (int i = 0; i < c; i += 8) {
      const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(xr + i), vmu);
      vacc = _mm256_fmadd_ps(d, d, vacc);
    }
    const float rs = 1.0f / std::sqrt(hsum8(vacc) / c + eps);
    const __m256 vrs = _mm256_set1_ps(rs);
    for (int i = 0; i < c; i += 8) {
      const __m256 norm = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(xr + i), vmu), vrs);
      _mm256_storeu_ps(yr + i,
                       _mm256_fmadd_ps(norm, _mm256_loadu_ps(w + i), _mm256_loadu_ps(b + i)));
    }
    mean[r] = mu;
    rstd[r] = rs;
  }
}
#endif

void layernorm_fwd_dispatch(float* y, float* mean, float* rstd, const float* x, const float* w,
                            const float* b, int rows, int c, float eps) {
#if COHORT_X86
  if (use_avx2()) return layernorm_fwd_avx2(y, mean, rstd, x, w, b, rows, c, eps);
#endif
  layernorm_fwd_generic(y, mean, rstd, x, w, b, rows, c, eps);
}

// dx = rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)), dnorm = dy * w.
COHORT_INLINE void layernorm_bwd_body(float* dx, float* dw, float* db, const float* dy,
                                      const float* x, const float* w, const float* mean,
                                      const float* rstd, int rows, int c) {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<int64_t>(r) * c;
    const float* dyr = dy + static_cast<int64_t>(r) * c;
    float* dxr = dx + static_cast<int64_t>(r) * c;
    const float mu = mean[r], rs = rstd[r];
    float a1[8] = {0, 0, 0, 0, 0, 0, 0, 0}, a2[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= c; i += 8)
      for (int k = 0; k < 8; ++k) {
        const float norm = (xr[i + k] - mu) * rs;
        const float dn = dyr[i + k] * w[i + k];
        a1[k] += dn;
        a2[k] += dn * norm;
        db[i + k] += dyr[i + k];
        dw[i + k] += dyr[i + k] * norm;
      }
    float s1 = ((a1[0] + a1[1]) + (a1[2] + a1[3])) + ((a1[4] + a1[5]) + (a1[6] + a1[7]));
    float s2 = ((a2[0] + a2[1]) + (a2[2] + a2[3])) + ((a2[4] + a2[5]) + (a2[6] + a2[7]));
    for (; i < c; ++i) {
      const float norm = (xr[i] - mu) * rs;
      const float dn = dyr[i] * w[i];
      s1 += dn;
      s2 += dn * norm;
      db[i] += dyr[i];
      dw[i] += dyr[i] * norm;
    }
    const float m1 = s1 / c, m2 = s2 / c;
    for (i = 0; i < c; ++i) {
      const float norm = (xr[i] - mu) * rs;
      dxr[i] = rs * (dyr[i] * w[i] - m1 - norm * m2);
    }
  }
}
void layernorm_bwd_generic(float* dx, float* dw, float* db, const float* dy, const float* x,
                           const float* w, const float* mean, const float* rstd, int rows, int c) {
  layernorm_bwd_body(dx, dw, db, dy, x, w, mean, rstd, rows, c);
}

#if COHORT_X86
COHORT_AVX2 void layernorm_bwd_avx2(float* dx, float* dw, float* db, const float* dy,
                                    const float* x, const float* w, const float* mean,
                                    const float* rstd, int rows, int c) {
  if (c % 8 != 0) return layernorm_bwd_body(dx, dw, db, dy, x, w, mean, rstd, rows, c);
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<int64_t>(r) * c;
    const float* dyr = dy + static_cast<int64_t>(r) * c;
    float* dxr = dx + static_cast<int64_t>(r) * c;
    const __m256 vmu = _mm256_set1_ps(mean[r]), vrs = _mm256_set1_ps(rstd[r]);
    __m256 a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps();
    for (int i = 0; i < c; i += 8) {
      const __m256 norm = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(xr + i), vmu), vrs);
      const __m256 d = _mm256_loadu_ps(dyr + i);
      const __m256 dn = _mm256_mul_ps(d, _mm256_loadu_ps(w + i));
      a1 = _mm256_add_ps(a1, dn);
      a2 = _mm256_fmadd_ps(dn, norm, a2);
      _mm256_storeu_ps(db + i, _mm256_add_ps(_mm256_loadu_ps(db + i), d));
      _mm256_storeu_ps(dw + i, _mm256_fmadd_ps(d, norm, _mm256_loadu_ps(dw + i)));
    }
    const __m256 m1 = _mm256_set1_ps(hsum8(a1) / c), m2 = _mm256_set1_ps(hsum8(a2) / c);
    for (int i = 0; i < c; i += 8) {
      const __m256 norm = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(xr + i), vmu), vrs);
      const __m256 dn = _mm256_mul_ps(_mm256_loadu_ps(dyr + i), _mm256_loadu_ps(w + i));
      const __m256 t = _mm256_sub_ps(_mm256_sub_ps(dn, m1), _mm256_mul_ps(norm, m2));
      _mm256_storeu_ps(dxr + i, _mm256_mul_ps(vrs, t));
    }
  }
}
#endif

void layernorm_bwd_dispatch(float* dx, float* dw, float* db, const float* dy, const float* x,
                            const float* w, const float* mean, const float* rstd, int rows, int c) {
#if COHORT_X86
  if (use_avx2()) return layernorm_bwd_avx2(dx, dw, db, dy, x, w, mean, rstd, rows, c);
#endif
  layernorm_bwd_generic(dx, dw, db, dy, x, w, mean, rstd, rows, c);
}

COHORT_INLINE void colsum_add_body(float* db, const float* dy, int rows, int out) {
  for (int r = 0; r < rows; ++r) {
    const float* d = dy + static_cast<int64_t>(r) * out;
    for (int j = 0; j < out; ++j) db[j] += d[j];
  }
}
COHORT_TWO_BUILDS(void, colsum_add, (float* db, const float* dy, int rows, int out),
                  (db, dy, rows, out))

COHORT_INLINE void bias_rows_body(float* y, const float* b, int rows, int out) {
  for (int r = 0; r < rows; ++r) std::memcpy(y + static_cast<int64_t>(r) * out, b, out * 4);
}
COHORT_TWO_BUILDS(void, bias_rows, (float* y, const float* b, int rows, int out), (y, b, rows, out))

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

// Causal softmax of one attention row: p[j] = softmax(s[0..i])_j for j <= i, 0 after.
void causal_softmax_row(float* row, int i, int t) {
  const int n = i + 1;
  const float m = row_max(row, n);
  const float inv = 1.0f / exp_shift_sum(row, row, n, m);
  for (int j = 0; j < n; ++j) row[j] *= inv;
  std::memset(row + n, 0, sizeof(float) * (t - n));
}

// Softmax backward of one attention row over its first n entries: dr = scale * p (dr - <p, dr>);
// entries [n, t) are set to zero.
float dot_generic(const float* a, const float* b, int n) {
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

#if COHORT_X86
COHORT_AVX2 float dot_avx2(const float* a, const float* b, int n) {
  __m256 acc = _mm256_setzero_ps();
  int i = 0;
  for (; i + 8 <= n; i += 8)
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  float s = hsum8(acc);
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}
#endif

COHORT_INLINE void softmax_bwd_scale_body(float* dr, const float* pr, int n, float dot, float sc) {
  for (int j = 0; j < n; ++j) dr[j] = sc * pr[j] * (dr[j] - dot);
}
COHORT_TWO_BUILDS(void, softmax_bwd_scale, (float* dr, const float* pr, int n, float dot, float sc),
                  (dr, pr, n, dot, sc))

void softmax_bwd_row(float* dr, const float* pr, int n, int t, float sc) {
#if COHORT_X86
  const float dot = use_avx2() ? dot_avx2(pr, dr, n) : dot_generic(pr, dr, n);
#else
  const float dot = dot_generic(pr, dr, n);
#endif
  softmax_bwd_scale_dispatch(dr, pr, n, dot, sc);
  std::memset(dr + n, 0, sizeof(float) * (t - n));
}

}  // namespace

// ---- public kernels ---------------------------------------------------------------------------

void set_num_threads(int n) { openblas_set_num_threads(n < 1 ? 1 : n); }
int num_threads() { return openblas_get_num_threads(); }

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

void set_portable_kernels(bool on) { g_simd.store(on ? 0 : (cpu_has_avx2() ? 1 : 0)); }
bool simd_kernels() { return use_avx2(); }

void gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
          const float* b, int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n,
              k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void linear_fwd(float* y, const float* x, const float* w, const float* b, int rows, int in,
                int out) {
  // Bias first, then one sgemm with beta = 1: the bias costs no extra pass over y.
  if (b) bias_rows_dispatch(y, b, rows, out);
  gemm(false, true, rows, out, in, 1.0f, x, in, w, in, b ? 1.0f : 0.0f, y, out);
}

void linear_bwd(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w,
                int rows, int in, int out) {
  if (dx) gemm(false, false, rows, in, out, 1.0f, dy, out, w, in, 0.0f, dx, in);
  gemm(true, false, out, in, rows, 1.0f, dy, out, x, in, 1.0f, dw, in);
  if (db) colsum_add_dispatch(db, dy, rows, out);
}

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

void layernorm_fwd(float* y, float* mean, float* rstd, const float* x, const float* w,
                   const float* b, int rows, int c, float eps) {
  layernorm_fwd_dispatch(y, mean, rstd, x, w, b, rows, c, eps);
}

void layernorm_bwd(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w,
                   const float* mean, const float* rstd, int rows, int c) {
  layernorm_bwd_dispatch(dx, dw, db, dy, x, w, mean, rstd, rows, c);
}

void embedding_fwd(float* out, const int32_t* ids, const float* wte, const float* wpe, int b, int t,
                   int c) {
  for (int i = 0; i < b; ++i)
    for (int j = 0; j < t; ++j) {
      const int64_t row = static_cast<int64_t>(i) * t + j;
      float* o = out + row * c;
      const float* e = wte + static_cast<int64_t>(ids[row]) * c;
      if (wpe) {
        const float* p = wpe + static_cast<int64_t>(j) * c;
        for (int k = 0; k < c; ++k) o[k] = e[k] + p[k];
      } else {
        std::memcpy(o, e, sizeof(float) * c);
      }
    }
}

void embedding_bwd(float* dwte, float* dwpe, const float* dout, const int32_t* ids, int b, int t,
                   int c) {
  for (int i = 0; i < b; ++i)
    for (int j = 0; j < t; ++j) {
      const int64_t row = static_cast<int64_t>(i) * t + j;
      const float* d = dout + row * c;
      add_dispatch(dwte + static_cast<int64_t>(ids[row]) * c, d, c);
      if (dwpe) add_dispatch(dwpe + static_cast<int64_t>(j) * c, d, c);
    }
}

// Causal attention touches only the lower triangle of the T x T score matrix. Rows are
// processed in blocks of k_att_block: the scores of rows [r0, r1) need keys [0, r1) only,
// and the gradients of keys/values [c0, c1) need query rows [c0, T) only, so every product
// below skips the all-zero upper blocks (about 40% of the work at T = 128).
constexpr int k_att_block = 32;

void attention_fwd(float* out, float* att, const float* qkv, int b, int t, int c, int nh) {
  const int hs = c / nh;
  const float sc = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int bi = 0; bi < b; ++bi)
    for (int h = 0; h < nh; ++h) {
      const float* q = qkv + static_cast<int64_t>(bi) * t * 3 * c + h * hs;
      const float* k = q + c;
      const float* v = q + 2 * c;
      float* a = att + (static_cast<int64_t>(bi) * nh + h) * t * t;
      float* o = out + static_cast<int64_t>(bi) * t * c + h * hs;
      for (int r0 = 0; r0 < t; r0 += k_att_block) {
        const int r1 = std::min(t, r0 + k_att_block), rows = r1 - r0;
        float* ab = a + static_cast<int64_t>(r0) * t;
        // S = scale * Q K^T for these rows and keys [0, r1); the causal softmax zeroes the
        // rest of each row, so P is exactly lower-triangular.
        gemm(false, true, rows, r1, hs, sc, q + static_cast<int64_t>(r0) * 3 * c, 3 * c, k, 3 * c,
             0.0f, ab, t);
        for (int i = r0; i < r1; ++i) causal_softmax_row(a + static_cast<int64_t>(i) * t, i, t);
        gemm(false, false, rows, hs, r1, 1.0f, ab, t, v, 3 * c, 0.0f,
             o + static_cast<int64_t>(r0) * c, c);
      }
    }
}

void attention_bwd(float* dqkv, float* scratch, const float* dout, const float* qkv,
                   const float* att, int b, int t, int c, int nh) {
  const int hs = c / nh;
  const float sc = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int bi = 0; bi < b; ++bi)
    for (int h = 0; h < nh; ++h) {
      const int64_t base = static_cast<int64_t>(bi) * t * 3 * c + h * hs;
      const float* q = qkv + base;
      const float* k = q + c;
      const float* v = q + 2 * c;
      float* dq = dqkv + base;
      float* dk = dq + c;
      float* dv = dq + 2 * c;
      const float* p = att + (static_cast<int64_t>(bi) * nh + h) * t * t;
      float* ds = scratch + (static_cast<int64_t>(bi) * nh + h) * t * t;
      const float* dO = dout + static_cast<int64_t>(bi) * t * c + h * hs;
      const int64_t ld3 = 3 * c;
      for (int r0 = 0; r0 < t; r0 += k_att_block) {
        const int r1 = std::min(t, r0 + k_att_block), rows = r1 - r0;
        // dP = dO V^T on the causal part, then the softmax backward per row with the score
        // scale folded in: dS = scale * P (dP - <P, dP>), zero above the diagonal.
        float* db = ds + static_cast<int64_t>(r0) * t;
        gemm(false, true, rows, r1, hs, 1.0f, dO + static_cast<int64_t>(r0) * c, c, v, 3 * c, 0.0f,
             db, t);
        for (int i = r0; i < r1; ++i)
          softmax_bwd_row(ds + static_cast<int64_t>(i) * t, p + static_cast<int64_t>(i) * t, i + 1,
                          t, sc);
        // dQ[rows] = dS[rows, 0:r1] K[0:r1].
        gemm(false, false, rows, hs, r1, 1.0f, db, t, k, 3 * c, 0.0f, dq + r0 * ld3, 3 * c);
      }
      for (int c0 = 0; c0 < t; c0 += k_att_block) {
        const int c1 = std::min(t, c0 + k_att_block), cols = c1 - c0;
        // Keys / values [c0, c1) are seen by query rows [c0, T) only:
        // dV = P[c0:T, c0:c1]^T dO[c0:T]; dK = dS[c0:T, c0:c1]^T Q[c0:T].
        const int64_t off = static_cast<int64_t>(c0) * t + c0;
        gemm(true, false, cols, hs, t - c0, 1.0f, p + off, t, dO + static_cast<int64_t>(c0) * c, c,
             0.0f, dv + c0 * ld3, 3 * c);
        gemm(true, false, cols, hs, t - c0, 1.0f, ds + off, t, q + c0 * ld3, 3 * c, 0.0f,
             dk + c0 * ld3, 3 * c);
      }
    }
}

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

void adamw_step(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1,
                float beta2, float eps, float weight_decay, int t) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), t);
  const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), t);
  const float decay = 1.0f - lr * weight_decay;
  const float step_size = static_cast<float>(lr / bc1);
  const float sqrt_bc2 = static_cast<float>(std::sqrt(bc2));
  adamw_dispatch(p, g, m, v, n, lr, beta1, beta2, eps, decay, step_size, sqrt_bc2);
}

void sgd_step(float* p, const float* g, float* buf, int64_t n, float lr, float momentum,
              float weight_decay) {
  sgd_dispatch(p, g, buf, n, lr, momentum, weight_decay);
}

double sum_squares(const float* x, int64_t n) { return sum_squares_dispatch(x, n); }
void scale(float* x, float s, int64_t n) { scale_dispatch(x, s, n); }
void add_inplace(float* y, const float* x, int64_t n) { add_dispatch(y, x, n); }

}  // namespace cohort::gpu::cpu
