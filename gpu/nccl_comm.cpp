// NCCL backend of the device layer. Host compiler, every build: NCCL and the CUDA runtime
// are used only when COHORT_HAVE_CUDA and COHORT_HAVE_NCCL (gpu/CMakeLists.txt), otherwise
// every call reports no_device. Completion is polled (ncclCommGetAsyncError +
// cudaStreamQuery) instead of blocking in cudaStreamSynchronize, so that a deadline or an
// abort() from another thread can end any wait: a dead peer never hangs a survivor.
#include "gpu/nccl_comm.hpp"

#include <chrono>
#include <string>
#include <cstring>
#include <thread>

#include "gpu/bounded_call.hpp"

#if COHORT_HAVE_CUDA && COHORT_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#endif

namespace cohort::gpu {

const char* nccl_status_string(nccl_status s) {
  switch (s) {
    case nccl_status::ok:
      return "ok";
    case nccl_status::no_device:
      return "no CUDA device or NCCL";
    case nccl_status::invalid_argument:
      return "invalid argument";
    case nccl_status::timeout:
      return "timeout";
    case nccl_status::aborted:
      return "aborted";
    case nccl_status::nccl_error:
      return "NCCL error";
    case nccl_status::cuda_error:
      return "CUDA error";
  }
  return "unknown status";
}

namespace {
// The same argument checks with and without NCCL, so callers see one behaviour.
bool init_args_valid(const std::vector<char>& unique_id, int rank, int size, int timeout_ms) {
  return size >= 1 && rank >= 0 && rank < size && timeout_ms > 0 &&
         unique_id.size() == nccl_unique_id_bytes;
}
const char* kBadInitArgs = "init: need 0 <= rank < size, timeout_ms > 0 and a 128-byte unique id";
}  // namespace

nccl_status nccl_comm::fail(nccl_status s, const std::string& detail) {
  last_error_ = std::string(nccl_status_string(s)) + ": " + detail;
  return s;
}

#if COHORT_HAVE_CUDA && COHORT_HAVE_NCCL

static_assert(nccl_unique_id_bytes == NCCL_UNIQUE_ID_BYTES, "NCCL id size changed");

struct nccl_comm::impl {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  void* scratch = nullptr;  // the barrier's one float
  int device = -1;
};

namespace {

using clock_type = std::chrono::steady_clock;

std::string nccl_text(ncclResult_t r, ncclComm_t comm) {
  std::string s = ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && last[0] != '\0') s += std::string(" (") + last + ")";
  return s;
}

std::string cuda_text(cudaError_t e) {
  (void)cudaGetLastError();  // clear the sticky slot so later calls do not report it again
  return std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")";
}

}  // namespace

bool nccl_compiled() { return true; }

int nccl_version() {
  int v = 0;
  return ncclGetVersion(&v) == ncclSuccess ? v : 0;
}

nccl_status nccl_make_unique_id(std::vector<char>* out, std::string* detail) {
  out->clear();
  ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) {
    if (detail) *detail = std::string("ncclGetUniqueId: ") + nccl_text(r, nullptr);
    return nccl_status::nccl_error;
  }
  out->assign(id.internal, id.internal + NCCL_UNIQUE_ID_BYTES);
  return nccl_status::ok;
}

nccl_comm::nccl_comm() : impl_(std::make_unique<impl>()) {}

nccl_comm::~nccl_comm() {
  std::lock_guard<std::mutex> lock(mutex_);
  // Abort, never destroy: ncclCommDestroy may wait for peers, and a peer may be dead.
  abort_locked();
  // A stuck abort's thread may still use the stream and the scratch: they are left as they
  // are (the process exits soon after, stuck()).
  if (stuck_) return;
  if (impl_->device >= 0) cudaSetDevice(impl_->device);
  if (impl_->scratch) cudaFree(impl_->scratch);
  if (impl_->stream) cudaStreamDestroy(impl_->stream);
}

