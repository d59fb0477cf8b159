// CUDA twins of the layer ops of runtime/cpu/kernels.hpp (declared in gpu/cuda_kernels.hpp):
// gemm and linear (cuBLAS plus a bias pass and a column sum), layernorm, embedding,
// attention and the softmax cross-entropy. Written for correctness and readability first:
// each kernel mirrors the arithmetic of its CPU twin so the comparison tests can use tight
// tolerances. Reductions run in a fixed order (no float atomics) except the embedding
// backward, where repeated token ids make atomics the simple correct choice.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cmath>
#include <limits>
#include <string>

#include "gpu/cuda_common.cuh"
#include "gpu/cuda_kernels.hpp"

namespace cohort::gpu::cuda {

// The launch geometry, block reductions and host helpers of gpu/cuda_common.cuh.
using namespace detail;

namespace {

// y[r, j] += b[j]: cuBLAS has no bias epilogue for plain sgemm, so the bias is its own pass.
__global__ void add_bias_rows_kernel(float* y, const float* b, int64_t rows, int out) {
  COHORT_GRID_STRIDE(i, rows * out) { y[i] += b[i % out]; }
}

// db[j] += sum_r dy[r, j]: one thread per column walks the rows, so adjacent threads read
// adjacent addresses (coalesced) and each sum has a fixed order (deterministic).
__global__ void colsum_add_kernel(float* db, const float* dy, int rows, int out) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= out) return;
  float s = 0.0f;
  for (int r = 0; r < rows; ++r) s += dy[static_cast<int64_t>(r) * out + j];
  db[j] += s;
}

// One block per row. Two passes (mean, then centred variance) like the CPU twin and PyTorch:
// a one-pass E[x^2] - E[x]^2 loses the variance when |mean| >> std.
__global__ void layernorm_fwd_kernel(float* y, float* mean, float* rstd, const float* x,
                                     const float* w, const float* b, int c, float eps) {
  const int64_t row = blockIdx.x;
  const float* xr = x + row * c;
  float* yr = y + row * c;
  float s = 0.0f;
  for (int i = threadIdx.x; i < c; i += blockDim.x) s += xr[i];
  const float mu = block_sum(s) / c;
  float v = 0.0f;
  for (int i = threadIdx.x; i < c; i += blockDim.x) v += (xr[i] - mu) * (xr[i] - mu);
  const float rs = 1.0f / sqrtf(block_sum(v) / c + eps);
  for (int i = threadIdx.x; i < c; i += blockDim.x) yr[i] = (xr[i] - mu) * rs * w[i] + b[i];
  if (threadIdx.x == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
}

// dx of one row per block: dx = rstd * (dy*w - mean(dy*w) - norm * mean(dy*w*norm)).
__global__ void layernorm_bwd_dx_kernel(float* dx, const float* dy, const float* x, const float* w,
                                        const float* mean, const float* rstd, int c) {
  const int64_t row = blockIdx.x;
  const float* xr = x + row * c;
  const float* dyr = dy + row * c;
  const float mu = mean[row], rs = rstd[row];
  float s1 = 0.0f, s2 = 0.0f;
  for (int i = threadIdx.x; i < c; i += blockDim.x) {
    const float norm = (xr[i] - mu) * rs;
    const float dn = dyr[i] * w[i];
    s1 += dn;
    s2 += dn * norm;
  }
  const float m1 = block_sum(s1) / c;
  const float m2 = block_sum(s2) / c;
  for (int i = threadIdx.x; i < c; i += blockDim.x) {
    const float norm = (xr[i] - mu) * rs;
    dx[row * c + i] = rs * (dyr[i] * w[i] - m1 - norm * m2);
  }
}

// dw[i] += sum_r dy*norm, db[i] += sum_r dy: one thread per column, as colsum_add_kernel,
// so parameter gradients accumulate in a fixed order without atomics.
__global__ void layernorm_bwd_params_kernel(float* dw, float* db, const float* dy, const float* x,
                                            const float* mean, const float* rstd, int rows, int c) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= c) return;
  float sw = 0.0f, sb = 0.0f;
  for (int r = 0; r < rows; ++r) {
    const int64_t k = static_cast<int64_t>(r) * c + i;
    const float norm = (x[k] - mean[r]) * rstd[r];
    sb += dy[k];
    sw += dy[k] * norm;
  }
  dw[i] += sw;
  db[i] += sb;
}

