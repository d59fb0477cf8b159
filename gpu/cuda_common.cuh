// What the .cu files of gpu/ share: device-side warp and block reductions, the launch
// geometry of grid-stride loops, and the host-side helpers every op's launch uses (the
// thread's stream, status recording, cuBLAS handle, deterministic reduction; defined in
// gpu/cuda_context.cu). Included only by .cu files (needs nvcc); the public declarations of
// the CUDA twins are in gpu/cuda_kernels.hpp.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "gpu/device.hpp"

namespace cohort::gpu::cuda::detail {

/// Threads per block for every kernel: a multiple of the warp size (the reductions below
/// rely on that) and small enough that one block per row still fills SMs for short rows.
constexpr int k_threads = 256;

/// Blocks for a grid-stride loop over n elements. Capped because each thread loops anyway;
/// a capped grid is enough to fill an H200 (132 SMs x 8 blocks of 256) many times over.
inline int blocks_for(int64_t n) {
  const int64_t b = (n + k_threads - 1) / k_threads;
  return static_cast<int>(b < (1 << 20) ? b : (1 << 20));
}

/// Sum across the 32 lanes of a warp; every lane gets the total.
template <class T>
__device__ inline T warp_sum(T v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

/// Max across the 32 lanes of a warp; every lane gets the result.
__device__ inline float warp_max(float v) {
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

/// Sum across the block (blockDim.x a multiple of 32); every thread gets the total. The
/// order is fixed by the block shape, so the result is the same on every run. Safe to call
/// several times in a row: the leading barrier keeps a previous call's readers from seeing
/// this call's partials.
template <class T>
__device__ inline T block_sum(T v) {
  __shared__ T partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int nwarps = blockDim.x >> 5;
  return warp_sum(lane < nwarps ? partial[lane] : T(0));
}

/// Max across the block; every thread gets the result. Same reuse rule as block_sum.
__device__ inline float block_max(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int nwarps = blockDim.x >> 5;
  return warp_max(lane < nwarps ? partial[lane] : -INFINITY);
}

// ---- host side (gpu/cuda_context.cu) ----------------------------------------------------

/// Grid-stride loop over [0, n): any n works with a capped grid (blocks_for).
#define COHORT_GRID_STRIDE(i, n)                                                         \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

/// The calling thread's current stream (set_stream): every launch goes there.
cudaStream_t stream();
/// Records `s` as the outcome of this thread's last op (last_status()) and returns it.
status record(status s);
/// ok, or the CUDA error `e` as a status whose message starts with `what`; clears the
/// non-sticky error slot so the next op is not blamed.
status from_cuda(cudaError_t e, const char* what);
/// Status of the kernel launch just issued (configuration errors show up here at once).
status launched(const char* what);
/// invalid_argument with `what` as the message.
status bad(const char* what);
/// This thread's cuBLAS handle for the current device (created on first use, plain FP32),
/// bound to the current stream.
status blas_handle(cublasHandle_t* out);
/// Sum (or sum of squares) of x[0..n) into *out on the host, in double and in a fixed order
/// (same bits on every run); synchronises the stream.
status reduce_to_host(double* out, const float* x, int64_t n, bool square);

}  // namespace cohort::gpu::cuda::detail
