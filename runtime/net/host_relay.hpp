// A host agent's relay (docs/agent.md): the one connection from a host to the coordinator.
// Local workers connect to the relay's ROUTER instead of the coordinator; their frames go on
// over the relay's DEALER in a proxy's envelope ([worker id, frame]) and the coordinator's
// answers come back the same way. Their heartbeats stop here: once a heartbeat period the
// relay sends one host_beat listing who beat, and it answers the workers' own acks while it
// hears the coordinator. A worker silent past the job's timeout is reported at once as hung,
// and the supervisor's exit notices (report_exit) go out as the agent's. One thread owns
// both sockets; other threads reach it through an inproc pipe.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <zmq.hpp>

#include "runtime/net/curve.hpp"
#include "runtime/net/protocol.hpp"

namespace cohort::net {

struct relay_options {
  /// The coordinator's endpoint (one; a run with standbys keeps its workers direct).
  std::string coordinator;
  /// The agent's client name, "agent-HOST" (is_agent_name).
  std::string name;
  /// Where local workers connect: loopback only (the relay checks nothing a worker sends
  /// beyond its envelope; the coordinator does).
  std::string bind = "tcp://127.0.0.1:0";
  /// The launcher key towards the coordinator; null: no keys (plain ZeroMQ both ways).
  std::shared_ptr<const client_keys> keys;
  /// With keys: the worker public key (Z85) the local socket admits; the local socket speaks
  /// CURVE with a key pair the relay makes at start (public_key()).
  std::string worker_public;
  size_t max_message_bytes = 64u << 20;
  /// The workers' heartbeat period until the coordinator's register_ok says it.
  int heartbeat_ms = 100;
  /// A worker silent this long is reported hung; until register_ok says it.
  int timeout_ms = 500;
  /// Answers workers' acks only while the coordinator was heard within this.
  int coordinator_timeout_ms = 10000;
};

/// What the relay did so far (any thread).
struct relay_counters {
  uint64_t up = 0;          ///< worker frames relayed to the coordinator
  uint64_t down = 0;        ///< coordinator frames relayed to workers
  uint64_t host_beats = 0;  ///< host_beat frames sent
  uint64_t acks = 0;        ///< worker heartbeats answered by the relay
  uint64_t hung = 0;        ///< workers reported hung
  uint64_t exits = 0;       ///< exit notices sent (report_exit)
  uint64_t dropped = 0;     ///< frames not relayed (malformed envelope, too large, queue full)
};

class host_relay {
 public:
  /// Binds the local socket, connects to the coordinator and starts registering. Throws
  /// usage_error / io_error when the local endpoint cannot be bound.
  explicit host_relay(relay_options opts);
  ~host_relay();
  host_relay(const host_relay&) = delete;
  host_relay& operator=(const host_relay&) = delete;

  /// The endpoint local workers join (`cohort worker --join EP --agent-key KEY`).
  const std::string& endpoint() const { return endpoint_; }
  /// The coordinator's endpoint the relay connects to.
  const std::string& coordinator() const { return opts_.coordinator; }
  /// With keys: the local socket's public key (Z85), the workers' server key; else empty.
  const std::string& public_key() const { return self_.public_key; }
  /// Waits up to WAIT for the coordinator's register_ok; false if it did not come (refused:
  /// refusal() says why).
  bool wait_registered(std::chrono::milliseconds wait);
  /// The coordinator's refusal of the agent, if any.
  std::string refusal() const;
  /// The supervisor reaped worker NAME (pid PID) with exit CODE: one exit_notice, now.
  void report_exit(const std::string& name, int64_t pid, int32_t code);
  /// Last time anything arrived from the coordinator.
  std::chrono::steady_clock::time_point heard() const;
  relay_counters counters() const;
  /// Stops the thread; idempotent.
  void stop();

 private:
  void run(std::promise<std::string>* ready);

  relay_options opts_;
  keypair self_;
  zmq::context_t ctx_;
  std::unique_ptr<zap_handler> zap_;
  std::string endpoint_;
  std::string pipe_name_;
  std::thread thread_;
  std::mutex push_mu_;
  std::unique_ptr<zmq::socket_t> push_;
  bool stopped_ = false;
  std::atomic<bool> registered_{false};
  std::atomic<int64_t> heard_ns_{0};
  mutable std::mutex state_mu_;
  std::string refusal_;
  relay_counters counters_;  // guarded by state_mu_
};

}  // namespace cohort::net