void nccl_comm::abort_locked() {
  if (aborted_ || impl_->comm == nullptr) return;
  aborted_ = true;
  // ncclCommAbort is known to hang (NVIDIA/nccl issues 549, 1013, 1317, 1777): bounded. The
  // caller's polling has stopped, so the abort still runs alone on the communicator.
  ncclComm_t comm = impl_->comm;
  const int device = impl_->device;
  const bool returned = call_within(
      [comm, device] {
        if (device >= 0) cudaSetDevice(device);
        ncclCommAbort(comm);
      },
      abort_deadline_ms_);
  if (!returned) {
    stuck_ = true;
    last_error_ = "ncclCommAbort did not return within " + std::to_string(abort_deadline_ms_) +
                  " ms (a known NCCL hang: NVIDIA/nccl issues 549, 1013, 1317, 1777); its "
                  "thread holds the device, so this process leaves its groups as a dead member";
  }
}

bool nccl_comm::shrinkable_locked() const {
#if defined(NCCL_SHRINK_DEFAULT)
  return impl_->comm != nullptr && !abort_requested_ && !failed_ && !aborted_ && !stuck_;
#else
  return false;  // nothing could shrink it: abort as before
#endif
}

bool nccl_comm::kept_for_shrink_locked() const {
  return interrupt_requested_ && shrinkable_locked();
}

void nccl_comm::quiesce_locked() {
#if defined(NCCL_REVOKE_DEFAULT)
  // ncclCommRevoke (NCCL 2.28): stops the operations in flight and leaves the communicator
  // to a shrink once it is quiescent. Bounded like every abort: it may hang as they do.
  ncclComm_t comm = impl_->comm;
  const int device = impl_->device;
  ncclResult_t revoked = ncclInternalError;
  if (!call_within(
          [comm, device, &revoked] {
            if (device >= 0) cudaSetDevice(device);
            revoked = ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT);
          },
          abort_deadline_ms_)) {
    stuck_ = true;
    last_error_ = "ncclCommRevoke did not return within " + std::to_string(abort_deadline_ms_) +
                  " ms; its thread holds the device, so this process leaves its groups as a "
                  "dead member";
    return;
  }
  if (revoked != ncclSuccess && revoked != ncclInProgress) {
    failed_ = true;
    last_error_ = "interrupt: ncclCommRevoke: " + nccl_text(revoked, comm);
    return;
  }
  // Quiescent when NCCL says so and the stream has drained.
  const auto deadline = clock_type::now() + std::chrono::milliseconds(abort_deadline_ms_);
  for (;;) {
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(comm, &state) != ncclSuccess ||
        (state != ncclSuccess && state != ncclInProgress)) {
      failed_ = true;
      last_error_ = "interrupt: the revoked communicator reports an error";
      return;
    }
    if (state == ncclSuccess && cudaStreamQuery(impl_->stream) == cudaSuccess) return;
    if (clock_type::now() >= deadline) {
      failed_ = true;
      last_error_ = "interrupt: the revoked communicator was not quiescent after " +
                    std::to_string(abort_deadline_ms_) + " ms";
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
#else
  // No way to end the collective without aborting the communicator.
  failed_ = true;
#endif
}

void nccl_comm::interrupt() {
  // No NCCL call here: a call that is polling sees the flag and returns; the communicator
  // stays as it is until shrink() or the destructor.
  interrupt_requested_ = true;
  dead_ = true;
}

bool nccl_comm::shrinkable() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return shrinkable_locked();
}

void nccl_comm::abort() {
  abort_requested_ = true;
  dead_ = true;
  std::lock_guard<std::mutex> lock(mutex_);
  // A call that is polling sees the request and aborts itself (NCCL wants the abort
  // and the polling on one thread); otherwise abort here.
  if (!busy_) abort_locked();
}

