// What every CUDA op shares: the calling thread's last status, its lazily created cuBLAS
// handles and scratch buffers (one per device, each with the event of its last use), the
// status helpers, and the deterministic two-stage reduction. Declared for the other .cu
// files in gpu/cuda_common.cuh; the public part (last_status, release_thread_resources) in
// gpu/cuda_kernels.hpp. The thread's stream lives in gpu/device.cpp (gpu::set_stream).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "gpu/cublas_loader.hpp"
#include "gpu/cuda_common.cuh"
#include "gpu/cuda_kernels.hpp"

namespace cohort::gpu::cuda {

namespace {

// ---- per-thread state: last status, lazily created handles and scratch -------------------

constexpr int k_max_devices = 16;
constexpr int k_scratch_uses = static_cast<int>(detail::scratch_use::count);
// Stage-1 partial sums of the deterministic reduction: at most this many blocks.
constexpr int k_reduce_blocks = 256;

struct scratch_buffer {
  void* p = nullptr;
  std::size_t bytes = 0;
  cudaEvent_t last_use = nullptr;  // recorded when a lease ends; created with the buffer
};

struct thread_state {
  status last = status::ok;
  cublasHandle_t blas[k_max_devices] = {};
  scratch_buffer scratch[k_max_devices][k_scratch_uses] = {};
};
// Per thread because workers drive devices from several threads; nothing is freed at thread
// exit because the CUDA context may already be gone then (release_thread_resources frees).
thread_local thread_state ts_;

}  // namespace

namespace detail {

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

// Queues both stages into `partials` (k_reduce_blocks doubles) and *out_device.
status queue_reduction(double* out_device, double* partials, const float* x, int64_t n,
                       bool square) {
  int blocks = blocks_for(n);
  if (blocks > k_reduce_blocks) blocks = k_reduce_blocks;
  if (blocks < 1) blocks = 1;  // n == 0: one block writes the 0 partial, so the sum is 0
  reduce_stage1_kernel<<<blocks, k_threads, 0, stream()>>>(partials, x, n, square);
  if (status s = launched("reduce_stage1_kernel"); s != status::ok) return s;
  reduce_stage2_kernel<<<1, k_threads, 0, stream()>>>(out_device, partials, blocks);
  return launched("reduce_stage2_kernel");
}

}  // namespace

status blas_handle(cublasHandle_t* out) {
  int dev = 0;
  if (status s = current_device(&dev); s != status::ok) return s;
  if (ts_.blas[dev] == nullptr) {
    const blas::api* b = blas::get();
    if (b == nullptr) return set_error(status::cublas_error, blas::load_error());
    cublasHandle_t h = nullptr;
    if (b->create(&h) != CUBLAS_STATUS_SUCCESS)
      return set_error(status::cublas_error, "cublasCreate failed");
    // Default math: no TF32 for CUBLAS_COMPUTE_32F, so fp32 products stay within ~1e-5 of
    // the CPU twin; the bf16 precision asks for its tensor cores per call (gemm_rm).
    b->set_math_mode(h, CUBLAS_DEFAULT_MATH);
    ts_.blas[dev] = h;
  }
  if (blas::get()->set_stream(ts_.blas[dev], stream()) != CUBLAS_STATUS_SUCCESS)
    return set_error(status::cublas_error, "cublasSetStream failed");
  *out = ts_.blas[dev];
  return status::ok;
}

status scratch_lease::acquire(std::size_t bytes, void** out) {
  *out = nullptr;
  if (device_ >= 0) return bad("scratch_lease: acquired twice");
  int dev = 0;
  if (status s = current_device(&dev); s != status::ok) return s;
  scratch_buffer& b = ts_.scratch[dev][static_cast<int>(use_)];
  if (b.last_use == nullptr) {
    if (status s = from_cuda(cudaEventCreateWithFlags(&b.last_use, cudaEventDisableTiming),
                             "cudaEventCreate(scratch)");
        s != status::ok)
      return s;
  }
  if (b.bytes < bytes) {
    // Work queued by an earlier holder (on any stream) may still use the old buffer: wait
    // for it before freeing. The event is a no-op if never recorded.
    if (b.p != nullptr) {
      if (status s = from_cuda(cudaEventSynchronize(b.last_use), "cudaEventSynchronize(scratch)");
          s != status::ok)
        return s;
      (void)cudaFree(b.p);
      b.p = nullptr;
      b.bytes = 0;
    }
    const std::size_t want = (bytes + 4095) / 4096 * 4096;
    if (status s = from_cuda(cudaMalloc(&b.p, want),
                             ("cudaMalloc(scratch " + std::to_string(want) + " bytes)").c_str());
        s != status::ok) {
      b.p = nullptr;
      return s;
    }
    b.bytes = want;
  }
  // An earlier holder on another stream may still be reading or writing: order after it.
  if (status s = from_cuda(cudaStreamWaitEvent(stream(), b.last_use, 0), "cudaStreamWaitEvent");
      s != status::ok)
    return s;
  device_ = dev;
  *out = b.p;
  return status::ok;
}

scratch_lease::~scratch_lease() {
  if (device_ < 0) return;
  // The next holder waits for everything queued on this stream so far, this holder's work
  // included. A failure here leaves the event at the previous use; the stream's own error
  // surfaces at its next synchronising call.
  (void)cudaEventRecord(ts_.scratch[device_][static_cast<int>(use_)].last_use, stream());
}

status reduce_to_device(double* out_device, const float* x, int64_t n, bool square) {
  scratch_lease lease(scratch_use::reduction);
  void* p = nullptr;
  if (status s = lease.acquire(sizeof(double) * k_reduce_blocks, &p); s != status::ok) return s;
  return queue_reduction(out_device, static_cast<double*>(p), x, n, square);
}

status reduce_to_host(double* out, const float* x, int64_t n, bool square) {
  scratch_lease lease(scratch_use::reduction);
  void* p = nullptr;
  if (status s = lease.acquire(sizeof(double) * (k_reduce_blocks + 1), &p); s != status::ok)
    return s;
  double* partials = static_cast<double*>(p);
  double* result = partials + k_reduce_blocks;
  if (status s = queue_reduction(result, partials, x, n, square); s != status::ok) return s;
  if (status s =
          from_cuda(cudaMemcpyAsync(out, result, sizeof(double), cudaMemcpyDeviceToHost, stream()),
                    "cudaMemcpyAsync(reduction result)");
      s != status::ok)
    return s;
  return from_cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
}

}  // namespace detail

status last_status() { return ts_.last; }

void release_thread_resources() {
  for (int d = 0; d < k_max_devices; ++d) {
    if (ts_.blas[d]) blas::get()->destroy(ts_.blas[d]);  // a handle means cuBLAS loaded
    ts_.blas[d] = nullptr;
    for (scratch_buffer& b : ts_.scratch[d]) {
      if (b.p) cudaFree(b.p);
      if (b.last_use) cudaEventDestroy(b.last_use);
      b = scratch_buffer{};
    }
  }
}

}  // namespace cohort::gpu::cuda
