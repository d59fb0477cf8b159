// A communicator over device memory (NCCL) that also takes host memory: each pointer a call
// gets is asked where it lives, and a host buffer goes through a device scratch buffer the
// wrapper owns (copied in before the collective, out after). The step's control path passes
// host memory through the DP communicator (the step counters after a state transfer); the
// gradients stay on the device and pass straight through. Owns the staging only.
#pragma once
#include <cstddef>
#include <functional>
#include <memory>

#include "runtime/comm/communicator.hpp"

namespace cohort::comm {

/// Device memory as the staging needs it: the gpu/ calls for NCCL (gpu_staging_memory), a
/// fake in tests. Every function but is_device throws comm_error on failure.
struct staging_memory {
  /// True when `p` is device memory the wrapped communicator can use directly.
  std::function<bool(const void* p)> is_device;
  std::function<void*(std::size_t bytes)> allocate;
  std::function<void(void* p)> release;  ///< never throws
  /// Host to device; the bytes are on the device, for any stream, when it returns.
  std::function<void(void* device, const void* host, std::size_t bytes)> to_device;
  /// Device to host; the host holds the bytes when it returns.
  std::function<void(void* host, const void* device, std::size_t bytes)> to_host;
};

/// Wraps `inner` (which takes device pointers only); rank, size, backend, abort, dead and
/// traffic are inner's. The scratch grows to the largest staged call and is kept. A failed
/// allocation or copy throws its comm_error and aborts inner, so the wrapper is dead too.
class device_staged_comm : public communicator {
 public:
  device_staged_comm(std::unique_ptr<communicator> inner, staging_memory memory);
  ~device_staged_comm() override;

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const char* backend() const override { return inner_->backend(); }
  bool memory_bound() const override { return inner_->memory_bound(); }
  void allreduce_sum(float* data, std::size_t n) override;
  void allreduce_sum(std::int64_t* data, std::size_t n) override;
  void allgather(const void* send, void* recv, std::size_t bytes) override;
  void alltoall(const void* send, void* recv, std::size_t bytes) override;
  void broadcast(void* data, std::size_t bytes, int root) override;
  void barrier() override { inner_->barrier(); }
  void abort() override { inner_->abort(); }
  void interrupt() override { inner_->interrupt(); }
  bool can_shrink() const override { return inner_->can_shrink(); }
  /// inner's shrink, staged the same way (its own scratch); null where inner gives null.
  std::unique_ptr<communicator> shrink(const std::vector<int>& excluded, bool abort_parent,
                                       int timeout_ms) override;
  bool dead() const override { return inner_->dead(); }
  bool stuck() const override { return inner_->stuck(); }
  comm_traffic traffic() const override { return inner_->traffic(); }
  /// Calls that went through the scratch so far (tests).
  std::size_t staged_calls() const { return staged_calls_; }

 private:
  /// The scratch, at least `bytes` long.
  char* scratch(std::size_t bytes);
  /// Runs a memory operation; a comm_error from it aborts inner (the wrapper is dead with it).
  template <class F>
  void guarded(F&& f);
  /// In-place collectives: `op` on `data` itself, or on a device copy of it.
  template <class Op>
  void in_place(void* data, std::size_t bytes, bool copy_in, Op&& op);

  std::unique_ptr<communicator> inner_;
  staging_memory memory_;
  void* scratch_ = nullptr;
  std::size_t scratch_bytes_ = 0;
  std::size_t staged_calls_ = 0;
};

/// staging_memory over gpu/ for CUDA device `device`: is_device is gpu::is_device_pointer,
/// the copies synchronise the device after a host-to-device copy (a copy from pageable memory
/// may return before its DMA lands, and NCCL's stream is not ordered after it).
staging_memory gpu_staging_memory(int device);

}  // namespace cohort::comm
