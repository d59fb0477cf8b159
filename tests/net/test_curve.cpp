// CurveZMQ (runtime/net/curve.*): key files as keygen writes them and as a user may damage
// them, the role table, loopback endpoints, and a ROUTER bridge with keys over real sockets:
// only authorized keys get a frame through, and each frame only if its key's role may send it
// (with its role handed on); a flood of refused keys is logged a few lines a period.
#include <doctest/doctest.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "runtime/core/error.hpp"
#include "runtime/net/curve.hpp"
#include "runtime/net/protocol.hpp"
#include "runtime/net/zmq_bridge.hpp"
#include "tests/data/temp_dir.hpp"
#include "tests/net/bridge_util.hpp"

using namespace cohort;
using namespace cohort::net;
using cohort::test::eventually;
using cohort::test::inbox;
using cohort::test::temp_dir;
using std::chrono::milliseconds;

namespace {

unsigned mode_of(const std::string& path) {
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  return st.st_mode & 07777;
}

// The message of the usage_error F throws ("" when it throws none).
std::string usage_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const usage_error& e) {
    return e.what();
  }
  return "";
}

void append(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::app) << text;
}

}  // namespace

TEST_CASE("keygen writes private files that load back, and never overwrites a key") {
  temp_dir tmp;
  const std::string dir = tmp.file("keys");
  write_job_keys(dir);
  CHECK(has_job_keys(dir));
  CHECK(mode_of(dir) == 0700);
  for (const char* f : {"coordinator.key", "coordinator.pub", "worker.key", "launcher.key",
                        "admin.key", "authorized"})
    CHECK_MESSAGE(mode_of(dir + "/" + f) == 0600, f);
  const server_keys server = load_server_keys(dir);
  CHECK(server.authorized.size() == 3);
  for (key_role role : {key_role::worker, key_role::launcher, key_role::admin}) {
    const client_keys c = load_client_keys(dir, role);
    CHECK(c.server_public == server.self.public_key);
    CHECK(c.role == role);
    REQUIRE(server.authorized.count(c.self.public_key) == 1);
    CHECK(server.authorized.at(c.self.public_key) == role);
  }
  // Different pairs for every role and the coordinator.
  CHECK(load_client_keys(dir, key_role::worker).self.public_key !=
        load_client_keys(dir, key_role::admin).self.public_key);
  const std::string again = usage_message([&] { write_job_keys(dir); });
  CHECK(again.find("never overwrites") != std::string::npos);
  CHECK(load_server_keys(dir).self.secret_key == server.self.secret_key);  // untouched
}

TEST_CASE("damaged key files are refused naming the file, the line and the fix") {
  temp_dir tmp;
  const std::string dir = tmp.file("keys");
  write_job_keys(dir);
  SUBCASE("a secret others can read") {
    ::chmod((dir + "/worker.key").c_str(), 0644);
    const std::string m = usage_message([&] { load_client_keys(dir, key_role::worker); });
    CHECK(m.find("worker.key has mode 0644") != std::string::npos);
    CHECK(m.find("chmod 600") != std::string::npos);
  }
  SUBCASE("a missing file") {
    std::filesystem::remove(dir + "/coordinator.pub");
    const std::string m = usage_message([&] { load_client_keys(dir, key_role::admin); });
    CHECK(m.find("coordinator.pub") != std::string::npos);
    CHECK(m.find("cohort keygen") != std::string::npos);
  }
  SUBCASE("an authorized line with an unknown role, and one with a bad key") {
    append(dir + "/authorized", "root " + make_keypair().public_key + "\n");
    CHECK(usage_message([&] { load_server_keys(dir); }).find("authorized:6:") != std::string::npos);
  }
  SUBCASE("a key that is not 40 characters of Z85") {
    append(dir + "/authorized", "admin tooshort\n");
    CHECK(usage_message([&] { load_server_keys(dir); }).find("authorized:6:") != std::string::npos);
  }
  SUBCASE("a public key that does not belong to the secret") {
    const keypair other = make_keypair();
    const std::string path = dir + "/admin.key";
    std::ofstream(path, std::ios::trunc)
        << "public " << other.public_key << "\nsecret "
        << load_client_keys(dir, key_role::worker).self.secret_key << "\n";
    CHECK(usage_message([&] {
            load_client_keys(dir, key_role::admin);
          }).find("is not the secret key's") != std::string::npos);
  }
  SUBCASE("an extra authorized key is admitted with its role") {
    const keypair op = make_keypair();
    append(dir + "/authorized", "admin " + op.public_key + "  # an operator\n");
    const server_keys s = load_server_keys(dir);
    CHECK(s.authorized.size() == 4);
    CHECK(s.authorized.at(op.public_key) == key_role::admin);
  }
}

