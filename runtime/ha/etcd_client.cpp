// etcd v3 over its HTTP/JSON gateway (grpc-gateway in etcd 3.4). What the gateway does that
// a reader of the gRPC API would not expect, found by trying it against etcd 3.4.23:
//   - int64 fields (revisions, lease ids, TTLs) come back as JSON strings; fields at their
//     zero value are left out ("succeeded": false, an empty value, "deleted": 0, TTL 0);
//   - /v3/lease/keepalive is a stream: its one answer is wrapped in {"result": {...}}, and a
//     lease that is gone answers 200 with no TTL rather than an error;
//   - a missing lease on revoke or put is HTTP 404 with {"code": 5, "message": ...}.
#include "runtime/ha/etcd_client.hpp"

#include <httplib.h>
#include <openssl/evp.h>
#include <signal.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "runtime/core/error.hpp"
#include "runtime/core/log_limiter.hpp"

namespace cohort::ha {

using nlohmann::json;

namespace {

constexpr int grpc_not_found = 5;

std::string lease_name(int64_t lease) { return "lease " + std::to_string(lease); }

// An int64 the gateway sends as a string (or, from other gateways, a number); 0 if absent.
int64_t i64(const json& j, const char* field) {
  const auto it = j.find(field);
  if (it == j.end() || it->is_null()) return 0;
  if (it->is_string()) return std::stoll(it->get<std::string>());
  return it->get<int64_t>();
}

kv kv_from(const json& j) {
  kv out;
  out.key = base64_decode(j.value("key", ""));
  out.value = base64_decode(j.value("value", ""));
  out.create_revision = i64(j, "create_revision");
  out.mod_revision = i64(j, "mod_revision");
  out.lease = i64(j, "lease");
  return out;
}

int64_t header_revision(const json& j) {
  const auto it = j.find("header");
  return it == j.end() ? 0 : i64(*it, "revision");
}

// The smallest key after every key that starts with PREFIX ("\0" = no end: the whole space).
std::string prefix_end(std::string prefix) {
  while (!prefix.empty()) {
    auto& last = reinterpret_cast<unsigned char&>(prefix.back());
    if (last < 0xff) {
      ++last;
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');
}

// "http[s]://HOST:PORT" -> (whether https, HOST, PORT), or usage_error.
struct parsed_endpoint {
  bool https = false;
  std::string host;
  int port = 0;
};

parsed_endpoint parse_endpoint(std::string url) {
  const std::string how =
      "; write endpoints as http://HOST:PORT or https://HOST:PORT, e.g. https://127.0.0.1:2379";
  parsed_endpoint out;
  std::string rest;
  if (url.rfind("https://", 0) == 0) {
    out.https = true;
    rest = url.substr(8);
  } else if (url.rfind("http://", 0) == 0) {
    rest = url.substr(7);
  } else {
    throw usage_error("etcd endpoint '" + url + "' does not start with http:// or https://" + how);
  }
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  const auto colon = rest.rfind(':');
  const std::string port = colon == std::string::npos ? "" : rest.substr(colon + 1);
  if (colon == std::string::npos || colon == 0 || port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string::npos || std::stoi(port) > 65535 ||
      rest.find('/') != std::string::npos)
    throw usage_error("etcd endpoint '" + url + "' is not HOST:PORT" + how);
  out.host = rest.substr(0, colon);
  out.port = std::stoi(port);
  return out;
}

// httplib's error, in words, with the timeout that ended it.
std::string why(httplib::Error e, const etcd_timeouts& t) {
  switch (e) {
    case httplib::Error::Connection:
      return "connection refused or failed";
    case httplib::Error::ConnectionTimeout:
      return "no connection within " + std::to_string(t.connect_ms) + " ms";
    case httplib::Error::Read:
      return "no answer within " + std::to_string(t.read_ms) + " ms";
    case httplib::Error::Write:
      return "could not send the request";
    case httplib::Error::SSLConnection:
      return "TLS handshake failed (is the endpoint https, and does it accept our client "
             "certificate?)";
    case httplib::Error::SSLServerVerification:
      return "etcd's certificate is not signed by our etcd-ca.crt for this address";
    case httplib::Error::SSLLoadingCerts:
      return "cannot load the CA certificate";
    default:
      return "HTTP client error " + httplib::to_string(e);
  }
}

// One request's outcome: etcd's status and JSON answer, or why there was none.
struct reply {
  bool answered = false;
  int status = 0;
  json body;
  httplib::Error failure = httplib::Error::Success;
};

// POSTs TEXT to PATH. The gateway ends an error answer (HTTP 4xx/5xx) with an HTTP trailer
// (Grpc-Trailer-Content-Type), which cpp-httplib 0.11 cannot parse: it reports a read error
// after it has read the whole body. So the status and body are captured as they arrive, and
// a body that parses as a complete JSON object counts as the answer whatever httplib says.
reply post(httplib::Client& client, const std::string& path, const std::string& text) {
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = text;
  req.set_header("Content-Type", "application/json");
  reply out;
  std::string body;
  req.response_handler = [&out](const httplib::Response& r) {
    out.status = r.status;
    return true;
  };
  req.content_receiver = [&body](const char* data, std::size_t n, uint64_t, uint64_t) {
    body.append(data, n);
    return true;
  };
  const auto res = client.send(req);
  out.failure = res ? httplib::Error::Success : res.error();
  if (out.status == 0) return out;
  out.body = json::parse(body, nullptr, false);
  if (!out.body.is_discarded() && out.body.is_object()) {
    out.answered = true;
  } else if (res) {
    throw protocol_error("etcd answered " + path + " with HTTP " + std::to_string(out.status) +
                         " and a body that is not JSON (" + body.substr(0, 200) +
                         "); is this an etcd v3.4+ client URL?");
  }
  return out;
}

// OpenSSL writes to its socket with write(2), which raises SIGPIPE when etcd has closed the
// connection (a refused client certificate, a restart): the default action would kill the
// coordinator instead of letting it see the error and fail over. Ignored once, and only if
// nobody installed a handler (as the Gloo communicator does for its sockets).
void ignore_sigpipe_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current {};
    if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      struct sigaction ignore {};
      ignore.sa_handler = SIG_IGN;
      sigemptyset(&ignore.sa_mask);
      sigaction(SIGPIPE, &ignore, nullptr);
    }
  });
}

}  // namespace

