// Causal multi-head self-attention, forward and backward: blocked sgemms over the lower
// triangle of the score matrix and a softmax per row (the row helpers are in simd.cpp).
// The products stay float32 under train.precision: bf16 (detail::gemm_fp32): at the GPT's
// shapes they are hundreds of small products a layer (32-row blocks of one head), where
// oneDNN's cost per call outweighs the bf16 kernels' speed (docs/precision.md has the figures).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "runtime/cpu/kernels.hpp"
#include "runtime/cpu/matmul_bf16.hpp"
#include "runtime/cpu/simd.hpp"

namespace cohort::cpu {

namespace {

using detail::exp_shift_sum;
using detail::row_max;
using detail::use_avx2;
#if COHORT_X86
using detail::hsum8;
#endif

// Causal softmax of one attention row: p[j] = softmax(s[0..i])_j for j <= i, 0 after.
void causal_softmax_row(float* row, int i, int t) {
  const int n = i + 1;
  const float m = row_max(row, n);
  const float inv = 1.0f / exp_shift_sum(row, row, n, m);
  for (int j = 0; j < n; ++j) row[j] *= inv;
  std::memset(row + n, 0, sizeof(float) * (t - n));
}

// <a, b> over n floats: eight lanes with FMA where the CPU has AVX2.
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

float dot_dispatch(const float* a, const float* b, int n) {
#if COHORT_X86
  return use_avx2() ? dot_avx2(a, b, n) : dot_generic(a, b, n);
#else
  return dot_generic(a, b, n);
#endif
}

COHORT_INLINE void softmax_bwd_scale_body(float* dr, const float* pr, int n, float dot, float sc) {
  for (int j = 0; j < n; ++j) dr[j] = sc * pr[j] * (dr[j] - dot);
}
COHORT_TWO_BUILDS(void, softmax_bwd_scale, (float* dr, const float* pr, int n, float dot, float sc),
                  (dr, pr, n, dot, sc))

// Softmax backward of one attention row over its first n entries: dr = scale * p (dr - <p, dr>);
// entries [n, t) are set to zero.
void softmax_bwd_row(float* dr, const float* pr, int n, int t, float sc) {
  softmax_bwd_scale_dispatch(dr, pr, n, dot_dispatch(pr, dr, n), sc);
  std::memset(dr + n, 0, sizeof(float) * (t - n));
}

// Decode attention of one head, in two passes over the cached positions, each one call (the
// positions' loop inside the SIMD build, not a call per position). Scores: s[j] = sc * <q,
// k[j] + off> in eight lanes, summed lane by lane (the AVX2 build turns the lanes into one
// FMA register); mix: y = inv * sum_j s[j] (v[j] + off).
COHORT_INLINE void head_scores_body(float* s, const float* q, const float* const* k, int off,
                                    int n, int hs, float sc) {
  for (int j = 0; j < n; ++j) {
    const float* kj = k[j] + off;
    float lane[8] = {};
    int d = 0;
    for (; d + 8 <= hs; d += 8)
      for (int i = 0; i < 8; ++i) lane[i] += q[d + i] * kj[d + i];
    float dot = ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
    for (; d < hs; ++d) dot += q[d] * kj[d];
    s[j] = sc * dot;
  }
}
COHORT_TWO_BUILDS(void, head_scores,
                  (float* s, const float* q, const float* const* k, int off, int n, int hs, float sc),
                  (s, q, k, off, n, hs, sc))

COHORT_INLINE void head_mix_body(float* y, const float* p, float inv, const float* const* v,
                                 int off, int n, int hs) {
  for (int d = 0; d < hs; ++d) y[d] = 0.0f;
  for (int j = 0; j < n; ++j) {
    const float w = p[j] * inv;
    const float* vj = v[j] + off;
    for (int d = 0; d < hs; ++d) y[d] += w * vj[d];
  }
}
COHORT_TWO_BUILDS(void, head_mix,
                  (float* y, const float* p, float inv, const float* const* v, int off, int n, int hs),
                  (y, p, inv, v, off, n, hs))

// Causal attention touches only the lower triangle of the T x T score matrix. Rows are
// processed in blocks of k_att_block: the scores of rows [r0, r1) need keys [0, r1) only,
// and the gradients of keys/values [c0, c1) need query rows [c0, T) only, so every product
// below skips the all-zero upper blocks (about 40% of the work at T = 128).
constexpr int k_att_block = 32;

}  // namespace

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
        detail::gemm_fp32(false, true, rows, r1, hs, sc, q + static_cast<int64_t>(r0) * 3 * c,
                          3 * c, k, 3 * c, 0.0f, ab, t);
        for (int i = r0; i < r1; ++i) causal_softmax_row(a + static_cast<int64_t>(i) * t, i, t);
        detail::gemm_fp32(false, false, rows, hs, r1, 1.0f, ab, t, v, 3 * c, 0.0f,
                          o + static_cast<int64_t>(r0) * c, c);
      }
    }
}

void attention_decode_row(float* y, const float* q, const float* const* k, const float* const* v,
                          int n, int c, int nh, float* scores) {
  const int hs = c / nh;
  const float sc = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int h = 0; h < nh; ++h) {
    const int off = h * hs;
    head_scores_dispatch(scores, q + off, k, off, n, hs, sc);
    const float m = row_max(scores, n);
    const float inv = 1.0f / exp_shift_sum(scores, scores, n, m);
    head_mix_dispatch(y + off, scores, inv, v, off, n, hs);
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
        detail::gemm_fp32(false, true, rows, r1, hs, 1.0f, dO + static_cast<int64_t>(r0) * c, c, v,
                          3 * c, 0.0f, db, t);
        for (int i = r0; i < r1; ++i)
          softmax_bwd_row(ds + static_cast<int64_t>(i) * t, p + static_cast<int64_t>(i) * t, i + 1,
                          t, sc);
        // dQ[rows] = dS[rows, 0:r1] K[0:r1].
        detail::gemm_fp32(false, false, rows, hs, r1, 1.0f, db, t, k, 3 * c, 0.0f, dq + r0 * ld3,
                          3 * c);
      }
      for (int c0 = 0; c0 < t; c0 += k_att_block) {
        const int c1 = std::min(t, c0 + k_att_block), cols = c1 - c0;
        // Keys / values [c0, c1) are seen by query rows [c0, T) only:
        // dV = P[c0:T, c0:c1]^T dO[c0:T]; dK = dS[c0:T, c0:c1]^T Q[c0:T].
        const int64_t off = static_cast<int64_t>(c0) * t + c0;
        detail::gemm_fp32(true, false, cols, hs, t - c0, 1.0f, p + off, t,
                          dO + static_cast<int64_t>(c0) * c, c, 0.0f, dv + c0 * ld3, 3 * c);
        detail::gemm_fp32(true, false, cols, hs, t - c0, 1.0f, ds + off, t, q + c0 * ld3, 3 * c,
                          0.0f, dk + c0 * ld3, 3 * c);
      }
    }
}

}  // namespace cohort::cpu
