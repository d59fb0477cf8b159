// The NCCL backend of communicator: wraps gpu::nccl_comm (status values) into the
// communicator interface (comm_error), and exchanges NCCL's unique id through a kv_client
// under the generation's keys. Owns the id exchange only; NCCL itself is in gpu/.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "gpu/nccl_comm.hpp"
#include "runtime/comm/communicator.hpp"
#include "runtime/comm/kv_client.hpp"

namespace cohort::comm {

/// Every pointer passed to it is device memory of `device`; make_communicator wraps it in a
/// device_staged_comm, which also takes host memory.
class nccl_communicator : public communicator {
 public:
  /// Rank 0 generates the unique id and sets it under generation_key(generation,
  /// prefix + "/unique_id"); the other ranks get it (waiting up to rendezvous_timeout).
  /// Then non-blocking NCCL init, aborted after `timeout`. Throws comm_error:
  /// unavailable without a GPU or NCCL, timeout, rendezvous, peer_lost.
  nccl_communicator(kv_client& kv, std::uint64_t generation, int rank, int size, int device,
                    std::chrono::milliseconds timeout, std::chrono::milliseconds rendezvous_timeout,
                    const std::string& prefix = "nccl");

  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }
  const char* backend() const override { return "nccl"; }

  void allreduce_sum(float* data, std::size_t n) override;
  void allreduce_sum(std::int64_t* data, std::size_t n) override;
  void allgather(const void* send, void* recv, std::size_t bytes) override;
  void alltoall(const void* send, void* recv, std::size_t bytes) override;
  void broadcast(void* data, std::size_t bytes, int root) override;
  void barrier() override;
  /// ncclCommAbort (by the polling thread if a call is in flight): prompt, and the peers'
  /// calls fail too.
  void abort() override { comm_->abort(); }
  /// gpu::nccl_comm::interrupt: the waits end, the NCCL communicator stays for shrink().
  void interrupt() override { comm_->interrupt(); }
  bool can_shrink() const override { return comm_->shrinkable(); }
  /// gpu::nccl_comm::shrink (ncclCommShrink); the new communicator waits on its calls with
  /// this one's timeout. Throws comm_error with what NCCL said.
  std::unique_ptr<communicator> shrink(const std::vector<int>& excluded, bool abort_parent,
                                       int timeout_ms) override;
  bool dead() const override { return comm_->dead(); }
  bool stuck() const override { return comm_->stuck(); }
  /// gpu::nccl_comm::last_error(): what the abort or the failed call said.
  const std::string& last_error() const { return comm_->last_error(); }
  /// Not measured: NCCL chooses its algorithm and moves the bytes inside the library,
  /// where cohort cannot count them (see comm_traffic).
  comm_traffic traffic() const override { return comm_traffic{}; }

 private:
  explicit nccl_communicator(std::unique_ptr<gpu::nccl_comm> shrunk) : comm_(std::move(shrunk)) {}
  void check(gpu::nccl_status s, const char* op);

  std::unique_ptr<gpu::nccl_comm> comm_ = std::make_unique<gpu::nccl_comm>();
};

/// The comm_failure a gpu::nccl_status stands for.
comm_failure failure_of(gpu::nccl_status s);

}  // namespace cohort::comm
