// The NCCL communicator of the device layer: init from a unique id with a deadline
// (non-blocking init polled until done), allreduce / allgather / alltoall / broadcast / barrier on
// device memory, and ncclCommAbort on timeout or abort(). Status values, no exceptions,
// no CUDA or NCCL header needed to include it; the id exchange and the communicator
// interface live in runtime/comm/nccl_communicator.*.
#pragma once
#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace cohort::gpu {

/// Outcome of an NCCL call. Anything but ok (and invalid_argument) leaves the
/// communicator aborted: only destruction is left.
enum class nccl_status : int {
  ok = 0,
  no_device,         ///< built without CUDA or NCCL, no driver, or no such device
  invalid_argument,  ///< a caller bug caught at the boundary (bad rank, id size, root, ...)
  timeout,           ///< init or a collective did not finish before its deadline
  aborted,           ///< abort() was called
  nccl_error,        ///< NCCL reported an error (a peer failed, a network error, ...)
  cuda_error,        ///< a CUDA runtime call failed (stream, memory, kernel)
};

/// Short fixed text for a status ("ok", "timeout", ...); never null.
const char* nccl_status_string(nccl_status s);

/// Bytes of an NCCL unique id (NCCL_UNIQUE_ID_BYTES).
constexpr std::size_t nccl_unique_id_bytes = 128;

/// True when this build compiled the NCCL backend (CUDA and libnccl were found).
bool nccl_compiled();
/// ncclGetVersion() (e.g. 22809 for 2.28.9); 0 when not compiled. Needs no GPU.
int nccl_version();
/// The id rank 0 generates and every rank passes to init (ncclGetUniqueId). On failure
/// `out` is empty and `detail` (if given) says why.
nccl_status nccl_make_unique_id(std::vector<char>* out, std::string* detail = nullptr);

/// Element types of allreduce_sum.
enum class nccl_dtype { f32, i64 };

/// One rank of an NCCL communicator on one GPU, with its own stream. Calls block the
/// calling thread until the operation has completed on the GPU (polling, so that a
/// deadline and abort() can end the wait); one collective at a time; only abort() may be
/// called from another thread.
class nccl_comm {
 public:
  nccl_comm();
  /// Aborts the NCCL communicator (never waits for peers) and frees the stream.
  ~nccl_comm();
  nccl_comm(const nccl_comm&) = delete;
  nccl_comm& operator=(const nccl_comm&) = delete;

  /// Joins the group: `rank` of `size` on CUDA device `device`, with `unique_id`
  /// (nccl_unique_id_bytes) from rank 0. Non-blocking init (ncclCommInitRankConfig with
  /// blocking = 0) polled with ncclCommGetAsyncError; aborted after `timeout_ms`.
  /// `timeout_ms` also bounds every later collective (from enqueue to completion).
  nccl_status init(const std::vector<char>& unique_id, int rank, int size, int device,
                   int timeout_ms);

