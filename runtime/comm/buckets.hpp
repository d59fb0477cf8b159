// The gradient bucket engine: splits a flat gradient buffer into buckets (last layers
// first), allreduces each bucket as soon as backward marks its whole range ready, on one
// communication thread per lane (a lane is one communicator of the same group; bucket k
// goes to lane k % lanes, so with several lanes several buckets are in flight at once),
// and records when each allreduce ran, so the caller can measure how much of it backward
// hid (overlap_seconds). Owns the threads and the accounting; it does not own the
// communicators or the buffer, and does not know when backward ran.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/comm/communicator.hpp"
#include "runtime/comm/compressed_allreduce.hpp"
#include "runtime/comm/holders_sum.hpp"

namespace cohort::comm {

/// Element type of the gradient buffer: float sums (train.determinism: fast) or int64
/// fixed point (bitwise), whose sums do not depend on order.
enum class grad_type { f32, i64 };

/// One bucket: elements [offset, offset + count) of the flat buffer, and how it travels.
struct bucket_range {
  std::size_t offset = 0;
  std::size_t count = 0;
  wire_format format = wire_format::f32;
};

/// A stretch of a float buffer that travels compressed (comm.compression, 1-bit Adam).
struct wire_segment {
  std::size_t offset = 0;
  std::size_t count = 0;
  wire_format format = wire_format::f32;
};

/// How the plain (uncompressed) stretches of a float buffer are summed.
enum class plain_sum {
  transport,   ///< the communicator's allreduce_sum, in its own order (ring, shm, hierarchy)
  rank_order,  ///< ordered_allreduce_sum: the same bits on every transport and host layout
};

/// How a float buffer travels: the compressed stretches (sorted, disjoint; everything
/// else is summed as plain floats, as `plain` says) and, optionally, their error memory
/// (whole-buffer arrays indexed like the buffer, see compressed_allreduce.hpp). Training
/// state: the owner (the seat) keeps the memory alive while an engine uses the plan.
struct wire_plan {
  std::vector<wire_segment> compressed;
  error_memory memory;
  plain_sum plain = plain_sum::transport;
  bool operator==(const wire_plan& o) const;
};

/// Splits `elements` into buckets of `bucket_mb` MiB (2^20 bytes; at least one element)
/// in REVERSE order: bucket 0 holds the last elements of the buffer (backward produces the
/// last layers' gradients first), the last bucket starts at 0 and may be smaller. A bucket
/// never crosses the edge of a compressed segment: it has one format. Throws usage_error
/// if bucket_mb <= 0 or a segment is unsorted, overlapping or outside the buffer.
std::vector<bucket_range> plan_buckets(std::size_t elements, std::size_t element_bytes,
                                       double bucket_mb,
                                       const std::vector<wire_segment>& compressed = {});

/// The step's collectives, in the order every rank runs them: each a list of buckets
/// (indices into BUCKETS, ascending) of one format, summed in one call. Buckets of the plain
/// float wire are one collective each, as planned. Compressed buckets are gathered: a wire
/// plan interleaves compressed stretches with plain ones (1-bit Adam keeps biases and norms
/// at full precision), and on a slow link each collective costs its rounds' latency, so the
/// buckets of one format share collectives of at most PER elements, each opened by its
/// first bucket in BUCKETS' order (the plain buckets between them too: one for the MLP's
/// biases instead of three).
std::vector<std::vector<std::size_t>> plan_collectives(const std::vector<bucket_range>& buckets,
                                                       std::size_t per);

/// A stretch of wall time on the steady clock (one process's clock: compare only
/// intervals taken in the same process). Empty when end <= begin.
struct time_interval {
  std::chrono::steady_clock::time_point begin, end;
  double seconds() const {
    return end > begin ? std::chrono::duration<double>(end - begin).count() : 0.0;
  }
};

/// Seconds of wall time covered by both some interval of `a` and some interval of `b`: the
/// length of (union of a) intersected with (union of b). Intervals may come in any order and
/// overlap one another; empty ones count for nothing.
double overlap_seconds(std::vector<time_interval> a, std::vector<time_interval> b);

/// Seconds covered by the union of `a`.
double covered_seconds(std::vector<time_interval> a);

/// What one step's reduction cost and when it ran.
struct bucket_timing {
  /// Wall time during which at least one lane was in allreduce_sum (and the post-scale)
  /// for this step: the union of `collectives` (with one lane, their sum).
  double allreduce_s = 0;
  /// Time the compute thread spent blocked in wait_all: the communication it could not
  /// hide. At least the last bucket's allreduce, which starts after backward has ended.
  double wait_s = 0;
  std::size_t buckets = 0;       ///< collectives run (one per bucket on the plain wire)
  std::size_t bytes = 0;         ///< bytes reduced per rank this step (the buffer's size)
  std::vector<double> bucket_s;  ///< per collective, in communication order
  /// Per collective, in communication order: when the communication thread started and finished its
  /// allreduce (and post-scale); bucket_s[k] is collectives[k].seconds(). The share hidden
  /// behind backward is overlap_seconds(collectives, {backward}) / allreduce_s.
  std::vector<time_interval> collectives;
};

/// Usage, once per step, from the compute thread:
///
///   engine.begin(grads);                       // grads: elements floats (or int64)
///   ... backward: engine.mark_ready(off, n);   // each range once, in any order/chunking
///   bucket_timing t = engine.wait_all();       // grads now hold the sum over ranks
///
/// Each lane reduces its buckets strictly in order (lane l: l, l + L, l + 2L, ..., each as
/// soon as it and the lane's earlier ones are ready), so every rank issues the same
/// collectives on each communicator in the same order whatever its chunking of
/// mark_ready. A failure on one lane aborts the others. Scaling: each float bucket is multiplied by
/// `post_scale` right after its allreduce, on the communication thread (pass
/// 1 / world size for the mean over ranks, or 1 to leave it to the caller; compressed
/// buckets too, after their compressed sum, see set_wire); int64
/// buckets are never scaled (post_scale must be 1): the caller converts back from fixed
/// point once.
class bucket_engine {
 public:
  /// `comm` must outlive the engine; one engine per communicator (per generation).
  bucket_engine(communicator& comm, std::size_t elements, grad_type type, double bucket_mb,
                float post_scale = 1.0f);
  /// One lane per communicator (at least one; all of the same group and generation, each
  /// outliving the engine, none used by anything else while the engine lives).
  bucket_engine(const std::vector<communicator*>& lanes, std::size_t elements, grad_type type,
                double bucket_mb, float post_scale = 1.0f);
  /// Joins the communication threads (after their current collectives, bounded by the
  /// communicators' timeout; call abort() first to make that prompt).
  ~bucket_engine();
  bucket_engine(const bucket_engine&) = delete;
  bucket_engine& operator=(const bucket_engine&) = delete;