// OpenSSL's block coder (RFC 4648 with padding, no line breaks), which cohort already links.
std::string base64_encode(const std::string& bytes) {
  std::string out((bytes.size() + 2) / 3 * 4 + 1, '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(&out[0]),
                                reinterpret_cast<const unsigned char*>(bytes.data()),
                                static_cast<int>(bytes.size()));
  out.resize(static_cast<std::size_t>(n));
  return out;
}

std::string base64_decode(const std::string& text) {
  auto invalid = [&] {
    return protocol_error("etcd sent invalid base64 (" + log_quoted(text) +
                          "): is the endpoint an etcd v3 gateway?");
  };
  // EVP_DecodeBlock takes whole quads only and counts the padding as zero bytes.
  if (text.size() % 4 != 0 ||
      text.find_first_of(std::string(1, '\0') + " \t\r\n") != std::string::npos)
    throw invalid();
  std::string out(text.size() / 4 * 3, '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(&out[0]),
                                reinterpret_cast<const unsigned char*>(text.data()),
                                static_cast<int>(text.size()));
  if (n < 0) throw invalid();
  std::size_t pad = 0;
  while (pad < 2 && pad < text.size() && text[text.size() - 1 - pad] == '=') ++pad;
  out.resize(static_cast<std::size_t>(n) - pad);
  return out;
}

struct etcd_client::endpoint {
  std::string url;
  std::unique_ptr<httplib::Client> client;
};

etcd_client::etcd_client(std::vector<std::string> endpoints, etcd_timeouts timeouts, etcd_tls tls)
    : endpoints_(std::move(endpoints)), timeouts_(timeouts) {
  if (endpoints_.empty())
    throw usage_error("etcd_client: no endpoints; give at least one http(s)://HOST:PORT");
  for (const auto& url : endpoints_) {
    const parsed_endpoint p = parse_endpoint(url);
    auto ep = std::make_unique<endpoint>();
    ep->url = url;
    if (p.https) {
      ignore_sigpipe_once();
      if (tls.empty())
        throw usage_error("etcd endpoint '" + url +
                          "' is https, and no client certificate was "
                          "given: put etcd-ca.crt, etcd-client.crt and etcd-client.key in the "
                          "job's key folder (--keys DIR)");
      // The client certificate is how etcd (--client-cert-auth) tells the run from anyone
      // else who reaches its port; the CA is how we tell etcd from anyone else.
      ep->client = std::make_unique<httplib::Client>(
          "https://" + p.host + ":" + std::to_string(p.port), tls.cert_file, tls.key_file);
      ep->client->set_ca_cert_path(tls.ca_file);
      ep->client->enable_server_certificate_verification(true);
    } else {
      ep->client = std::make_unique<httplib::Client>(p.host, p.port);
    }
    if (!ep->client->is_valid())
      throw usage_error("etcd endpoint '" + url + "': cannot set up its client (a TLS file of " +
                        tls.cert_file + ", " + tls.key_file + " unreadable or malformed?)");
    ep->client->set_connection_timeout(std::chrono::milliseconds(timeouts_.connect_ms));
    ep->client->set_read_timeout(std::chrono::milliseconds(timeouts_.read_ms));
    ep->client->set_write_timeout(std::chrono::milliseconds(timeouts_.read_ms));
    ep->client->set_keep_alive(true);
    conns_.push_back(std::move(ep));
  }
}

