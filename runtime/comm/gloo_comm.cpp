#include "runtime/comm/gloo_comm.hpp"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/context.h>
#include <gloo/transport/device.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/device.h>
#include <signal.h>

#include <atomic>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <unordered_set>
#include <vector>

#include "runtime/comm/build_abort.hpp"

// How a communicator fails its peers at once (abort, or a build whose generation is over):
// it hard-closes every pair through Gloo's public Pair::close() (the same call as
// gloo::Context::closeConnections). A TCP pair's close resets its socket (SO_LINGER 0), so
// each peer's read fails with ECONNRESET and the peer's pending operations fail then, not
// at their timeout; close also wakes a connect waiting on the pair. The local waits a
// closed pair does not wake (a buffer mid-read, an algorithm's next segment) are cut by the
// buffer registry below. Gloo's tcp::Context::signalException would do both halves, but it
// is protected and its header cannot be included from Debian's libgloo-dev (it needs
// gloo/common/memory.h, which the package lacks).

namespace cohort::comm {

// Why the buffers are tracked: Gloo's tcp::Pair::signalException wakes the buffers of
// pending operations but not the one its receive loop is reading into at that moment
// (Pair::rx_), so a collective that abort() catches mid-read waited for the whole
// collective timeout. Every unbound buffer the algorithms create goes through this
// registry, and abort() also calls abortWaitRecv / abortWaitSend on each: a wait in
// progress returns at once, no wait starts after the abort, and the collective comes back
// (an operation on the closed pair throws, or the algorithm runs out) as `aborted`.
class buffer_registry {
 public:
  void add(gloo::transport::UnboundBuffer* b) {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) abort_one(b);
    live_.insert(b);
  }
  void remove(gloo::transport::UnboundBuffer* b) {
    std::lock_guard<std::mutex> lock(mu_);
    live_.erase(b);
  }
  void abort_all() {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = true;
    for (auto* b : live_) abort_one(b);
  }
  /// Read on every wait: lock-free (set under mu_ so add() sees it consistently).
  bool aborted() const { return aborted_.load(); }
  /// Keeps B alive until take_parked(): Gloo freed it while unwinding from a failed
  /// collective, and its transport thread may still be finishing a transfer on it.
  void park(std::unique_ptr<gloo::transport::UnboundBuffer> b) {
    std::lock_guard<std::mutex> lock(mu_);
    parked_.push_back(std::move(b));
  }
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> take_parked() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::move(parked_);
  }

 private:
  static void abort_one(gloo::transport::UnboundBuffer* b) {
    b->abortWaitRecv();
    b->abortWaitSend();
  }
  std::mutex mu_;
  std::unordered_set<gloo::transport::UnboundBuffer*> live_;
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> parked_;
  std::atomic<bool> aborted_{false};
};

std::shared_ptr<buffer_registry> gloo_comm::make_registry() {
  return std::make_shared<buffer_registry>();
}

// Counted where the algorithms hand a transfer to the transport, so traffic() reports what
// Gloo's algorithm actually moved (its segment sizes and padding included), not a formula.
struct byte_counters {
  std::atomic<std::uint64_t> sent{0};
  std::atomic<std::uint64_t> received{0};
};

std::shared_ptr<byte_counters> gloo_comm::make_counters() {
  return std::make_shared<byte_counters>();
}

comm_traffic gloo_comm::traffic() const {
  comm_traffic t;
  t.sent = bytes_->sent.load();
  t.received = bytes_->received.load();
  t.measured = true;
  return t;
}

