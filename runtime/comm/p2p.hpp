// Point-to-point tensor channel between pipeline stages over ZeroMQ: one PULL socket a
// worker binds, PUSH sockets to the peers it sends to, a checked frame header, and a stash
// for frames that arrive before they are asked for. Owns the sockets of one generation;
// knows nothing of schedules, actors or the coordinator (who connects to whom is theirs).
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "runtime/comm/comm_error.hpp"

namespace zmq {
class context_t;
class socket_t;
class message_t;
}  // namespace zmq

namespace cohort::net {
struct client_keys;
class zap_handler;
}  // namespace cohort::net

namespace cohort::comm {

/// The header that opens every frame, little-endian on the wire (p2p_header_bytes bytes):
/// magic u32, version u16, reserved u16 (0), generation u64, sender i32, reserved u32 (0),
/// tag u64, payload bytes u64. Public so tests can craft frames that lie.
struct p2p_header {
  static constexpr std::uint32_t magic_value = 0x50325043;  // "CP2P" read little-endian
  static constexpr std::uint16_t version_value = 1;
  std::uint32_t magic = magic_value;
  std::uint16_t version = version_value;
  std::uint64_t generation = 0;
  std::int32_t sender = 0;
  std::uint64_t tag = 0;
  std::uint64_t bytes = 0;
};
constexpr std::size_t p2p_header_bytes = 40;

/// Encodes `h` into exactly p2p_header_bytes bytes at `out`.
void encode_p2p_header(const p2p_header& h, unsigned char* out);
/// Decodes p2p_header_bytes bytes at `in` (no check of the values: the channel does that).
p2p_header decode_p2p_header(const unsigned char* in);

/// What a channel accepts, so a buggy or hostile sender cannot make it hold unbounded memory.
struct p2p_limits {
  /// Largest payload a frame may carry: ZeroMQ drops the connection of a peer that sends a
  /// larger one (ZMQ_MAXMSGSIZE), before any of it is held. A pipeline stage passes its
  /// largest tensor: micro_batch x context x d_model floats.
  std::size_t max_message_bytes = 256u << 20;
  /// Frames that arrived before anyone asked for them: at most this many, and this many
  /// payload bytes, at once. Beyond either, recv fails (invalid) and the channel is dead.
  std::size_t max_stash_frames = 4096;
  std::size_t max_stash_bytes = 1u << 30;
};

/// How a channel with keys makes sure its frames come from the job's workers.
enum class p2p_security : std::uint8_t {
  /// Each connection is authenticated once, when it is made (ZeroMQ PLAIN, checked by a ZAP
  /// handler): the password is p2p_password(), an HMAC under the worker's secret key of the
  /// receiving channel's endpoint and generation, so it proves the key without revealing it
  /// and opens no other channel and no later generation. Frames then travel in clear, as
  /// the Gloo data plane's do: no cost per byte.
  authenticate,
  /// CurveZMQ: each connection authenticated by the worker key, and every frame encrypted
  /// and authenticated (XSalsa20-Poly1305 on libzmq's I/O thread: one more pass over every
  /// byte).
  encrypt,
};

/// "authenticate", "encrypt".
const char* to_string(p2p_security s);
/// The security named TEXT (as above), or throws comm_error(invalid).
p2p_security parse_p2p_security(const std::string& text);

/// The PLAIN password a sender presents to the channel bound at ENDPOINT for GENERATION
/// under p2p_security::authenticate: hex HMAC-SHA256 keyed by the worker's secret key.
std::string p2p_password(const std::string& worker_secret_key, std::uint64_t generation,
                         const std::string& endpoint);

/// One worker's point-to-point endpoint for a generation: a PULL socket it binds, and PUSH
/// sockets to the peers it sends to. Tensors travel as [header, payload] multipart frames;
/// the header is checked, and a frame of another generation, a wrong magic or version, a
/// wrong shape, or a payload whose size disagrees with its header is counted and dropped,
/// never trusted.
///
/// Threads: connect/send/recv from ONE thread (the stage's compute thread); abort(),
/// dropped(), bytes_*() and dead() from any thread. After any comm_error the channel is
/// dead (as a communicator is): later calls throw comm_error at once; build the next
/// generation's channel instead. Sends queue the payload (one copy) and return once ZeroMQ
/// holds it; a peer that is not connected (not up yet, or dead) makes send wait until the
/// timeout. Frames from one sender arrive in the order it sent them. The stash is bounded
/// (p2p_limits): the runtime's own stages send only what the schedule will ask for, so
/// going past the bound means a peer that is not one of them.
class p2p_channel {
 public:
  /// Binds tcp://bind_host:* (OS-picked port). `bind_host` must be the address peers reach
  /// (it is advertised as is). `self` is this worker's id in the pipeline (e.g. its stage),
  /// `generation` tags every frame, `timeout_ms` (> 0) bounds every send/recv. Throws
  /// comm_error(invalid) when the address cannot be bound or a limit is 0. With KEYS (the
  /// job's worker key) the PULL socket admits only senders that hold that key, and the PUSH
  /// sockets prove it, as SECURITY says; without, any local or remote process may send.
  p2p_channel(const std::string& bind_host, int self, std::uint64_t generation, int timeout_ms,
              const p2p_limits& limits = {}, const net::client_keys* keys = nullptr,
              p2p_security security = p2p_security::authenticate);
  /// Closes every socket with linger 0: never blocks on a dead or slow peer; frames not yet
  /// delivered are lost. abort() must not run concurrently with destruction.
  ~p2p_channel();
  p2p_channel(const p2p_channel&) = delete;
  p2p_channel& operator=(const p2p_channel&) = delete;

