// Host side of the device layer. Compiled by the host compiler in every build; the CUDA
// runtime API is used only when COHORT_HAVE_CUDA, otherwise every call reports no_device.
#include "gpu/device.hpp"

#include <string>

#if COHORT_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace cohort::gpu {

namespace {
// Per thread, like cudaGetLastError: concurrent workers must not see each other's errors.
thread_local std::string last_error_;
// Per thread because workers drive devices from several threads, each on its own stream.
thread_local void* stream_ = nullptr;

// The argument rule of the asynchronous copies, checked before anything else so a caller
// sees the same status with or without CUDA: null pointers are a bug unless nothing moves.
status check_copy(const char* what, const void* dst, const void* src, std::size_t bytes) {
  if (bytes > 0 && (dst == nullptr || src == nullptr))
    return set_error(status::invalid_argument,
                     std::string(what) + ": null pointer for " + std::to_string(bytes) + " bytes");
  return status::ok;
}

#if COHORT_HAVE_CUDA
status from_cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return status::ok;
  // Clear the runtime's last-error slot so a later cudaGetLastError does not report it again.
  (void)cudaGetLastError();
  status s = status::cuda_error;
  if (e == cudaErrorMemoryAllocation) s = status::out_of_memory;
  if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) s = status::no_device;
  return set_error(
      s, std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}
#endif
}  // namespace

const char* status_string(status s) {
  switch (s) {
    case status::ok:
      return "ok";
    case status::no_device:
      return "no CUDA device";
    case status::invalid_argument:
      return "invalid argument";
    case status::out_of_memory:
      return "device out of memory";
    case status::cuda_error:
      return "CUDA error";
    case status::cublas_error:
      return "cuBLAS error";
  }
  return "unknown status";
}

const char* last_error_message() { return last_error_.c_str(); }

status set_error(status s, const std::string& detail) {
  last_error_ = std::string(status_string(s)) + ": " + detail;
  return s;
}

bool cuda_compiled() { return COHORT_HAVE_CUDA != 0; }

void set_stream(void* stream) { stream_ = stream; }
void* current_stream() { return stream_; }

#if COHORT_HAVE_CUDA

int device_count() {
  int n = 0;
  // Without a driver this fails (cudaErrorInsufficientDriver / NoDevice): that is "0
  // devices", not an error the caller must handle.
  if (from_cuda(cudaGetDeviceCount(&n), "cudaGetDeviceCount") != status::ok) return 0;
  return n;
}

status device_info_of(int index, device_info* out) {
  if (out == nullptr) return set_error(status::invalid_argument, "device_info_of: null output");
  const int n = device_count();
  if (n == 0) return set_error(status::no_device, "device_info_of: no CUDA device");
  if (index < 0 || index >= n)
    return set_error(status::invalid_argument, "device_info_of: index " + std::to_string(index) +
                                                   " not in [0, " + std::to_string(n) + ")");
  cudaDeviceProp prop{};
  if (status s = from_cuda(cudaGetDeviceProperties(&prop, index), "cudaGetDeviceProperties");
      s != status::ok)
    return s;
  out->index = index;
  out->name = prop.name;
  out->total_bytes = prop.totalGlobalMem;
  out->cc_major = prop.major;
  out->cc_minor = prop.minor;
  out->multiprocessors = prop.multiProcessorCount;
  // Free memory is per device; query it on that device and restore the caller's current one.
  int prev = 0;
  if (status s = from_cuda(cudaGetDevice(&prev), "cudaGetDevice"); s != status::ok) return s;
  if (status s = from_cuda(cudaSetDevice(index), "cudaSetDevice"); s != status::ok) return s;
  std::size_t free_b = 0, total_b = 0;
  status s = from_cuda(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  (void)cudaSetDevice(prev);
  out->free_bytes = free_b;
  return s;
}

status set_device(int index) {
  if (device_count() == 0) return set_error(status::no_device, "set_device: no CUDA device");
  return from_cuda(cudaSetDevice(index), "cudaSetDevice");
}

status device_malloc(void** ptr, std::size_t bytes) {
  if (ptr == nullptr) return set_error(status::invalid_argument, "device_malloc: null output");
  *ptr = nullptr;
  return from_cuda(cudaMalloc(ptr, bytes), ("cudaMalloc(" + std::to_string(bytes) + ")").c_str());
}

status device_free(void* ptr) {
  if (ptr == nullptr) return status::ok;
  return from_cuda(cudaFree(ptr), "cudaFree");
}

status copy_to_device(void* dst, const void* src, std::size_t bytes) {
  return from_cuda(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
}

status copy_to_host(void* dst, const void* src, std::size_t bytes) {
  return from_cuda(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
}

status device_zero(void* dst, std::size_t bytes) {
  return from_cuda(cudaMemset(dst, 0, bytes), "cudaMemset");
}

status device_synchronize() { return from_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

namespace {
cudaStream_t stream() { return static_cast<cudaStream_t>(stream_); }
}  // namespace

status stream_synchronize() {
  return from_cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
}

status host_alloc_pinned(void** ptr, std::size_t bytes) {
  if (ptr == nullptr) return set_error(status::invalid_argument, "host_alloc_pinned: null output");
  *ptr = nullptr;
  return from_cuda(cudaHostAlloc(ptr, bytes, cudaHostAllocDefault),
                   ("cudaHostAlloc(" + std::to_string(bytes) + ")").c_str());
}

status host_free_pinned(void* ptr) {
  if (ptr == nullptr) return status::ok;
  return from_cuda(cudaFreeHost(ptr), "cudaFreeHost");
}

status copy_to_device_async(void* dst, const void* src, std::size_t bytes) {
  if (status s = check_copy("copy_to_device_async", dst, src, bytes); s != status::ok) return s;
  if (bytes == 0) return status::ok;
  return from_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream()),
                   "cudaMemcpyAsync H2D");
}

status copy_to_host_async(void* dst, const void* src, std::size_t bytes) {
  if (status s = check_copy("copy_to_host_async", dst, src, bytes); s != status::ok) return s;
  if (bytes == 0) return status::ok;
  return from_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream()),
                   "cudaMemcpyAsync D2H");
}