namespace {

// Polls until the communicator's pending work (init, or an enqueue in non-blocking mode)
// is done and, with `stream`, the stream is idle; or until error, abort or deadline.
template <class Fail>
nccl_status wait_done(ncclComm_t comm, cudaStream_t stream, const std::atomic<bool>& abort,
                      const std::atomic<bool>& interrupt, clock_type::time_point deadline,
                      int timeout_ms, const char* what, Fail&& fail) {
  for (long spins = 0;; ++spins) {
    if (abort.load()) return fail(nccl_status::aborted, std::string(what) + ": abort() was called");
    if (interrupt.load())
      return fail(nccl_status::aborted,
                  std::string(what) + ": interrupted (a newer generation; the communicator is "
                                      "kept for a shrink)");
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess)
      return fail(nccl_status::nccl_error,
                  std::string(what) + ": ncclCommGetAsyncError: " + nccl_text(r, comm));
    if (state != ncclSuccess && state != ncclInProgress)
      return fail(nccl_status::nccl_error, std::string(what) + ": " + nccl_text(state, comm));
    if (state == ncclSuccess) {
      if (stream == nullptr) return nccl_status::ok;
      const cudaError_t q = cudaStreamQuery(stream);
      if (q == cudaSuccess) return nccl_status::ok;
      if (q != cudaErrorNotReady)
        return fail(nccl_status::cuda_error, std::string(what) + ": " + cuda_text(q));
    }
    if (clock_type::now() >= deadline)
      return fail(nccl_status::timeout, std::string(what) + ": not complete after " +
                                            std::to_string(timeout_ms) +
                                            " ms (a peer is missing, hung or too slow)");
    // Spin briefly (small collectives finish in microseconds), then stop burning a core.
    if (spins < 2000)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace

nccl_status nccl_comm::init(const std::vector<char>& unique_id, int rank, int size, int device,
                            int timeout_ms) {
  if (impl_->comm != nullptr || dead_)
    return fail(nccl_status::invalid_argument, "init: called twice");
  if (!init_args_valid(unique_id, rank, size, timeout_ms))
    return fail(nccl_status::invalid_argument, kBadInitArgs);
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0)
    return fail(nccl_status::no_device,
                "init: no CUDA device" + (e != cudaSuccess ? ": " + cuda_text(e) : std::string()));
  if (device < 0 || device >= count)
    return fail(nccl_status::no_device, "init: device " + std::to_string(device) + " of " +
                                            std::to_string(count) + " does not exist");
  rank_ = rank;
  size_ = size;
  timeout_ms_ = timeout_ms;
  impl_->device = device;
  if ((e = cudaSetDevice(device)) != cudaSuccess)
    return fail(nccl_status::cuda_error, "init: cudaSetDevice: " + cuda_text(e));
  if ((e = cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking)) != cudaSuccess)
    return fail(nccl_status::cuda_error, "init: cudaStreamCreate: " + cuda_text(e));
  if ((e = cudaMalloc(&impl_->scratch, sizeof(float))) != cudaSuccess)
    return fail(nccl_status::cuda_error, "init: cudaMalloc: " + cuda_text(e));

  ncclUniqueId id;
  std::memcpy(id.internal, unique_id.data(), NCCL_UNIQUE_ID_BYTES);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // return at once; completion is polled below, under a deadline
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (abort_requested_) return fail(nccl_status::aborted, "init: abort() was called");
    busy_ = true;
  }
  const auto deadline = clock_type::now() + std::chrono::milliseconds(timeout_ms);
  const ncclResult_t r = ncclCommInitRankConfig(&impl_->comm, size, id, rank, &config);
  nccl_status s = nccl_status::ok;
  if (r != ncclSuccess && r != ncclInProgress)
    s = fail(nccl_status::nccl_error, "init: ncclCommInitRankConfig: " + nccl_text(r, impl_->comm));
  else if (impl_->comm == nullptr)
    s = fail(nccl_status::nccl_error, "init: ncclCommInitRankConfig returned no communicator");
  else
    s = wait_done(impl_->comm, nullptr, abort_requested_, interrupt_requested_, deadline,
                  timeout_ms, "init",
                  [this](nccl_status st, const std::string& d) { return fail(st, d); });
  std::lock_guard<std::mutex> lock(mutex_);
  busy_ = false;
  // An interrupted init never formed a communicator worth shrinking: abort it.
  if (s != nccl_status::ok || abort_requested_ || interrupt_requested_) {
    dead_ = true;
    abort_locked();
    if (s == nccl_status::ok) s = fail(nccl_status::aborted, "init: abort() was called");
  }
  return s;
}

