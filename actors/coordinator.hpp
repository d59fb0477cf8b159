// The coordinator actor (roster, heartbeat monitor, rendezvous store, status, stop, ping
// benchmark, training steps, admin commands) and coordinator_node, which wires it to a ROUTER
// zmq_bridge in one process. Membership, store and step decisions are pure functions
// (runtime/net, runtime/step/training_job.hpp); the actor only keeps their state, reads the clock
// and sends what they decide (coordinator.cpp; ctl drain / scale / inject in
// coordinator_admin.cpp; the process in coordinator_node.cpp).
#pragma once
#include <atomic>
#include <caf/all.hpp>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "actors/messages.hpp"
#include "runtime/core/log_limiter.hpp"
#include "runtime/net/heartbeat_table.hpp"
#include "runtime/net/kv_store.hpp"
#include "runtime/net/membership.hpp"
#include "runtime/net/protocol.hpp"
#include "runtime/net/roster_changes.hpp"
#include "runtime/net/zmq_bridge.hpp"
#include "runtime/step/control_faults.hpp"
#include "runtime/step/training_job.hpp"

namespace cohort {
struct config;
}

namespace cohort::actors {

// The step's logic lives in runtime/step/; the coordinator actor drives it.
using step::job_actions;
using step::training_job;

namespace mb = net::membership;

/// What the coordinator actor needs from outside. coordinator_node wires it to a bridge;
/// tests wire it to plain vectors and a manual clock.
struct coordinator_io {
  std::function<void(const std::string& peer, const net::message& m)> send;
  std::function<void(const std::string& peer)> admit;      ///< peer may send more than register
  std::function<void(const std::string& peer)> forget;     ///< optional: back to register only
  /// Optional: PEER, a host agent, may relay its workers' frames (zmq_bridge::allow_relay).
  std::function<void(const std::string& peer)> relay;
  std::function<std::vector<net::counter>()> drop_counts;  ///< optional
  std::function<mb::mono_time()> clock;                    ///< optional: steady_clock::now
  /// Optional: where the bridge thread answers live members' heartbeats itself (the actor
  /// publishes the roster to it and reads the beats back before looking for the silent).
  std::shared_ptr<net::heartbeat_table> beats;
  /// Optional: until when the transport has read everything that arrived (zmq_bridge::
  /// caught_up); a member is only declared silent for time the coordinator could hear it.
  std::function<mb::mono_time()> caught_up;
};

/// Clients (ctl calls, benchmark drivers) the coordinator remembers at once: ZeroMQ never says
/// when one is gone, so the oldest registration is forgotten beyond this (never the launcher).
inline constexpr size_t max_clients = 256;
/// Host agents the coordinator keeps at once (one per host: far above any job's hosts).
inline constexpr size_t max_agents = 65536;

/// Timing and limits of the coordinator.
struct coordinator_options {
  mb::options membership;
  net::kv::options kv;
  int tick_ms = 25;  ///< period of check_timeouts and store expiry
  /// The training job; null: control plane only (no job is sent to workers).
  std::shared_ptr<training_job> job;
  /// Called on the actor's thread after every job event (progress, notes, the end); when
  /// actions.finished or actions.failed is set the coordinator stops the cluster right after.
  std::function<void(const job_actions&, const training_job&)> on_job;
  /// ha: this leader's term (0 without ha); stamped on every frame the node sends.
  uint64_t term = 0;
  /// ha: this leader took over a running job: its workers are re-attaching, and until they
  /// have formed its first generation it cannot count them, so `ctl scale` is refused (the
  /// asker retries) instead of asking the launcher for workers that are on their way back.
  bool taking_over = false;
  /// ha: a coordinator fault is due (its place in the job's fault list): the host records
  /// it and carries it out, before the step's messages go out. Null: none can be.
  std::function<void(const faults::fault_spec&, std::size_t index)> on_coordinator_fault;
  /// ha: worker faults are about to act (job_actions::fired_faults): the host records them
  /// before their orders go out. Null: nothing to record.
  std::function<void(const std::vector<faults::fault_fired>&)> on_worker_faults;
  /// ha: status_reply.coordinator ({"leader", "term", "pid", "standbys"}); null: none.
  std::function<std::string()> coordinator_status;
  /// ha: `ctl inject SPEC` is about to add a fault: the host records it where the next
  /// leader finds it (etcd), so that it outlives this leader. Empty: recorded; else why not
  /// (the fault is then refused). Null: nothing to record.
  std::function<std::string(const std::string& spec)> record_added_fault;
  /// ha: `ctl scale` is about to act (SPEC "scale to=N"): the host records it with a fenced
  /// write, so that only the run's leader acts on it (a deposed leader that has not noticed
  /// yet would otherwise accept it and its order to the launcher die with it). Empty: this
  /// coordinator leads; else why not (the request is refused, saying so). Null:
  /// no ha, nothing to check.
  std::function<std::string(const std::string& spec)> confirm_scale;
  /// ha: a stop with a checkpoint, asked BY, is about to act: the host records it (fenced)
  /// so that a leader taking over mid-stop carries it out. Empty: recorded; else why not
  /// (the stop is refused, saying so). Null: no ha.
  std::function<std::string(const std::string& by)> record_stop;
  /// Every frame between the coordinator and a member, in and out, passes through it
  /// (injected faults); null: the job's (step::job_frame_filter), none without a job.
  std::shared_ptr<step::frame_filter> control_filter;
};

/// Options from a resolved config: fault_tolerance.* and parallel.*; tick = heartbeat / 2.
coordinator_options coordinator_options_from(const config& cfg);

/// The coordinator actor's state: a plain struct, all behaviour in coordinator.cpp.
struct coordinator_state {
  static inline const char* name = "cohort.coordinator";

