// CurveZMQ for cohort's sockets: a job's keys on disk (`cohort keygen DIR`), the roles a key
// may hold (worker, launcher, admin), which messages each role may send, and a ZAP handler
// that admits only authorized public keys (or one PLAIN credential, for the p2p channels'
// authenticate mode) and stamps each connection with its role (the message property
// "User-Id"). Owns no socket of the control plane: the bridge and the p2p channel set these
// keys on theirs.
#pragma once
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/core/log_limiter.hpp"

namespace zmq {
class context_t;
class message_t;
}  // namespace zmq

namespace cohort::net {

struct register_request;

/// What a key may do. A worker joins the roster and trains (and asks to drain itself on
/// SIGTERM); the launcher reports its children's exits and stops the job; an admin runs
/// `cohort ctl` (status, stop, drain, scale, inject).
enum class key_role : uint8_t { worker = 0, launcher = 1, admin = 2 };

/// "worker", "launcher", "admin".
const char* to_string(key_role r);
/// The role named TEXT, or nullopt.
std::optional<key_role> parse_key_role(const std::string& text);

/// A CURVE key pair as Z85 text (40 characters each).
struct keypair {
  std::string public_key;
  std::string secret_key;
};

/// A fresh key pair from libzmq (throws io_error if libzmq was built without CURVE).
keypair make_keypair();
/// True when TEXT is a 40-character Z85 key.
bool valid_z85_key(const std::string& text);

/// What a connecting side needs: the coordinator's public key and its own pair.
struct client_keys {
  std::string server_public;
  keypair self;
  key_role role = key_role::worker;
};

/// What the coordinator needs: its pair and every authorized public key (Z85) with its role.
struct server_keys {
  keypair self;
  std::map<std::string, key_role> authorized;
};

/// Writes a job's keys into DIR (created 0700 if absent; an existing key file is never
/// overwritten: usage_error naming it). Files, all 0600:
///   coordinator.key, worker.key, launcher.key, admin.key  ("public Z85" and "secret Z85")
///   coordinator.pub                                       ("public Z85")
///   authorized                                            ("ROLE Z85" per line, # comments)
void write_job_keys(const std::string& dir);
/// True when DIR holds a job's keys (its coordinator.pub exists).
bool has_job_keys(const std::string& dir);

/// Loads the keys of ROLE from DIR: DIR/ROLE.key and DIR/coordinator.pub. Throws usage_error
/// naming the file and the fix (a missing file, a malformed line, a secret file readable by
/// group or others), untrusted_folder_error (exit 2) when DIR or a file in it is not the
/// user's alone (require_private_folder: another owner, writable by group or others).
client_keys load_client_keys(const std::string& dir, key_role role);
/// Loads DIR/coordinator.key and DIR/authorized (same errors, with file:line; DIR checked the
/// same way, so that nobody else can have replaced `authorized`).
server_keys load_server_keys(const std::string& dir);

/// May a connection holding ROLE send a frame of wire type TYPE (msg_type's value) to the
/// coordinator? Decided from the envelope alone, before anything else of the frame is read.
bool role_may_send(key_role role, int type);
/// Why REQUEST may not register over a connection holding ROLE ("" when it may): a worker
/// key registers workers, a launcher key the client "launch", an admin key other clients.
std::string registration_problem(key_role role, const register_request& request);

/// True for endpoints only this host can reach: tcp://127.x.y.z, tcp://localhost,
/// tcp://[::1], ipc:// and inproc://. Anything else (tcp://0.0.0.0, tcp://*, a host's
/// address or name) may be reachable from the network.
bool loopback_endpoint(const std::string& endpoint);

/// The ZAP handler of one ZeroMQ context (RFC 27): answers every CURVE handshake on a CURVE
/// server socket of that context, admitting the authorized public keys with their role as
/// the connection's User-Id, and refusing every other key. A PLAIN handshake is admitted
/// only with the one credential admit_plain() named (none by default). Must be constructed
/// before any such socket binds: without a handler libzmq admits every key. One thread,
/// stopped and joined by the destructor.
class zap_handler {
 public:
  /// Binds inproc://zeromq.zap.01 in CTX (throws io_error if that context has one already).
  zap_handler(zmq::context_t& ctx, std::map<std::string, key_role> authorized);
  ~zap_handler();
  zap_handler(const zap_handler&) = delete;
  zap_handler& operator=(const zap_handler&) = delete;

  /// From now on, also admits a PLAIN handshake presenting exactly USER and PASSWORD
  /// (compared in constant time), with ROLE as its User-Id; replaces an earlier credential.
  /// Any thread.
  void admit_plain(std::string user, std::string password, key_role role);

  uint64_t admitted() const { return admitted_.load(); }
  uint64_t refused() const { return refused_.load(); }

 private:
  void run();

  // The role a request's credentials earn, or nullopt.
  std::optional<key_role> admits(const std::vector<zmq::message_t>& request) const;

  std::map<std::string, key_role> authorized_;  // by the key's 32 raw bytes
  struct plain_credential {
    std::string user, password;
    key_role role = key_role::worker;
  };
  mutable std::mutex plain_mutex_;
  std::optional<plain_credential> plain_;  // guarded by plain_mutex_
  std::string stop_name_;
  std::unique_ptr<class zap_sockets> sockets_;
  std::thread thread_;
  std::atomic<uint64_t> admitted_{0};
  std::atomic<uint64_t> refused_{0};
  log_limiter refusal_log_;  // the handler thread's: a flood of bad keys logs a few lines
};

/// The role stamped on a received message by a zap_handler (its "User-Id" property), or
/// nullopt on a connection without CURVE. MSG is a zmq_msg_t*.
std::optional<key_role> message_role(void* msg);

}  // namespace cohort::net
