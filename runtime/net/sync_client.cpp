// sync_client (a blocking DEALER for CLI tools and tests) and make_identity; declared in
// zmq_bridge.hpp beside the bridge whose peer it is.
#include <unistd.h>

#include <cstdio>
#include <random>

#include "runtime/core/error.hpp"
#include "runtime/net/zmq_bridge.hpp"

namespace cohort::net {
namespace {

// zmq::poll that treats a signal arriving meanwhile (EINTR; e.g. SIGCHLD in the launcher)
// as "nothing ready yet" instead of an error. True when ITEM became ready. A send or receive
// with dontwait can fail with EINTR as well (libzmq first processes the socket's commands,
// in a poll a signal can cut: a launch ended "internal error: Interrupted system call" as
// its workers exited): sync_client retries those too.
bool poll_retrying(zmq::pollitem_t* item, std::chrono::milliseconds timeout) {
  try {
    return zmq::poll(item, 1, timeout) > 0;
  } catch (const zmq::error_t& e) {
    if (e.num() == EINTR) return false;
    throw;
  }
}

}  // namespace

std::string make_identity(const std::string& prefix) {
  std::random_device rd;
  char buf[32];
  std::snprintf(buf, sizeof buf, "-%ld-%08x", static_cast<long>(::getpid()), rd());
  return prefix + buf;
}

sync_client::sync_client(const std::string& endpoint, size_t max_message_bytes)
    : sync_client(endpoint, max_message_bytes, make_identity("client")) {}

sync_client::sync_client(const std::string& endpoint, size_t max_message_bytes,
                         const std::string& identity, const client_keys* keys)
    : endpoint_(endpoint),
      max_bytes_(max_message_bytes),
      curve_(keys != nullptr),
      ctx_(1),
      sock_(ctx_, zmq::socket_type::dealer) {
  sock_.set(zmq::sockopt::linger, bridge_linger_ms);
  sock_.set(zmq::sockopt::routing_id, identity);
  if (keys) {
    sock_.set(zmq::sockopt::curve_serverkey, keys->server_public);
    sock_.set(zmq::sockopt::curve_publickey, keys->self.public_key);
    sock_.set(zmq::sockopt::curve_secretkey, keys->self.secret_key);
  }
  try {
    sock_.connect(endpoint);
  } catch (const zmq::error_t& e) {
    throw usage_error("cannot connect to '" + endpoint + "': " + e.what() +
                      " (expected tcp://HOST:PORT as printed by `cohort coordinator`)");
  }
}

sync_client::~sync_client() { sock_.close(); }

bool sync_client::send(const message& m) { return send_frame(encode(m)); }

bool sync_client::send_frame(const std::string& frame) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(1000);
  while (std::chrono::steady_clock::now() < deadline) {
    zmq::pollitem_t item{sock_.handle(), 0, ZMQ_POLLOUT, 0};
    if (!poll_retrying(&item, std::chrono::milliseconds(100))) continue;
    try {
      return sock_.send(zmq::buffer(frame), zmq::send_flags::dontwait).has_value();
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) throw;  // a signal cut it (see poll_retrying): not sent, try again
    }
  }
  return false;
}

std::optional<message> sync_client::recv(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() < 0) return std::nullopt;
    zmq::pollitem_t item{sock_.handle(), 0, ZMQ_POLLIN, 0};
    if (!poll_retrying(&item, left)) continue;
    if (!(item.revents & ZMQ_POLLIN)) continue;
    zmq::message_t frame;
    try {
      if (!sock_.recv(frame, zmq::recv_flags::dontwait)) continue;
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) throw;  // a signal cut it: nothing taken, try again
      continue;
    }
    const std::string_view bytes(frame.data<char>(), frame.size());
    decoded d = decode(bytes, max_bytes_);
    if (d.ok()) return std::move(d.msg);
    if (d.error == decode_error::bad_version)
      throw io_error("the coordinator at " + endpoint_ + " speaks cohort protocol v" +
                     std::to_string(frame_version(bytes)) + ", this build v" +
                     std::to_string(protocol_version) + ": use the same cohort build for both");
  }
}

std::optional<message> sync_client::register_as(const register_request& r,
                                                std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  if (!send(r)) return std::nullopt;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    auto m = recv(std::max(left, std::chrono::milliseconds(0)));
    if (!m) return std::nullopt;
    const msg_type t = type_of(*m);
    if (t == msg_type::register_ok || t == msg_type::register_reject) {
      registered_ = t == msg_type::register_ok;
      return m;
    }
  }
}

message sync_client::request(const message& req, msg_type reply_type,
                             std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto left = [&] {
    return std::max(std::chrono::milliseconds(0),
                    std::chrono::duration_cast<std::chrono::milliseconds>(
                        deadline - std::chrono::steady_clock::now()));
  };
  const std::string no_answer = "no answer from coordinator at " + endpoint_ + " within " +
                                std::to_string(timeout.count()) +
                                " ms (is `cohort coordinator` running there? " +
                                (curve_ ? "Are these keys the ones it authorizes?)"
                                        : "If it was started with keys, pass the same --keys DIR)");
  // A standby coordinator (ha) names the leader: the request goes there instead, and while
  // no leader is known it is asked again.
  for (int hops = 0; !registered_; ++hops) {
    register_request r;
    r.role = peer_role::client;
    r.name = "client";
    r.pid = static_cast<int64_t>(::getpid());
    auto reply = register_as(r, left());
    if (!reply) throw io_error(no_answer);
    if (auto* rej = std::get_if<register_reject>(&*reply)) {
      if (!rej->standby || hops >= 64 || left().count() == 0)
        throw io_error("coordinator at " + endpoint_ + " refused the client: " + rej->reason);
      if (!rej->leader.empty() && rej->leader != endpoint_) {
        sock_.disconnect(endpoint_);
        endpoint_ = rej->leader;
        sock_.connect(endpoint_);
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
  }
  if (!send(req)) throw io_error(no_answer);
  while (true) {
    auto m = recv(left());
    if (!m) throw io_error(no_answer);
    if (type_of(*m) == reply_type) return std::move(*m);
  }
}

}  // namespace cohort::net