  struct kv_waiter {
    std::string peer;
    uint64_t request_id = 0;
  };
  /// A worker that asked to join a full world (elastic.max_workers): it is seated, in
  /// arrival order, the moment a member leaves, in the same generation change, so no step
  /// opens between the departure and the spare taking the seat.
  struct spare {
    std::string peer;
    std::string name;
    int64_t pid = 0;
    mb::mono_time asked{};  ///< its last registration; entries silent for 3 retries expire
  };
  /// A registration waiting for the join window to close (coordinator_joins.cpp).
  struct joiner {
    std::string peer;
    std::string name;
    int64_t pid = 0;
  };
  struct bench_run {
    caf::response_promise promise;
    std::string peer;
    uint32_t left = 0;
    uint64_t seq = 0;
    bench_result result;
  };

  coordinator_options opts;
  coordinator_io io;
  mb::roster roster;
  net::kv::store store;
  std::unordered_map<mb::member_id, std::string> peer_of;    ///< every member ever, to its peer
  std::unordered_map<std::string, mb::member_id> member_at;  ///< peer -> its current member
  std::unordered_set<std::string> clients;                   ///< ctl / launch / bench peers
  std::deque<std::string> client_order;              ///< the same, oldest registration first
  /// Those of them that registered as `launch`: the one heard from last is the launcher
  /// (its status requests, every 250 ms), whatever order their registrations came in.
  std::unordered_set<std::string> launch_peers;
  std::vector<spare> spares;                         ///< waiting for a seat, oldest first
  std::vector<joiner> joiners;                       ///< in the open join window, in arrival order
  mb::mono_time join_first{};                        ///< when the open join window opened
  mb::mono_time join_last{};                         ///< its latest registration
  bool join_timer = false;                           ///< a co_joins is on its way
  int scale_awaited = 0;  ///< the worker count a scale asked the launcher for (0: none)
  net::scale_order last_scale;  ///< the newest scale order sent (seq 0: none yet)
  mb::change_log changes;                            ///< who left in each announced generation
  std::vector<mb::member_id> announced;              ///< members of the last announced generation
  std::unordered_map<mb::member_id, uint64_t> held;  ///< generation each member was last told
  std::string launcher;  ///< the client registered as "launch" (starts workers on scale)
  /// Host agents ("agent-HOST" clients, docs/agent.md): never forgotten as clients are; each
  /// may report the exits of the workers it relays.
  std::unordered_set<std::string> agents;
  std::unordered_map<uint64_t, kv_waiter> kv_waiters;  ///< store request id -> requester
  uint64_t next_kv_id = 1;
  int64_t step = 0;  ///< next training step (the job's), 0 without a job
  bool stopping = false;
  bool formed = false;  ///< a generation has been announced (opts.taking_over: re-attached)
  /// When the next tick should arrive, and whether the tick now queued was put off once
  /// because the coordinator itself ran late (see the tick handler).
  mb::mono_time tick_due{};
  bool tick_deferred = false;
  mb::mono_time tick_queued{};  ///< when a deferred tick was queued again
  std::unique_ptr<bench_run> bench;
  log_limiter peer_warnings;  ///< how often warnings a peer causes reach the log
};

/// The coordinator actor. Messages it handles:
///   (co_in, net::sender, net::message)  a frame from the bridge (register, heartbeat, ...)
///   (co_tick)                     timer: check_timeouts, store expiry (self-scheduled)
///   (co_joins)                    timer: the join window may close (coordinator_joins.cpp)
///   (co_status) -> status_reply   local status
///   (co_stop, reason)             tell every worker and client to stop, then quit
///   (co_bench, name, n) -> bench_result  n ping/pong round trips with worker NAME
caf::behavior coordinator_actor(caf::stateful_actor<coordinator_state>* self,
                                coordinator_options opts, coordinator_io io);

/// One coordinator process: a CAF actor system, the coordinator actor and a ROUTER bridge
/// bound to `bind` (tcp://127.0.0.1:0 picks a free port).
class coordinator_node {
 public:
  /// Starts everything. Throws io_error when `bind` cannot be bound. With KEYS the bridge
  /// speaks CURVE and admits only the authorized keys, each with its role.
  coordinator_node(coordinator_options opts, const std::string& bind, size_t max_message_bytes,
                   std::shared_ptr<const net::server_keys> keys = nullptr);
  /// Stops the actor (if still running) and the bridge.
  ~coordinator_node();

