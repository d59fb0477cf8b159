// The bridge thread is the only user of the network socket and of the inproc PULL end.
// Other threads never touch those; they push [peer, frame] pairs into the PULL end through
// one mutex-guarded PUSH socket (a ZeroMQ socket may change threads only behind a full
// memory barrier, which the mutex provides).
#include "runtime/net/zmq_bridge.hpp"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <zmq_addon.hpp>

#include "runtime/core/error.hpp"
#include "runtime/net/relay.hpp"

namespace cohort::net {
namespace {


// libzmq disconnects a peer whose message exceeds ZMQ_MAXMSGSIZE before we ever see it.
// We want oversized frames counted, so the socket limit sits well above ours and only
// protects memory against absurd sizes.
int64_t socket_size_limit(size_t max_bytes) {
  const uint64_t m = max_bytes;
  return static_cast<int64_t>(std::max<uint64_t>(2 * m, m + (1u << 20)));
}

std::atomic<uint64_t> pipe_counter{0};

constexpr int send_hwm = 100000;
// Pending connections a ROUTER bridge queues before accepting them (listen(2)).
constexpr int listen_backlog = 4096;

}  // namespace

const char* to_string(drop_reason r) {
  switch (r) {
    case drop_reason::unknown_peer:
      return "unknown_peer";
    case drop_reason::bad_parts:
      return "bad_parts";
    case drop_reason::send_failed:
      return "send_failed";
    case drop_reason::wrong_role:
      return "wrong_role";
    case drop_reason::stale_term:
      return "stale_term";
    case drop_reason::count_:
      return "unknown";
    default:
      return to_string(static_cast<decode_error>(r));
  }
}

zmq_bridge::zmq_bridge(bridge_options opts, inbound_fn on_message)
    : opts_(std::move(opts)), on_message_(std::move(on_message)), ctx_(1), term_(opts_.term) {
  pipe_name_ = "inproc://cohort-bridge-" + std::to_string(pipe_counter.fetch_add(1));
  if (opts_.curve_server && opts_.kind == bridge_options::socket_kind::router)
    zap_ = std::make_unique<zap_handler>(ctx_, opts_.curve_server->authorized);
  std::promise<std::string> ready;
  auto fut = ready.get_future();
  thread_ = std::thread([this, &ready] { run(&ready); });
  try {
    endpoint_ = fut.get();
  } catch (...) {
    thread_.join();
    throw;
  }
  push_ = std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::push);
  push_->set(zmq::sockopt::sndhwm, send_hwm);
  push_->set(zmq::sockopt::linger, 0);
  push_->connect(pipe_name_);
}

zmq_bridge::~zmq_bridge() { stop(); }

