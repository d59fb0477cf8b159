// What every CUDA op shares: the calling thread's stream and last status, its lazily created
// cuBLAS handles and reduction scratch (one per device), the status helpers, and the
// deterministic two-stage reduction. Declared for the other .cu files in gpu/cuda_common.cuh;
// the public part (last_status, streams, release_thread_resources) in gpu/cuda_kernels.hpp.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "gpu/cuda_common.cuh"
#include "gpu/cuda_kernels.hpp"

namespace cohort::gpu::cuda {

namespace {

// ---- per-thread state: current stream, last status, lazily created handles ---------------

constexpr int k_max_devices = 16;
// Stage-1 partial sums of the deterministic reduction: at most this many blocks.
constexpr int k_reduce_blocks = 256;

struct thread_state {
  cudaStream_t stream = nullptr;
  status last = status::ok;
  cublasHandle_t blas[k_max_devices] = {};
  double* scratch[k_max_devices] = {};  // k_reduce_blocks + 1 doubles per device
};
// Per thread because workers drive devices from several threads; nothing is freed at thread
// exit because the CUDA context may already be gone then (release_thread_resources frees).
thread_local thread_state ts_;

}  // namespace

namespace detail {

cudaStream_t stream() { return ts_.stream; }

status record(status s) {
  ts_.last = s;
  return s;
}

status from_cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return status::ok;
  (void)cudaGetLastError();  // clear the non-sticky slot so the next op is not blamed
  return set_error(
      e == cudaErrorMemoryAllocation ? status::out_of_memory : status::cuda_error,
      std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

status launched(const char* what) { return from_cuda(cudaGetLastError(), what); }

status bad(const char* what) { return set_error(status::invalid_argument, what); }

namespace {

status current_device(int* dev) {
  if (status s = from_cuda(cudaGetDevice(dev), "cudaGetDevice"); s != status::ok) return s;
  if (*dev < 0 || *dev >= k_max_devices) return bad("device index beyond k_max_devices");
  return status::ok;
}

status scratch_buffer(double** out) {
  int dev = 0;
  if (status s = current_device(&dev); s != status::ok) return s;
  if (ts_.scratch[dev] == nullptr) {
    void* p = nullptr;
    if (status s = from_cuda(cudaMalloc(&p, sizeof(double) * (k_reduce_blocks + 1)),
                             "cudaMalloc(reduction scratch)");
        s != status::ok)
      return s;
    ts_.scratch[dev] = static_cast<double*>(p);
  }
  *out = ts_.scratch[dev];
  return status::ok;
}

// Deterministic two-stage reduction in double: stage 1 has a grid that depends only on n,
// each block writes one partial; stage 2 (one block) sums the partials. No atomics, so the
// same input gives the same bits on every run (gradient-norm clipping must not jitter).
__global__ void reduce_stage1_kernel(double* partial, const float* x, int64_t n, bool square) {
  double s = 0.0;
  COHORT_GRID_STRIDE(i, n) {
    const double xi = x[i];
    s += square ? xi * xi : xi;
  }
  s = block_sum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void reduce_stage2_kernel(double* result, const double* partial, int count) {
  double s = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) s += partial[i];
  s = block_sum(s);
  if (threadIdx.x == 0) *result = s;
}

}  // namespace

status blas_handle(cublasHandle_t* out) {
  int dev = 0;
  if (status s = current_device(&dev); s != status::ok) return s;
  if (ts_.blas[dev] == nullptr) {
    cublasHandle_t h = nullptr;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS)
      return set_error(status::cublas_error, "cublasCreate failed");
    // Plain FP32 (no TF32 tensor-core rounding): results stay within ~1e-5 of the CPU twin.
    cublasSetMathMode(h, CUBLAS_DEFAULT_MATH);
    ts_.blas[dev] = h;
  }
  if (cublasSetStream(ts_.blas[dev], ts_.stream) != CUBLAS_STATUS_SUCCESS)
    return set_error(status::cublas_error, "cublasSetStream failed");
  *out = ts_.blas[dev];
  return status::ok;
}

/// Sum (or sum of squares) of x[0..n) into *out on the host; synchronises the stream.
status reduce_to_host(double* out, const float* x, int64_t n, bool square) {
  double* scratch = nullptr;
  if (status s = scratch_buffer(&scratch); s != status::ok) return s;
  int blocks = blocks_for(n);
  if (blocks > k_reduce_blocks) blocks = k_reduce_blocks;
  reduce_stage1_kernel<<<blocks, k_threads, 0, stream()>>>(scratch, x, n, square);
  if (status s = launched("reduce_stage1_kernel"); s != status::ok) return s;
  reduce_stage2_kernel<<<1, k_threads, 0, stream()>>>(scratch + k_reduce_blocks, scratch, blocks);
  if (status s = launched("reduce_stage2_kernel"); s != status::ok) return s;
  if (status s = from_cuda(cudaMemcpyAsync(out, scratch + k_reduce_blocks, sizeof(double),
                                           cudaMemcpyDeviceToHost, ts_.stream),
                           "cudaMemcpyAsync(reduction result)");
      s != status::ok)
    return s;
  return from_cuda(cudaStreamSynchronize(ts_.stream), "cudaStreamSynchronize");
}

}  // namespace detail

status last_status() { return ts_.last; }
void set_stream(void* stream) { ts_.stream = static_cast<cudaStream_t>(stream); }
void* current_stream() { return ts_.stream; }

void release_thread_resources() {
  for (int d = 0; d < k_max_devices; ++d) {
    if (ts_.blas[d]) cublasDestroy(ts_.blas[d]);
    if (ts_.scratch[d]) cudaFree(ts_.scratch[d]);
    ts_.blas[d] = nullptr;
    ts_.scratch[d] = nullptr;
  }
}

}  // namespace cohort::gpu::cuda
