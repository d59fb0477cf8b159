// remote_kv: the comm::kv_client a worker's communicators rendezvous through, backed by
// the coordinator's generation-scoped store and reached over the worker's own control
// connection (worker_node::kv_call). Owns the request building, the timeouts and the
// mapping of kv_reply statuses to comm_error; not the store (runtime/net/kv_store.hpp)
// nor the transport (actors/worker.hpp).
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/comm/kv_client.hpp"
#include "runtime/net/protocol.hpp"

namespace cohort::step {

/// comm::kv_client over the coordinator's rendezvous store, reached through a worker's own
/// connection. Every request is tagged with `generation` (the store scopes keys by it, and
/// answers superseded once the roster has moved past it). Thread-safe when `call` is
/// (worker_node::kv_call is); holds no state of its own besides its settings.
///
/// Errors (comm::comm_error, kind in parentheses):
///   status timeout, or a get / wait that the coordinator answered not_found -> (timeout)
///   status superseded: "generation G was superseded: rebuild for the current generation"
///                                                                          -> (rendezvous)
///   status invalid (key or value over the store's limits, ...): its reason -> (invalid)
///   anything else the coordinator should not have answered                 -> (rendezvous)
class remote_kv : public comm::kv_client {
 public:
  /// `call` is worker_node::kv_call (or a test double): sends a kv_set / kv_get / kv_wait
  /// and returns the coordinator's kv_reply, or status timeout when none came in time.
  using call_fn = std::function<net::kv_reply(net::message, std::chrono::milliseconds)>;

  /// `slack` is added to each request's own timeout for the round trip (set has none of
  /// its own and gets `slack` alone): the coordinator's answer, timeout included, arrives
  /// before `call` gives up on it.
  remote_kv(call_fn call, std::uint64_t generation,
            std::chrono::milliseconds slack = std::chrono::milliseconds(2000));

  /// Stores `value` under `key` in this generation (overwrites). Values up to the store's
  /// max_value_bytes (1 MiB by default) and the control channel's max_message_bytes.
  void set(const std::string& key, const std::vector<char>& value) override;
  /// The value of `key`; the coordinator holds the request until some rank sets it or
  /// `timeout` passes (timeout 0: answered at once, comm_error(timeout) if unset).
  std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout) override;
  /// Returns once every key is set in this generation; comm_error(timeout) after `timeout`.
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;

  /// The generation every request is tagged with.
  std::uint64_t generation() const { return generation_; }
  /// The round-trip allowance added to each request's timeout.
  std::chrono::milliseconds slack() const { return slack_; }

 private:
  net::kv_reply call(net::message req, std::chrono::milliseconds own_timeout) const;

  call_fn call_;
  std::uint64_t generation_;
  std::chrono::milliseconds slack_;
};

}  // namespace cohort::step
