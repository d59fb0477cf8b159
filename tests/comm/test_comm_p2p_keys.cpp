// p2p_channel with a job's keys, in both securities (comm.p2p_security): frames from the
// job's workers arrive both ways, up to the largest tensor; frames from a local process
// without the worker key (no credentials, a key or password of its own, a password replayed
// from another channel or generation, the other security's mechanism) never reach the stash.
#include <doctest/doctest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "runtime/comm/p2p.hpp"
#include "runtime/core/error.hpp"
#include "runtime/net/curve.hpp"
#include "tests/comm/p2p_test_util.hpp"
#include "tests/data/temp_dir.hpp"

using namespace cohort::comm;
using cohort::comm::test::header_bytes;
using cohort::comm::test::raw_pusher;

namespace {

// A frame whose header passes every check of the channel: sender 0 (the neighbour), tag 3.
std::vector<std::string> forged_frame() {
  p2p_header h;
  h.generation = 1;
  h.sender = 0;
  h.tag = 3;
  h.bytes = 4;
  return {header_bytes(h), "evil"};
}

void plain_credentials(zmq::socket_t& s, const std::string& user, const std::string& password) {
  s.set(zmq::sockopt::plain_username, user);
  s.set(zmq::sockopt::plain_password, password);
}

void curve_credentials(zmq::socket_t& s, const std::string& server_public,
                       const cohort::net::keypair& self) {
  s.set(zmq::sockopt::curve_serverkey, server_public);
  s.set(zmq::sockopt::curve_publickey, self.public_key);
  s.set(zmq::sockopt::curve_secretkey, self.secret_key);
}

void only_the_worker_key_gets_through(p2p_security security) {
  cohort::test::temp_dir tmp;
  cohort::net::write_job_keys(tmp.file("keys"));
  const auto worker =
      cohort::net::load_client_keys(tmp.file("keys"), cohort::net::key_role::worker);
  const auto other = cohort::net::make_keypair();
  // The largest tensor is 4 KiB: a frame of exactly that size must still pass the socket's
  // size limit once the security has wrapped it.
  p2p_limits lim;
  lim.max_message_bytes = 4096;
  p2p_channel a("127.0.0.1", 0, 1, 10000, lim, &worker, security);
  p2p_channel b("127.0.0.1", 1, 1, 1500, lim, &worker, security);
  // A channel of the same job in another generation: its password must not open b.
  p2p_channel later("127.0.0.1", 1, 2, 1500, lim, &worker, security);

  // Each intruder's socket holds its frame until a connection is admitted, which never is.
  std::vector<std::unique_ptr<raw_pusher>> intruders;
  auto add = [&](const std::function<void(zmq::socket_t&)>& setup) {
    intruders.push_back(std::make_unique<raw_pusher>(b.endpoint(), setup));
    // Queued, or refused already: either way nothing of it may reach b.
    intruders.back()->offer(forged_frame());
  };
  add({});  // no credentials at all (the NULL mechanism)
  add([&](zmq::socket_t& s) { curve_credentials(s, worker.self.public_key, other); });
  add([&](zmq::socket_t& s) {
    plain_credentials(s, "worker", p2p_password(other.secret_key, 1, b.endpoint()));
  });
  add([&](zmq::socket_t& s) {  // replayed from the later generation's channel
    plain_credentials(s, "worker", p2p_password(worker.self.secret_key, 2, later.endpoint()));
  });
  add([&](zmq::socket_t& s) {  // right password, another user name
    plain_credentials(s, "admin", p2p_password(worker.self.secret_key, 1, b.endpoint()));
  });
  // The other security's way in, with the right key: a mechanism the socket does not speak.
  if (security == p2p_security::authenticate)
    add([&](zmq::socket_t& s) { curve_credentials(s, worker.self.public_key, worker.self); });
  else
    add([&](zmq::socket_t& s) {
      plain_credentials(s, "worker", p2p_password(worker.self.secret_key, 1, b.endpoint()));
    });

  // The job's own channel, with the worker key: its frame arrives, and it is the only one.
  a.connect(1, b.endpoint());
  const std::uint32_t v = 7;
  a.send(1, 4, &v, sizeof v);
  std::uint32_t got = 0;
  b.recv(0, 4, &got, sizeof got);
  CHECK(got == 7);
  CHECK(b.stashed() == 0);
  // Both ways, as neighbouring stages run: activations one way, gradients back.
  b.connect(0, a.endpoint());
  for (std::uint32_t i = 0; i < 3; ++i) {
    b.send(0, 100 + i, &i, sizeof i);
    std::uint32_t back = 99;
    a.recv(1, 100 + i, &back, sizeof back);
    CHECK(back == i);
    a.send(1, 200 + i, &i, sizeof i);
    b.recv(0, 200 + i, &back, sizeof back);
    CHECK(back == i);
  }
  std::vector<unsigned char> big(4096);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<unsigned char>(i * 131 + 5);
  a.send(1, 5, big.data(), big.size());
  std::vector<unsigned char> big_in(4096, 0);
  b.recv(0, 5, big_in.data(), big_in.size());
  CHECK(big_in == big);
  // No forged frame (tag 3) ever came in: the recv times out (and that ends the channel).
  char buf[4];
  CHECK_THROWS_AS(b.recv(0, 3, buf, sizeof buf), comm_error);
  CHECK(b.bytes_received() == sizeof v + 3 * sizeof(std::uint32_t) + 4096);
  CHECK(b.dropped() == 0);  // refused at the handshake, not dropped after decoding
}

}  // namespace

TEST_CASE("p2p with keys, authenticate: only the job's worker key gets a frame through") {
  only_the_worker_key_gets_through(p2p_security::authenticate);
}

TEST_CASE("p2p with keys, encrypt: only the job's worker key gets a frame through") {
  only_the_worker_key_gets_through(p2p_security::encrypt);
}

TEST_CASE("p2p_password: per key, generation and endpoint, and the securities by name") {
  const auto k1 = cohort::net::make_keypair(), k2 = cohort::net::make_keypair();
  const std::string ep = "tcp://127.0.0.1:4000";
  const std::string p = p2p_password(k1.secret_key, 1, ep);
  CHECK(p.size() == 64);
  CHECK(p == p2p_password(k1.secret_key, 1, ep));
  CHECK(p != p2p_password(k2.secret_key, 1, ep));
  CHECK(p != p2p_password(k1.secret_key, 2, ep));
  CHECK(p != p2p_password(k1.secret_key, 1, "tcp://127.0.0.1:4001"));
  CHECK(p.find(k1.secret_key) == std::string::npos);
  for (auto s : {p2p_security::authenticate, p2p_security::encrypt})
    CHECK(parse_p2p_security(to_string(s)) == s);
  CHECK_THROWS_AS(parse_p2p_security("none"), comm_error);
}
