// The host side of the device layer: status values, device discovery, device and pinned
// host memory, copies (synchronous, and asynchronous on the thread's current stream). Always
// compiled; without CUDA (COHORT_HAVE_CUDA=0) or without a driver the same API reports zero
// devices and every device call returns status::no_device. Errors are values (an enum plus a
// per-thread detail message, like NCCL's ncclResult_t); nothing here throws, and no CUDA
// header is needed to include it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace cohort::gpu {

/// Outcome of a device-layer call. `ok` is 0 so `if (s != status::ok)` reads naturally.
enum class status : int {
  ok = 0,
  no_device,         ///< built without CUDA, no driver, or no device: nothing to run on
  invalid_argument,  ///< a caller bug caught at the boundary (null pointer, bad index, ...)
  out_of_memory,     ///< cudaMalloc / pool chunk allocation failed
  cuda_error,        ///< any other CUDA runtime error (launch failure, illegal address, ...)
  cublas_error,      ///< a cuBLAS call failed
};

/// Short fixed text for a status ("ok", "no CUDA device", ...); never null.
const char* status_string(status s);

/// Detail of the last failing call on this thread (which call, what CUDA said); empty when
/// no call has failed yet. Each failure overwrites it; successes leave it alone.
const char* last_error_message();

/// Records a failure for last_error_message() and returns `s` (used by the device layer;
/// public so the CUDA translation unit can share the same per-thread message).
status set_error(status s, const std::string& detail);

/// True when this build compiled gpu/ with nvcc (COHORT_HAVE_CUDA).
bool cuda_compiled();

/// Number of usable CUDA devices: 0 (never a crash, never an exception) when the build has
/// no CUDA, the driver is missing or too old, or no device is present.
int device_count();

/// What one device is; filled by device_info_of().
struct device_info {
  int index = -1;
  std::string name;
  std::size_t total_bytes = 0;
  std::size_t free_bytes = 0;
  int cc_major = 0;  ///< compute capability, e.g. 9.0 for H100 / H200
  int cc_minor = 0;
  int multiprocessors = 0;
};

/// Fills `out` for device `index` (0 <= index < device_count()).
status device_info_of(int index, device_info* out);

/// Makes `index` the current device of the calling thread.
status set_device(int index);

/// Device memory: `*ptr` is null on failure. Prefer device_pool for memory reused every step.
status device_malloc(void** ptr, std::size_t bytes);
/// Frees memory from device_malloc (null is a no-op).
status device_free(void* ptr);
/// Synchronous copies host -> device and device -> host, and a device memset to zero.
status copy_to_device(void* dst_device, const void* src_host, std::size_t bytes);
status copy_to_host(void* dst_host, const void* src_device, std::size_t bytes);
status device_zero(void* dst_device, std::size_t bytes);
/// Waits for all work on the current device (surfaces asynchronous kernel errors).
status device_synchronize();

// ---- the calling thread's stream and the asynchronous calls queued on it ----
// Asynchronous calls return once the work is queued; errors raised while it runs surface at
// the next synchronising call (stream_synchronize, device_synchronize, copy_to_host). For the
// copies and the fill: null pointers with bytes > 0 are invalid_argument (checked first, in
// every build), and 0 bytes is a no-op that returns ok, with or without a device.

/// Makes `stream` (a cudaStream_t; nullptr = the legacy default stream, the initial value) the
/// calling thread's current stream: the asynchronous calls below and every CUDA op
/// (gpu/cuda_kernels.hpp, where these two are also cuda::set_stream / cuda::current_stream)
/// queue their work there. Per thread; the caller owns the stream.
void set_stream(void* stream);
/// The calling thread's current stream (a cudaStream_t).
void* current_stream();
/// Waits for the work queued on the calling thread's current stream.
status stream_synchronize();

/// Page-locked host memory (cudaHostAlloc): what makes the asynchronous copies below truly
/// asynchronous (from pageable memory CUDA stages the copy and may finish it before
/// returning). `*ptr` is null on failure.
status host_alloc_pinned(void** ptr, std::size_t bytes);
/// Frees memory from host_alloc_pinned (null is a no-op).
status host_free_pinned(void* ptr);
/// Host -> device on the current stream; `src_host` must stay unchanged until the stream has
/// reached the copy.
status copy_to_device_async(void* dst_device, const void* src_host, std::size_t bytes);
/// Device -> host on the current stream; `dst_host` is valid only after stream_synchronize().
status copy_to_host_async(void* dst_host, const void* src_device, std::size_t bytes);
/// Device -> device on the current stream (the ranges must not overlap).
status device_copy(void* dst_device, const void* src_device, std::size_t bytes);
/// Sets `bytes` of device memory to zero on the current stream.
status device_fill_zero_async(void* dst_device, std::size_t bytes);

}  // namespace cohort::gpu

// ---- where a pointer lives (the NCCL communicator's host staging) ----
namespace cohort::gpu {

/// True when `p` is memory a CUDA device reads directly: device or managed memory
/// (cudaPointerGetAttributes). Host memory, pinned or not, null, and every pointer in a build
/// without CUDA or on a machine without a device are false.
bool is_device_pointer(const void* p);

}  // namespace cohort::gpu