__global__ void embedding_fwd_kernel(float* out, const int32_t* ids, const float* wte,
                                     const float* wpe, int t, int c, int64_t n) {
  COHORT_GRID_STRIDE(i, n) {
    const int64_t row = i / c;
    const int k = static_cast<int>(i % c);
    float e = wte[static_cast<int64_t>(ids[row]) * c + k];
    if (wpe) e += wpe[(row % t) * c + k];
    out[i] = e;
  }
}

// The same token id can appear many times in a batch, so rows of dwte are shared between
// threads: atomicAdd is the simple correct accumulation. Its order varies from run to run,
// so this gradient is not bitwise reproducible (the CPU path is, for determinism: bitwise).
__global__ void embedding_bwd_wte_kernel(float* dwte, const float* dout, const int32_t* ids, int c,
                                         int64_t n) {
  COHORT_GRID_STRIDE(i, n) {
    const int64_t row = i / c;
    atomicAdd(&dwte[static_cast<int64_t>(ids[row]) * c + i % c], dout[i]);
  }
}

// Position t only ever receives rows (b, t): one thread per (t, k) sums over the batch in a
// fixed order, no atomics needed.
__global__ void embedding_bwd_wpe_kernel(float* dwpe, const float* dout, int b, int t, int c) {
  COHORT_GRID_STRIDE(i, static_cast<int64_t>(t) * c) {
    float s = 0.0f;
    for (int bi = 0; bi < b; ++bi) s += dout[static_cast<int64_t>(bi) * t * c + i];
    dwpe[i] += s;
  }
}

// One block per (batch, head, query row i): scores into att, causal softmax in place, then
// out = P V for that row. Straightforward and memory-bound; a fused flash-style kernel can
// replace it once this one is the reference on the GPU side too.
__global__ void attention_fwd_kernel(float* out, float* att, const float* qkv, int t, int c, int nh,
                                     float sc) {
  const int i = blockIdx.x % t;
  const int h = (blockIdx.x / t) % nh;
  const int64_t bi = blockIdx.x / (static_cast<int64_t>(t) * nh);
  const int hs = c / nh;
  const float* q = qkv + (bi * t + i) * 3 * c + h * hs;
  float* a = att + static_cast<int64_t>(blockIdx.x) * t;  // rows of [B,NH,T,T] in block order
  // Each thread keeps the same j's through the three softmax phases, so it only ever reads
  // what it wrote itself; the block reductions are the only cross-thread steps.
  float mx = -INFINITY;
  for (int j = threadIdx.x; j <= i; j += blockDim.x) {
    const float* k = qkv + (bi * t + j) * 3 * c + c + h * hs;
    float s = 0.0f;
    for (int d = 0; d < hs; ++d) s += q[d] * k[d];
    a[j] = s * sc;
    mx = fmaxf(mx, a[j]);
  }
  mx = block_max(mx);
  float sum = 0.0f;
  for (int j = threadIdx.x; j <= i; j += blockDim.x) {
    a[j] = expf(a[j] - mx);
    sum += a[j];
  }
  const float inv = 1.0f / block_sum(sum);
  for (int j = threadIdx.x; j < t; j += blockDim.x) a[j] = j <= i ? a[j] * inv : 0.0f;
  __syncthreads();  // the P V product below reads every thread's probabilities
  float* o = out + (bi * t + i) * c + h * hs;
  for (int d = threadIdx.x; d < hs; d += blockDim.x) {
    float s = 0.0f;
    for (int j = 0; j <= i; ++j) s += a[j] * qkv[(bi * t + j) * 3 * c + 2 * c + h * hs + d];
    o[d] = s;
  }
}

