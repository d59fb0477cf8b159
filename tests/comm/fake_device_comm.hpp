// Test-only CPU stand-in for the NCCL communicator (runtime/comm/nccl_communicator.*): the
// communicator interface shaped like gpu::nccl_comm::run (a call enqueues on its rank's
// stream thread, which runs collectives in order and records an event each, and waits for
// that event until the timeout or an abort), a fake shrink, and injected hangs / failures
// on the group (one unique id). Ranks are threads over host memory; no elastic rule here.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/comm/communicator.hpp"

namespace cohort::comm::testing {

/// A completed collective as its rank's stream recorded it.
struct fake_event {
  std::size_t seq = 0;     ///< the collective's number on this communicator (0, 1, ...)
  std::string op;          ///< "allreduce_f32", "allreduce_i64", "allgather", ...
  std::size_t amount = 0;  ///< elements (allreduce) or bytes (the others)
  bool operator==(const fake_event& o) const {
    return seq == o.seq && op == o.op && amount == o.amount;
  }
};

struct fake_op;
class fake_device_comm;

/// One NCCL communicator's world (what a unique id names). One mutex guards everything
/// of the group and its communicators: a fake, not a performance model.
class fake_nccl_group {
 public:
  explicit fake_nccl_group(int size) : size_(size) {}
  int size() const { return size_; }

  /// Rank `rank`'s stream stalls at its collective `seq` until release_hangs() (a hung
  /// kernel, a member stuck in the collective).
  void hang_at(int rank, std::size_t seq);
  /// Rank `rank`'s stream fails collective `seq` (NCCL reports an error on that rank).
  void fail_at(int rank, std::size_t seq);
  /// abort() / shrink() of `rank` does not return until release_hangs().
  void hang_abort(int rank);
  void hang_shrink(int rank);
  /// Ends every injected hang (the stuck calls then return).
  void release_hangs();
  /// Blocks until `n` collectives are running on streams of this group (test order).
  void wait_running(int n);
  /// Blocks until `n` calls of abort() on this group's communicators have returned.
  void wait_aborts_returned(int n);

 private:
  friend class fake_device_comm;
  struct slot {  // collective `seq`, as the ranks' streams arrive at it
    std::vector<std::shared_ptr<fake_op>> ops;
    int arrived = 0;
    bool done = false;
  };
  struct shrink_slot {
    std::shared_ptr<fake_nccl_group> child;
    int arrived = 0;
  };
  bool hang_here(int rank, std::size_t seq) const;

  const int size_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::size_t, slot> slots_;
  std::map<std::vector<int>, shrink_slot> shrinks_;
  std::set<std::pair<int, std::size_t>> hangs_, fails_;
  std::set<int> abort_hangs_, shrink_hangs_;
  bool released_ = false;
  bool poisoned_ = false;  // a member aborted, failed or timed out: no collective completes
  bool stalled_ = false;   // a member was interrupted in a collective: none completes, no call ends
  int running_ = 0;
  int aborts_returned_ = 0;
};

/// One rank of a fake_nccl_group: the communicator contract of communicator.hpp, with
/// NCCL's failure semantics: abort() ends this rank's call (aborted) and poisons the group
/// (the peers' calls fail: peer_lost); a timeout does the same (timeout).
class fake_device_comm : public communicator {
 public:
  fake_device_comm(std::shared_ptr<fake_nccl_group> group, int rank,
                   std::chrono::milliseconds timeout);
  /// Stops the stream (a hung one too); a collective still pending poisons the group.
  ~fake_device_comm() override;

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  const char* backend() const override { return "fake-nccl"; }
  void allreduce_sum(float* data, std::size_t n) override;
  void allreduce_sum(std::int64_t* data, std::size_t n) override;
  void allgather(const void* send, void* recv, std::size_t bytes) override;
  void alltoall(const void* send, void* recv, std::size_t bytes) override;
  void broadcast(void* data, std::size_t bytes, int root) override;
  void barrier() override;
  void abort() override;
  /// NCCL's interrupt (gpu::nccl_comm::interrupt): this rank's call in flight and every later
  /// one throw aborted; a collective left on the stream cannot complete (the group is
  /// poisoned, as on a real GPU its peers would wait for ever), but the communicator is not
  /// aborted: can_shrink() stays true (false once a call failed on its own, as on a GPU).
  void interrupt() override;
  bool can_shrink() const override;
  /// The communicator interface's shrink: shrink() below, as a communicator. Throws invalid
  /// for an aborted communicator.
  std::unique_ptr<communicator> shrink(const std::vector<int>& excluded, bool abort_parent,
                                       int timeout_ms) override;
  bool dead() const override;
  comm_traffic traffic() const override { return comm_traffic{}; }

  /// ncclCommShrink: every rank not in `excluded` calls it; each gets its rank in a new
  /// group of the survivors (old order kept). Without `abort_parent` the group must have
  /// no collective in flight (NCCL_SHRINK_DEFAULT); with it, those are ended first
  /// (NCCL_SHRINK_ABORT). Throws comm_error: invalid (excluded rank, busy parent),
  /// timeout (a survivor never came).
  std::shared_ptr<fake_device_comm> shrink(const std::vector<int>& excluded, bool abort_parent);

  /// This rank's completed collectives, in completion order.
  std::vector<fake_event> events() const;
  /// Collectives enqueued so far (the next one's seq).
  std::size_t enqueued() const;

 private:
  void run(std::shared_ptr<fake_op> op);
  void stream_loop();
  void complete(fake_nccl_group::slot& s);

  const std::shared_ptr<fake_nccl_group> group_;
  const int rank_;
  const std::chrono::milliseconds timeout_;
  std::deque<std::shared_ptr<fake_op>> queue_;  // guarded by group_->mutex_
  std::vector<fake_event> events_;
  std::size_t next_seq_ = 0;
  bool stop_ = false;
  bool dead_ = false;
  bool abort_requested_ = false;
  bool interrupt_requested_ = false;
  bool failed_ = false;  // a call failed on its own (timeout, a peer's failure): never shrunk
  std::thread stream_;  // last: started once every member above exists
};

}  // namespace cohort::comm::testing
