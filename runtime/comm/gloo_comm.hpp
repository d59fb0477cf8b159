// The Gloo backend of communicator: TCP transport, rendezvous through a Gloo Store the
// caller passes in (kv_gloo_store over the coordinator, or any other), Gloo's own
// algorithms (ring allreduce, ring allgather, broadcast, barrier). Owns the Gloo context
// and its abort; knows nothing of the coordinator or of generations (the store does).
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "runtime/comm/communicator.hpp"

namespace gloo {
class Context;
namespace rendezvous {
class Store;
}
namespace transport {
class Context;
}
}  // namespace gloo

namespace cohort::comm {

class build_abort;      // build_abort.hpp: ends the build from another thread
class buffer_registry;  // gloo_comm.cpp: the live unbound buffers, for abort()
struct byte_counters;   // gloo_comm.cpp: bytes posted to the transport, for traffic()

/// How a gloo_comm connects. Timeouts come from the runtime's config, never Gloo's
/// 30 s / multi-minute defaults.
struct gloo_options {
  /// Keys of this group in the store are "<prefix>/<gloo key>" (gloo::rendezvous::
  /// PrefixStore), so several groups (dp, tp, ...) can rendezvous in one generation.
  std::string prefix = "gloo";
  /// Bound on every wait inside a collective: a peer that makes no progress for this
  /// long makes the call throw comm_error(timeout). Large transfers that keep moving do
  /// not time out (Gloo applies it per send/recv wait, not to the whole call).
  std::chrono::milliseconds timeout{5000};
  /// Bound on each rendezvous wait (peers may start later than each other); 0: timeout.
  /// Gloo bounds a TCP connect to a published address by 5x this value.
  std::chrono::milliseconds rendezvous_timeout{0};
  /// Address the TCP transport listens on and advertises; ignored if iface is set.
  std::string hostname = "127.0.0.1";
  /// Network interface to use instead of hostname (e.g. "eth0"); empty: use hostname.
  std::string iface;
  /// Optional: aborting it fails the construction at once with comm_error(aborted), also
  /// while a TCP connect waits for a peer that died after publishing its address (the
  /// store's own waits end when the store says so: the coordinator answers superseded).
  std::shared_ptr<build_abort> cancel;
};

/// A communicator over one connected Gloo context. Construction is the rendezvous: it
/// blocks until every rank has joined (or throws comm_error after the rendezvous timeout,
/// or comm_error(aborted) once opts.cancel is aborted).
/// The first construction sets SIGPIPE to ignored if it is at its default (Gloo's socket
/// writes would otherwise kill the process when a peer dies).
class gloo_comm : public communicator {
 public:
  /// Joins group (`rank` of `size`) through `store`; the store is used only here.
  gloo_comm(gloo::rendezvous::Store& store, int rank, int size, const gloo_options& opts);
  ~gloo_comm() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "gloo"; }

  void allreduce_sum(float* data, std::size_t n) override;
  void allreduce_sum(std::int64_t* data, std::size_t n) override;
  void allgather(const void* send, void* recv, std::size_t bytes) override;
  void alltoall(const void* send, void* recv, std::size_t bytes) override;
  void broadcast(void* data, std::size_t bytes, int root) override;
  void barrier() override;
  /// Signals an error into every TCP pair of the context, as Gloo itself does when a wait
  /// times out: pending sends/recvs of a blocked call wake with an exception, the
  /// sockets close (peers fail promptly too). See docs/collectives.md for the limits.
  void abort() override;
  bool dead() const override { return dead_.load(); }
  /// Measured: the bytes of every send and receive the algorithms post on an unbound
  /// buffer (all of Gloo's collectives used here go through them).
  comm_traffic traffic() const override;

  /// The connected Gloo context (tests and the bench compare against raw Gloo with it).
  const std::shared_ptr<gloo::Context>& context() const { return context_; }
  std::chrono::milliseconds timeout() const { return opts_.timeout; }

 private:
  template <class Fn>
  void run(const char* op, Fn&& fn);
  // Fails every pending operation of the context and closes its sockets (once).
  void abort_transport();
  static std::shared_ptr<buffer_registry> make_registry();
  static std::shared_ptr<byte_counters> make_counters();

  int rank_;
  int size_;
  gloo_options opts_;
  std::shared_ptr<gloo::Context> context_;
  std::shared_ptr<gloo::transport::Context> transport_;  ///< the connected (TCP) context
  /// Every unbound buffer the algorithms create, so abort() can end its waits.
  std::shared_ptr<buffer_registry> buffers_ = make_registry();
  /// Bytes posted on those buffers (shared with them: a buffer may outlive a failed call).
  std::shared_ptr<byte_counters> bytes_ = make_counters();
  std::atomic<bool> dead_{false};
  std::atomic<bool> aborted_{false};
  std::mutex abort_mutex_;  // one signal into the transport, even if abort() races itself
  bool transport_signalled_ = false;
};

}  // namespace cohort::comm
