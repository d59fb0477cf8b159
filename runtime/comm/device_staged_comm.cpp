#include "runtime/comm/device_staged_comm.hpp"

#include <string>
#include <utility>

#include "gpu/device.hpp"

namespace cohort::comm {

device_staged_comm::device_staged_comm(std::unique_ptr<communicator> inner, staging_memory memory)
    : inner_(std::move(inner)), memory_(std::move(memory)) {}

device_staged_comm::~device_staged_comm() {
  // The communicator first (NCCL's destructor aborts, bounded): freeing the scratch waits for
  // the device, which must not hold a collective that could still use it.
  inner_.reset();
  if (scratch_ != nullptr) memory_.release(scratch_);
}

template <class F>
void device_staged_comm::guarded(F&& f) {
  try {
    f();
  } catch (const comm_error&) {
    // A failed copy or allocation ends the communicator like a failed collective would
    // (communicator.hpp: after any comm_error only destruction is left).
    inner_->abort();
    throw;
  }
}

char* device_staged_comm::scratch(std::size_t bytes) {
  if (bytes > scratch_bytes_) {
    if (scratch_ != nullptr) memory_.release(scratch_);
    scratch_ = nullptr;
    scratch_bytes_ = 0;
    guarded([&] { scratch_ = memory_.allocate(bytes); });
    scratch_bytes_ = bytes;
  }
  ++staged_calls_;
  return static_cast<char*>(scratch_);
}

template <class Op>
void device_staged_comm::in_place(void* data, std::size_t bytes, bool copy_in, Op&& op) {
  if (bytes == 0 || memory_.is_device(data)) return op(data);
  char* d = scratch(bytes);
  if (copy_in) guarded([&] { memory_.to_device(d, data, bytes); });
  op(d);
  guarded([&] { memory_.to_host(data, d, bytes); });
}

void device_staged_comm::allreduce_sum(float* data, std::size_t n) {
  in_place(data, n * sizeof(float), true,
           [&](void* p) { inner_->allreduce_sum(static_cast<float*>(p), n); });
}

void device_staged_comm::allreduce_sum(std::int64_t* data, std::size_t n) {
  in_place(data, n * sizeof(std::int64_t), true,
           [&](void* p) { inner_->allreduce_sum(static_cast<std::int64_t*>(p), n); });
}

void device_staged_comm::broadcast(void* data, std::size_t bytes, int root) {
  // Only the root's bytes matter going in; every rank's come out.
  in_place(data, bytes, rank() == root, [&](void* p) { inner_->broadcast(p, bytes, root); });
}

namespace {
// Where the receive half starts in a scratch holding both halves (device allocations and
// NCCL like 256-byte alignment).
std::size_t aligned(std::size_t bytes) { return (bytes + 255) / 256 * 256; }
}  // namespace

void device_staged_comm::allgather(const void* send, void* recv, std::size_t bytes) {
  const std::size_t total = bytes * static_cast<std::size_t>(size());
  const bool send_host = bytes > 0 && !memory_.is_device(send);
  const bool recv_host = bytes > 0 && !memory_.is_device(recv);
  if (!send_host && !recv_host) return inner_->allgather(send, recv, bytes);
  char* d = scratch(aligned(send_host ? bytes : 0) + (recv_host ? total : 0));
  const void* s = send;
  void* r = recv;
  if (send_host) {
    guarded([&] { memory_.to_device(d, send, bytes); });
    s = d;
  }
  if (recv_host) r = d + aligned(send_host ? bytes : 0);
  inner_->allgather(s, r, bytes);
  if (recv_host) guarded([&] { memory_.to_host(recv, r, total); });
}

void device_staged_comm::alltoall(const void* send, void* recv, std::size_t bytes) {
  const std::size_t total = bytes * static_cast<std::size_t>(size());
  const bool send_host = bytes > 0 && !memory_.is_device(send);
  const bool recv_host = bytes > 0 && !memory_.is_device(recv);
  if (!send_host && !recv_host) return inner_->alltoall(send, recv, bytes);
  char* d = scratch(aligned(send_host ? total : 0) + (recv_host ? total : 0));
  const void* s = send;
  void* r = recv;
  if (send_host) {
    guarded([&] { memory_.to_device(d, send, total); });
    s = d;
  }
  if (recv_host) r = d + aligned(send_host ? total : 0);
  inner_->alltoall(s, r, bytes);
  if (recv_host) guarded([&] { memory_.to_host(recv, r, total); });
}

staging_memory gpu_staging_memory(int device) {
  // The calling thread (the bucket engine's, the step's) may have another current device.
  const auto on_device = [device](const char* what) {
    if (gpu::set_device(device) != gpu::status::ok)
      throw comm_error(comm_failure::unavailable, what, gpu::last_error_message());
  };
  const auto check = [](gpu::status s, const char* what) {
    if (s != gpu::status::ok)
      throw comm_error(
          s == gpu::status::out_of_memory ? comm_failure::invalid : comm_failure::unavailable, what,
          gpu::last_error_message());
  };
  staging_memory m;
  m.is_device = [](const void* p) { return gpu::is_device_pointer(p); };
  m.allocate = [=](std::size_t bytes) {
    on_device("nccl staging: allocate");
    void* p = nullptr;
    check(gpu::device_malloc(&p, bytes), "nccl staging: allocate");
    return p;
  };
  m.release = [device](void* p) {
    (void)gpu::set_device(device);
    (void)gpu::device_free(p);
  };
  m.to_device = [=](void* d, const void* h, std::size_t bytes) {
    on_device("nccl staging: copy in");
    check(gpu::copy_to_device(d, h, bytes), "nccl staging: copy in");
    check(gpu::device_synchronize(), "nccl staging: copy in");
  };
  m.to_host = [=](void* h, const void* d, std::size_t bytes) {
    on_device("nccl staging: copy out");
    check(gpu::copy_to_host(h, d, bytes), "nccl staging: copy out");
  };
  return m;
}

std::unique_ptr<communicator> device_staged_comm::shrink(const std::vector<int>& excluded,
                                                         bool abort_parent, int timeout_ms) {
  std::unique_ptr<communicator> child = inner_->shrink(excluded, abort_parent, timeout_ms);
  if (!child) return nullptr;
  return std::make_unique<device_staged_comm>(std::move(child), memory_);
}

}  // namespace cohort::comm
