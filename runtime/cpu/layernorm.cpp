// LayerNorm forward and backward: one body per direction, built twice (portable and
// AVX2/FMA, simd.hpp), with hand-written intrinsics for rows whose width is a multiple of 8.
#include <cmath>

#include "runtime/cpu/kernels.hpp"
#include "runtime/cpu/simd.hpp"

namespace cohort::cpu {

namespace {

using detail::use_avx2;
#if COHORT_X86
using detail::hsum8;
#endif

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

}  // namespace

void layernorm_fwd(float* y, float* mean, float* rstd, const float* x, const float* w,
                   const float* b, int rows, int c, float eps) {
  layernorm_fwd_dispatch(y, mean, rstd, x, w, b, rows, c, eps);
}

void layernorm_bwd(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w,
                   const float* mean, const float* rstd, int rows, int c) {
  layernorm_bwd_dispatch(dx, dw, db, dy, x, w, mean, rstd, rows, c);
}

}  // namespace cohort::cpu
