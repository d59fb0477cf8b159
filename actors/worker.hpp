// The worker actor (registration, generation tracking, rejoin after being declared dead,
// stop, ping) and worker_node, which wires it to a DEALER zmq_bridge plus the heartbeat
// thread. Training runs in the allreduce_group actor (dp_group.hpp), which this actor
// spawns when the coordinator sends a job and forwards step messages to.
//
// Worker states:
//
//   start --send register--> REGISTERING --register_ok--> ACTIVE --stop / SIGTERM--> DONE (0)
//                               |   ^                         |
//               register_reject |   |  heartbeat_ack with     | no ack for
//               or no answer    |   +--rejoin_required -------+ coordinator_timeout_ms
//                               v      (drop old generation,  v
//                            DONE (1)   register again: new   DONE (1)
//                                       member id)
#pragma once
#include <atomic>
#include <caf/all.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "actors/dp_group.hpp"
#include "actors/messages.hpp"
#include "runtime/net/protocol.hpp"
#include "runtime/net/zmq_bridge.hpp"
#include "runtime/step/control_faults.hpp"

namespace cohort::actors {

/// What the worker actor needs from outside (a bridge in worker_node, vectors in tests).
struct worker_io {
  std::function<void(const net::message& m)> send;  ///< to the coordinator
  std::function<void(int exit_code)> on_exit;       ///< called once, just before quitting
  /// Rendezvous-store call for the training group (worker_node::kv_call); empty: the worker
  /// cannot train (control-plane tests).
  std::function<net::kv_reply(net::message, std::chrono::milliseconds)> kv_call;
  /// This host's address on the route to the coordinator: where the data plane listens
  /// when comm.interface is auto (worker_node: net::local_address_toward its endpoint).
  std::string data_host = "127.0.0.1";
  /// ha: speak to another coordinator candidate from now on (worker_node: the bridge's
  /// reconnect); empty without ha.
  std::function<void(const std::string& endpoint)> reconnect;
  /// ha: the highest leadership term heard (the bridge's term floor); 0 without ha.
  std::function<uint64_t()> term;
};

/// State the actor shares with the heartbeat thread and the bridge thread. Heartbeats must
/// not depend on the actor being idle, so they read these atomics instead of asking it.
struct worker_shared {
  std::atomic<uint64_t> member_id{0};  ///< 0 while not registered: no heartbeats
  std::atomic<uint64_t> generation{0};
  std::atomic<uint32_t> heartbeat_ms{0};  ///< from register_ok
  std::atomic<uint64_t> unacked{0};       ///< heartbeats sent since the coordinator last spoke
  /// ha: silence after which the leader counts as lost (its register_ok's timeout_ms);
  /// 0: the worker's coordinator_timeout_ms.
  std::atomic<uint32_t> lost_after_ms{0};
  /// The control link as injected faults leave it (muted: no heartbeats; cut: frames held,
  /// not lost; they arrive late and stale generations are ignored on both sides).
  step::held_link link;
  /// The coordinator's clock against ours (tracing: probes with the heartbeats).
  clock_sync clock;
};

/// A worker asks the coordinator to answer one heartbeat in this many at most (fewer when
/// coordinator_timeout_ms is short against the period: at least four answers per timeout).
inline constexpr uint64_t max_beats_per_ack = 8;

/// Who the worker is and how long it waits for a silent coordinator.
struct worker_options {
  std::string name;  ///< empty: the coordinator picks one (kept across rejoins)
  int64_t pid = 0;   ///< reported so a launcher's exit notice can name this worker
  int coordinator_timeout_ms = 10000;  ///< no register answer / no ack this long: exit 1
  /// CURVE keys (role worker) for the control plane and the pipeline's p2p channels; null:
  /// no CURVE (a coordinator started without keys).
  std::shared_ptr<const net::client_keys> keys;
  /// ha: every coordinator candidate's endpoint (the first is joined first). With more
  /// than one, a worker that loses the leader re-attaches to the next leader, keeping its
  /// training state, for up to reattach_ms; with one, losing it ends the worker (exit 1).
  std::vector<std::string> candidates;
  int reattach_ms = 30000;
  bool ha() const { return candidates.size() > 1; }
  /// The data plane's address (comm.interface: auto) is the local address of the route to
  /// this endpoint; empty: the endpoint joined. A host agent's workers join the agent on
  /// loopback and name the coordinator here.
  std::string route_to;
};

struct worker_state {
  static inline const char* name = "cohort.worker";
  enum class phase { registering, active, done };