// Backward, step 1, one block per (batch, head, row i): dP[i,j] = dO_i . V_j, then the
// softmax backward with the score scale folded in: dS = scale * P (dP - <P_i, dP_i>),
// written to scratch (0 above the diagonal, as the CPU twin leaves it).
__global__ void attention_bwd_ds_kernel(float* ds, const float* dout, const float* qkv,
                                        const float* att, int t, int c, int nh, float sc) {
  const int i = blockIdx.x % t;
  const int h = (blockIdx.x / t) % nh;
  const int64_t bi = blockIdx.x / (static_cast<int64_t>(t) * nh);
  const int hs = c / nh;
  const float* p = att + static_cast<int64_t>(blockIdx.x) * t;
  float* dr = ds + static_cast<int64_t>(blockIdx.x) * t;
  const float* go = dout + (bi * t + i) * c + h * hs;
  float dot = 0.0f;
  for (int j = threadIdx.x; j <= i; j += blockDim.x) {
    const float* v = qkv + (bi * t + j) * 3 * c + 2 * c + h * hs;
    float s = 0.0f;
    for (int d = 0; d < hs; ++d) s += go[d] * v[d];
    dr[j] = s;
    dot += p[j] * s;
  }
  dot = block_sum(dot);
  for (int j = threadIdx.x; j < t; j += blockDim.x)
    dr[j] = j <= i ? sc * p[j] * (dr[j] - dot) : 0.0f;
}

// Backward, step 2, one block per (batch, head, row r), after every dS row exists:
// dQ_r = sum_{j<=r} dS[r,j] K_j;  dK_r = sum_{i>=r} dS[i,r] Q_i;  dV_r = sum_{i>=r} P[i,r] dO_i.
// Every element of dqkv is written by exactly one thread (assigned, no atomics).
__global__ void attention_bwd_dqkv_kernel(float* dqkv, const float* ds, const float* dout,
                                          const float* qkv, const float* att, int t, int c,
                                          int nh) {
  const int r = blockIdx.x % t;
  const int h = (blockIdx.x / t) % nh;
  const int64_t bi = blockIdx.x / (static_cast<int64_t>(t) * nh);
  const int hs = c / nh;
  const int64_t bh = blockIdx.x / t;  // (bi, h) index into [B,NH,T,T]
  const float* dsb = ds + bh * t * t;
  const float* pb = att + bh * t * t;
  for (int d = threadIdx.x; d < hs; d += blockDim.x) {
    float dq = 0.0f, dk = 0.0f, dv = 0.0f;
    for (int j = 0; j <= r; ++j)
      dq += dsb[static_cast<int64_t>(r) * t + j] * qkv[(bi * t + j) * 3 * c + c + h * hs + d];
    for (int i = r; i < t; ++i) {
      const int64_t ir = static_cast<int64_t>(i) * t + r;
      dk += dsb[ir] * qkv[(bi * t + i) * 3 * c + h * hs + d];
      dv += pb[ir] * dout[(bi * t + i) * c + h * hs + d];
    }
    float* g = dqkv + (bi * t + r) * 3 * c + h * hs + d;
    g[0] = dq;
    g[c] = dk;
    g[2 * c] = dv;
  }
}

// One block per row: max, exp-sum, probabilities, and the loss in log-sum-exp form (exact
// even when probs[target] underflows), as the CPU twin computes it.
__global__ void softmax_xent_fwd_kernel(float* probs, float* losses, const float* logits,
                                        const int32_t* targets, int v) {
  const int64_t row = blockIdx.x;
  const float* lr = logits + row * v;
  float* pr = probs + row * v;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < v; j += blockDim.x) mx = fmaxf(mx, lr[j]);
  mx = block_max(mx);
  float s = 0.0f;
  for (int j = threadIdx.x; j < v; j += blockDim.x) {
    pr[j] = expf(lr[j] - mx);
    s += pr[j];
  }
  s = block_sum(s);
  const float inv = 1.0f / s;
  for (int j = threadIdx.x; j < v; j += blockDim.x) pr[j] *= inv;
  if (threadIdx.x == 0) losses[row] = logf(s) + mx - lr[targets[row]];
}

__global__ void softmax_xent_bwd_kernel(float* dlogits, const float* probs, const int32_t* targets,
                                        int v, float scale, int64_t n) {
  COHORT_GRID_STRIDE(i, n) {
    const float d = probs[i] * scale;
    dlogits[i] = (i % v) == targets[i / v] ? d - scale : d;
  }
}

