// Key files are plain text so that a user can read, copy and audit them; secret files must
// be private (0600), as ssh insists for its keys. The ZAP handler runs on its own thread:
// libzmq's I/O thread waits for its answer during each handshake, so it must never sit
// behind a busy bridge or a stage's compute.
#include "runtime/net/curve.hpp"

#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "runtime/core/atomic_file.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/folder_trust.hpp"
#include "runtime/core/sha256.hpp"
#include "runtime/net/protocol.hpp"
#include "runtime/net/relay.hpp"

namespace cohort::net {
namespace fs = std::filesystem;

class zap_sockets {
 public:
  zap_sockets(zmq::context_t& ctx, const std::string& stop_name)
      : rep(ctx, zmq::socket_type::rep),
        stop_in(ctx, zmq::socket_type::pair),
        stop_out(ctx, zmq::socket_type::pair) {
    rep.set(zmq::sockopt::linger, 0);
    stop_in.set(zmq::sockopt::linger, 0);
    stop_out.set(zmq::sockopt::linger, 0);
    stop_in.bind(stop_name);
    stop_out.connect(stop_name);
  }
  zmq::socket_t rep;
  zmq::socket_t stop_in;   // the handler thread's
  zmq::socket_t stop_out;  // the destructor's
};

namespace {

constexpr const char* roles[] = {"worker", "launcher", "admin"};
constexpr const char* zap_endpoint = "inproc://zeromq.zap.01";
std::atomic<uint64_t> zap_counter{0};

std::string z85_to_raw(const std::string& z85) {
  std::array<uint8_t, 32> raw{};
  if (z85.size() != 40 || zmq_z85_decode(raw.data(), z85.c_str()) == nullptr) return {};
  return std::string(reinterpret_cast<const char*>(raw.data()), raw.size());
}

std::string file_of(const std::string& dir, const std::string& name) {
  return (fs::path(dir) / name).string();
}

// The lines of PATH, refused when it is missing or (for a secret) readable by others.
std::vector<std::string> read_key_file(const std::string& path, bool secret) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw usage_error("cannot read key file " + path + ": " + std::strerror(errno) +
                      " (create a job's keys with `cohort keygen DIR` and pass that DIR)");
  if (secret && (st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    throw usage_error("key file " + path + " has mode " + mode +
                      ": others can read its secret; make it private with `chmod 600 " + path +
                      "`");
  }
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// "WORD Z85" on line LINE of PATH (1-based), checked.
std::string key_line(const std::string& path, const std::vector<std::string>& lines, size_t line,
                     const std::string& word) {
  std::istringstream is(line <= lines.size() ? lines[line - 1] : std::string());
  std::string w, key;
  is >> w >> key;
  if (w != word || !valid_z85_key(key))
    throw usage_error(path + ":" + std::to_string(line) + ": expected '" + word +
                      " KEY' with a 40-character Z85 key (files written by `cohort keygen`)");
  return key;
}

keypair read_pair(const std::string& path) {
  const auto lines = read_key_file(path, true);
  keypair k{key_line(path, lines, 1, "public"), key_line(path, lines, 2, "secret")};
  char derived[41] = {};
  if (zmq_curve_public(derived, k.secret_key.c_str()) != 0 || k.public_key != derived)
    throw usage_error(path +
                      ": its public key is not the secret key's (write new keys with "
                      "`cohort keygen`)");
  return k;
}

std::string pair_text(const keypair& k) {
  return "public " + k.public_key + "\nsecret " + k.secret_key + "\n";
}

}  // namespace

const char* to_string(key_role r) {
  const auto i = static_cast<size_t>(r);
  return i < 3 ? roles[i] : "unknown";
}

std::optional<key_role> parse_key_role(const std::string& text) {
  for (size_t i = 0; i < 3; ++i)
    if (text == roles[i]) return static_cast<key_role>(i);
  return std::nullopt;
}

keypair make_keypair() {
  char pub[41] = {}, sec[41] = {};
  if (zmq_curve_keypair(pub, sec) != 0)
    throw io_error(std::string("cannot make a CURVE key pair: ") + zmq_strerror(zmq_errno()) +
                   " (libzmq without CURVE support)");
  return keypair{pub, sec};
}

bool valid_z85_key(const std::string& text) { return !z85_to_raw(text).empty(); }

bool has_job_keys(const std::string& dir) { return fs::exists(file_of(dir, "coordinator.pub")); }

void write_job_keys(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw usage_error("cannot create key folder " + dir + ": " + ec.message());
  ::chmod(dir.c_str(), 0700);
  // Keys written into a folder another user can change would be theirs to replace.
  require_private_folder(dir, "key folder", 1);
  const char* files[] = {"coordinator.key", "coordinator.pub", "worker.key",
                         "launcher.key",    "admin.key",       "authorized"};
  for (const char* f : files)
    if (fs::exists(file_of(dir, f)))
      throw usage_error("key file " + file_of(dir, f) +
                        " exists: keygen never overwrites keys (remove the folder's keys first, "
                        "or pick a new folder)");
  const keypair coord = make_keypair();
  std::string authorized =
      "# Public keys the coordinator admits, one per line: ROLE KEY (roles: worker, launcher,\n"
      "# admin). Add a line to admit another key, e.g. an operator's admin key.\n";
  for (const char* role : roles) {
    const keypair k = make_keypair();
    write_file_atomic(file_of(dir, std::string(role) + ".key"), pair_text(k), 0600);
    authorized += std::string(role) + " " + k.public_key + "\n";
  }
  write_file_atomic(file_of(dir, "coordinator.key"), pair_text(coord), 0600);
  write_file_atomic(file_of(dir, "coordinator.pub"), "public " + coord.public_key + "\n", 0600);
  write_file_atomic(file_of(dir, "authorized"), authorized, 0600);
}

client_keys load_client_keys(const std::string& dir, key_role role) {
  // A file's own mode says nothing when its folder is another's: they can replace the file
  // (a coordinator.pub of theirs would make this client talk to their coordinator).
  require_private_folder(dir, "key folder", 1);
  client_keys k;
  k.role = role;
  const std::string pub = file_of(dir, "coordinator.pub");
  k.server_public = key_line(pub, read_key_file(pub, false), 1, "public");
  k.self = read_pair(file_of(dir, std::string(to_string(role)) + ".key"));
  return k;
}

server_keys load_server_keys(const std::string& dir) {
  // Whoever can replace `authorized` decides who is admin: the folder must be the user's.
  require_private_folder(dir, "key folder", 1);
  server_keys k;
  k.self = read_pair(file_of(dir, "coordinator.key"));
  const std::string path = file_of(dir, "authorized");
  const auto lines = read_key_file(path, true);
  for (size_t i = 0; i < lines.size(); ++i) {
    std::istringstream is(lines[i]);
    std::string role_text, key, extra;
    if (!(is >> role_text) || role_text[0] == '#') continue;
    is >> key;
    const auto role = parse_key_role(role_text);
    if (!role || !valid_z85_key(key) || (is >> extra && extra[0] != '#'))
      throw usage_error(path + ":" + std::to_string(i + 1) +
                        ": expected 'ROLE KEY' (ROLE one of worker, launcher, admin; KEY a "
                        "40-character Z85 public key)");
    k.authorized[key] = *role;
  }
  if (k.authorized.empty())
    throw usage_error(path +
                      ": no key is authorized, so nobody could join (write keys with "
                      "`cohort keygen DIR`)");
  return k;
}

bool role_may_send(key_role role, int type) {
  switch (static_cast<msg_type>(type)) {
    case msg_type::register_request:
    case msg_type::ping:
    case msg_type::pong:
      return true;
    case msg_type::heartbeat:
    case msg_type::leave:
    case msg_type::kv_set:
    case msg_type::kv_get:
    case msg_type::kv_wait:
    case msg_type::worker_ready:
    case msg_type::step_vote:
    case msg_type::train_report:
    case msg_type::telemetry:
      return role == key_role::worker;
    case msg_type::exit_notice:
    case msg_type::host_beat:
      return role == key_role::launcher;
    case msg_type::status_request:
    case msg_type::stop:
      return role == key_role::launcher || role == key_role::admin;
    case msg_type::admin_request:
      // A worker asks to drain itself on SIGTERM (the coordinator refuses it anything else).
      return role == key_role::admin || role == key_role::worker;
    default:  // what only the coordinator sends
      return false;
  }
}

std::string registration_problem(key_role role, const register_request& r) {
  const bool worker = r.role == peer_role::worker;
  switch (role) {
    case key_role::worker:
      return worker ? "" : "a worker key registers workers only, not the client '" + r.name + "'";
    case key_role::launcher:
      return !worker && (r.name == "launch" || is_agent_name(r.name))
                 ? ""
                 : "a launcher key registers the client 'launch' or a host agent 'agent-HOST' only";
    case key_role::admin:
      return !worker && r.name != "launch" && !is_agent_name(r.name)
                 ? ""
                 : "an admin key registers clients other than 'launch' and 'agent-HOST' only";
  }
  return "unknown key role";
}

bool loopback_endpoint(const std::string& ep) {
  if (ep.rfind("ipc://", 0) == 0 || ep.rfind("inproc://", 0) == 0) return true;
  if (ep.rfind("tcp://", 0) != 0) return false;
  const std::string rest = ep.substr(6);
  if (rest.rfind("127.", 0) == 0 || rest.rfind("localhost:", 0) == 0 ||
      rest.rfind("[::1]:", 0) == 0)
    return true;
  return false;
}

zap_handler::zap_handler(zmq::context_t& ctx, std::map<std::string, key_role> authorized) {
  for (const auto& [z85, role] : authorized) {
    const std::string raw = z85_to_raw(z85);
    if (raw.empty()) throw usage_error("not a Z85 public key: '" + z85 + "'");
    authorized_[raw] = role;
  }
  stop_name_ = "inproc://cohort-zap-stop-" + std::to_string(zap_counter.fetch_add(1));
  sockets_ = std::make_unique<zap_sockets>(ctx, stop_name_);
  try {
    sockets_->rep.bind(zap_endpoint);
  } catch (const zmq::error_t& e) {
    throw io_error(std::string("cannot start the CURVE authenticator (ZAP): ") + e.what());
  }
  thread_ = std::thread([this] { run(); });
}

zap_handler::~zap_handler() {
  try {
    sockets_->stop_out.send(zmq::str_buffer("stop"), zmq::send_flags::none);
  } catch (const zmq::error_t&) {
  }
  if (thread_.joinable()) thread_.join();
}

void zap_handler::admit_plain(std::string user, std::string password, key_role role) {
  std::lock_guard<std::mutex> lock(plain_mutex_);
  plain_ = plain_credential{std::move(user), std::move(password), role};
}

std::optional<key_role> zap_handler::admits(const std::vector<zmq::message_t>& req) const {
  // RFC 27: version, request id, domain, address, identity, mechanism, credentials...
  if (req.size() < 7 || req[0].to_string() != "1.0") return std::nullopt;
  const std::string mechanism = req[5].to_string();
  if (mechanism == "CURVE") {
    const auto it = authorized_.find(req[6].to_string());
    if (it != authorized_.end()) return it->second;
  } else if (mechanism == "PLAIN" && req.size() >= 8) {
    std::lock_guard<std::mutex> lock(plain_mutex_);
    if (plain_ && req[6].to_string_view() == plain_->user &&
        equal_secret(req[7].to_string_view(), plain_->password))
      return plain_->role;
  }
  return std::nullopt;
}

void zap_handler::run() {
  auto& rep = sockets_->rep;
  while (true) {
    zmq::pollitem_t items[] = {{rep.handle(), 0, ZMQ_POLLIN, 0},
                               {sockets_->stop_in.handle(), 0, ZMQ_POLLIN, 0}};
    try {
      zmq::poll(items, 2, std::chrono::milliseconds(-1));
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      // ETERM: the context was shut down (a p2p channel aborted): nothing left to answer.
      if (e.num() != ETERM) spdlog::error("CURVE authenticator: poll failed: {}", e.what());
      return;
    }
    if (items[1].revents & ZMQ_POLLIN) return;
    if (!(items[0].revents & ZMQ_POLLIN)) continue;
    std::vector<zmq::message_t> req;
    try {
      if (!zmq::recv_multipart(rep, std::back_inserter(req), zmq::recv_flags::dontwait)) continue;
    } catch (const zmq::error_t&) {
      return;  // ETERM
    }
    const std::optional<key_role> role = admits(req);
    const std::string status = role ? "200" : "400", text = role ? "OK" : "refused",
                      user = role ? to_string(*role) : "";
    (role ? admitted_ : refused_).fetch_add(1);
    if (!role) {
      // Anyone who reaches the port can be refused at will: a few lines a period, counted.
      if (const auto l = refusal_log_.admit())
        spdlog::warn(
            "authenticator: refused a {} connection from {} (credentials not authorized){}",
            req.size() > 5 ? req[5].to_string() : std::string("?"),
            req.size() > 3 ? req[3].to_string() : std::string("?"),
            log_limiter::suffix(*l, "refused"));
    }
    std::array<zmq::message_t, 6> reply{
        zmq::message_t(std::string("1.0")),
        zmq::message_t(req.size() > 1 ? req[1].to_string() : std::string()),
        zmq::message_t(status),
        zmq::message_t(text),
        zmq::message_t(user),
        zmq::message_t()};
    try {
      zmq::send_multipart(rep, reply);
    } catch (const zmq::error_t& e) {
      spdlog::error("CURVE authenticator: reply failed: {}", e.what());
    }
  }
}

std::optional<key_role> message_role(void* msg) {
  const char* user = zmq_msg_gets(static_cast<zmq_msg_t*>(msg), "User-Id");
  if (user == nullptr) return std::nullopt;
  return parse_key_role(user);
}

}  // namespace cohort::net
