#include "runtime/comm/nccl_communicator.hpp"

#include "gpu/device.hpp"

namespace cohort::comm {

comm_failure failure_of(gpu::nccl_status s) {
  switch (s) {
    case gpu::nccl_status::no_device:
      return comm_failure::unavailable;
    case gpu::nccl_status::invalid_argument:
      return comm_failure::invalid;
    case gpu::nccl_status::timeout:
      return comm_failure::timeout;
    case gpu::nccl_status::aborted:
      return comm_failure::aborted;
    case gpu::nccl_status::ok:  // not a failure; never thrown
    case gpu::nccl_status::nccl_error:
    case gpu::nccl_status::cuda_error:
      break;
  }
  // NCCL reports a failed or vanished peer as a remote / system error.
  return comm_failure::peer_lost;
}

nccl_communicator::nccl_communicator(kv_client& kv, std::uint64_t generation, int rank, int size,
                                     int device, std::chrono::milliseconds timeout,
                                     std::chrono::milliseconds rendezvous_timeout,
                                     const std::string& prefix) {
  const std::string what = "nccl init (rank " + std::to_string(rank) + " of " +
                           std::to_string(size) + ", cuda:" + std::to_string(device) + ")";
  if (!gpu::nccl_compiled())
    throw comm_error(comm_failure::unavailable, what,
                     "this build has no NCCL backend; use comm.backend: gloo");
  if (gpu::device_count() == 0)
    throw comm_error(comm_failure::unavailable, what,
                     std::string("no CUDA device here (") + gpu::last_error_message() +
                         "); use comm.backend: gloo or run on a GPU machine");
  if (size < 1 || rank < 0 || rank >= size)
    throw comm_error(comm_failure::invalid, what, "rank must be in [0, size) and size >= 1");
  const std::string key = generation_key(generation, prefix + "/unique_id");
  std::vector<char> id;
  if (rank == 0) {
    std::string detail;
    const gpu::nccl_status s = gpu::nccl_make_unique_id(&id, &detail);
    if (s != gpu::nccl_status::ok) throw comm_error(failure_of(s), what, detail);
    kv.set(key, id);
  } else {
    id = kv.get(key, rendezvous_timeout);  // throws comm_error(timeout) itself
  }
  const gpu::nccl_status s = comm_->init(id, rank, size, device, static_cast<int>(timeout.count()));
  if (s != gpu::nccl_status::ok) throw comm_error(failure_of(s), what, comm_->last_error());
}

void nccl_communicator::check(gpu::nccl_status s, const char* op) {
  if (s == gpu::nccl_status::ok) return;
  throw comm_error(failure_of(s),
                   std::string("nccl ") + op + " (rank " + std::to_string(comm_->rank()) + " of " +
                       std::to_string(comm_->size()) + ")",
                   comm_->last_error());
}

void nccl_communicator::allreduce_sum(float* data, std::size_t n) {
  check(comm_->allreduce_sum(data, n, gpu::nccl_dtype::f32), "allreduce_sum(float)");
}
void nccl_communicator::allreduce_sum(std::int64_t* data, std::size_t n) {
  check(comm_->allreduce_sum(data, n, gpu::nccl_dtype::i64), "allreduce_sum(int64)");
}
void nccl_communicator::allgather(const void* send, void* recv, std::size_t bytes) {
  check(comm_->allgather(send, recv, bytes), "allgather");
}
void nccl_communicator::alltoall(const void* send, void* recv, std::size_t bytes) {
  check(comm_->alltoall(send, recv, bytes), "alltoall");
}
void nccl_communicator::broadcast(void* data, std::size_t bytes, int root) {
  check(comm_->broadcast(data, bytes, root), "broadcast");
}
void nccl_communicator::barrier() { check(comm_->barrier(), "barrier"); }

}  // namespace cohort::comm

namespace cohort::comm {

std::unique_ptr<communicator> nccl_communicator::shrink(const std::vector<int>& excluded,
                                                        bool abort_parent, int timeout_ms) {
  auto out = std::make_unique<gpu::nccl_comm>();
  const gpu::nccl_status s = comm_->shrink(excluded, abort_parent, timeout_ms, out.get());
  if (s != gpu::nccl_status::ok)
    throw comm_error(failure_of(s),
                     "nccl shrink (rank " + std::to_string(comm_->rank()) + " of " +
                         std::to_string(comm_->size()) + ", " + std::to_string(excluded.size()) +
                         " excluded)",
                     comm_->last_error());
  return std::unique_ptr<communicator>(new nccl_communicator(std::move(out)));
}

}  // namespace cohort::comm
