// The ZeroMQ side of the control plane: zmq_bridge (one thread owning a ROUTER or DEALER
// socket, fed by other threads through an inproc PUSH/PULL pipe, decoding inbound frames
// and dropping/counting bad ones) and sync_client (a blocking DEALER for CLI tools and
// tests). Knows nothing of actors: inbound messages leave through a std::function.
#pragma once
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>
#include <zmq.hpp>

#include "runtime/core/trace.hpp"
#include "runtime/net/codec.hpp"
#include "runtime/net/curve.hpp"
#include "runtime/core/log_limiter.hpp"
#include "runtime/net/protocol.hpp"
#include "runtime/net/sender.hpp"

namespace cohort::net {

/// Why the bridge dropped an inbound frame. The decode reasons share decode_error's values.
enum class drop_reason : uint8_t {
  too_short = static_cast<uint8_t>(decode_error::too_short),
  too_large = static_cast<uint8_t>(decode_error::too_large),
  bad_magic = static_cast<uint8_t>(decode_error::bad_magic),
  bad_version = static_cast<uint8_t>(decode_error::bad_version),
  unknown_type = static_cast<uint8_t>(decode_error::unknown_type),
  length_mismatch = static_cast<uint8_t>(decode_error::length_mismatch),
  truncated = static_cast<uint8_t>(decode_error::truncated),
  trailing_bytes = static_cast<uint8_t>(decode_error::trailing_bytes),
  bad_value = static_cast<uint8_t>(decode_error::bad_value),
  unknown_peer = static_cast<uint8_t>(decode_error::count_),  ///< ROUTER identity not admitted
  bad_parts,    ///< multipart shape is wrong (e.g. ROUTER frame without identity + payload)
  send_failed,  ///< outbound frame could not be queued (peer gone / high-water mark)
  wrong_role,   ///< CURVE: the connection's key holds no role that may send this frame
  stale_term,   ///< DEALER: from a coordinator of a lower term than one already heard (ha)
  count_
};

/// How long frames stay queued after a bridge's or a client's socket closes, so that a final
/// `stop` or `leave` still leaves the process; a peer that is gone costs at most this much
/// at shutdown.
inline constexpr int bridge_linger_ms = 1000;

/// Largest frame a ROUTER bridge reads from a peer it has not admitted (a register_request
/// with a name of at most a few KiB); larger ones are dropped as too_large unread.
inline constexpr size_t max_unregistered_bytes = 4096;

/// Stable name of a drop reason ("unknown_peer").
const char* to_string(drop_reason r);

/// Options of a bridge. ROUTER binds `endpoint`; DEALER connects to it.
struct bridge_options {
  enum class socket_kind { router, dealer };
  socket_kind kind = socket_kind::router;
  std::string endpoint = "tcp://127.0.0.1:0";
  size_t max_message_bytes = 64u << 20;
  /// DEALER routing id. Set it: a ROUTER-assigned id changes on every reconnect, and the
  /// coordinator would then take the reconnected worker for an unknown peer.
  std::string identity;
  /// After handling traffic, poll without blocking for this long before sleeping (saves a
  /// wake-up when an answer follows quickly; costs CPU only right after traffic). 0: never.
  int spin_us = 0;

  /// A frame in another protocol version arrived (counted as bad_version either way).
  /// ROUTER: the bridge itself answers each such peer once with a register_reject in this
  /// build's version, so the peer learns which version this side speaks. DEALER: called
  /// once, on the bridge thread, with the version the other side speaks (must not block).
  std::function<void(int version)> on_version_mismatch;
  /// ROUTER: speak CURVE as the server with these keys. Only the authorized keys connect
  /// (a ZAP handler in the bridge's context decides), and every frame is checked against
  /// the role of its connection's key before anything but its envelope is read.
  std::shared_ptr<const server_keys> curve_server;
  /// DEALER: speak CURVE as a client with these keys.
  std::shared_ptr<const client_keys> curve_client;
  /// The leadership term stamped on every outbound frame (set_term changes it).
  uint64_t term = 0;
  /// DEALER: the connection to the endpoint dropped (the peer's process died: its kernel
  /// closed the socket). Called on the bridge thread; must not block. ZeroMQ reconnects on
  /// its own; a worker with standbys (ha) looks for the next leader at once instead of
  /// waiting for the old one's silence.
  std::function<void()> on_disconnect;
};

/// Owns one ZeroMQ socket on its own thread. Thread-safe: send/admit/forget/counters may be
/// called from any thread; the callback runs on the bridge thread and must not block.
class zmq_bridge {
 public:
  /// Called on the bridge thread for every frame that decoded and passed the peer check.
  using inbound_fn = std::function<void(const sender& from, message msg)>;