etcd_client::~etcd_client() = default;

json etcd_client::call(const char* what, const std::string& subject, const std::string& path,
                       const json& body, bool idempotent, bool not_found_ok) {
  const std::lock_guard<std::mutex> lock(mutex_);
  const std::string text = body.dump();
  const std::string op = std::string("etcd ") + what + " " + subject;
  std::string tried;
  for (std::size_t i = 0; i < conns_.size(); ++i) {
    const std::size_t at = (preferred_ + i) % conns_.size();
    endpoint& ep = *conns_[at];
    const reply res = post(*ep.client, path, text);
    if (!res.answered) {
      const httplib::Error e = res.failure;
      // Connect failures mean etcd never saw the request: another endpoint may take it.
      const bool unsent =
          e == httplib::Error::Connection || e == httplib::Error::ConnectionTimeout ||
          e == httplib::Error::SSLConnection || e == httplib::Error::SSLServerVerification;
      tried += (tried.empty() ? "" : ", ") + ep.url + " (" + why(e, timeouts_) + ")";
      if (unsent || idempotent) continue;
      throw error(op + " at " + ep.url + ": sent, but " + why(e, timeouts_) +
                  "; it may have been applied: read the key back before repeating it, and "
                  "check etcd's load and log");
    }
    preferred_ = at;
    const json& j = res.body;
    // Unary errors come as {"code","message"} with an HTTP error status; a stream's as
    // {"error": {...}} inside a 200.
    const json& err = j.contains("error") && j["error"].is_object() ? j["error"] : j;
    const int64_t code = err.contains("code") ? i64(err, "code") : i64(err, "grpc_code");
    if (res.status == 200 && !(j.contains("error") && j["error"].is_object())) return j;
    if (code == grpc_not_found && not_found_ok) return json();
    const std::string message = err.value("message", j.dump().substr(0, 200));
    throw error(op + " at " + ep.url + ": etcd refused it: " + message + " (HTTP " +
                std::to_string(res.status) + ", code " + std::to_string(code) + ")" +
                (code == grpc_not_found ? "; the lease may have expired: grant a new one"
                                        : "; see etcd's log"));
  }
  throw error(op + ": etcd unreachable or not answering at " + tried +
              "; check the ha.etcd endpoints and that etcd runs there (curl ENDPOINT/health)");
}

int64_t etcd_client::grant(int ttl_s) {
  if (ttl_s < 1)
    throw usage_error("etcd lease TTL must be at least 1 s, got " + std::to_string(ttl_s));
  const json j = call("grant", "TTL " + std::to_string(ttl_s) + " s", "/v3/lease/grant",
                      {{"TTL", std::to_string(ttl_s)}}, false);
  const int64_t id = i64(j, "ID");
  if (id == 0) throw protocol_error("etcd grant answered without a lease ID: " + j.dump());
  return id;
}

int64_t etcd_client::keepalive(int64_t lease) {
  const json j = call("keepalive", lease_name(lease), "/v3/lease/keepalive",
                      {{"ID", std::to_string(lease)}}, true, true);
  if (j.is_null()) return 0;
  const json& r = j.contains("result") ? j["result"] : j;
  return std::max<int64_t>(0, i64(r, "TTL"));
}

void etcd_client::revoke(int64_t lease) {
  call("revoke", lease_name(lease), "/v3/lease/revoke", {{"ID", std::to_string(lease)}}, true,
       true);
}

int64_t etcd_client::put(const std::string& key, const std::string& value, int64_t lease) {
  json body = {{"key", base64_encode(key)}, {"value", base64_encode(value)}};
  if (lease != 0) body["lease"] = std::to_string(lease);
  return header_revision(call("put", "key " + log_quoted(key), "/v3/kv/put", body, false));
}

