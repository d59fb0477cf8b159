// The shared-memory backend of communicator, for the ranks of a group that share one host:
// one segment in /dev/shm per group and generation, every rank's chunk copied in once, each
// rank summing its own slice of every chunk across the ranks (in rank order, so every rank
// gets the same bits), the sums copied out. Waits spin briefly, then sleep on a futex in
// the segment, so more ranks than cores do not starve each other; every wait is bounded by
// the timeout, abort() wakes every rank of the group, and a peer whose process is gone is
// noticed within a few milliseconds. Owns the segment and its protocol; which groups use it
// is the factory's decision (runtime/comm/factory.hpp).
#pragma once
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "runtime/comm/communicator.hpp"
#include "runtime/comm/kv_client.hpp"

namespace cohort::comm {

class build_abort;

struct shm_options {
  /// Store keys: "<prefix>/name" (the segment rank 0 made), "<prefix>/attached/<r>".
  std::string prefix = "shm";
  std::chrono::milliseconds timeout{5000};             ///< every wait inside a collective
  std::chrono::milliseconds rendezvous_timeout{5000};  ///< the store waits of construction
  std::size_t chunk_bytes = std::size_t(1) << 18;  ///< per rank and buffer (256 KiB: measured best)
  std::shared_ptr<build_abort> cancel;                 ///< optional: ends construction
  /// Test seam, empty in production: runs on the calling thread each time a collective is
  /// about to sleep waiting for a peer (tests abort a call proven to be blocked).
  std::function<void()> before_wait;
};

/// This host's identity for "same host": host name, network namespace and boot id, so
/// emulated hosts (network namespaces on one machine) count as different hosts.
std::string host_identity();

class shm_comm final : public communicator {
 public:
  /// Joins the group through KV (keys scoped by GENERATION, like Gloo's). Throws
  /// comm_error (rendezvous, timeout, unavailable: no /dev/shm, or aborted).
  shm_comm(kv_client& kv, std::uint64_t generation, int rank, int size, const shm_options& o);
  ~shm_comm() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "shm"; }
  bool memory_bound() const override { return true; }

  /// Float sums in rank order (0 + 1 + ... + n-1): the same bits on every rank; they may
  /// differ in the last bits from Gloo's ring, whose order is another. int64 sums are exact
  /// and equal Gloo's.
  void allreduce_sum(float* data, std::size_t n) override;
  void allreduce_sum(std::int64_t* data, std::size_t n) override;
  void allgather(const void* send, void* recv, std::size_t bytes) override;
  void alltoall(const void* send, void* recv, std::size_t bytes) override;
  /// In one pass through the segment: each rank copies the range in, then its holders add
  /// the ranks' copies of what they hold (one synchronisation per chunk, half an
  /// allreduce's).
  void holders_sum(float* data, std::size_t offset, std::size_t count, const holding& h) override;
  void holders_sum(std::int64_t* data, std::size_t offset, std::size_t count,
                   const holding& h) override;
  void broadcast(void* data, std::size_t bytes, int root) override;
  void barrier() override;
  /// Marks the segment aborted and wakes every waiter of every rank: their calls throw
  /// comm_error(aborted), this rank's at once, the peers' at their next wait.
  void abort() override;
  bool dead() const override { return dead_.load(); }
  /// Bytes this rank copied into the segment (sent) and out of it (received).
  comm_traffic traffic() const override;

  struct segment;  ///< the mapped layout (shm_comm.cpp)

 private:
  template <class T>
  void allreduce(T* data, std::size_t n, const char* op);
  template <class T>
  void to_holders(T* data, std::size_t offset, std::size_t count, const holding& h,
                  const char* op);
  // Arrives at the next phase and waits until every rank has: the one synchronisation.
  void sync(const char* op);
  void check_usable(const char* op);
  [[noreturn]] void fail(comm_failure kind, const char* op, const std::string& detail);
  unsigned char* buffer(int parity, int rank) const;

  int rank_;
  int size_;
  shm_options opts_;
  segment* seg_ = nullptr;
  std::size_t mapped_bytes_ = 0;
  std::uint64_t phase_ = 0;  ///< phases this rank has completed
  int parity_ = 0;           ///< which of the two buffer sets the next chunk uses
  std::atomic<bool> dead_{false};
  std::atomic<bool> aborted_{false};
  std::atomic<std::uint64_t> sent_{0};
  std::atomic<std::uint64_t> received_{0};
};

}  // namespace cohort::comm