  /// Binds or connects and starts the thread. Throws cohort::io_error when the endpoint
  /// cannot be bound/connected (message names the endpoint and the ZeroMQ reason).
  zmq_bridge(bridge_options opts, inbound_fn on_message);
  /// Stops the thread and closes the sockets (linger 0: unsent frames are dropped).
  ~zmq_bridge();
  zmq_bridge(const zmq_bridge&) = delete;
  zmq_bridge& operator=(const zmq_bridge&) = delete;

  /// The endpoint actually bound (ZMQ_LAST_ENDPOINT, real port) or connected to.
  const std::string& endpoint() const { return endpoint_; }

  /// Queues M for PEER (ignored on a DEALER). Encoding happens on the calling thread.
  void send(const std::string& peer, const message& m);
  /// Queues an already-encoded frame (benchmarks and tests of the receiving side).
  void send_frame(const std::string& peer, std::string frame);
  /// Sends M to PEER at once, from the inbound callback only (the bridge thread): an answer
  /// that skips the queue, e.g. the coordinator's heartbeat_ack. False if not queued.
  bool reply(const std::string& peer, const message& m);

  /// Until when everything that reached the socket has been read: now while the thread
  /// waits for traffic, else the last time it found the socket empty. A coordinator that
  /// looks for silent members asks this first, so its own lag is not blamed on them.
  std::chrono::steady_clock::time_point caught_up() const;

  /// The term stamped on frames sent from now on (a coordinator elected through etcd).
  void set_term(uint64_t term) { term_.store(term); }
  /// DEALER: the highest term heard so far; frames of a lower one are dropped (stale_term).
  uint64_t term_floor() const { return term_floor_.load(); }
  /// DEALER: disconnects from the current endpoint and connects to ENDPOINT (the next
  /// coordinator candidate), keeping the routing id and the term floor. Frames queued for
  /// the old endpoint are dropped. Asynchronous: done on the bridge thread.
  void reconnect(const std::string& endpoint);

  /// ROUTER: PEER may now send any message (before, only register_request passes).
  void admit(const std::string& peer);
  /// ROUTER: PEER is back to register_request only (and relays no more).
  void forget(const std::string& peer);
  /// ROUTER: PEER (a registered host agent) may relay its workers' frames and send
  /// host_beat (docs/agent.md).
  void allow_relay(const std::string& peer);

  /// Frames dropped for reason R so far.
  uint64_t dropped(drop_reason r) const;
  /// Every non-zero drop counter as (reason name, count), and with CURVE the connections
  /// whose key was refused ("refused_key").
  std::vector<std::pair<std::string, uint64_t>> drop_counts() const;
  /// Frames that decoded and were handed to the callback.
  uint64_t delivered() const { return delivered_.load(); }
  /// ROUTER with CURVE: connections whose key the ZAP handler refused (0 without CURVE).
  uint64_t refused_keys() const { return zap_ ? zap_->refused() : 0; }

  /// Stops the bridge thread now; further sends are dropped. Idempotent.
  void stop();

 private:
  void run(std::promise<std::string>* ready);
  void on_inbound(std::vector<zmq::message_t>& parts, zmq::socket_t& net);
  void on_version_mismatch(const std::string& peer, int version, zmq::socket_t& net);
  // Sends [peer, frame] on NET (a DEALER sends the frame alone) without blocking; a frame
  // that cannot be queued (the peer gone, a full queue) is counted as send_failed.
  bool send_out(zmq::socket_t& net, zmq::message_t& peer, zmq::message_t& frame);
  bool send_out(zmq::socket_t& net, const std::string& peer, const std::string& frame);
  void count(drop_reason r) { counters_[static_cast<size_t>(r)].fetch_add(1); }

