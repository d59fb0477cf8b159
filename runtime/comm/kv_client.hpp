// How communicators rendezvous: kv_client, the small key-value interface the coordinator's
// store (over ZeroMQ, in actors/) and the local stores (runtime/comm/local_kv.hpp) provide,
// and kv_gloo_store, Gloo's rendezvous::Store over a kv_client with every key prefixed by
// the roster generation (the way PyTorch puts its TCPStore under Gloo). No transport here.
#pragma once
#include <gloo/rendezvous/store.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace cohort::comm {

/// A rendezvous key-value store shared by the ranks of a group. Values are opaque bytes;
/// keys are set once per generation (a second set of the same key overwrites it).
/// Implementations are thread-safe and throw comm_error (timeout or rendezvous).
class kv_client {
 public:
  virtual ~kv_client() = default;
  /// Publishes `value` under `key`.
  virtual void set(const std::string& key, const std::vector<char>& value) = 0;
  /// The value of `key`, waiting up to `timeout` for some rank to set it.
  virtual std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  /// Returns once every key is set; comm_error(timeout) after `timeout`.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
};

/// "gen/<generation>/<key>": the key a generation-scoped user of a kv_client stores.
std::string generation_key(std::uint64_t generation, const std::string& key);

/// Gloo's rendezvous::Store over a kv_client, keys scoped to one generation, so an address
/// left by an older generation can never be picked up by a newer group. Gloo's get() has
/// no timeout argument and must block until the key exists: it waits `get_timeout`.
/// The errors Gloo sees are the kv_client's comm_error, which Gloo lets through.
class kv_gloo_store : public gloo::rendezvous::Store {
 public:
  kv_gloo_store(kv_client& kv, std::uint64_t generation, std::chrono::milliseconds get_timeout);

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  /// Gloo's no-timeout wait: waits `get_timeout`.
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

  std::uint64_t generation() const { return generation_; }

 private:
  kv_client& kv_;
  std::uint64_t generation_;
  std::chrono::milliseconds get_timeout_;
};

}  // namespace cohort::comm
