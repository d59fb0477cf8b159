// The host side of the device layer: status values, device discovery, device memory
// and copies. Always compiled; without CUDA (COHORT_HAVE_CUDA=0) or without a driver the
// same API reports zero devices and every device call returns status::no_device.
// Errors are values (an enum plus a per-thread detail message, like NCCL's ncclResult_t
// and ncclGetErrorString); nothing here throws, and no CUDA header is needed to include it.
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

}  // namespace cohort::gpu

// ---- where a pointer lives (the NCCL communicator's host staging) ----
namespace cohort::gpu {

/// True when `p` is memory a CUDA device reads directly: device or managed memory
/// (cudaPointerGetAttributes). Host memory, pinned or not, null, and every pointer in a build
/// without CUDA or on a machine without a device are false.
bool is_device_pointer(const void* p);

}  // namespace cohort::gpu