  bridge_options opts_;
  inbound_fn on_message_;
  zmq::context_t ctx_;
  std::unique_ptr<zap_handler> zap_;  // ROUTER with curve_server; before the socket binds
  std::string endpoint_;
  std::string pipe_name_;
  std::thread thread_;
  std::mutex push_mu_;  // guards push_: ZeroMQ sockets are not thread-safe
  std::unique_ptr<zmq::socket_t> push_;
  bool stopped_ = false;  // guarded by push_mu_
  mutable std::mutex peers_mu_;
  std::unordered_set<std::string> admitted_;
  std::unordered_set<std::string> relays_;  ///< host agents (allow_relay)
  /// ROUTER: peers already told of a version mismatch (bridge thread only; bounded).
  std::unordered_set<std::string> told_version_;
  /// ROUTER: how often telling such a peer is logged (bridge thread only): new identities
  /// cost nothing to make, so the set above does not bound the log.
  log_limiter version_log_;
  bool version_reported_ = false;  ///< DEALER: on_version_mismatch already called
  std::array<std::atomic<uint64_t>, static_cast<size_t>(drop_reason::count_)> counters_{};
  std::atomic<uint64_t> delivered_{0};
  std::atomic<uint64_t> term_{0};
  std::atomic<uint64_t> term_floor_{0};
  std::atomic<bool> thread_done_{false};
  zmq::socket_t* net_ = nullptr;          // the bridge thread's socket (reply)
  std::atomic<bool> waiting_{false};      // the thread is blocked in poll
  std::atomic<int64_t> caught_up_ns_{0};  // steady_clock ns when the socket was last empty
};

/// A blocking DEALER for short-lived tools (ctl, launch, tests): one thread, one socket.
class sync_client {
 public:
  /// Connects to ENDPOINT (ZeroMQ connects lazily: nothing fails until a timeout).
  explicit sync_client(const std::string& endpoint, size_t max_message_bytes = 64u << 20);
  /// Same, with a fixed routing id (see bridge_options::identity) and, when KEYS is not
  /// null, CURVE with those keys.
  sync_client(const std::string& endpoint, size_t max_message_bytes, const std::string& identity,
              const client_keys* keys = nullptr);
  ~sync_client();

  /// Sends M; false if it could not be queued within a second.
  bool send(const message& m);
  /// Sends raw bytes as one frame (tests use this for malformed frames).
  bool send_frame(const std::string& frame);
  /// Next decodable message within TIMEOUT; frames that fail to decode are skipped, but a
  /// frame in another protocol version throws io_error naming both versions.
  std::optional<message> recv(std::chrono::milliseconds timeout);
  /// Registers as a client (role client), sends REQ and waits for a reply of type
  /// REPLY_TYPE. Throws cohort::io_error naming the endpoint when nothing answers.
  message request(const message& req, msg_type reply_type, std::chrono::milliseconds timeout);
  /// Registers with the given request and waits for register_ok / register_reject.
  std::optional<message> register_as(const register_request& r, std::chrono::milliseconds timeout);

  const std::string& endpoint() const { return endpoint_; }

 private:
  std::string endpoint_;
  size_t max_bytes_;
  bool curve_ = false;
  zmq::context_t ctx_;
  zmq::socket_t sock_;
  bool registered_ = false;
};

/// A routing id unlikely to repeat across processes and restarts: PREFIX-pid-random.
std::string make_identity(const std::string& prefix);

/// Monotonic nanoseconds, for ping timestamps and ages: the trace recorder's clock, so that
/// a clock probe's offset applies to the spans it shifts.
inline uint64_t now_ns() { return static_cast<uint64_t>(trace::now_ns()); }

}  // namespace cohort::net
