// Device-side helpers shared by the CUDA kernels: warp and block reductions and the launch
// geometry of grid-stride loops. Included only by .cu files (needs nvcc); the host-facing
// declarations are in gpu/cuda_kernels.hpp.
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

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

}  // namespace cohort::gpu::cuda::detail