namespace {

// Gloo's rendezvous context with its transport context (a protected member) in reach.
class open_context : public gloo::rendezvous::Context {
 public:
  using gloo::rendezvous::Context::Context;
  gloo::transport::Context* transport_context() const { return transportContext_.get(); }
  /// Puts TRACKER between the algorithms and the connected transport context.
  void interpose(std::shared_ptr<gloo::transport::Context> tracker) {
    transportContext_ = std::move(tracker);
  }
  std::shared_ptr<gloo::transport::Context> transport_shared() const { return transportContext_; }
};

// An unbound buffer that delegates to Gloo's, is known to the registry while it lives and
// counts the bytes of every transfer posted on it.
class tracked_buffer final : public gloo::transport::UnboundBuffer {
 public:
  tracked_buffer(std::unique_ptr<gloo::transport::UnboundBuffer> inner,
                 std::shared_ptr<buffer_registry> registry, std::shared_ptr<byte_counters> bytes)
      : UnboundBuffer(inner->ptr, inner->size),
        inner_(std::move(inner)),
        registry_(std::move(registry)),
        bytes_(std::move(bytes)) {
    registry_->add(inner_.get());
  }
  ~tracked_buffer() override {
    registry_->remove(inner_.get());
    // Unwinding from a failed or aborted collective (a peer died): Gloo's transport thread
    // may still complete a transfer on this buffer and signal its condition variable after
    // the waiter gave up (ThreadSanitizer saw that signal race the buffer's destruction).
    // The communicator frees it once its pairs are closed (~gloo_comm).
    if (std::uncaught_exceptions() > 0 || registry_->aborted()) registry_->park(std::move(inner_));
  }
  // Gloo's abort flag is consumed by one wait, and its algorithms wait on the same buffer
  // again (segment after segment): after an abort no wait may start at all.
  bool waitRecv(int* rank, std::chrono::milliseconds timeout) override {
    return !registry_->aborted() && inner_->waitRecv(rank, timeout);
  }
  bool waitSend(int* rank, std::chrono::milliseconds timeout) override {
    return !registry_->aborted() && inner_->waitSend(rank, timeout);
  }
  // Gloo's "unspecified" count (the default argument) means the rest of the buffer.
  std::size_t length(size_t offset, size_t nbytes) const {
    return nbytes == kUnspecifiedByteCount ? size - offset : nbytes;
  }
  void abortWaitRecv() override { inner_->abortWaitRecv(); }
  void abortWaitSend() override { inner_->abortWaitSend(); }
  void send(int dst, uint64_t slot, size_t offset, size_t nbytes) override {
    inner_->send(dst, slot, offset, nbytes);
    bytes_->sent += length(offset, nbytes);
  }
  void recv(int src, uint64_t slot, size_t offset, size_t nbytes) override {
    inner_->recv(src, slot, offset, nbytes);
    bytes_->received += length(offset, nbytes);
  }
  // From any one of srcs: a single message arrives.
  void recv(std::vector<int> srcs, uint64_t slot, size_t offset, size_t nbytes) override {
    inner_->recv(std::move(srcs), slot, offset, nbytes);
    bytes_->received += length(offset, nbytes);
  }

 private:
  std::unique_ptr<gloo::transport::UnboundBuffer> inner_;
  std::shared_ptr<buffer_registry> registry_;
  std::shared_ptr<byte_counters> bytes_;
};

// The connected transport context, seen through a layer that tracks unbound buffers.
// Pairs stay the inner context's: Gloo's pairs and buffers only ever talk to it.
class tracking_context final : public gloo::transport::Context {
 public:
  tracking_context(std::shared_ptr<gloo::transport::Context> inner,
                   std::shared_ptr<buffer_registry> registry, std::shared_ptr<byte_counters> bytes)
      : Context(inner->rank, inner->size),
        inner_(std::move(inner)),
        registry_(std::move(registry)),
        bytes_(std::move(bytes)) {
    setTimeout(inner_->getTimeout());
  }
  std::unique_ptr<gloo::transport::Pair>& getPair(int rank) override {
    return inner_->getPair(rank);
  }
  std::unique_ptr<gloo::transport::Pair>& createPair(int rank) override {
    return inner_->createPair(rank);
  }
  std::unique_ptr<gloo::transport::UnboundBuffer> createUnboundBuffer(void* ptr,
                                                                      size_t size) override {
    return std::make_unique<tracked_buffer>(inner_->createUnboundBuffer(ptr, size), registry_,
                                            bytes_);
  }

 private:
  std::shared_ptr<gloo::transport::Context> inner_;
  std::shared_ptr<buffer_registry> registry_;
  std::shared_ptr<byte_counters> bytes_;
};

// The TCP device, seen through a layer that keeps the transport context connectFullMesh
// creates (Gloo holds it in a local until every pair is connected), so a build_abort can
// signal its pairs while a connect waits.
class recording_device final : public gloo::transport::Device {
 public:
  explicit recording_device(std::shared_ptr<gloo::transport::Device> inner)
      : inner_(std::move(inner)) {}
  std::string str() const override { return inner_->str(); }
  const std::string& getPCIBusID() const override { return inner_->getPCIBusID(); }
  int getInterfaceSpeed() const override { return inner_->getInterfaceSpeed(); }
  bool hasGPUDirect() const override { return inner_->hasGPUDirect(); }
  std::shared_ptr<gloo::transport::Context> createContext(int rank, int size) override {
    auto c = inner_->createContext(rank, size);
    std::lock_guard<std::mutex> lock(mu_);
    created_ = c;
    return c;
  }
  std::shared_ptr<gloo::transport::Context> created() const {
    std::lock_guard<std::mutex> lock(mu_);
    return created_;
  }

