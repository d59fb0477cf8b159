// What the .cu files of gpu/ share: device-side warp and block reductions, the launch
// geometry of grid-stride loops, and the host-side helpers every op's launch uses (the
// thread's stream, status recording, cuBLAS handle, scratch buffers and the deterministic
// reduction, defined in gpu/cuda_context.cu; the row-major batched product, defined in
// gpu/cuda_matmul.cu). Included only by .cu files (needs nvcc); the public declarations of
// the CUDA twins are in gpu/cuda_kernels.hpp.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
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

/// The calling thread's current stream (gpu::set_stream): every launch goes there.
inline cudaStream_t stream() { return static_cast<cudaStream_t>(gpu::current_stream()); }
/// Records `s` as the outcome of this thread's last op (last_status()) and returns it.
status record(status s);
/// ok, or the CUDA error `e` as a status whose message starts with `what`; clears the
/// non-sticky error slot so the next op is not blamed.
status from_cuda(cudaError_t e, const char* what);
/// Status of the kernel launch just issued (configuration errors show up here at once).
status launched(const char* what);
/// invalid_argument with `what` as the message.
status bad(const char* what);
/// This thread's cuBLAS handle for the current device (created on first use, default math
/// mode: no TF32 unless a product asks for a fast compute type), bound to the current stream.
status blas_handle(cublasHandle_t* out);

/// C = alpha op(A) op(B) + beta C, row-major, for `batch` products at element strides sa,
/// sb, sc (ignored when batch == 1), at the thread's matmul precision. `what` names the
/// product in error messages. With beta == 0, C is never read (it may hold NaN).
status gemm_rm(const char* what, bool ta, bool tb, int m, int n, int k, float alpha, const float* a,
               int lda, long long sa, const float* b, int ldb, long long sb, float beta, float* c,
               int ldc, long long sc, int batch);

/// gemm_rm over operands that are already bf16 (BF16 true: CUDA_R_16BF, no conversion) or
/// float32, whatever the thread's precision; C is float32, accumulation FP32.
status gemm_rm_typed(const char* what, bool ta, bool tb, int m, int n, int k, float alpha,
                     const void* a, int lda, long long sa, const void* b, int ldb, long long sb,
                     float beta, float* c, int ldc, long long sc, int batch, bool bf16);
/// True when bf16 products run on bf16 operand copies (the default), false with
/// COHORT_CUDA_BF16=fast16bf (FP32 operands, CUBLAS_COMPUTE_32F_FAST_16BF).
bool bf16_via_copies();
/// y[0..n) = x[0..n) rounded to bfloat16 (y: n * 2 bytes), on the current stream.
status to_bf16(void* y, const float* x, int64_t n);

/// What a per-thread scratch buffer is for: each use has its own buffer per device.
enum class scratch_use : int {
  reduction,
  embedding_sort,
  matmul_a,         ///< a bf16 product's first operand, converted
  matmul_b,         ///< its second operand
  column_partials,  ///< bias_grad's and layernorm_bwd's per-chunk column sums
  bf16_0,           ///< attention's bf16 copies of whole buffers (qkv, P, dY, dS)
  bf16_1,
  bf16_2,
  bf16_3,
  count
};

/// Device temporary memory owned by the calling thread, one buffer per use and device,
/// created on first use and grown (never shrunk) when `bytes` exceeds it. Uses of one buffer
/// are serialised across streams: acquiring makes the current stream wait for the work of
/// the previous holder (an event recorded on release), and growing waits for it before the
/// old buffer is freed. Hold it through a scratch_lease, which releases on every path.
class scratch_lease {
 public:
  explicit scratch_lease(scratch_use use) : use_(use) {}
  ~scratch_lease();
  scratch_lease(const scratch_lease&) = delete;
  scratch_lease& operator=(const scratch_lease&) = delete;
  /// *out points at >= bytes of device memory (256-byte aligned) until the lease ends; the
  /// caller queues its work on the current stream meanwhile.
  status acquire(std::size_t bytes, void** out);

 private:
  scratch_use use_;
  int device_ = -1;  ///< the device acquired on; -1 while nothing is held
};

/// Rows of one chunk of a column reduction (bias_grad, layernorm_bwd's dw and db): each chunk's
/// column sums are taken in parallel, then added in chunk order, so the bits depend only on
/// the shape.
constexpr int k_column_chunk_rows = 128;

/// Queues the sum (or sum of squares) of x[0..n) into *out_device (one double), in double
/// and in a fixed order: the grid depends only on n, so the same input gives the same bits.
status reduce_to_device(double* out_device, const float* x, int64_t n, bool square);
/// reduce_to_device, read back into *out on the host; synchronises the stream.
status reduce_to_host(double* out, const float* x, int64_t n, bool square);

}  // namespace cohort::gpu::cuda::detail