std::optional<kv> etcd_client::get(const std::string& key) {
  const json j =
      call("get", "key " + log_quoted(key), "/v3/kv/range", {{"key", base64_encode(key)}}, true);
  const auto it = j.find("kvs");
  if (it == j.end() || it->empty()) return std::nullopt;
  return kv_from(it->at(0));
}

std::vector<kv> etcd_client::get_prefix(const std::string& prefix) {
  const json j = call("get_prefix", "prefix " + log_quoted(prefix), "/v3/kv/range",
                      {{"key", base64_encode(prefix.empty() ? std::string(1, '\0') : prefix)},
                       {"range_end", base64_encode(prefix_end(prefix))}},
                      true);
  std::vector<kv> out;
  const auto it = j.find("kvs");
  if (it != j.end())
    for (const auto& e : *it) out.push_back(kv_from(e));
  return out;
}

void etcd_client::del(const std::string& key) {
  call("del", "key " + log_quoted(key), "/v3/kv/deleterange", {{"key", base64_encode(key)}}, true);
}

txn_result etcd_client::create_if_absent(const std::string& key, const std::string& value,
                                         int64_t lease) {
  const std::string k = base64_encode(key);
  json put = {{"key", k}, {"value", base64_encode(value)}};
  if (lease != 0) put["lease"] = std::to_string(lease);
  const json range = {{"request_range", {{"key", k}}}};
  const json body = {
      {"compare",
       json::array(
           {{{"key", k}, {"target", "CREATE"}, {"result", "EQUAL"}, {"create_revision", "0"}}})},
      {"success", json::array({{{"request_put", put}}, range})},
      {"failure", json::array({range})}};
  // Not idempotent: repeated after a lost answer it would report our own key as another's.
  const json j = call("create_if_absent", "key " + log_quoted(key), "/v3/kv/txn", body, false);
  txn_result out;
  out.created = j.value("succeeded", false);
  out.revision = header_revision(j);
  const auto rs = j.find("responses");
  if (rs != j.end() && !rs->empty()) {
    const json& last = rs->back().value("response_range", json::object());
    const auto kvs = last.find("kvs");
    if (kvs != last.end() && !kvs->empty()) out.current = kv_from(kvs->at(0));
  }
  return out;
}

bool etcd_client::put_if_created_at(const std::string& key, const std::string& value,
                                    const std::string& guard_key, int64_t guard_create_revision) {
  // create_revision 0 is what etcd compares an absent key as: a guard of 0 would let the
  // write through exactly when nobody leads.
  if (guard_create_revision <= 0)
    throw usage_error("fenced put of key " + log_quoted(key) + ": guard revision must be > 0, got " +
                      std::to_string(guard_create_revision) + " (campaign first)");
  const json body = {
      {"compare", json::array({{{"key", base64_encode(guard_key)},
                                {"target", "CREATE"},
                                {"result", "EQUAL"},
                                {"create_revision", std::to_string(guard_create_revision)}}})},
      {"success",
       json::array(
           {{{"request_put", {{"key", base64_encode(key)}, {"value", base64_encode(value)}}}}})}};
  const json j =
      call("put_if_created_at", "key " + log_quoted(key) + " guarded by " + log_quoted(guard_key),
           "/v3/kv/txn", body, false);
  return j.value("succeeded", false);
}

bool etcd_client::del_if_created_at(const std::string& key, int64_t create_revision) {
  if (create_revision <= 0) return false;  // 0 would match an absent key
  const std::string k = base64_encode(key);
  const json body = {
      {"compare", json::array({{{"key", k},
                                {"target", "CREATE"},
                                {"result", "EQUAL"},
                                {"create_revision", std::to_string(create_revision)}}})},
      {"success", json::array({{{"request_delete_range", {{"key", k}}}}})}};
  const json j = call("del_if_created_at", "key " + log_quoted(key), "/v3/kv/txn", body, false);
  return j.value("succeeded", false);
}

bool etcd_client::healthy() {
  const std::lock_guard<std::mutex> lock(mutex_);
  for (std::size_t i = 0; i < conns_.size(); ++i) {
    const std::size_t at = (preferred_ + i) % conns_.size();
    const auto res = conns_[at]->client->Get("/health");
    if (!res || res->status != 200) continue;
    const json j = json::parse(res->body, nullptr, false);
    if (j.is_object() && j.value("health", "") == "true") {
      preferred_ = at;
      return true;
    }
  }
  return false;
}

}  // namespace cohort::ha