template <class Enqueue>
nccl_status nccl_comm::run(const char* what, Enqueue&& enqueue) {
  if (impl_->comm == nullptr && !dead_)
    return fail(nccl_status::invalid_argument, std::string(what) + ": init first");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (dead_ || abort_requested_ || interrupt_requested_) {
      dead_ = true;
      // An interrupted communicator stays un-aborted for the shrink that follows.
      if (!kept_for_shrink_locked()) abort_locked();
      return fail(abort_requested_ || interrupt_requested_ ? nccl_status::aborted
                                                           : nccl_status::nccl_error,
                  std::string(what) + ": the communicator is dead after an earlier failure");
    }
    busy_ = true;
  }
  const auto deadline = clock_type::now() + std::chrono::milliseconds(timeout_ms_);
  nccl_status s = nccl_status::ok;
  cudaError_t e = cudaSetDevice(impl_->device);
  if (e != cudaSuccess) {
    s = fail(nccl_status::cuda_error, std::string(what) + ": cudaSetDevice: " + cuda_text(e));
  } else {
    const ncclResult_t r = enqueue(impl_->comm, impl_->stream);
    if (r != ncclSuccess && r != ncclInProgress)
      s = fail(nccl_status::nccl_error, std::string(what) + ": " + nccl_text(r, impl_->comm));
    else
      s = wait_done(impl_->comm, impl_->stream, abort_requested_, interrupt_requested_, deadline,
                    timeout_ms_, what,
                    [this](nccl_status st, const std::string& d) { return fail(st, d); });
  }
  std::lock_guard<std::mutex> lock(mutex_);
  busy_ = false;
  if (s != nccl_status::ok || abort_requested_ || interrupt_requested_) {
    dead_ = true;
    // Only an interrupt keeps the communicator: any failure of its own (an NCCL or CUDA
    // error, a timeout) aborts it, so that the peers' calls fail too. A collective the
    // interrupt left on the stream is revoked first: a kernel waiting for a dead peer would
    // otherwise hold every later device synchronisation of this process.
    if (s != nccl_status::ok && s != nccl_status::aborted) failed_ = true;
    if (s == nccl_status::aborted && !abort_requested_ && !failed_) quiesce_locked();
    if (!kept_for_shrink_locked()) abort_locked();
  }
  return s;
}

nccl_status nccl_comm::allreduce_sum(void* data, std::size_t n, nccl_dtype type) {
  if (data == nullptr && n > 0) return fail(nccl_status::invalid_argument, "allreduce: null data");
  const ncclDataType_t t = type == nccl_dtype::f32 ? ncclFloat32 : ncclInt64;
  return run("ncclAllReduce", [&](ncclComm_t c, cudaStream_t s) {
    return ncclAllReduce(data, data, n, t, ncclSum, c, s);
  });
}

nccl_status nccl_comm::allgather(const void* send, void* recv, std::size_t bytes) {
  if ((send == nullptr || recv == nullptr) && bytes > 0)
    return fail(nccl_status::invalid_argument, "allgather: null buffer");
  return run("ncclAllGather", [&](ncclComm_t c, cudaStream_t s) {
    return ncclAllGather(send, recv, bytes, ncclUint8, c, s);
  });
}