status check_attention(int b, int t, int c, int nh) {
  if (b < 0 || t < 0 || c < 0 || nh <= 0 || c % nh != 0)
    return bad("attention: need b, t, c >= 0, nh > 0 and c divisible by nh");
  return status::ok;
}

}  // namespace

status gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
            const float* b, int ldb, float beta, float* c, int ldc) {
  if (m < 0 || n < 0 || k < 0) return record(bad("gemm: negative size"));
  cublasHandle_t h = nullptr;
  if (status s = blas_handle(&h); s != status::ok) return record(s);
  // cuBLAS is column-major. A row-major matrix is its transpose read column-major, so
  // C = op(A) op(B) (row-major) is C^T = op(B)^T op(A)^T (column-major): swap the operands
  // and m/n, keep each operand's own transpose flag and leading dimension.
  const cublasStatus_t st =
      cublasSgemm(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k,
                  &alpha, b, ldb, a, lda, &beta, c, ldc);
  if (st != CUBLAS_STATUS_SUCCESS)
    return record(
        set_error(status::cublas_error, std::string("cublasSgemm: ") + cublasGetStatusString(st)));
  return record(status::ok);
}

status linear_fwd(float* y, const float* x, const float* w, const float* b, int rows, int in,
                  int out) {
  if (status s = gemm(false, true, rows, out, in, 1.0f, x, in, w, in, 0.0f, y, out);
      s != status::ok)
    return s;
  if (b == nullptr || rows == 0 || out == 0) return record(status::ok);
  const int64_t n = static_cast<int64_t>(rows) * out;
  add_bias_rows_kernel<<<blocks_for(n), k_threads, 0, stream()>>>(y, b, rows, out);
  return record(launched("add_bias_rows_kernel"));
}

status linear_bwd(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w,
                  int rows, int in, int out) {
  if (dx) {
    if (status s = gemm(false, false, rows, in, out, 1.0f, dy, out, w, in, 0.0f, dx, in);
        s != status::ok)
      return s;
  }
  if (status s = gemm(true, false, out, in, rows, 1.0f, dy, out, x, in, 1.0f, dw, in);
      s != status::ok)
    return s;
  if (db == nullptr || out == 0) return record(status::ok);
  colsum_add_kernel<<<(out + k_threads - 1) / k_threads, k_threads, 0, stream()>>>(db, dy, rows,
                                                                                   out);
  return record(launched("colsum_add_kernel"));
}

status layernorm_fwd(float* y, float* mean, float* rstd, const float* x, const float* w,
                     const float* b, int rows, int c, float eps) {
  if (rows < 0 || c <= 0 || !w || !b) return record(bad("layernorm_fwd: need c > 0, w and b"));
  if (rows == 0) return record(status::ok);
  layernorm_fwd_kernel<<<rows, k_threads, 0, stream()>>>(y, mean, rstd, x, w, b, c, eps);
  return record(launched("layernorm_fwd_kernel"));
}

status layernorm_bwd(float* dx, float* dw, float* db, const float* dy, const float* x,
                     const float* w, const float* mean, const float* rstd, int rows, int c) {
  if (rows < 0 || c <= 0 || !dw || !db) return record(bad("layernorm_bwd: need c > 0, dw and db"));
  if (rows == 0) return record(status::ok);
  layernorm_bwd_dx_kernel<<<rows, k_threads, 0, stream()>>>(dx, dy, x, w, mean, rstd, c);
  if (status s = launched("layernorm_bwd_dx_kernel"); s != status::ok) return record(s);
  layernorm_bwd_params_kernel<<<(c + k_threads - 1) / k_threads, k_threads, 0, stream()>>>(
      dw, db, dy, x, mean, rstd, rows, c);
  return record(launched("layernorm_bwd_params_kernel"));
}

status embedding_fwd(float* out, const int32_t* ids, const float* wte, const float* wpe, int b,
                     int t, int c) {
  if (b < 0 || t < 0 || c < 0) return record(bad("embedding_fwd: negative size"));
  const int64_t n = static_cast<int64_t>(b) * t * c;
  if (n == 0) return record(status::ok);
  embedding_fwd_kernel<<<blocks_for(n), k_threads, 0, stream()>>>(out, ids, wte, wpe, t, c, n);
  return record(launched("embedding_fwd_kernel"));
}

