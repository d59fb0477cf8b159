// What the p2p channel tests share: a raw ZeroMQ PUSH socket that sends crafted frames, as a
// buggy or hostile peer would, and a header's bytes. Tests only.
#pragma once
#include <doctest/doctest.h>

#include <functional>
#include <string>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "runtime/comm/p2p.hpp"

namespace cohort::comm::test {

/// A plain ZeroMQ PUSH socket connected to ENDPOINT; SETUP (credentials, say) runs on it
/// before it connects.
struct raw_pusher {
  zmq::context_t ctx{1};
  zmq::socket_t sock{ctx, zmq::socket_type::push};
  explicit raw_pusher(const std::string& endpoint,
                      const std::function<void(zmq::socket_t&)>& setup = {}) {
    sock.set(zmq::sockopt::linger, 0);
    if (setup) setup(sock);
    sock.connect(endpoint);
  }
  /// Queues PARTS as one multipart frame (the socket holds it until a connection takes it).
  void send(std::vector<std::string> parts) {
    std::vector<zmq::const_buffer> bufs;
    for (const auto& p : parts) bufs.push_back(zmq::buffer(p));
    REQUIRE(zmq::send_multipart(sock, bufs));
  }
  /// Queues PARTS if the socket can take them now, without waiting: a socket whose every
  /// connection the peer refuses may hold no pipe at the moment (ZeroMQ drops it after a
  /// failed handshake and reconnects later), and a blocking send would then wait forever.
  /// Returns whether the frame was queued.
  bool offer(std::vector<std::string> parts) {
    std::vector<zmq::const_buffer> bufs;
    for (const auto& p : parts) bufs.push_back(zmq::buffer(p));
    return zmq::send_multipart(sock, bufs, zmq::send_flags::dontwait).has_value();
  }
};

/// The p2p_header_bytes bytes that encode H.
inline std::string header_bytes(const p2p_header& h) {
  std::string s(p2p_header_bytes, '\0');
  encode_p2p_header(h, reinterpret_cast<unsigned char*>(s.data()));
  return s;
}

}  // namespace cohort::comm::test
