// Every socket of a channel is used by the one thread that calls connect/send/recv. abort()
// never touches a socket: it shuts the context down (zmq_ctx_shutdown is thread-safe),
// which makes a poll or send blocked in that thread return ETERM at once.
#include "runtime/comm/p2p.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "runtime/core/sha256.hpp"
#include "runtime/net/curve.hpp"

namespace cohort::comm {

namespace {

// Room for CurveZMQ's framing of one message (33 bytes), rounded up.
constexpr std::size_t curve_overhead = 64;

using clock_type = std::chrono::steady_clock;

// Frames queued per socket before a sender waits. A pipeline keeps only a few tensors in
// flight per peer; a small bound keeps a slow receiver from piling up gigabytes.
constexpr int queue_frames = 32;

void put_u16(unsigned char* p, std::uint16_t v) {
  for (int i = 0; i < 2; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
void put_u32(unsigned char* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
void put_u64(unsigned char* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
std::uint64_t get_le(const unsigned char* p, int n) {
  std::uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

int remaining_ms(clock_type::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now()).count();
  // Round up: a poll of 0 ms would spin when less than a millisecond is left.
  return left < 0 ? 0 : static_cast<int>(left) + 1;
}

std::string who(int peer, std::uint64_t tag) {
  return "peer " + std::to_string(peer) + " tag " + std::to_string(tag);
}

}  // namespace

void encode_p2p_header(const p2p_header& h, unsigned char* out) {
  std::memset(out, 0, p2p_header_bytes);
  put_u32(out + 0, h.magic);
  put_u16(out + 4, h.version);
  put_u64(out + 8, h.generation);
  put_u32(out + 16, static_cast<std::uint32_t>(h.sender));
  put_u64(out + 24, h.tag);
  put_u64(out + 32, h.bytes);
}

p2p_header decode_p2p_header(const unsigned char* in) {
  p2p_header h;
  h.magic = static_cast<std::uint32_t>(get_le(in + 0, 4));
  h.version = static_cast<std::uint16_t>(get_le(in + 4, 2));
  h.generation = get_le(in + 8, 8);
  h.sender = static_cast<std::int32_t>(static_cast<std::uint32_t>(get_le(in + 16, 4)));
  h.tag = get_le(in + 24, 8);
  h.bytes = get_le(in + 32, 8);
  return h;
}

const char* to_string(p2p_security s) {
  return s == p2p_security::encrypt ? "encrypt" : "authenticate";
}

p2p_security parse_p2p_security(const std::string& text) {
  if (text == "authenticate") return p2p_security::authenticate;
  if (text == "encrypt") return p2p_security::encrypt;
  throw comm_error(comm_failure::invalid, "p2p security",
                   "'" + text + "' is not one of authenticate, encrypt");
}

std::string p2p_password(const std::string& worker_secret_key, std::uint64_t generation,
                         const std::string& endpoint) {
  return hmac_sha256_hex(
      worker_secret_key,
      "cohort-p2p/1 generation " + std::to_string(generation) + " endpoint " + endpoint);
}

p2p_channel::p2p_channel(const std::string& bind_host, int self, std::uint64_t generation,
                         int timeout_ms, const p2p_limits& limits, const net::client_keys* keys,
                         p2p_security security)
    : self_(self),
      generation_(generation),
      timeout_ms_(timeout_ms),
      security_(security),
      limits_(limits) {
  const std::string op = "p2p bind " + bind_host;
  if (timeout_ms <= 0)
    throw comm_error(comm_failure::invalid, op,
                     "timeout_ms must be positive, got " + std::to_string(timeout_ms));
  if (limits.max_message_bytes == 0 || limits.max_stash_frames == 0 || limits.max_stash_bytes == 0)
    throw comm_error(comm_failure::invalid, op, "p2p limits must be positive");
  ctx_ = std::make_unique<zmq::context_t>(1);
  const bool curve = keys && security == p2p_security::encrypt;
  if (keys) {
    // Every worker of the job holds the same worker key: with CURVE it is the server key of
    // each channel and the only client key a channel admits; with PLAIN its secret keys the
    // password, which the handler learns once the endpoint is known (it refuses every
    // connection until then). The handler exists before the bind.
    keys_ = std::make_shared<const net::client_keys>(*keys);
    std::map<std::string, net::key_role> authorized;
    if (curve) authorized.emplace(keys->self.public_key, net::key_role::worker);
    zap_ = std::make_unique<net::zap_handler>(*ctx_, std::move(authorized));
  }
  pull_ = std::make_unique<zmq::socket_t>(*ctx_, zmq::socket_type::pull);
  try {
    if (curve) {
      pull_->set(zmq::sockopt::curve_server, 1);
      pull_->set(zmq::sockopt::curve_secretkey, keys_->self.secret_key);
    } else if (keys_) {
      pull_->set(zmq::sockopt::plain_server, 1);
    }
    if (keys_) pull_->set(zmq::sockopt::zap_domain, "cohort-p2p");
    pull_->set(zmq::sockopt::linger, 0);
    pull_->set(zmq::sockopt::rcvhwm, queue_frames);
    // Each part of a frame is one ZeroMQ message: the header and the payload. A larger one
    // makes ZeroMQ drop that peer's connection before holding it.
    // With CURVE libzmq applies the limit to the encrypted message, which carries the
    // MESSAGE command's name, nonce, flags and MAC (33 bytes) on top of the part: without
    // that room the largest tensor itself would drop the connection.
    const std::size_t max_part =
        std::max(limits.max_message_bytes, p2p_header_bytes) + (curve ? curve_overhead : 0);
    pull_->set(zmq::sockopt::maxmsgsize,
               static_cast<int64_t>(std::min<std::size_t>(max_part, INT64_MAX)));
    // An IPv6 address (it has ':') is bracketed, and the sockets must be told to use IPv6.
    if (bind_host.find(':') != std::string::npos) {
      ipv6_ = true;
      pull_->set(zmq::sockopt::ipv6, 1);
      pull_->bind("tcp://[" + bind_host + "]:*");
    } else {
      pull_->bind("tcp://" + bind_host + ":*");
    }
    endpoint_ = pull_->get(zmq::sockopt::last_endpoint);
    if (keys_ && !curve)
      zap_->admit_plain("worker", p2p_password(keys_->self.secret_key, generation_, endpoint_),
                        net::key_role::worker);
  } catch (const zmq::error_t& e) {
    pull_.reset();
    zap_.reset();
    ctx_.reset();
    const bool malformed = e.num() == EINVAL || e.num() == EPROTONOSUPPORT;
    throw comm_error(malformed ? comm_failure::invalid : comm_failure::unavailable, op,
                     std::string(e.what()) +
                         " (give an address of this host the peers reach, "
                         "e.g. 127.0.0.1 or a hostname)");
  }
}

p2p_channel::~p2p_channel() {
  // Linger is 0 on every socket, so neither close nor the context's termination waits for a
  // peer: unsent frames are dropped.
  push_.clear();
  pull_.reset();
  zap_.reset();
  ctx_.reset();
}

void p2p_channel::check_usable(const char* op) const {
  if (aborted_.load()) throw comm_error(comm_failure::aborted, op, "the channel was aborted");
  if (dead_.load())
    throw comm_error(comm_failure::invalid, op,
                     "the channel failed before; build the next generation's channel");
}

void p2p_channel::fail(comm_failure kind, const std::string& op, const std::string& detail) {
  dead_.store(true);
  // An ETERM or a timeout racing abort() reports what the caller asked for: aborted.
  if (aborted_.load()) kind = comm_failure::aborted;
  throw comm_error(kind, op, detail);
}

void p2p_channel::abort() {
  dead_.store(true);
  if (aborted_.exchange(true)) return;
  ctx_->shutdown();
}

void p2p_channel::connect(int peer, const std::string& endpoint) {
  const std::string op = "p2p connect to " + std::to_string(peer) + " at " + endpoint;
  check_usable(op.c_str());
  if (push_.count(peer) != 0) fail(comm_failure::invalid, op, "that peer is connected already");
  std::unique_ptr<zmq::socket_t> sock;
  try {
    sock = std::make_unique<zmq::socket_t>(*ctx_, zmq::socket_type::push);
    sock->set(zmq::sockopt::linger, 0);
    sock->set(zmq::sockopt::sndhwm, queue_frames);
    // Queue only to a live connection: with the peer gone (or not up yet) the socket is not
    // writable and send times out, instead of filling a queue nobody will ever read.
    sock->set(zmq::sockopt::immediate, 1);
    if (keys_ && security_ == p2p_security::encrypt) {
      sock->set(zmq::sockopt::curve_serverkey, keys_->self.public_key);
      sock->set(zmq::sockopt::curve_publickey, keys_->self.public_key);
      sock->set(zmq::sockopt::curve_secretkey, keys_->self.secret_key);
    } else if (keys_) {
      sock->set(zmq::sockopt::plain_username, "worker");
      sock->set(zmq::sockopt::plain_password,
                p2p_password(keys_->self.secret_key, generation_, endpoint));
    }
    if (ipv6_ || endpoint.find('[') != std::string::npos) sock->set(zmq::sockopt::ipv6, 1);
    sock->connect(endpoint);
  } catch (const zmq::error_t& e) {
    if (e.num() == ETERM) fail(comm_failure::aborted, op, "the channel was aborted");
    fail(comm_failure::invalid, op,
         std::string(e.what()) + " (expected tcp://HOST:PORT from the peer's endpoint())");
  }
  push_.emplace(peer, std::move(sock));
}

void p2p_channel::send(int peer, std::uint64_t tag, const void* data, std::size_t bytes) {
  check_usable("p2p send");
  auto it = push_.find(peer);
  if (it == push_.end())
    fail(comm_failure::invalid, "p2p send to " + who(peer, tag),
         "no connect() to that peer in this channel");
  zmq::socket_t& sock = *it->second;
  p2p_header h;
  h.generation = generation_;
  h.sender = self_;
  h.tag = tag;
  h.bytes = bytes;
  zmq::message_t head(p2p_header_bytes);
  encode_p2p_header(h, head.data<unsigned char>());
  // The one copy of the payload: ZeroMQ sends after this returns, from its own buffer, so
  // the caller may reuse `data` at once (and a timeout never leaves ZeroMQ reading it).
  zmq::message_t payload(data, bytes);
  const auto deadline = clock_type::now() + std::chrono::milliseconds(timeout_ms_);
  try {
    while (true) {
      zmq::pollitem_t item{sock.handle(), 0, ZMQ_POLLOUT, 0};
      int ready = 0;
      try {
        // The test seam only: a look that does not wait tells whether this send must.
        if (before_wait_ && zmq::poll(&item, 1, std::chrono::milliseconds(0)) == 0) before_wait_();
        ready = zmq::poll(&item, 1, std::chrono::milliseconds(remaining_ms(deadline)));
      } catch (const zmq::error_t& e) {
        if (e.num() != EINTR) throw;
      }
      if (aborted_.load()) fail(comm_failure::aborted, "p2p send to " + who(peer, tag), "aborted");
      zmq::send_result_t queued;
      if (ready > 0) {
        try {
          queued = sock.send(head, zmq::send_flags::sndmore | zmq::send_flags::dontwait);
        } catch (const zmq::error_t& e) {
          if (e.num() != EINTR) throw;  // a signal: poll again
        }
      }
      if (queued) {
        // A multipart frame is queued whole once its first part is: this cannot block.
        if (!sock.send(payload, zmq::send_flags::dontwait))
          fail(comm_failure::invalid, "p2p send to " + who(peer, tag),
               "payload part refused after its header was queued");
        break;
      }
      if (clock_type::now() >= deadline)
        fail(comm_failure::timeout, "p2p send to " + who(peer, tag),
             "the peer took nothing within " + std::to_string(timeout_ms_) +
                 " ms (not connected, dead, or not receiving)");
    }
  } catch (const zmq::error_t& e) {
    fail(e.num() == ETERM ? comm_failure::aborted : comm_failure::invalid,
         "p2p send to " + who(peer, tag), e.what());
  }
  bytes_sent_.fetch_add(bytes);
}

std::unique_ptr<zmq::message_t> p2p_channel::drain(const key& want) {
  std::vector<zmq::message_t> parts;
  while (true) {
    parts.clear();
    try {
      if (!zmq::recv_multipart(*pull_, std::back_inserter(parts), zmq::recv_flags::dontwait))
        return nullptr;
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) return nullptr;  // a signal: the caller polls and comes back
      throw;
    }
    // Never trusted: shape, magic, version, generation and the payload's size are checked
    // before anything of the frame is used.
    if (parts.size() != 2 || parts[0].size() != p2p_header_bytes) {
      dropped_.fetch_add(1);
      continue;
    }
    const p2p_header h = decode_p2p_header(parts[0].data<unsigned char>());
    if (h.magic != p2p_header::magic_value || h.version != p2p_header::version_value ||
        h.generation != generation_ || h.bytes != parts[1].size()) {
      dropped_.fetch_add(1);
      continue;
    }
    auto payload = std::make_unique<zmq::message_t>(std::move(parts[1]));
    const key k{h.sender, h.tag};
    if (k == want) return payload;
    if (stash_count_ + 1 > limits_.max_stash_frames ||
        stash_bytes_ + payload->size() > limits_.max_stash_bytes)
      fail(comm_failure::invalid, "p2p recv from " + who(want.first, want.second),
           std::to_string(stash_count_ + 1) + " frames (" +
               std::to_string(stash_bytes_ + payload->size()) +
               " bytes) arrived that nobody asked for; the limit is " +
               std::to_string(limits_.max_stash_frames) + " frames and " +
               std::to_string(limits_.max_stash_bytes) +
               " bytes (a peer sends what the schedule does not ask for)");
    stash_bytes_ += payload->size();
    stash_[k].push_back(std::move(payload));
    ++stash_count_;
  }
}

void p2p_channel::recv(int peer, std::uint64_t tag, void* data, std::size_t bytes) {
  check_usable("p2p recv");
  const key want{peer, tag};
  const auto op = [&] { return "p2p recv from " + who(peer, tag); };
  std::unique_ptr<zmq::message_t> got;
  if (auto it = stash_.find(want); it != stash_.end()) {
    got = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) stash_.erase(it);
    --stash_count_;
    stash_bytes_ -= got->size();
  }
  const auto deadline = clock_type::now() + std::chrono::milliseconds(timeout_ms_);
  try {
    while (!got) {
      got = drain(want);
      if (got) break;
      if (aborted_.load()) fail(comm_failure::aborted, op(), "aborted");
      if (clock_type::now() >= deadline)
        fail(comm_failure::timeout, op(),
             "nothing arrived within " + std::to_string(timeout_ms_) +
                 " ms (the peer is slow, hung, dead, or sends another tag)");
      zmq::pollitem_t item{pull_->handle(), 0, ZMQ_POLLIN, 0};
      if (before_wait_) before_wait_();
      try {
        zmq::poll(&item, 1, std::chrono::milliseconds(remaining_ms(deadline)));
      } catch (const zmq::error_t& e) {
        if (e.num() != EINTR) throw;
      }
    }
  } catch (const zmq::error_t& e) {
    fail(e.num() == ETERM ? comm_failure::aborted : comm_failure::invalid, op(), e.what());
  }
  if (got->size() != bytes) {
    dropped_.fetch_add(1);
    fail(comm_failure::invalid, op(),
         "the frame holds " + std::to_string(got->size()) + " bytes, the receiver expects " +
             std::to_string(bytes) + " (both sides must agree on the tensor's shape)");
  }
  if (bytes > 0) std::memcpy(data, got->data(), bytes);
  bytes_received_.fetch_add(bytes);
}

}  // namespace cohort::comm