 private:
  std::shared_ptr<gloo::transport::Device> inner_;
  mutable std::mutex mu_;
  std::shared_ptr<gloo::transport::Context> created_;
};

// Hard-closes every pair of TRANSPORT but SELF's (see the note at the top). Only called
// once every pair exists: Gloo's context reads its pair list without a lock.
void close_pairs(gloo::transport::Context* transport, int self, int size) {
  if (transport == nullptr) return;
  for (int r = 0; r < size; ++r) {
    if (r == self) continue;
    auto& pair = transport->getPair(r);
    if (pair) pair->close();
  }
}

// The store connectFullMesh talks to, seen through CANCEL: every call checks it first, and
// when Gloo publishes this rank's pair addresses (the key "<rank>", set right after every
// pair exists, before any connect), CANCEL is armed to signal those pairs. Pairs are only
// touched once all of them exist: Gloo's tcp::Context reads its pair list without a lock.
class abortable_store final : public gloo::rendezvous::Store {
 public:
  abortable_store(gloo::rendezvous::Store& inner, int rank, int size,
                  std::shared_ptr<build_abort> cancel, std::shared_ptr<recording_device> device)
      : inner_(inner),
        rank_(rank),
        size_(size),
        cancel_(std::move(cancel)),
        device_(std::move(device)) {}
  ~abortable_store() override { disarm(); }

  void set(const std::string& key, const std::vector<char>& data) override {
    check("rendezvous set '" + key + "'");
    if (cancel_ && key == std::to_string(rank_) && !armed_) {
      armed_ = true;
      id_ = cancel_->arm(
          [t = device_->created(), r = rank_, n = size_] { close_pairs(t.get(), r, n); });
      check("rendezvous set '" + key + "'");
    }
    inner_.set(key, data);
  }
  std::vector<char> get(const std::string& key) override {
    check("rendezvous get '" + key + "'");
    std::vector<char> v = inner_.get(key);
    note_peer(key, v);
    return v;
  }
  /// The peer connectFullMesh fetched last, "rank 1, which advertised [10.0.0.3]:41234"
  /// (Gloo connects to it right after the fetch), or "" before any.
  const std::string& last_peer() const { return last_peer_; }
  void wait(const std::vector<std::string>& keys) override {
    check("rendezvous wait");
    inner_.wait(keys);
  }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    check("rendezvous wait");
    inner_.wait(keys, timeout);
  }
  /// The connects are over (done or failed): the pairs are the communicator's now.
  void disarm() {
    if (armed_) cancel_->disarm(id_);
    armed_ = false;
  }

 private:
  void check(const std::string& op) const {
    if (cancel_) cancel_->check(op);
  }
  // Key "<i>" holds rank i's pair addresses, one per other rank in rank order (Gloo's
  // connectFullMesh layout); the one for this rank says where Gloo will connect.
  void note_peer(const std::string& key, const std::vector<char>& all) {
    if (key.empty() || key.find_first_not_of("0123456789") != std::string::npos) return;
    const int i = std::stoi(key);
    if (i == rank_ || size_ < 2 || all.size() % static_cast<std::size_t>(size_ - 1) != 0) return;
    const std::size_t each = all.size() / static_cast<std::size_t>(size_ - 1);
    const std::size_t at = static_cast<std::size_t>(rank_ > i ? rank_ - 1 : rank_) * each;
    try {
      gloo::transport::tcp::Address a(std::vector<char>(all.begin() + at, all.begin() + at + each));
      last_peer_ = "rank " + key + ", which advertised " + a.str();
    } catch (const std::exception&) {
      last_peer_ = "rank " + key;
    }
  }
  gloo::rendezvous::Store& inner_;
  int rank_;
  int size_;
  std::string last_peer_;
  std::shared_ptr<build_abort> cancel_;
  std::shared_ptr<recording_device> device_;
  bool armed_ = false;
  std::size_t id_ = 0;
};

using reduce_fn = void (*)(void*, const void*, const void*, std::size_t);

// Gloo tags need to be unique only among operations running at the same time; a
// communicator runs one at a time, so every collective uses Gloo's default, exactly as
// a direct call does (the bench compares the two).
constexpr std::uint32_t kTag = 0;