  /// In place sum over ranks of `n` elements at device pointer `data`.
  nccl_status allreduce_sum(void* data, std::size_t n, nccl_dtype type);
  /// `recv` (size * bytes, device) gets rank r's `bytes` from `send` at offset r * bytes.
  nccl_status allgather(const void* send, void* recv, std::size_t bytes);
  /// `send` (size * bytes, device) holds one block per rank; rank r's block for this rank
  /// lands in `recv` at offset r * bytes (grouped ncclSend / ncclRecv).
  nccl_status alltoall(const void* send, void* recv, std::size_t bytes);
  /// `bytes` at device pointer `data` on `root` are copied to every rank.
  nccl_status broadcast(void* data, std::size_t bytes, int root);
  /// Returns once every rank has entered it (a one-element allreduce).
  nccl_status barrier();
  /// Makes OUT (a fresh nccl_comm) this communicator without the ranks in EXCLUDED (old
  /// ranks, ascending, not this one, at least one): ncclCommShrink (NCCL 2.27+), non-blocking,
  /// polled until done or TIMEOUT_MS (then OUT is aborted and `timeout` returned). ABORT_PARENT
  /// (NCCL_SHRINK_ABORT) first ends operations in flight on this communicator: use it when a
  /// departed rank died or hung. Every remaining rank must call it with the same EXCLUDED.
  /// This communicator is left as it was (drop it once OUT works). no_device where NCCL has
  /// no ncclCommShrink. An interrupted communicator can be shrunk (always with abort_parent:
  /// operations may be in flight); an aborted or failed one cannot.
  nccl_status shrink(const std::vector<int>& excluded, bool abort_parent, int timeout_ms,
                     nccl_comm* out);
  /// Thread-safe, idempotent: a call in flight returns `aborted` promptly and so does every
  /// later collective, but the NCCL communicator is NOT aborted: the operation the call had
  /// queued is revoked (ncclCommRevoke, NCCL 2.28+; without it, or if the revoke fails, the
  /// communicator is aborted as before), and the communicator is kept for shrink()
  /// (with abort_parent: NCCL_SHRINK_ABORT ends the operations left in flight) or for the
  /// destructor. What the step does when a newer generation is announced: the survivors
  /// of a departure shrink the communicator they hold instead of building a new one.
  void interrupt();
  /// True while this communicator can still be shrunk: initialised, never aborted (an
  /// interrupted one can), and this NCCL has ncclCommShrink.
  bool shrinkable() const;
  /// Thread-safe, idempotent: a call in flight returns `aborted` promptly and the NCCL
  /// communicator is aborted (ncclCommAbort), which makes the peers' calls fail too. The
  /// ncclCommAbort runs on a thread of its own and is waited for until the abort deadline:
  /// one that does not return leaves the communicator stuck() instead of hanging the caller.
  void abort();
  /// True once a call failed or abort() was called.
  bool dead() const { return dead_.load(); }
  /// True when ncclCommAbort did not return within the abort deadline: its thread is left
  /// inside NCCL, holding the device; this communicator's memory is never freed. The
  /// process must leave its groups as a dead member and exit (docs/gpu_training.md).
  bool stuck() const { return stuck_.load(); }
  /// How long an abort waits for ncclCommAbort (default 10 s); set before the first abort.
  void set_abort_deadline_ms(int ms) { abort_deadline_ms_ = ms; }
  /// Detail of the last failure on this communicator ("" if none): which call, what NCCL
  /// or CUDA said.
  const std::string& last_error() const { return last_error_; }
  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  struct impl;
  nccl_status fail(nccl_status s, const std::string& detail);
  template <class Enqueue>
  nccl_status run(const char* what, Enqueue&& enqueue);
  void abort_locked();
  /// Initialised, never aborted, no failure of its own, and this NCCL has ncclCommShrink.
  bool shrinkable_locked() const;
  /// Interrupted, and shrinkable_locked(): shrink() may use it.
  bool kept_for_shrink_locked() const;
  /// After an interrupt ended a call in flight: ncclCommRevoke (NCCL 2.28+), then waits
  /// (bounded) until the communicator is quiescent and its stream drained; otherwise (no
  /// revoke, an error, the deadline) marks it failed, so that it is aborted instead.
  void quiesce_locked();

  std::unique_ptr<impl> impl_;
  int rank_ = -1;
  int size_ = 0;
  int timeout_ms_ = 0;
  std::string last_error_;
  std::atomic<bool> dead_{false};
  std::atomic<bool> abort_requested_{false};
  std::atomic<bool> interrupt_requested_{false};
  std::atomic<bool> stuck_{false};
  int abort_deadline_ms_ = 10000;
  mutable std::mutex mutex_;  // guards busy_, aborted_ and the one ncclCommAbort
  bool busy_ = false;     // a call is polling: it aborts, not abort()
  bool aborted_ = false;  // ncclCommAbort done
  bool failed_ = false;   // a call failed on its own (not by an interrupt)
};

}  // namespace cohort::gpu