  worker_options opts;
  worker_io io;
  std::shared_ptr<worker_shared> shared;
  phase ph = phase::registering;
  uint64_t incarnation = 0;  ///< +1 per registration attempt; stale timers compare it
  uint64_t member_id = 0;
  uint64_t generation = 0;
  int32_t rank = -1;
  net::coords at;
  /// The roster as this worker holds it: the generation of the last roster_update applied
  /// (0: none yet; `generation` may be newer, from a heartbeat_ack) and its world size.
  uint64_t roster_generation = 0;
  uint32_t world_size = 0;
  int registrations = 0;  ///< successful registrations (1 + rejoins)
  bool spare = false;     ///< waiting for a seat (world full)
  bool draining = false;  ///< asked to leave at the next step boundary
  /// The job's fault_tolerance.on_sigterm is checkpoint (job_spec.sigterm_checkpoints):
  /// SIGTERM asks the coordinator to stop the whole run with a checkpoint (asked_stop).
  bool sigterm_checkpoints = false;
  bool asked_stop = false;
  /// When asked_stop was sent: a SIGTERM within stop_echo of it is the same request from
  /// another sender (Slurm signals every process of a step, and the host agent passes its
  /// own SIGTERM on), not the second SIGTERM that leaves at once.
  std::chrono::steady_clock::time_point asked_stop_at{};
  /// ha: looking for a leader since then (a loss or the first registration); empty: not.
  std::optional<std::chrono::steady_clock::time_point> reattach_since;
  size_t candidate = 0;          ///< ha: index of the candidate spoken to now
  bool probing = false;          ///< ha: that candidate was tried blindly (no standby named it)
  uint64_t lost_term = 0;        ///< ha: term of the leader last lost (a hint to it is stale)
  uint64_t prev_member = 0;      ///< ha: the member id held under the lost leader
  uint64_t prev_generation = 0;  ///< ha: the newest generation heard from it
  caf::actor group;              ///< the allreduce_group, once a job arrived
  std::shared_ptr<dp_group_shared> group_shared = std::make_shared<dp_group_shared>();
};

/// The worker actor. Messages it handles:
///   (co_start)                   send the first registration (once its transport is up)
///   (co_in, peer, net::message)  a frame from the coordinator
///   (co_leave)                   SIGTERM: while training, drain (leave at the next step
///                                boundary, then exit 0); otherwise, or the second time,
///                                leave at once and exit 0
///   (co_retry, incarnation)      a spare registers again
///   (co_dleft, incarnation)      a drain not answered in time: leave at once
///   (co_lost)                    the heartbeat thread heard nothing for too long: exit 1
///   (co_regto, incarnation)      registration attempt timed out: exit 1
///   (co_fatal, why)              the training group cannot run the job: exit 1
caf::behavior worker_actor(caf::stateful_actor<worker_state>* self, worker_options opts,
                           worker_io io, std::shared_ptr<worker_shared> shared);

/// One worker process: actor system, worker actor, DEALER bridge, heartbeat thread.
class worker_node {
 public:
  /// Connects to ENDPOINT (lazily: a coordinator that is not up yet is waited for up to
  /// opts.coordinator_timeout_ms) and starts registering.
  worker_node(const std::string& endpoint, worker_options opts, size_t max_message_bytes);
  ~worker_node();

  /// Blocks until the worker actor quits; returns its exit code (0 stop/leave, 1 failure).
  int wait();
  /// Leave gracefully (thread-safe; e.g. from a signal thread).
  void request_leave();
  bool done() const { return done_.load(); }
  const caf::actor& actor() const { return actor_; }

  /// Member id and generation this worker currently holds (0 while registering).
  uint64_t member_id() const { return shared_->member_id.load(); }
  uint64_t generation() const { return shared_->generation.load(); }

  /// Rendezvous-store call through this worker's connection, for communicator setup
  /// (a kv_client adapter in runtime/comm can sit on it). REQ is a kv_set, kv_get or
  /// kv_wait; its request_id is assigned here. Blocks until the coordinator answers or
  /// TIMEOUT passes (then status timeout, reason says so). Thread-safe; the reply never
  /// goes through the actor, so a busy actor does not delay rendezvous.
  net::kv_reply kv_call(net::message req, std::chrono::milliseconds timeout);

 private:
  void heartbeat_loop();
  /// Sends M to the coordinator, or holds it while cut off (partition).
  void send_out(const net::message& m);
  /// Frames held during a cut that has ended, in order (heartbeat thread).
  void flush_held();

  // Outstanding kv_call requests, answered from the bridge thread by request id.
  struct kv_pending {
    std::mutex mu;
    std::unordered_map<uint64_t, std::promise<net::kv_reply>> waiting;
    uint64_t next_id = 1;
  };
  std::shared_ptr<kv_pending> kv_ = std::make_shared<kv_pending>();
  static void deliver(worker_shared& shared, kv_pending& kv, const caf::actor& target,
                      const std::string& peer, net::message m);

  int coordinator_timeout_ms_;
  std::unique_ptr<caf::actor_system_config> caf_cfg_;
  std::unique_ptr<caf::actor_system> system_;
  std::shared_ptr<worker_shared> shared_ = std::make_shared<worker_shared>();
  std::atomic<net::zmq_bridge*> out_{nullptr};
  std::unique_ptr<net::zmq_bridge> bridge_;
  caf::actor actor_;
  std::atomic<int> exit_code_{1};
  std::atomic<bool> done_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_heartbeats_ = false;  // guarded by mu_
  std::thread heartbeats_;
};

}  // namespace cohort::actors