TEST_CASE("roles: which messages each key may send, and what it may register as") {
  const auto t = [](msg_type m) { return static_cast<int>(m); };
  struct row {
    msg_type type;
    bool worker, launcher, admin;
  };
  const row table[] = {
      {msg_type::register_request, true, true, true},
      {msg_type::heartbeat, true, false, false},
      {msg_type::kv_set, true, false, false},
      {msg_type::kv_wait, true, false, false},
      {msg_type::step_vote, true, false, false},
      {msg_type::telemetry, true, false, false},
      {msg_type::leave, true, false, false},
      {msg_type::exit_notice, false, true, false},
      {msg_type::stop, false, true, true},
      {msg_type::status_request, false, true, true},
      {msg_type::admin_request, true, false, true},
      {msg_type::step_open, false, false, false},
      {msg_type::roster_update, false, false, false},
      {msg_type::pong, true, true, true},
  };
  for (const row& r : table) {
    CAPTURE(type_name(r.type));
    CHECK(role_may_send(key_role::worker, t(r.type)) == r.worker);
    CHECK(role_may_send(key_role::launcher, t(r.type)) == r.launcher);
    CHECK(role_may_send(key_role::admin, t(r.type)) == r.admin);
  }
  const register_request worker{peer_role::worker, "w", 1};
  const register_request launch{peer_role::client, "launch", 1};
  const register_request ctl{peer_role::client, "client", 1};
  CHECK(registration_problem(key_role::worker, worker).empty());
  CHECK_FALSE(registration_problem(key_role::worker, ctl).empty());
  CHECK(registration_problem(key_role::launcher, launch).empty());
  CHECK_FALSE(registration_problem(key_role::launcher, ctl).empty());
  CHECK_FALSE(registration_problem(key_role::launcher, worker).empty());
  CHECK(registration_problem(key_role::admin, ctl).empty());
  CHECK_FALSE(registration_problem(key_role::admin, launch).empty());  // not the launcher
  CHECK_FALSE(registration_problem(key_role::admin, worker).empty());
}

TEST_CASE("loopback endpoints: what only this host reaches") {
  for (const char* ep : {"tcp://127.0.0.1:0", "tcp://127.0.0.5:5555", "tcp://localhost:1",
                         "tcp://[::1]:9", "ipc:///tmp/x", "inproc://a"})
    CHECK_MESSAGE(loopback_endpoint(ep), ep);
  for (const char* ep : {"tcp://0.0.0.0:0", "tcp://*:5555", "tcp://10.0.0.1:0", "tcp://eth0:0",
                         "tcp://myhost:1", "tcp://[::]:1", "tcp://128.0.0.1:1"})
    CHECK_FALSE_MESSAGE(loopback_endpoint(ep), ep);
}

