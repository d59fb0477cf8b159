// The one collective interface cohort's data plane uses (allreduce, allgather, broadcast,
// alltoall, barrier, abort), whatever the backend: Gloo over TCP (runtime/comm/gloo_comm.hpp) or
// NCCL (runtime/comm/nccl_communicator.hpp). Owns the contract, not any transport; the
// factory that picks a backend is runtime/comm/factory.hpp.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/comm_error.hpp"

namespace cohort::comm {

/// A fixed group of `size()` ranks built for one roster generation.
///
/// Contract (every backend):
/// - Collective calls are blocking and must be made by every rank in the same order with
///   the same sizes. One collective at a time per communicator (the bucket engine gives
///   them a single communication thread); only abort() may be called concurrently.
/// - Pointers live where the backend computes: host memory for Gloo; for NCCL (as
///   make_communicator builds it) device memory of the communicator's GPU, or host memory,
///   which goes through a device scratch (device_staged_comm).
/// - Every call is bounded by the timeout the communicator was built with: a hung or
///   dead peer makes the call throw comm_error (timeout or peer_lost), never hang.
/// - After any comm_error the communicator is dead (Gloo's rule: a transport error
///   closes its pairs): every later call throws comm_error(invalid) at once. Build a new
///   one, normally for the next generation, and drop this one.
/// Bytes a communicator handed to its transport since it was built: `sent` is counted as
/// each send is posted, `received` as each receive is posted (so a collective cut short by
/// an error may count bytes that never arrived). `measured` is false for a backend that
/// cannot see its own transfers (NCCL moves them inside the library): then both are 0 and
/// mean "not known", never an estimate.
struct comm_traffic {
  std::uint64_t sent = 0;
  std::uint64_t received = 0;
  bool measured = false;
};

struct holding;  // runtime/comm/holders_sum.hpp

class communicator {
 public:
  virtual ~communicator() = default;
  communicator() = default;
  communicator(const communicator&) = delete;
  communicator& operator=(const communicator&) = delete;

  /// This process's rank in [0, size()).
  virtual int rank() const = 0;
  /// Ranks in the group.
  virtual int size() const = 0;
  /// "gloo", "shm", "hierarchical" or "nccl": for logs and summaries.
  virtual const char* backend() const = 0;
  /// True when every collective is a copy through one host's memory (shared memory): more
  /// communicators beside it buy nothing, since copies are bound by memory bandwidth, not
  /// by round trips (comm.lanes).
  virtual bool memory_bound() const { return false; }

  /// In place: data[i] becomes the sum over ranks of data[i]. Float sums depend on the
  /// backend's order (Gloo's ring); use the int64 overload for order-free sums.
  virtual void allreduce_sum(float* data, std::size_t n) = 0;
  /// In place, integer sum (the fixed-point bitwise mode): exact, independent of order.
  /// Overflow wraps in the backend; callers bound their values so it cannot happen.
  virtual void allreduce_sum(std::int64_t* data, std::size_t n) = 0;
  /// Every rank contributes `bytes` from `send`; `recv` (size() * bytes) receives rank r's
  /// block at offset r * bytes, on every rank.
  virtual void allgather(const void* send, void* recv, std::size_t bytes) = 0;
  /// Personalised exchange: `send` holds size() blocks of `bytes`; block j goes to rank j,
  /// and `recv` (size() * bytes) receives rank r's block for this rank at offset r * bytes.
  virtual void alltoall(const void* send, void* recv, std::size_t bytes) = 0;
  /// Elements [offset, offset + count) of `data`: each element that H says this rank holds
  /// becomes the sum over ranks, added in rank order; the others keep their values (the
  /// sum of sharded gradients, runtime/comm/holders_sum.hpp). The default runs one alltoall
  /// of padded blocks; a backend with a cheaper way overrides it.
  virtual void holders_sum(float* data, std::size_t offset, std::size_t count, const holding& h);
  virtual void holders_sum(std::int64_t* data, std::size_t offset, std::size_t count,
                           const holding& h);
  /// Rank `root`'s `bytes` at `data` are copied to `data` on every rank.
  virtual void broadcast(void* data, std::size_t bytes, int root) = 0;
  /// Returns once every rank has entered the barrier.
  virtual void barrier() = 0;

  /// Thread-safe, callable from any thread at any time, idempotent: makes a collective
  /// blocked in another thread throw comm_error(aborted) promptly and kills the
  /// communicator (peers see their pending collectives fail too). See docs/collectives.md
  /// for how promptly each backend manages it.
  virtual void abort() = 0;
  /// True once a call failed or abort() was called: only destruction is left.
  virtual bool dead() const = 0;
  /// Like abort() for this rank's calls (the one in flight and every later one throw
  /// comm_error(aborted)), but it keeps what a backend can rebuild the group from: NCCL
  /// leaves its communicator un-aborted so that the survivors of a departure can shrink it
  /// (can_shrink, shrink) instead of building a new one. Any other backend: abort().
  virtual void interrupt() { abort(); }
  /// True when shrink() can give this rank's part of the group without some ranks: only an
  /// NCCL communicator (2.27+) that was never aborted and never failed (an interrupted one
  /// can). Every other backend: false.
  virtual bool can_shrink() const { return false; }
  /// The group without the ranks in EXCLUDED (old ranks, ascending, not this one, at least
  /// one), the survivors in their old order; every survivor calls it with the same list.
  /// ABORT_PARENT ends operations still in flight on this communicator first (a departed
  /// rank died or hung). Bounded by TIMEOUT_MS. Throws comm_error (timeout, invalid,
  /// peer_lost) or returns null where the backend cannot shrink (can_shrink() false). This
  /// communicator is left as it was: drop it once the result works.
  virtual std::unique_ptr<communicator> shrink(const std::vector<int>& excluded, bool abort_parent,
                                               int timeout_ms) {
    (void)excluded;
    (void)abort_parent;
    (void)timeout_ms;
    return nullptr;
  }
  /// True when an abort did not return by its deadline (NCCL's ncclCommAbort can hang): a
  /// thread is left inside the library holding the device, so the process must not build
  /// again but leave its groups as a dead member (step::dp_links::drop exits it).
  virtual bool stuck() const { return false; }

  /// The transport traffic so far (thread-safe; read it between collectives for one
  /// collective's share).
  virtual comm_traffic traffic() const = 0;
};

/// Sums N doubles at DATA over C's group in place, in rank order (an allgather of every
/// rank's values, then the adds rank 0 first), so every rank gets the same bits whatever
/// the backend: the communicator has no double allreduce. Host memory (staged on NCCL).
inline void allreduce_sum_rank_order(communicator& c, double* data, std::size_t n) {
  const auto size = static_cast<std::size_t>(c.size());
  std::vector<double> all(n * size);
  c.allgather(data, all.data(), n * sizeof(double));
  for (std::size_t i = 0; i < n; ++i) {
    double x = 0;
    for (std::size_t r = 0; r < size; ++r) x += all[r * n + i];
    data[i] = x;
  }
}

}  // namespace cohort::comm
