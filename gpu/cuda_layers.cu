// CUDA twins of the layer ops of runtime/cpu/kernels.hpp (declared in gpu/cuda_kernels.hpp):
// layernorm and the softmax cross-entropy. Written for correctness and readability first:
// each kernel mirrors the arithmetic of its CPU twin so the comparison tests can use tight
// tolerances. Reductions run in a fixed order (no float atomics). Not here: the products
// (gpu/cuda_matmul.cu), attention (gpu/cuda_attention.cu), the embedding
// (gpu/cuda_embedding.cu).
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

// dw[i] += sum_r dy*norm, db[i] += sum_r dy in two passes, as bias_grad's column sums
// (gpu/cuda_matmul.cu): per chunk of k_column_chunk_rows rows the partial sums (one thread per
// (chunk, column)), then each column adds its chunks in order. No atomics: the bits depend
// only on the shape.
__global__ void layernorm_bwd_partials_kernel(float* part_w, float* part_b, const float* dy,
                                              const float* x, const float* mean, const float* rstd,
                                              int rows, int c) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= c) return;
  const int r0 = blockIdx.y * k_column_chunk_rows;
  const int r1 = min(rows, r0 + k_column_chunk_rows);
  float sw = 0.0f, sb = 0.0f;
  for (int r = r0; r < r1; ++r) {
    const int64_t k = static_cast<int64_t>(r) * c + i;
    const float norm = (x[k] - mean[r]) * rstd[r];
    sb += dy[k];
    sw += dy[k] * norm;
  }
  part_w[static_cast<int64_t>(blockIdx.y) * c + i] = sw;
  part_b[static_cast<int64_t>(blockIdx.y) * c + i] = sb;
}

__global__ void layernorm_bwd_finish_kernel(float* dw, float* db, const float* part_w,
                                            const float* part_b, int chunks, int c) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= c) return;
  float sw = 0.0f, sb = 0.0f;
  for (int k = 0; k < chunks; ++k) {
    sw += part_w[static_cast<int64_t>(k) * c + i];
    sb += part_b[static_cast<int64_t>(k) * c + i];
  }
  dw[i] += sw;
  db[i] += sb;
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

}  // namespace

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
  const int chunks = (rows + k_column_chunk_rows - 1) / k_column_chunk_rows;
  if (chunks > 65535)
    return record(bad("layernorm_bwd: more than 65535 * 128 rows (the grid's y limit)"));
  scratch_lease lease(scratch_use::column_partials);
  void* p = nullptr;
  if (status s = lease.acquire(2 * sizeof(float) * static_cast<std::size_t>(chunks) * c, &p);
      s != status::ok)
    return record(s);
  float* part_w = static_cast<float*>(p);
  float* part_b = part_w + static_cast<int64_t>(chunks) * c;
  const int col_blocks = (c + k_threads - 1) / k_threads;
  layernorm_bwd_partials_kernel<<<dim3(col_blocks, chunks), k_threads, 0, stream()>>>(
      part_w, part_b, dy, x, mean, rstd, rows, c);
  if (status s = launched("layernorm_bwd_partials_kernel"); s != status::ok) return record(s);
  layernorm_bwd_finish_kernel<<<col_blocks, k_threads, 0, stream()>>>(dw, db, part_w, part_b,
                                                                      chunks, c);
  return record(launched("layernorm_bwd_finish_kernel"));
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