status embedding_bwd(float* dwte, float* dwpe, const float* dout, const int32_t* ids, int b, int t,
                     int c) {
  if (b < 0 || t < 0 || c < 0) return record(bad("embedding_bwd: negative size"));
  const int64_t n = static_cast<int64_t>(b) * t * c;
  if (n == 0) return record(status::ok);
  embedding_bwd_wte_kernel<<<blocks_for(n), k_threads, 0, stream()>>>(dwte, dout, ids, c, n);
  if (status s = launched("embedding_bwd_wte_kernel"); s != status::ok) return record(s);
  if (dwpe == nullptr) return record(status::ok);
  embedding_bwd_wpe_kernel<<<blocks_for(static_cast<int64_t>(t) * c), k_threads, 0, stream()>>>(
      dwpe, dout, b, t, c);
  return record(launched("embedding_bwd_wpe_kernel"));
}

status attention_fwd(float* out, float* att, const float* qkv, int b, int t, int c, int nh) {
  if (status s = check_attention(b, t, c, nh); s != status::ok) return record(s);
  const int64_t rows = static_cast<int64_t>(b) * nh * t;
  if (rows == 0) return record(status::ok);
  if (rows > std::numeric_limits<int>::max()) return record(bad("attention_fwd: b*nh*t too large"));
  const float sc = 1.0f / sqrtf(static_cast<float>(c / nh));
  attention_fwd_kernel<<<static_cast<int>(rows), k_threads / 2, 0, stream()>>>(out, att, qkv, t, c,
                                                                               nh, sc);
  return record(launched("attention_fwd_kernel"));
}

status attention_bwd(float* dqkv, float* scratch, const float* dout, const float* qkv,
                     const float* att, int b, int t, int c, int nh) {
  if (status s = check_attention(b, t, c, nh); s != status::ok) return record(s);
  const int64_t rows = static_cast<int64_t>(b) * nh * t;
  if (rows == 0) return record(status::ok);
  if (rows > std::numeric_limits<int>::max()) return record(bad("attention_bwd: b*nh*t too large"));
  const float sc = 1.0f / sqrtf(static_cast<float>(c / nh));
  attention_bwd_ds_kernel<<<static_cast<int>(rows), k_threads / 2, 0, stream()>>>(
      scratch, dout, qkv, att, t, c, nh, sc);
  if (status s = launched("attention_bwd_ds_kernel"); s != status::ok) return record(s);
  attention_bwd_dqkv_kernel<<<static_cast<int>(rows), 64, 0, stream()>>>(dqkv, scratch, dout, qkv,
                                                                         att, t, c, nh);
  return record(launched("attention_bwd_dqkv_kernel"));
}

float softmax_xent_fwd(float* probs, float* losses, const float* logits, const int32_t* targets,
                       int n, int v) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  if (n < 0 || v <= 0) {
    record(bad("softmax_xent_fwd: need n >= 0, v > 0"));
    return nan;
  }
  if (n == 0) {
    record(status::ok);
    return 0.0f;  // as the CPU twin: the mean over no rows is 0
  }
  softmax_xent_fwd_kernel<<<n, k_threads, 0, stream()>>>(probs, losses, logits, targets, v);
  double total = 0.0;
  status s = launched("softmax_xent_fwd_kernel");
  if (s == status::ok) s = reduce_to_host(&total, losses, n, false);
  record(s);
  return s == status::ok ? static_cast<float>(total / n) : nan;
}

status softmax_xent_bwd(float* dlogits, const float* probs, const int32_t* targets, int n, int v,
                        float scale) {
  if (n < 0 || v <= 0) return record(bad("softmax_xent_bwd: need n >= 0, v > 0"));
  const int64_t total = static_cast<int64_t>(n) * v;
  if (total == 0) return record(status::ok);
  softmax_xent_bwd_kernel<<<blocks_for(total), k_threads, 0, stream()>>>(dlogits, probs, targets, v,
                                                                         scale, total);
  return record(launched("softmax_xent_bwd_kernel"));
}

}  // namespace cohort::gpu::cuda