void zmq_bridge::stop() {
  {
    std::lock_guard<std::mutex> lock(push_mu_);
    if (stopped_) return;
    stopped_ = true;
    // A one-part message on the pipe is the stop signal; data is always two parts. Never
    // block on it: if the bridge thread already ended (poll failure), nobody would read it.
    while (!thread_done_.load()) {
      if (push_->send(zmq::message_t(), zmq::send_flags::dontwait)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(push_mu_);
  push_->close();
  zap_.reset();
}

void zmq_bridge::send(const std::string& peer, const message& m) {
  send_frame(peer, encode(m, term_.load()));
}

void zmq_bridge::reconnect(const std::string& endpoint) {
  COHORT_CHECK(opts_.kind == bridge_options::socket_kind::dealer);
  std::lock_guard<std::mutex> lock(push_mu_);
  if (stopped_) return;
  // Three parts on the pipe: a reconnect (data is two parts, stop one).
  std::array<zmq::message_t, 3> parts{zmq::message_t(), zmq::message_t(endpoint.data(), endpoint.size()),
                                      zmq::message_t()};
  if (!zmq::send_multipart(*push_, parts, zmq::send_flags::dontwait))
    count(drop_reason::send_failed);
}

void zmq_bridge::send_frame(const std::string& peer, std::string frame) {
  std::lock_guard<std::mutex> lock(push_mu_);
  if (stopped_) return;
  std::array<zmq::message_t, 2> parts{zmq::message_t(peer.data(), peer.size()),
                                      zmq::message_t(frame.data(), frame.size())};
  // Never block a sender (an actor, the heartbeat thread): a pipe that is full means the
  // bridge thread is wedged or gone, and the frame is counted as not sent.
  if (!zmq::send_multipart(*push_, parts, zmq::send_flags::dontwait))
    count(drop_reason::send_failed);
}

bool zmq_bridge::send_out(zmq::socket_t& net, zmq::message_t& peer, zmq::message_t& frame) {
  try {
    zmq::send_result_t ok;
    if (opts_.kind == bridge_options::socket_kind::router) {
      const std::string_view name(peer.data<char>(), peer.size());
      if (const auto relayed = split_relay_peer(name)) {
        // A worker behind its host's agent: [agent, worker, frame], as a proxy's envelope.
        ok = net.send(zmq::buffer(relayed->first), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
        if (ok) ok = net.send(zmq::buffer(relayed->second), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
      } else {
        ok = net.send(peer, zmq::send_flags::sndmore | zmq::send_flags::dontwait);
      }
      if (ok) ok = net.send(frame, zmq::send_flags::dontwait);
    } else {
      ok = net.send(frame, zmq::send_flags::dontwait);
    }
    if (ok) return true;
  } catch (const zmq::error_t&) {
    // EHOSTUNREACH from ROUTER_MANDATORY: that peer is gone.
  }
  count(drop_reason::send_failed);
  return false;
}

bool zmq_bridge::send_out(zmq::socket_t& net, const std::string& peer, const std::string& frame) {
  zmq::message_t p(peer.data(), peer.size()), f(frame.data(), frame.size());
  return send_out(net, p, f);
}

bool zmq_bridge::reply(const std::string& peer, const message& m) {
  COHORT_CHECK(std::this_thread::get_id() == thread_.get_id() && net_ != nullptr);
  return send_out(*net_, peer, encode(m, term_.load()));
}

std::chrono::steady_clock::time_point zmq_bridge::caught_up() const {
  if (waiting_.load()) return std::chrono::steady_clock::now();
  return std::chrono::steady_clock::time_point(std::chrono::nanoseconds(caught_up_ns_.load()));
}

void zmq_bridge::admit(const std::string& peer) {
  std::lock_guard<std::mutex> lock(peers_mu_);
  admitted_.insert(peer);
}

void zmq_bridge::forget(const std::string& peer) {
  std::lock_guard<std::mutex> lock(peers_mu_);
  admitted_.erase(peer);
  relays_.erase(peer);
}

void zmq_bridge::allow_relay(const std::string& peer) {
  std::lock_guard<std::mutex> lock(peers_mu_);
  relays_.insert(peer);
}

uint64_t zmq_bridge::dropped(drop_reason r) const {
  return counters_[static_cast<size_t>(r)].load();
}

std::vector<std::pair<std::string, uint64_t>> zmq_bridge::drop_counts() const {
  std::vector<std::pair<std::string, uint64_t>> out;
  for (size_t i = 1; i < counters_.size(); ++i) {
    const uint64_t v = counters_[i].load();
    if (v != 0) out.emplace_back(to_string(static_cast<drop_reason>(i)), v);
  }
  // Refusals are logged a few a period (log_limiter): the count here is the whole of them.
  if (const uint64_t v = refused_keys(); v != 0) out.emplace_back("refused_key", v);
  return out;
}

void zmq_bridge::run(std::promise<std::string>* ready) {
  struct mark_done {
    std::atomic<bool>* flag;
    ~mark_done() { flag->store(true); }
  } done{&thread_done_};
  const bool router = opts_.kind == bridge_options::socket_kind::router;
  zmq::socket_t net(ctx_, router ? zmq::socket_type::router : zmq::socket_type::dealer);
  std::string connected;  // DEALER: the endpoint connected now (reconnect changes it)
  zmq::socket_t pull(ctx_, zmq::socket_type::pull);
  try {
    net.set(zmq::sockopt::linger, bridge_linger_ms);
    net.set(zmq::sockopt::maxmsgsize, socket_size_limit(opts_.max_message_bytes));
    // Control traffic is small but bursty (a roster to every member, a benchmark): the
    // default high-water mark of 1000 frames would drop frames in a burst.
    net.set(zmq::sockopt::sndhwm, send_hwm);
    net.set(zmq::sockopt::rcvhwm, send_hwm);
    if (router) {
      net.set(zmq::sockopt::router_mandatory, 1);
      // A job's workers connect at once: ZeroMQ's default listen backlog (100) drops the
      // SYNs beyond it, and those workers retry after TCP's backoff (1 s, 3 s, 7 s ...).
      // The kernel caps this at net.core.somaxconn.
      net.set(zmq::sockopt::backlog, listen_backlog);
      if (zap_) {
        net.set(zmq::sockopt::curve_server, 1);
        net.set(zmq::sockopt::curve_secretkey, opts_.curve_server->self.secret_key);
        net.set(zmq::sockopt::zap_domain, "cohort");
      }
      net.bind(opts_.endpoint);
    } else {
      if (!opts_.identity.empty()) net.set(zmq::sockopt::routing_id, opts_.identity);
      if (const auto& k = opts_.curve_client) {
        net.set(zmq::sockopt::curve_serverkey, k->server_public);
        net.set(zmq::sockopt::curve_publickey, k->self.public_key);
        net.set(zmq::sockopt::curve_secretkey, k->self.secret_key);
      }
      net.connect(opts_.endpoint);
      connected = opts_.endpoint;
    }
    pull.set(zmq::sockopt::rcvhwm, send_hwm);
    pull.set(zmq::sockopt::linger, 0);
    pull.bind(pipe_name_);
  } catch (const zmq::error_t& e) {
    const std::string msg = std::string("cannot ") + (router ? "bind " : "connect to ") +
                            opts_.endpoint + ": " + e.what() +
                            " (use an endpoint like tcp://127.0.0.1:0)";
    // A malformed endpoint is the user's to fix (exit 2); a taken port is a runtime failure.
    const bool malformed = e.num() == EINVAL || e.num() == EPROTONOSUPPORT;
    ready->set_exception(malformed ? std::make_exception_ptr(usage_error(msg))
                                   : std::make_exception_ptr(io_error(msg)));
    return;
  }
  net_ = &net;
  struct forget_socket {
    zmq::socket_t** p;
    ~forget_socket() { *p = nullptr; }
  } forget_net{&net_};
  const auto mark_caught_up = [this] {
    caught_up_ns_ = std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now().time_since_epoch())
                        .count();
  };
  mark_caught_up();
  ready->set_value(router ? net.get(zmq::sockopt::last_endpoint) : opts_.endpoint);

  // DEALER with on_disconnect: the socket's monitor reports a dropped connection.
  std::unique_ptr<zmq::socket_t> monitor;
  if (!router && opts_.on_disconnect) {
    const std::string mon = pipe_name_ + "-monitor";
    if (zmq_socket_monitor(net.handle(), mon.c_str(), ZMQ_EVENT_DISCONNECTED) == 0) {
      monitor = std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::pair);
      monitor->set(zmq::sockopt::linger, 0);
      monitor->connect(mon);
    }
  }
  std::vector<zmq::message_t> parts;
  bool running = true;
  // After handling traffic, keep polling without blocking for a short while: an answer
  // often follows within microseconds, and catching it awake saves a thread wake-up on
  // each hop. Idle bridges (heartbeats only) block as usual.
  const auto spin = std::chrono::microseconds(opts_.spin_us);
  auto spin_until = std::chrono::steady_clock::now();
  while (running) {
    zmq::pollitem_t items[] = {{net.handle(), 0, ZMQ_POLLIN, 0},
                               {pull.handle(), 0, ZMQ_POLLIN, 0},
                               {monitor ? monitor->handle() : nullptr, 0, ZMQ_POLLIN, 0}};
    try {
      const bool spinning = std::chrono::steady_clock::now() < spin_until;
      // Blocked in poll, the thread has read everything that reached the socket.
      if (!spinning) waiting_ = true;
      const int n =
          zmq::poll(items, monitor ? 3 : 2, std::chrono::milliseconds(spinning ? 0 : -1));
      if (!spinning) {
        mark_caught_up();
        waiting_ = false;
      }
      if (n == 0) continue;
      spin_until = std::chrono::steady_clock::now() + spin;
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      spdlog::error("zmq bridge: poll failed: {}", e.what());
      break;
    }
    if (items[0].revents & ZMQ_POLLIN) {
      // Drain everything readable so one busy peer cannot starve the outbound pipe.
      while (true) {
        parts.clear();
        auto n = zmq::recv_multipart(net, std::back_inserter(parts), zmq::recv_flags::dontwait);
        if (!n) {
          mark_caught_up();
          break;
        }
        on_inbound(parts, net);
      }
    }
    if (monitor && (items[2].revents & ZMQ_POLLIN)) {
      // Two frames an event: (u16 event, u32 value), then the endpoint it concerns.
      while (true) {
        parts.clear();
        if (!zmq::recv_multipart(*monitor, std::back_inserter(parts), zmq::recv_flags::dontwait))
          break;
        if (parts.size() == 2 && parts[0].size() >= 2 && parts[1].to_string() == connected) {
          uint16_t event = 0;
          std::memcpy(&event, parts[0].data(), sizeof event);
          if (event == ZMQ_EVENT_DISCONNECTED) opts_.on_disconnect();
        }
      }
    }
    if (items[1].revents & ZMQ_POLLIN) {
      while (true) {
        parts.clear();
        auto n = zmq::recv_multipart(pull, std::back_inserter(parts), zmq::recv_flags::dontwait);
        if (!n) break;
        if (parts.size() == 3 && !router) {
          const std::string next = parts[1].to_string();
          try {
            if (!connected.empty()) net.disconnect(connected);
          } catch (const zmq::error_t&) {
            // Already gone (ZeroMQ drops a connection it could not keep): nothing to undo.
          }
          try {
            net.connect(next);
            connected = next;
          } catch (const zmq::error_t& e) {
            spdlog::error("zmq bridge: cannot connect to {}: {}", next, e.what());
            connected.clear();
          }
          continue;
        }
        if (parts.size() != 2) {
          running = false;
          break;
        }
        send_out(net, parts[0], parts[1]);
      }
    }
  }
}

void zmq_bridge::on_version_mismatch(const std::string& peer, int version, zmq::socket_t& net) {
  const bool router = opts_.kind == bridge_options::socket_kind::router;
  if (!router) {
    if (!version_reported_ && opts_.on_version_mismatch) opts_.on_version_mismatch(version);
    version_reported_ = true;
    return;
  }
  if (told_version_.count(peer) != 0) return;
  if (told_version_.size() >= 4096) told_version_.clear();  // bounded: a flood of identities
  told_version_.insert(peer);
  if (const auto l = version_log_.admit())
    spdlog::warn(
        "zmq bridge: a peer speaks cohort protocol v{}, this build v{}: its frames are dropped "
        "and it is told so{}",
        version, protocol_version, log_limiter::suffix(*l, "such peers"));
  const std::string reason = "protocol version mismatch: this side speaks cohort protocol v" +
                             std::to_string(protocol_version) + ", the peer v" +
                             std::to_string(version) + "; run the same cohort build everywhere";
  send_out(net, peer, encode(register_reject{reason, 0}, term_.load()));
  if (opts_.on_version_mismatch) opts_.on_version_mismatch(version);
}

void zmq_bridge::on_inbound(std::vector<zmq::message_t>& parts, zmq::socket_t& net) {
  const bool router = opts_.kind == bridge_options::socket_kind::router;
  // ROUTER: [peer, frame], or [agent, worker, frame] from a host agent relaying a worker.
  const bool relayed = router && parts.size() == 3;
  if (parts.size() != (router ? 2u : 1u) && !relayed) {
    count(drop_reason::bad_parts);
    return;
  }
  zmq::message_t& payload = parts.back();
  const std::string_view frame(payload.data<char>(), payload.size());
  std::string peer = router ? parts[0].to_string() : std::string();
  // A direct routing id may not pass for a relayed worker's name.
  if (router && is_relay_peer(peer)) {
    count(drop_reason::bad_parts);
    return;
  }
  // CURVE: the connection's key decides what it may send, from the envelope alone. The
  // role is read from the frame itself, so a routing id taken over by another connection
  // carries that connection's role, not the first one's.
  std::optional<key_role> role;
  if (zap_) role = message_role(payload.handle());
  if (zap_ && !role) {
    count(drop_reason::wrong_role);
    return;
  }
  bool relay = false;  // PEER is a registered host agent
  if (router) {
    std::lock_guard<std::mutex> lock(peers_mu_);
    relay = relays_.count(peer) != 0;
  }
  if (relayed) {
    // Only a host agent relays (with keys: a launcher key's connection); the frame is then
    // its worker's, held to a worker's rules, under the worker's own name.
    const size_t worker_bytes = parts[1].size();
    if (!relay || worker_bytes == 0 || worker_bytes > 255 || peer.size() > 255) {
      count(drop_reason::unknown_peer);
      return;
    }
    if (role && *role != key_role::launcher) {
      count(drop_reason::wrong_role);
      return;
    }
    if (role) role = key_role::worker;
    peer = relay_peer(peer, parts[1].to_string());
  } else if (router && !relay && frame_version(frame) == protocol_version &&
             frame_type(frame) == static_cast<int>(msg_type::host_beat)) {
    count(drop_reason::unknown_peer);  // a host beat from anyone but a registered agent
    return;
  }
  if (role && frame_version(frame) == protocol_version &&
      !role_may_send(*role, frame_type(frame))) {
    count(drop_reason::wrong_role);
    return;
  }
  bool admitted = !router;
  if (router) {
    std::lock_guard<std::mutex> lock(peers_mu_);
    admitted = admitted_.count(peer) != 0;
  }
  if (!admitted) {
    // A peer that has not registered may send one thing, a small register_request: look
    // at no more than the envelope of anything else (no payload of a stranger is decoded).
    if (frame.size() > max_unregistered_bytes) {
      count(drop_reason::too_large);
      return;
    }
    if (frame_version(frame) == protocol_version &&
        frame_type(frame) != static_cast<int>(msg_type::register_request)) {
      count(drop_reason::unknown_peer);
      return;
    }
  }
  decoded d = decode(frame, opts_.max_message_bytes);
  if (!d.ok()) {
    count(static_cast<drop_reason>(d.error));
    // Only the envelope of such a frame is read: its version field.
    if (d.error == decode_error::bad_version)
      on_version_mismatch(peer, frame_version(frame), net);
    return;
  }
  if (role) {
    if (const auto* r = std::get_if<register_request>(&d.msg)) {
      if (std::string why = registration_problem(*role, *r); !why.empty()) {
        count(drop_reason::wrong_role);
        send_out(net, peer, encode(register_reject{"refused: " + why, 0}, term_.load()));
        return;
      }
    }
  }
  if (!router && !std::holds_alternative<register_reject>(d.msg)) {
    // Fencing (ha): a coordinator of a lower term than one already heard was deposed;
    // nothing it says is obeyed. A higher term raises the floor. A refusal commands
    // nothing (a standby's names the leader): it passes whatever its term.
    uint64_t floor = term_floor_.load();
    if (d.term < floor) {
      count(drop_reason::stale_term);
      return;
    }
    if (d.term > floor) term_floor_.store(d.term);
  }
  delivered_.fetch_add(1);
  try {
    on_message_(sender{std::move(peer), role}, std::move(d.msg));
  } catch (const std::exception& e) {
    // The callback belongs to a higher layer; its failure must not take the socket down.
    spdlog::error("zmq bridge: inbound handler failed: {}", e.what());
  }
}

}  // namespace cohort::net