// Gloo 0.5 writes to its sockets with writev(2), which raises SIGPIPE when the peer has
// closed: the default action would kill a survivor of a dead peer instead of letting it
// see the error. Python (hence PyTorch) ignores SIGPIPE at startup; cohort does it here,
// once, and only if nobody installed a handler.
void ignore_sigpipe_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current;
    if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      struct sigaction ignore = {};
      ignore.sa_handler = SIG_IGN;
      sigemptyset(&ignore.sa_mask);
      sigaction(SIGPIPE, &ignore, nullptr);
    }
  });
}

comm_failure classify(const char* what) {
  // Gloo says "Timed out waiting ... for recv operation" / "Connect timeout"; everything
  // else it throws from a socket (read/write error, "Connection closed by peer") means the
  // peer is gone.
  if (std::strstr(what, "Timed out") || std::strstr(what, "timeout") ||
      std::strstr(what, "Application timeout"))
    return comm_failure::timeout;
  return comm_failure::peer_lost;
}

}  // namespace

gloo_comm::gloo_comm(gloo::rendezvous::Store& store, int rank, int size, const gloo_options& opts)
    : rank_(rank), size_(size), opts_(opts) {
  const std::string what = "gloo rendezvous (rank " + std::to_string(rank) + " of " +
                           std::to_string(size) + ", prefix '" + opts.prefix + "')";
  if (size < 1 || rank < 0 || rank >= size)
    throw comm_error(comm_failure::invalid, what, "rank must be in [0, size) and size >= 1");
  if (opts.timeout.count() <= 0)
    throw comm_error(comm_failure::invalid, what, "timeout must be > 0 ms");
  const auto rendezvous_timeout =
      opts.rendezvous_timeout.count() > 0 ? opts.rendezvous_timeout : opts.timeout;
  ignore_sigpipe_once();
  const auto& cancel = opts.cancel;
  const std::string self_host = opts.iface.empty() ? opts.hostname : "interface " + opts.iface;
  std::string last_peer;  // who Gloo was connecting to when it failed
  try {
    if (cancel) cancel->check(what);
    gloo::transport::tcp::attr attr;
    if (!opts.iface.empty())
      attr.iface = opts.iface;
    else
      attr.hostname = opts.hostname;
    auto recorder = std::make_shared<recording_device>(gloo::transport::tcp::CreateDevice(attr));
    std::shared_ptr<gloo::transport::Device> device = recorder;
    auto context = std::make_shared<open_context>(rank, size);
    // The context timeout bounds the store waits and the TCP connects of connectFullMesh
    // (Gloo waits 5x it for a connect); afterwards it is the collective timeout (each
    // collective also passes it).
    context->setTimeout(rendezvous_timeout);
    gloo::rendezvous::PrefixStore prefixed(opts.prefix, store);
    abortable_store guarded(prefixed, rank, size, cancel, recorder);
    try {
      context->connectFullMesh(guarded, device);
    } catch (const comm_error&) {
      throw;  // the store's: a rank did not arrive, or the generation is over
    } catch (const std::exception&) {
      last_peer = guarded.last_peer();
      throw;
    }
    guarded.disarm();
    // An abort that came while the last connect completed still ends this generation.
    if (cancel && cancel->aborted()) {
      close_pairs(context->transport_context(), rank, size);
      cancel->check(what);
    }
    context->setTimeout(opts.timeout);
    transport_ = context->transport_shared();
    context->interpose(std::make_shared<tracking_context>(transport_, buffers_, bytes_));
    context_ = std::move(context);
  } catch (const comm_error& e) {
    if (cancel && cancel->aborted()) throw comm_error(comm_failure::aborted, what, e.what());
    throw comm_error(
        e.kind() == comm_failure::timeout ? comm_failure::timeout : comm_failure::rendezvous, what,
        e.what());
  } catch (const std::exception& e) {
    // A connect the abort woke throws Gloo's IoException carrying the reason.
    if (cancel && cancel->aborted())
      throw comm_error(comm_failure::aborted, what,
                       std::string(e.what()) + " (aborted: " + cancel->why() + ")");
    if (!last_peer.empty())
      throw comm_error(comm_failure::unreachable, what,
                       "no connection between rank " + std::to_string(rank) + " at " + self_host +
                           " and " + last_peer + ": " + e.what() +
                           " (is that address reachable from here? comm.interface chooses "
                           "the address each worker advertises)");
    throw comm_error(classify(e.what()) == comm_failure::timeout ? comm_failure::timeout
                                                                 : comm_failure::rendezvous,
                     what, e.what());
  }
}