status device_copy(void* dst, const void* src, std::size_t bytes) {
  if (status s = check_copy("device_copy", dst, src, bytes); s != status::ok) return s;
  if (bytes == 0) return status::ok;
  return from_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()),
                   "cudaMemcpyAsync D2D");
}

status device_fill_zero_async(void* dst, std::size_t bytes) {
  if (status s = check_copy("device_fill_zero_async", dst, dst, bytes); s != status::ok) return s;
  if (bytes == 0) return status::ok;
  return from_cuda(cudaMemsetAsync(dst, 0, bytes, stream()), "cudaMemsetAsync");
}

#else  // !COHORT_HAVE_CUDA: the same API, reporting that there is nothing to run on.

namespace {
status not_built(const char* what) {
  return set_error(status::no_device,
                   std::string(what) + ": this build has no CUDA (nvcc not found)");
}
}  // namespace

int device_count() { return 0; }
status device_info_of(int, device_info* out) {
  // Argument errors first, as in the CUDA build, so callers see the same status either way.
  if (out == nullptr) return set_error(status::invalid_argument, "device_info_of: null output");
  return not_built("device_info_of");
}
status set_device(int) { return not_built("set_device"); }
status device_malloc(void** ptr, std::size_t) {
  if (ptr != nullptr) *ptr = nullptr;
  return not_built("device_malloc");
}
status device_free(void* ptr) { return ptr == nullptr ? status::ok : not_built("device_free"); }
status copy_to_device(void*, const void*, std::size_t) { return not_built("copy_to_device"); }
status copy_to_host(void*, const void*, std::size_t) { return not_built("copy_to_host"); }
status device_zero(void*, std::size_t) { return not_built("device_zero"); }
status device_synchronize() { return not_built("device_synchronize"); }
status stream_synchronize() { return not_built("stream_synchronize"); }
status host_alloc_pinned(void** ptr, std::size_t) {
  if (ptr == nullptr) return set_error(status::invalid_argument, "host_alloc_pinned: null output");
  *ptr = nullptr;
  return not_built("host_alloc_pinned");
}
status host_free_pinned(void* ptr) {
  return ptr == nullptr ? status::ok : not_built("host_free_pinned");
}
status copy_to_device_async(void* dst, const void* src, std::size_t bytes) {
  if (status s = check_copy("copy_to_device_async", dst, src, bytes); s != status::ok) return s;
  return bytes == 0 ? status::ok : not_built("copy_to_device_async");
}
status copy_to_host_async(void* dst, const void* src, std::size_t bytes) {
  if (status s = check_copy("copy_to_host_async", dst, src, bytes); s != status::ok) return s;
  return bytes == 0 ? status::ok : not_built("copy_to_host_async");
}
status device_copy(void* dst, const void* src, std::size_t bytes) {
  if (status s = check_copy("device_copy", dst, src, bytes); s != status::ok) return s;
  return bytes == 0 ? status::ok : not_built("device_copy");
}
status device_fill_zero_async(void* dst, std::size_t bytes) {
  if (status s = check_copy("device_fill_zero_async", dst, dst, bytes); s != status::ok) return s;
  return bytes == 0 ? status::ok : not_built("device_fill_zero_async");
}

#endif

}  // namespace cohort::gpu

// ---- where a pointer lives (the NCCL communicator's host staging) ----
namespace cohort::gpu {

#if COHORT_HAVE_CUDA
bool is_device_pointer(const void* p) {
  if (p == nullptr) return false;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();  // an unknown pointer must not poison the next CUDA call
    return false;
  }
  // cudaMemoryTypeUnregistered and cudaMemoryTypeHost (pinned) are host memory: NCCL's
  // collectives take device buffers.
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}
#else
bool is_device_pointer(const void*) { return false; }
#endif

}  // namespace cohort::gpu