  /// Endpoint actually bound, with the real port.
  const std::string& endpoint() const { return bridge_->endpoint(); }
  caf::actor_system& system() { return *system_; }
  const caf::actor& actor() const { return actor_; }
  net::zmq_bridge& bridge() { return *bridge_; }

  /// Asks the coordinator to stop the cluster (thread-safe; e.g. from a signal thread).
  void request_stop(const std::string& reason);
  /// Asks the training job to stop early with a checkpoint at the next step boundary it can
  /// reach (training_job::stop_early; thread-safe). BY names who asked (for the events).
  /// Without a job, or once it cannot stop early any more, nothing happens.
  void request_checkpoint_stop(const std::string& by);
  /// Blocks until the coordinator actor has quit.
  void wait();
  /// True once the actor has quit.
  bool done() const { return done_.load(); }
  /// Fault injection (`partition coordinator`): nothing in or out for MS milliseconds;
  /// frames are lost as a cut link loses them (thread-safe).
  void cut_off(uint32_t ms);

 private:
  // A host agent's host_beat, on the bridge thread: each entry as its worker's heartbeat
  // (recorded in BEATS when the table answers it, else to TARGET as a heartbeat).
  static void on_host_beat(const net::sender& from, const net::host_beat& hb,
                           net::heartbeat_table* beats, net::zmq_bridge* bridge,
                           const caf::actor& target);
  step::link_cut cut_;
  std::unique_ptr<caf::actor_system_config> caf_cfg_;
  std::unique_ptr<caf::actor_system> system_;
  std::atomic<net::zmq_bridge*> out_{nullptr};  // set once the bridge exists
  std::unique_ptr<net::zmq_bridge> bridge_;
  caf::actor actor_;
  std::atomic<bool> done_{false};
};

/// CAF settings shared by every cohort process: the work-sharing scheduler (no spinning
/// threads competing with ZeroMQ's I/O thread on small machines).
std::unique_ptr<caf::actor_system_config> make_caf_config();

/// How long a bridge keeps polling after traffic before it sleeps (bridge_options::spin_us);
/// COHORT_BRIDGE_SPIN_US overrides it for measurements.
int bridge_spin_us();

}  // namespace cohort::actors