gloo_comm::~gloo_comm() {
  // Buffers a failed collective left behind go last: after the contexts, so no pair of this
  // communicator can touch them any more.
  auto parked = buffers_->take_parked();
  context_.reset();
  transport_.reset();
  parked.clear();
}

template <class Fn>
void gloo_comm::run(const char* op, Fn&& fn) {
  auto where = [&] {
    return std::string("gloo ") + op + " (rank " + std::to_string(rank_) + " of " +
           std::to_string(size_) + ")";
  };
  if (dead_.load())
    throw comm_error(aborted_.load() ? comm_failure::aborted : comm_failure::invalid, where(),
                     "this communicator is dead after an earlier failure or abort(); build a "
                     "new one");
  try {
    fn();
    // A wait that abort() cut short returns false, which Gloo's algorithms do not check:
    // the call can come back without an error, with nothing reduced.
    if (aborted_.load())
      throw comm_error(comm_failure::aborted, where(), "aborted while the collective ran");
  } catch (const comm_error&) {
    dead_ = true;
    throw;
  } catch (const std::exception& e) {
    dead_ = true;
    const comm_failure kind = aborted_.load() ? comm_failure::aborted : classify(e.what());
    // Close every pair so the peers stop waiting for us now, not at their own timeout.
    abort_transport();
    throw comm_error(kind, where(), e.what());
  }
}

void gloo_comm::abort_transport() {
  std::lock_guard<std::mutex> lock(abort_mutex_);
  if (transport_signalled_ || !context_) return;
  transport_signalled_ = true;
  auto* transport = transport_.get();
  if (transport == nullptr) return;
  close_pairs(transport, rank_, size_);
  // Last: waits the close above cannot reach (a buffer mid-read) return now.
  buffers_->abort_all();
}

void gloo_comm::abort() {
  aborted_ = true;
  dead_ = true;
  abort_transport();
}

void gloo_comm::allreduce_sum(float* data, std::size_t n) {
  run("allreduce_sum(float)", [&] {
    gloo::AllreduceOptions o(context_);
    o.setOutput(data, n);
    o.setReduceFunction(static_cast<reduce_fn>(&gloo::sum<float>));
    o.setTag(kTag);
    o.setTimeout(opts_.timeout);
    gloo::allreduce(o);
  });
}

void gloo_comm::allreduce_sum(std::int64_t* data, std::size_t n) {
  run("allreduce_sum(int64)", [&] {
    gloo::AllreduceOptions o(context_);
    o.setOutput(data, n);
    o.setReduceFunction(static_cast<reduce_fn>(&gloo::sum<std::int64_t>));
    o.setTag(kTag);
    o.setTimeout(opts_.timeout);
    gloo::allreduce(o);
  });
}

void gloo_comm::allgather(const void* send, void* recv, std::size_t bytes) {
  run("allgather", [&] {
    gloo::AllgatherOptions o(context_);
    // Gloo only reads the input; its API takes a non-const pointer.
    o.setInput(static_cast<char*>(const_cast<void*>(send)), bytes);
    o.setOutput(static_cast<char*>(recv), bytes * static_cast<std::size_t>(size_));
    o.setTag(kTag);
    o.setTimeout(opts_.timeout);
    gloo::allgather(o);
  });
}

void gloo_comm::alltoall(const void* send, void* recv, std::size_t bytes) {
  run("alltoall", [&] {
    gloo::AlltoallOptions o(context_);
    const std::size_t total = bytes * static_cast<std::size_t>(size_);
    // Gloo only reads the input; its API takes a non-const pointer.
    o.setInput(static_cast<char*>(const_cast<void*>(send)), total);
    o.setOutput(static_cast<char*>(recv), total);
    o.setTag(kTag);
    o.setTimeout(opts_.timeout);
    gloo::alltoall(o);
  });
}

void gloo_comm::broadcast(void* data, std::size_t bytes, int root) {
  if (root < 0 || root >= size_)
    throw comm_error(
        comm_failure::invalid, "gloo broadcast",
        "root " + std::to_string(root) + " is not a rank of a group of " + std::to_string(size_));
  run("broadcast", [&] {
    gloo::BroadcastOptions o(context_);
    o.setOutput(static_cast<char*>(data), bytes);
    o.setRoot(root);
    o.setTag(kTag);
    o.setTimeout(opts_.timeout);
    gloo::broadcast(o);
  });
}

void gloo_comm::barrier() {
  run("barrier", [&] {
    gloo::BarrierOptions o(context_);
    o.setTag(kTag);
    o.setTimeout(opts_.timeout);
    gloo::barrier(o);
  });
}

}  // namespace cohort::comm