  /// tcp://host:port the peers must connect to.
  const std::string& endpoint() const { return endpoint_; }
  int self() const { return self_; }
  std::uint64_t generation() const { return generation_; }

  /// Opens the way to peer `peer` at `endpoint` (PUSH connect; returns at once, the TCP
  /// connection is made in the background). Throws comm_error(invalid) for a malformed
  /// endpoint or a peer already connected, comm_error(aborted) after abort().
  void connect(int peer, const std::string& endpoint);
  /// Sends `bytes` bytes at `data` with `tag` to `peer`. Throws comm_error: timeout (the
  /// peer's socket took nothing within the timeout: not connected, dead, or far behind),
  /// aborted, invalid (peer never connected, channel dead).
  void send(int peer, std::uint64_t tag, const void* data, std::size_t bytes);
  /// Receives the frame with `tag` sent by `peer` into `data` (exactly `bytes`), keeping
  /// frames of other (peer, tag) that arrive first for later recv calls; frames of one
  /// (peer, tag) are handed out in arrival order. Throws comm_error: timeout, aborted, or
  /// invalid (the frame holds another number of bytes; it is dropped and counted).
  void recv(int peer, std::uint64_t tag, void* data, std::size_t bytes);
  /// From any thread, idempotent: every blocked and later send/recv throws
  /// comm_error(aborted) promptly (shuts the ZeroMQ context down).
  void abort();

  /// Test seam, empty in production: HOOK runs on the calling thread each time a send finds
  /// the peer's socket full or unconnected, or a recv finds its frame not there, just before
  /// the call waits (tests abort a call proven to be blocked). Set before any send/recv.
  void set_before_wait(std::function<void()> hook) { before_wait_ = std::move(hook); }

  /// True once a call threw or abort() was called: only destruction is left.
  bool dead() const { return dead_.load(); }
  /// Frames dropped: malformed, of another generation, or of a size recv did not expect.
  std::uint64_t dropped() const { return dropped_.load(); }
  /// Payload bytes sent / received so far (headers not counted).
  std::uint64_t bytes_sent() const { return bytes_sent_.load(); }
  std::uint64_t bytes_received() const { return bytes_received_.load(); }
  /// Frames waiting in the stash (received, not yet asked for). The channel's thread only.
  std::size_t stashed() const { return stash_count_; }
  /// Their payload bytes. The channel's thread only.
  std::size_t stashed_bytes() const { return stash_bytes_; }

 private:
  using key = std::pair<int, std::uint64_t>;  // (sender, tag)
  // Throws for a dead/aborted channel before any socket is touched.
  void check_usable(const char* op) const;
  // Marks the channel dead and throws comm_error(kind) for `op`.
  [[noreturn]] void fail(comm_failure kind, const std::string& op, const std::string& detail);
  // Reads the frames the PULL socket holds now, stashing valid ones, until it holds no
  // more or the frame of `want` arrived: that one is returned instead of stashed.
  std::unique_ptr<zmq::message_t> drain(const key& want);

  int self_;
  std::uint64_t generation_;
  int timeout_ms_;
  std::string endpoint_;
  bool ipv6_ = false;  ///< bound to an IPv6 address: push sockets use IPv6 too
  std::unique_ptr<zmq::context_t> ctx_;
  std::unique_ptr<net::zap_handler> zap_;               ///< with keys: admits the worker key only
  std::shared_ptr<const net::client_keys> keys_;        ///< a copy, for the PUSH sockets
  p2p_security security_ = p2p_security::authenticate;  ///< with keys
  std::unique_ptr<zmq::socket_t> pull_;
  std::map<int, std::unique_ptr<zmq::socket_t>> push_;
  std::map<key, std::deque<std::unique_ptr<zmq::message_t>>> stash_;  ///< payloads
  std::size_t stash_count_ = 0;
  std::size_t stash_bytes_ = 0;
  p2p_limits limits_;
  std::function<void()> before_wait_;  ///< test seam (set_before_wait)
  std::atomic<bool> dead_{false};
  std::atomic<bool> aborted_{false};
  std::atomic<std::uint64_t> dropped_{0};
  std::atomic<std::uint64_t> bytes_sent_{0};
  std::atomic<std::uint64_t> bytes_received_{0};
};

}  // namespace cohort::comm