nccl_status nccl_comm::alltoall(const void* send, void* recv, std::size_t bytes) {
  if ((send == nullptr || recv == nullptr) && bytes > 0)
    return fail(nccl_status::invalid_argument, "alltoall: null buffer");
  return run("alltoall (grouped ncclSend / ncclRecv)", [&](ncclComm_t c, cudaStream_t s) {
    const auto* in = static_cast<const char*>(send);
    auto* out = static_cast<char*>(recv);
    ncclResult_t first = ncclGroupStart();
    for (int r = 0; r < size_ && (first == ncclSuccess || first == ncclInProgress); ++r) {
      const std::size_t off = static_cast<std::size_t>(r) * bytes;
      ncclResult_t e = ncclSend(in + off, bytes, ncclUint8, r, c, s);
      if (e == ncclSuccess || e == ncclInProgress)
        e = ncclRecv(out + off, bytes, ncclUint8, r, c, s);
      if (e != ncclSuccess && e != ncclInProgress) first = e;
    }
    // The group is closed whatever happened inside it.
    const ncclResult_t end = ncclGroupEnd();
    return first == ncclSuccess || first == ncclInProgress ? end : first;
  });
}

nccl_status nccl_comm::broadcast(void* data, std::size_t bytes, int root) {
  if (root < 0 || root >= size_)
    return fail(nccl_status::invalid_argument, "broadcast: root " + std::to_string(root) +
                                                   " is not a rank of " + std::to_string(size_));
  return run("ncclBroadcast", [&](ncclComm_t c, cudaStream_t s) {
    return ncclBroadcast(data, data, bytes, ncclUint8, root, c, s);
  });
}

nccl_status nccl_comm::barrier() {
  return run("barrier (ncclAllReduce of one float)", [&](ncclComm_t c, cudaStream_t s) {
    return ncclAllReduce(impl_->scratch, impl_->scratch, 1, ncclFloat32, ncclSum, c, s);
  });
}

nccl_status nccl_comm::shrink(const std::vector<int>& excluded, bool abort_parent, int timeout_ms,
                              nccl_comm* out) {
  if (out == nullptr || out == this || out->impl_->comm != nullptr || out->dead_)
    return fail(nccl_status::invalid_argument, "shrink: needs a fresh communicator to fill");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (impl_->comm == nullptr || (dead_ && !kept_for_shrink_locked()))
      return fail(nccl_status::invalid_argument,
                  "shrink: this communicator is not live (aborted or failed)");
    // Interrupted: a collective may still be in flight on the parent's stream.
    if (interrupt_requested_) abort_parent = true;
  }
  if (timeout_ms <= 0) return fail(nccl_status::invalid_argument, "shrink: timeout_ms must be > 0");
  // NCCL 2.28.3 fails a shrink that excludes nobody (seen on the H200, 2026-12-04): keeping
  // every rank is keeping the communicator (plan_nccl_rebuild's `keep`).
  if (excluded.empty())
    return fail(
        nccl_status::invalid_argument,
        "shrink: nothing to exclude (a shrink keeping every rank is the same communicator)");
  for (std::size_t i = 0; i < excluded.size(); ++i)
    if (excluded[i] < 0 || excluded[i] >= size_ || excluded[i] == rank_ ||
        (i > 0 && excluded[i] <= excluded[i - 1]))
      return fail(nccl_status::invalid_argument,
                  "shrink: excluded ranks must be ascending ranks of " + std::to_string(size_) +
                      " other than this one (" + std::to_string(rank_) + ")");