  /// Starts a step over `grads` (elements values; must stay valid until wait_all
  /// returns). The type must match the engine's. Throws comm_error(invalid) after a
  /// failed step: the communicator is dead, build a new engine with the new one.
  void begin(float* grads);
  void begin(std::int64_t* grads);
  /// Elements [offset, offset + count) are final for this step. Ranges of one step must not
  /// overlap and must stay inside the buffer (checked: a broken invariant aborts).
  void mark_ready(std::size_t offset, std::size_t count);
  /// Blocks until at most MOST collectives that a lane could run now (all their elements
  /// marked, and every earlier one of the lane's run or runnable) wait for their sum, or one
  /// failed: backward held back so that the gradients sharded mode gives back once summed
  /// (set_holders) do not pile up behind a busy communication thread. A collective still
  /// waiting for unmarked elements holds nothing back behind it, so this never waits for
  /// backward itself.
  void wait_pending(std::size_t most);
  /// Blocks until every bucket is reduced; returns the step's timing. Every element must
  /// have been marked ready. Rethrows the communication thread's comm_error if a
  /// collective failed (then the engine is dead, like its communicator).
  bucket_timing wait_all();
  /// Aborts every lane's communicator: a collective in flight fails at once, wait_all
  /// throws.
  void abort();

  /// How the float buffer travels from the next begin() on (between steps only; float
  /// engines only). Buckets are planned again when the plan changes.
  void set_wire(const wire_plan& plan);
  const wire_plan& wire() const { return wire_; }

  /// Sharded gradients (train.zero: 2), between steps: from the next begin() on, each bucket
  /// is summed only to the ranks that hold its elements (holders_sum, rank order; the plain
  /// wire only) instead of to every rank; null: allreduce again. ON_REDUCED (may be empty)
  /// runs on the lane's thread right after each bucket's sum with the bucket's range, so
  /// that the caller gives back at once what it does not hold. Float post-scaling touches
  /// only the held elements.
  void set_holders(std::shared_ptr<const holding> h,
                   std::function<void(std::size_t offset, std::size_t count)> on_reduced = {});
  const holding* holders() const { return holders_.get(); }

  /// Test seam, empty in production: HOOK runs on a lane's thread, with the engine's lock
  /// held, each time the lane has nothing to run and waits; its argument is the number of
  /// collectives run this step so far (tests wait for a lane that finished a collective and
  /// looked at what is ready, instead of sleeping).
  void set_before_wait(std::function<void(std::size_t done)> hook);

  const std::vector<bucket_range>& buckets() const { return buckets_; }
  /// The step's collectives (plan_collectives); lane l runs collectives l, l + L, ...
  const std::vector<std::vector<std::size_t>>& collectives() const { return collectives_; }
  std::size_t lanes() const { return lanes_.size(); }
  grad_type type() const { return type_; }
  std::size_t elements() const { return elements_; }

 private:
  void begin_step(void* grads, grad_type type);
  void comm_loop(std::size_t lane);
  std::size_t bucket_of(std::size_t element) const;
  void set_buckets(std::vector<bucket_range> buckets);
  void run_collective(communicator& comm, const std::vector<std::size_t>& members, void* grads,
                      const error_memory& memory, plain_sum plain, std::vector<float>& staging);

  const std::vector<communicator*> lanes_;
  const std::size_t elements_;
  const grad_type type_;
  const float post_scale_;
  const double bucket_mb_;
  wire_plan wire_;
  std::shared_ptr<const holding> holders_;  // set_holders (null: every rank gets every sum)
  std::function<void(std::size_t, std::size_t)> on_reduced_;
  std::vector<bucket_range> buckets_;
  std::vector<std::vector<std::size_t>> collectives_;
  std::vector<std::size_t> collective_of_;  // per bucket: the collective it travels in

  std::mutex mutex_;
  std::condition_variable changed_;  // readiness, progress, failure, stop
  bool stop_ = false;
  bool in_step_ = false;
  void* grads_ = nullptr;
  std::vector<std::size_t> missing_;           // per collective: elements not yet marked this step
  std::map<std::size_t, std::size_t> marked_;  // marked ranges (offset -> end), merged
  std::size_t marked_total_ = 0;
  std::vector<std::size_t> next_;   // per lane: the next collective it runs
  std::size_t done_ = 0;            // collectives run this step
  std::vector<time_interval> ran_;  // per collective: when it ran this step
  std::exception_ptr error_;
  std::function<void(std::size_t)> before_wait_;  // test seam (set_before_wait)
  std::vector<std::thread> threads_;              // last: started after every member above exists
};

}  // namespace cohort::comm