TEST_CASE("bridge with keys: strangers never get a frame through, each key only its role's") {
  temp_dir tmp;
  const std::string dir = tmp.file("keys");
  write_job_keys(dir);
  bridge_options o;
  o.kind = bridge_options::socket_kind::router;
  o.endpoint = "tcp://127.0.0.1:0";
  o.max_message_bytes = 1 << 16;
  o.curve_server = std::make_shared<const server_keys>(load_server_keys(dir));
  inbox in;
  zmq_bridge router(o, in.fn());
  const client_keys worker = load_client_keys(dir, key_role::worker);
  const client_keys admin = load_client_keys(dir, key_role::admin);

  // A key the coordinator never authorized: the handshake is refused by the ZAP handler.
  client_keys stranger = worker;
  stranger.self = make_keypair();
  sync_client intruder(router.endpoint(), 1 << 16, "intruder", &stranger);
  REQUIRE(intruder.send(register_request{peer_role::worker, "intruder", 1}));
  REQUIRE(eventually(milliseconds(10000), [&] { return router.refused_keys() == 1; }));
  // No keys at all: the handshake fails on the mechanism (never reaches the callback).
  sync_client plain(router.endpoint(), 1 << 16, "plain");
  REQUIRE(plain.send(register_request{peer_role::worker, "plain", 1}));

  // The worker key registers a worker; its stop is dropped unread, its heartbeat
  // (once admitted) goes through.
  sync_client w(router.endpoint(), 1 << 16, "w", &worker);
  REQUIRE(w.send(register_request{peer_role::worker, "w", 1}));
  REQUIRE(in.wait_for(1));
  CHECK(in.at(0).first == "w");
  CHECK(in.role_at(0) == key_role::worker);  // what the coordinator decides authority by
  router.admit("w");
  REQUIRE(w.send(stop{"not a worker's to send"}));
  REQUIRE(eventually(milliseconds(10000),
                     [&] { return router.dropped(drop_reason::wrong_role) == 1; }));
  REQUIRE(w.send(heartbeat{1, 1, 1}));
  REQUIRE(in.wait_for(2));
  CHECK(type_of(in.at(1).second) == msg_type::heartbeat);

  // The worker key may not register a client: refused with a reason, nothing delivered.
  sync_client w_as_client(router.endpoint(), 1 << 16, "w2", &worker);
  const auto reply =
      w_as_client.register_as(register_request{peer_role::client, "ctl", 1}, milliseconds(10000));
  REQUIRE(reply.has_value());
  REQUIRE(type_of(*reply) == msg_type::register_reject);
  CHECK(std::get<register_reject>(*reply).reason.find("worker key") != std::string::npos);

  // The admin key: a client, whose admin requests go through.
  sync_client a(router.endpoint(), 1 << 16, "a", &admin);
  REQUIRE(a.send(register_request{peer_role::client, "ctl", 1}));
  REQUIRE(in.wait_for(3));
  router.admit("a");
  REQUIRE(a.send(admin_request{2, "scale", "3"}));
  REQUIRE(in.wait_for(4));
  CHECK(type_of(in.at(3).second) == msg_type::admin_request);
  CHECK(in.role_at(3) == key_role::admin);
  // Nothing from the stranger or the keyless client ever reached the callback.
  for (size_t i = 0; i < in.size(); ++i) {
    CHECK(in.at(i).first != "intruder");
    CHECK(in.at(i).first != "plain");
  }
  CHECK(router.dropped(drop_reason::wrong_role) == 2);
  // Refusals are logged a few a period; ctl status counts every one.
  bool counted = false;
  for (const auto& [name, n] : router.drop_counts()) counted |= name == "refused_key" && n >= 1;
  CHECK(counted);
}

TEST_CASE("a flood of refused keys costs the log a few lines a period") {
  temp_dir tmp;
  const std::string dir = tmp.file("keys");
  write_job_keys(dir);
  bridge_options o;
  o.kind = bridge_options::socket_kind::router;
  o.endpoint = "tcp://127.0.0.1:0";
  o.curve_server = std::make_shared<const server_keys>(load_server_keys(dir));
  // Every line the authenticator writes lands here too.
  auto lines = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(1000);
  spdlog::default_logger()->sinks().push_back(lines);
  const auto t0 = std::chrono::steady_clock::now();
  {
    inbox in;
    zmq_bridge router(o, in.fn());
    client_keys stranger = load_client_keys(dir, key_role::worker);
    stranger.self = make_keypair();
    // Twenty connections, each refused (libzmq does not retry a refused handshake). The
    // handshake needs no frame; linger 0, as nothing they queue is ever sent.
    zmq::context_t ctx(1);
    std::vector<zmq::socket_t> intruders;
    for (int i = 0; i < 20; ++i) {
      intruders.emplace_back(ctx, zmq::socket_type::dealer);
      intruders.back().set(zmq::sockopt::linger, 0);
      intruders.back().set(zmq::sockopt::curve_serverkey, stranger.server_public);
      intruders.back().set(zmq::sockopt::curve_publickey, stranger.self.public_key);
      intruders.back().set(zmq::sockopt::curve_secretkey, stranger.self.secret_key);
      intruders.back().connect(router.endpoint());
    }
    REQUIRE(eventually(milliseconds(60000), [&] { return router.refused_keys() >= 20; }));
  }
  const auto periods =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - t0)
          .count() /
      10;
  auto& sinks = spdlog::default_logger()->sinks();
  sinks.erase(std::find(sinks.begin(), sinks.end(), lines));
  size_t refused_lines = 0;
  for (const std::string& l : lines->last_formatted())
    refused_lines += l.find("authenticator: refused") != std::string::npos;
  // 5 a period (log_limiter's default), whatever the number refused; never none.
  CHECK(refused_lines >= 1);
  CHECK(refused_lines <= static_cast<size_t>(5 * (periods + 1)));
}