#if defined(NCCL_SHRINK_DEFAULT)
  cudaError_t e = cudaSetDevice(impl_->device);
  if (e != cudaSuccess)
    return fail(nccl_status::cuda_error, "shrink: cudaSetDevice: " + cuda_text(e));
  out->impl_->device = impl_->device;
  if ((e = cudaStreamCreateWithFlags(&out->impl_->stream, cudaStreamNonBlocking)) != cudaSuccess)
    return fail(nccl_status::cuda_error, "shrink: cudaStreamCreate: " + cuda_text(e));
  if ((e = cudaMalloc(&out->impl_->scratch, sizeof(float))) != cudaSuccess)
    return fail(nccl_status::cuda_error, "shrink: cudaMalloc: " + cuda_text(e));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  out->timeout_ms_ = timeout_ms;
  const auto deadline = clock_type::now() + std::chrono::milliseconds(timeout_ms);
  // NCCL takes a non-const pointer, and refuses a null one even for an empty list.
  std::vector<int> ex(excluded);
  int none = -1;
  const ncclResult_t r = ncclCommShrink(impl_->comm, ex.empty() ? &none : ex.data(),
                                        static_cast<int>(ex.size()), &out->impl_->comm, &config,
                                        abort_parent ? NCCL_SHRINK_ABORT : NCCL_SHRINK_DEFAULT);
  nccl_status st = nccl_status::ok;
  if (r != ncclSuccess && r != ncclInProgress)
    st = out->fail(nccl_status::nccl_error, "shrink: ncclCommShrink: " + nccl_text(r, impl_->comm));
  else if (out->impl_->comm == nullptr)
    st = out->fail(nccl_status::nccl_error, "shrink: ncclCommShrink returned no communicator");
  else
    st = wait_done(out->impl_->comm, nullptr, out->abort_requested_, out->interrupt_requested_,
                   deadline, timeout_ms, "shrink",
                   [out](nccl_status x, const std::string& d) { return out->fail(x, d); });
  if (st == nccl_status::ok) {
    int rank = -1, count = 0;
    if (ncclCommUserRank(out->impl_->comm, &rank) != ncclSuccess ||
        ncclCommCount(out->impl_->comm, &count) != ncclSuccess)
      st = out->fail(nccl_status::nccl_error, "shrink: cannot read the new rank and size");
    out->rank_ = rank;
    out->size_ = count;
  }
  if (st != nccl_status::ok) {
    std::lock_guard<std::mutex> lock(out->mutex_);
    out->dead_ = true;
    out->abort_locked();
    last_error_ = out->last_error_;
  }
  return st;
#else
  (void)abort_parent;
  (void)timeout_ms;
  return fail(nccl_status::no_device, "shrink: this NCCL has no ncclCommShrink (2.27 or later)");
#endif
}

#else  // no CUDA or no NCCL in this build: every call says so.

struct nccl_comm::impl {};

namespace {
const char* kNotBuilt = "this build has no NCCL backend (CUDA toolkit or libnccl not found)";
}

bool nccl_compiled() { return false; }
int nccl_version() { return 0; }
nccl_status nccl_make_unique_id(std::vector<char>* out, std::string* detail) {
  out->clear();
  if (detail) *detail = kNotBuilt;
  return nccl_status::no_device;
}
nccl_comm::nccl_comm() : impl_(std::make_unique<impl>()) {}
nccl_comm::~nccl_comm() = default;
void nccl_comm::abort_locked() { aborted_ = true; }
bool nccl_comm::shrinkable_locked() const { return false; }
bool nccl_comm::kept_for_shrink_locked() const { return false; }
void nccl_comm::quiesce_locked() {}
void nccl_comm::abort() {
  abort_requested_ = true;
  dead_ = true;
}
void nccl_comm::interrupt() {
  interrupt_requested_ = true;
  dead_ = true;
}
bool nccl_comm::shrinkable() const { return false; }
nccl_status nccl_comm::init(const std::vector<char>& unique_id, int rank, int size, int,
                            int timeout_ms) {
  if (!init_args_valid(unique_id, rank, size, timeout_ms))
    return fail(nccl_status::invalid_argument, kBadInitArgs);
  return fail(nccl_status::no_device, kNotBuilt);
}
nccl_status nccl_comm::allreduce_sum(void*, std::size_t, nccl_dtype) {
  return fail(nccl_status::no_device, kNotBuilt);
}
nccl_status nccl_comm::allgather(const void*, void*, std::size_t) {
  return fail(nccl_status::no_device, kNotBuilt);
}
nccl_status nccl_comm::alltoall(const void*, void*, std::size_t) {
  return fail(nccl_status::no_device, kNotBuilt);
}
nccl_status nccl_comm::broadcast(void*, std::size_t, int) {
  return fail(nccl_status::no_device, kNotBuilt);
}
nccl_status nccl_comm::barrier() { return fail(nccl_status::no_device, kNotBuilt); }
nccl_status nccl_comm::shrink(const std::vector<int>&, bool, int, nccl_comm*) {
  return fail(nccl_status::no_device, kNotBuilt);
}

#endif

}  // namespace cohort::gpu
