// A small synchronous client for etcd v3 through its HTTP/JSON gateway (/v3/kv/*,
// /v3/lease/*, /health): the few calls leader election and fenced writes need. It owns one
// HTTP connection per endpoint and fails over between endpoints; it does not watch, does not
// keep leases alive by itself (election.hpp does), and knows nothing of cohort's jobs.
// cpp-httplib stays out of this header.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "runtime/ha/etcd_certs.hpp"

namespace cohort::ha {

/// One key as etcd stores it. Revisions are etcd's store revisions (they only grow);
/// lease 0: the key is not attached to a lease.
struct kv {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t lease = 0;
};

/// What create_if_absent did.
struct txn_result {
  bool created = false;       ///< the key was absent and is now ours
  int64_t revision = 0;       ///< the store's revision after the transaction
  std::optional<kv> current;  ///< the key as it is now (ours when created)
};

/// Timeouts of every call, per endpoint tried.
struct etcd_timeouts {
  int connect_ms = 500;  ///< TCP connect; a refused connection fails at once
  int read_ms = 2000;    ///< waiting for etcd's answer once the request is sent
};

/// Blocking calls, one at a time (a mutex serializes them): safe to share between threads.
/// Every failure is a cohort::error naming the call, the key or lease, the endpoint(s) and
/// what to check. A call goes to the endpoint that answered last; when it cannot be reached,
/// to the next one. A request that reached etcd but got no answer in time is retried
/// elsewhere only when repeating it is harmless (reads, keepalive, revoke); a put or a
/// transaction then fails instead, since it may have been applied.
class etcd_client {
 public:
  /// ENDPOINTS: "http://HOST:PORT" or "https://HOST:PORT" each; an https one presents TLS's
  /// client certificate and checks etcd's against TLS's CA. usage_error when the list is
  /// empty, an entry is malformed, or an https entry has no TLS files.
  explicit etcd_client(std::vector<std::string> endpoints, etcd_timeouts timeouts = {},
                       etcd_tls tls = {});
  ~etcd_client();
  etcd_client(const etcd_client&) = delete;
  etcd_client& operator=(const etcd_client&) = delete;

  /// Grants a lease of TTL_S seconds; its id. etcd raises a TTL below its minimum
  /// (1.5 election timeouts, rounded up: 2 s with etcd's default tuning) to that minimum.
  int64_t grant(int ttl_s);
  /// Renews LEASE once; the seconds it has left, 0 when the lease is gone (expired, revoked).
  int64_t keepalive(int64_t lease);
  /// Revokes LEASE and deletes its keys. A lease that is already gone is not an error.
  void revoke(int64_t lease);

  /// Puts KEY = VALUE, attached to LEASE when nonzero; the revision of the write.
  int64_t put(const std::string& key, const std::string& value, int64_t lease = 0);
  /// KEY as stored, or nullopt when absent.
  std::optional<kv> get(const std::string& key);
  /// Every key starting with PREFIX, in key order.
  std::vector<kv> get_prefix(const std::string& prefix);
  /// Deletes KEY (absent: nothing happens).
  void del(const std::string& key);

  /// Atomically: if KEY is absent, puts KEY = VALUE on LEASE. Either way, KEY as it is after.
  txn_result create_if_absent(const std::string& key, const std::string& value, int64_t lease);
  /// Atomically: puts KEY = VALUE only if GUARD_KEY exists with create revision
  /// GUARD_CREATE_REVISION (a fenced write: "only while I still lead term T"); whether applied.
  bool put_if_created_at(const std::string& key, const std::string& value,
                         const std::string& guard_key, int64_t guard_create_revision);

  /// Atomically: deletes KEY only if it exists with create revision CREATE_REVISION (a
  /// record read earlier, not one written since); whether deleted.
  bool del_if_created_at(const std::string& key, int64_t create_revision);

  /// Whether an endpoint answers GET /health with {"health":"true"}. Never throws.
  bool healthy();

  /// The endpoints as given.
  const std::vector<std::string>& endpoints() const { return endpoints_; }

 private:
  struct endpoint;
  // POSTs BODY to PATH, failing over between endpoints; etcd's answer (null for a "not
  // found" when NOT_FOUND_OK). WHAT and SUBJECT name the call and its key or lease in errors.
  nlohmann::json call(const char* what, const std::string& subject, const std::string& path,
                      const nlohmann::json& body, bool idempotent, bool not_found_ok = false);

  std::vector<std::string> endpoints_;
  etcd_timeouts timeouts_;
  std::vector<std::unique_ptr<endpoint>> conns_;
  std::size_t preferred_ = 0;  // index of the endpoint that answered last
  std::mutex mutex_;
};

/// Standard base64 (RFC 4648, padded), as the gateway carries keys and values.
std::string base64_encode(const std::string& bytes);
/// Inverse of base64_encode; cohort::error on a character outside the alphabet.
std::string base64_decode(const std::string& text);

}  // namespace cohort::ha
