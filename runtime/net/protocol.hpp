// Every control-plane wire message, one struct each: here, but for the training job's
// (runtime/net/protocol_train.hpp) and the worker's telemetry (runtime/net/telemetry.hpp);
// the type ids are in msg_types.hpp. The byte layout lives in codec.hpp and the meaning of
// each exchange in docs/protocol.md. Knows nothing of sockets or actors.
#pragma once
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <variant>
#include <vector>

#include "runtime/net/msg_types.hpp"
#include "runtime/net/protocol_train.hpp"
#include "runtime/net/telemetry.hpp"

namespace cohort::net {

/// First message of every peer; the only one accepted from an unknown ROUTER identity.
struct register_request {
  static constexpr msg_type type = msg_type::register_request;
  peer_role role = peer_role::worker;
  std::string name;  ///< worker name (unique among live members); empty: coordinator picks
  int64_t pid = 0;   ///< OS process id, so a launcher's exit notice can name the member
  /// A worker re-attaching after a leader change (ha): its member id and the newest
  /// generation it heard from the old leader (0: a first registration). The new leader
  /// continues member ids and generations above them, so nothing of the old term repeats.
  uint64_t prev_member = 0;
  uint64_t prev_generation = 0;
  template <class S>
  static auto fields(S& s) {
    return std::tie(s.role, s.name, s.pid, s.prev_member, s.prev_generation);
  }
};

/// Registration accepted: the member's identity in the current generation and the timing
/// the coordinator expects (workers take their heartbeat period from here, not a config).
struct register_ok {
  static constexpr msg_type type = msg_type::register_ok;
  uint64_t member_id = 0;  ///< unique for the coordinator's lifetime; 0 for clients
  std::string name;        ///< name actually assigned
  int32_t rank = -1;       ///< -1 for clients
  coords at;
  uint64_t generation = 0;
  uint32_t heartbeat_ms = 0;
  uint32_t timeout_ms = 0;
  template <class S>
  static auto fields(S& s) {
    return std::tie(s.member_id, s.name, s.rank, s.at, s.generation, s.heartbeat_ms, s.timeout_ms);
  }
};

/// Registration refused (world full, duplicate live name, coordinator stopping).
/// retry_ms > 0: the world is full (elastic.max_workers); the worker waits as a spare and
/// registers again after that long. 0: final, the worker exits 1.
struct register_reject {
  static constexpr msg_type type = msg_type::register_reject;
  std::string reason;
  uint32_t retry_ms = 0;
  /// From a standby coordinator (ha): the leader's endpoint as etcd names it, or empty
  /// while no leader is known; the worker registers there instead.
  std::string leader;
  uint64_t leader_term = 0;  ///< that leader's term (0: none known)
  bool standby = false;      ///< the answer of a standby: register with the leader instead
  template <class S>
  static auto fields(S& s) {
    return std::tie(s.reason, s.retry_ms, s.leader, s.leader_term, s.standby);
  }
  register_reject() = default;
  explicit register_reject(std::string why, uint32_t retry = 0)
      : reason(std::move(why)), retry_ms(retry) {}
};

/// Liveness beacon, sent from a worker's own heartbeat thread every heartbeat_ms.
struct heartbeat {
  static constexpr msg_type type = msg_type::heartbeat;
  uint64_t member_id = 0;
  uint64_t generation = 0;  ///< generation the worker believes is current
  uint64_t seq = 0;
  /// false: answer only if something changed (the member is behind the roster, or must
  /// rejoin). A worker asks often enough that silence from the coordinator stays far below
  /// its coordinator_timeout; every ack is one frame less for a coordinator of thousands.
  bool want_ack = true;
  template <class S>
  static auto fields(S& s) {
    return std::tie(s.member_id, s.generation, s.seq, s.want_ack);
  }
};

/// Answer to a heartbeat that asked for one, or that the coordinator must correct (behind
/// the roster, or declared dead). rejoin_required: the coordinator declared this member dead;
/// the worker must drop everything of its old generation and register again.
/// member_id echoes the heartbeat's, so a late ack for an old incarnation is ignored.
struct heartbeat_ack {
  static constexpr msg_type type = msg_type::heartbeat_ack;
  uint64_t member_id = 0;
  uint64_t generation = 0;
  uint64_t seq = 0;
  bool rejoin_required = false;
  template <class S>
  static auto fields(S& s) {
    return std::tie(s.member_id, s.generation, s.seq, s.rejoin_required);
  }
};

/// One roster entry as sent on the wire.
struct member_info {
  uint64_t member_id = 0;
  std::string name;
  int32_t rank = -1;
  coords at;
  member_state state = member_state::joining;
  int64_t pid = 0;
  template <class S>
  static auto fields(S& s) {
    return std::tie(s.member_id, s.name, s.rank, s.at, s.state, s.pid);
  }
};

/// What a member learns when the generation grows (join, death, leave, exit notice, an
/// aborted step): its own seat, the world size, and who left since the generation it holds.
/// The bytes grow with what changed, not with the job: a member holds (generation, rank, at,
/// world_size), and a change is applied to it. base_generation 0 is a full copy (a new
/// member, or one older than the coordinator remembers): nothing to apply it to, left empty.
struct roster_update {
  static constexpr msg_type type = msg_type::roster_update;
  uint64_t generation = 0;
  uint64_t base_generation = 0;  ///< the generation this change starts from; 0: a full copy
  int32_t rank = -1;             ///< this member's rank in `generation`
  coords at;                     ///< and its grid coordinates
  uint32_t world_size = 0;       ///< live members in `generation`
  std::vector<uint64_t> left;    ///< members that left after base_generation, in order
  template <class S>
  static auto fields(S& s) {
    return std::tie(s.generation, s.base_generation, s.rank, s.at, s.world_size, s.left);
  }
};

/// Rendezvous store: set KEY in GENERATION's namespace. Answered by kv_reply.
struct kv_set {
  static constexpr msg_type type = msg_type::kv_set;
  uint64_t request_id = 0;
  uint64_t generation = 0;
  std::string key;
  std::string value;  ///< opaque bytes
  template <class S>
  static auto fields(S& s) {
    return std::tie(s.request_id, s.generation, s.key, s.value);
  }
};

/// Rendezvous store: read KEY. timeout_ms 0: answer now (ok or not_found); otherwise wait
/// until KEY is set (Gloo's blocking get) or answer timeout after timeout_ms.
struct kv_get {
  static constexpr msg_type type = msg_type::kv_get;
  uint64_t request_id = 0;
  uint64_t generation = 0;
  std::string key;
  uint32_t timeout_ms = 0;
  template <class S>
  static auto fields(S& s) {
    return std::tie(s.request_id, s.generation, s.key, s.timeout_ms);
  }
};

/// Rendezvous store: answer once every key is set (kv_reply ok), or with timeout after
/// timeout_ms, or with superseded if the generation is dropped meanwhile.
struct kv_wait {
  static constexpr msg_type type = msg_type::kv_wait;
  uint64_t request_id = 0;
  uint64_t generation = 0;
  std::vector<std::string> keys;
  uint32_t timeout_ms = 0;
  template <class S>
  static auto fields(S& s) {
    return std::tie(s.request_id, s.generation, s.keys, s.timeout_ms);
  }
};

/// Answer to kv_set / kv_get / kv_wait, matched by request_id. value: kv_get's value.
struct kv_reply {
  static constexpr msg_type type = msg_type::kv_reply;
  uint64_t request_id = 0;
  kv_status status = kv_status::ok;
  std::string value;
  std::string reason;  ///< why, for every status but ok
  template <class S>
  static auto fields(S& s) {
    return std::tie(s.request_id, s.status, s.value, s.reason);
  }
};

/// Admin: ask the coordinator for its view (answered by status_reply).
struct status_request {
  static constexpr msg_type type = msg_type::status_request;
  uint64_t request_id = 0;
  template <class S>
  static auto fields(S& s) {
    return std::tie(s.request_id);
  }
};

/// One worker line of a status reply.
struct worker_status {
  member_info member;
  int64_t heartbeat_age_ms = 0;  ///< time since the last heartbeat the coordinator saw
  int64_t silent_ms = -1;        ///< dead members: silence at removal (detection latency); else -1
  template <class S>
  static auto fields(S& s) {
    return std::tie(s.member, s.heartbeat_age_ms, s.silent_ms);
  }
};

/// A named counter (frames dropped per reason, ...).
struct counter {
  std::string name;
  uint64_t value = 0;
  template <class S>
  static auto fields(S& s) {
    return std::tie(s.name, s.value);
  }
};

/// The coordinator's view: generation, training step (0 until training runs), every
/// member it knows (dead ones included until forgotten) and its drop counters.
struct status_reply {
  static constexpr msg_type type = msg_type::status_reply;
  uint64_t request_id = 0;
  uint64_t generation = 0;
  int64_t step = 0;
  std::vector<worker_status> workers;
  std::vector<counter> dropped;
  /// The job's recent figures as one JSON object (step rate, the step's split, the last
  /// events: run_report::live); empty without a job.
  std::string job;
  /// With ha: {"leader", "term", "pid", "standbys"} as one JSON object; empty without.
  std::string coordinator;
  template <class S>
  static auto fields(S& s) {
    return std::tie(s.request_id, s.generation, s.step, s.workers, s.dropped, s.job,
                    s.coordinator);
  }
};

/// Admin to coordinator: stop the cluster. Coordinator to worker: exit cleanly (code 0).
struct stop {
  static constexpr msg_type type = msg_type::stop;
  std::string reason;
  template <class S>
  static auto fields(S& s) {
    return std::tie(s.reason);
  }
};

/// Worker to coordinator: leaving on purpose (SIGTERM, end of work); no death needed.
struct leave {
  static constexpr msg_type type = msg_type::leave;
  uint64_t member_id = 0;
  uint64_t generation = 0;
  template <class S>
  static auto fields(S& s) {
    return std::tie(s.member_id, s.generation);
  }
};

/// Launcher to coordinator: a child process exited (faster than a heartbeat timeout).
struct exit_notice {
  static constexpr msg_type type = msg_type::exit_notice;
  std::string name;
  int64_t pid = 0;
  int32_t exit_code = 0;  ///< exit status, or 128 + signal number when killed
  template <class S>
  static auto fields(S& s) {
    return std::tie(s.name, s.pid, s.exit_code);
  }
};

/// One local worker's heartbeat as its host's agent relays it in a host_beat: the fields
/// of the worker's own heartbeat, and the routing id of the worker's connection to the agent
/// (the coordinator knows the worker as that connection behind the agent's).
struct relayed_beat {
  std::string worker;  ///< routing id at the agent (1..255 bytes)
  uint64_t member_id = 0;
  uint64_t generation = 0;
  uint64_t seq = 0;
  template <class S>
  static auto fields(S& s) {
    return std::tie(s.worker, s.member_id, s.generation, s.seq);
  }
};

/// Host agent to coordinator, once a heartbeat period: each local worker it heard within the
/// timeout, with its newest beat (docs/agent.md). The coordinator takes each entry as that
/// worker's heartbeat (answered through the agent only when the worker is behind or must
/// rejoin) and the frame itself as the agent's; want_ack asks for a host_beat_ack.
struct host_beat {
  static constexpr msg_type type = msg_type::host_beat;
  uint64_t seq = 0;
  bool want_ack = false;
  std::vector<relayed_beat> beats;
  template <class S>
  static auto fields(S& s) {
    return std::tie(s.seq, s.want_ack, s.beats);
  }
};

/// Coordinator to host agent: host_beat SEQ arrived (the agent answers its workers' own
/// heartbeats while it hears the coordinator).
struct host_beat_ack {
  static constexpr msg_type type = msg_type::host_beat_ack;
  uint64_t seq = 0;
  template <class S>
  static auto fields(S& s) {
    return std::tie(s.seq);
  }
};

/// Benchmark probe; answered by a pong with the same fields.
struct ping {
  static constexpr msg_type type = msg_type::ping;
  uint64_t seq = 0;
  uint64_t sent_ns = 0;
  template <class S>
  static auto fields(S& s) {
    return std::tie(s.seq, s.sent_ns);
  }
};

/// reply_ns: the answerer's steady clock when it answered (a worker's clock probe: the
/// coordinator's time between the ping's sending and the pong's arrival).
struct pong {
  static constexpr msg_type type = msg_type::pong;
  uint64_t seq = 0;
  uint64_t sent_ns = 0;
  uint64_t reply_ns = 0;
  template <class S>
  static auto fields(S& s) {
    return std::tie(s.seq, s.sent_ns, s.reply_ns);
  }
};

/// What an injected fault does to the worker that receives it (docs/faults.md).
enum class fault_action : uint8_t {
  kill = 0,  ///< SIGKILL itself in the middle of the step's backward
  hang = 1,  ///< stop heartbeating and computing for duration_ms, mid-step
  slow = 2,  ///< compute `factor` times slower during this step
  /// cut off from the coordinator for duration_ms, mid-step: no heartbeats, control frames
  /// dropped both ways, while the process keeps running (and later rejoins)
  partition = 3,
};

/// Coordinator to one member, just before its step_open: carry out an injected fault
/// during STEP of GENERATION (the fault-injection facility, never sent otherwise).
struct fault_order {
  static constexpr msg_type type = msg_type::fault_order;
  uint64_t generation = 0;
  int64_t step = 0;
  fault_action action = fault_action::kill;
  uint32_t duration_ms = 0;
  double factor = 1;
  template <class S>
  static auto fields(S& s) {
    return std::tie(s.generation, s.step, s.action, s.duration_ms, s.factor);
  }
};

/// Client (ctl) or worker to coordinator: an administrative command. command is "drain"
/// (argument: a worker's name; it leaves at the next step boundary), "scale" (argument:
/// the member count to reach) or "inject" (argument: a fault spec, docs/faults.md). A
/// worker sends "drain" with its own name on SIGTERM.
struct admin_request {
  static constexpr msg_type type = msg_type::admin_request;
  uint64_t request_id = 0;
  std::string command;
  std::string argument;
  template <class S>
  static auto fields(S& s) {
    return std::tie(s.request_id, s.command, s.argument);
  }
};

/// Coordinator's answer to an admin_request: ok, or refused with the reason (ctl exits 2).
struct admin_reply {
  static constexpr msg_type type = msg_type::admin_reply;
  uint64_t request_id = 0;
  bool ok = false;
  std::string text;
  template <class S>
  static auto fields(S& s) {
    return std::tie(s.request_id, s.ok, s.text);
  }
};

/// Coordinator to the launcher (a client registered as "launch"): start this many more
/// local workers (scaling up; scaling down drains members instead).
struct scale_order {
  static constexpr msg_type type = msg_type::scale_order;
  int32_t start_workers = 0;
  std::string reason;
  /// The sending coordinator's term (ha; 0 without) and the order's number within it
  /// (1, 2, ...): a coordinator sends its newest order again when a launcher registers
  /// while the workers it asked for are still missing (the order may have gone to a
  /// connection that had closed), and the launcher carries out each (term, seq) once.
  uint64_t term = 0;
  uint64_t seq = 0;
  template <class S>
  static auto fields(S& s) {
    return std::tie(s.start_workers, s.reason, s.term, s.seq);
  }
};

/// Any wire message. The alternative order is free; the type id is what goes on the wire.
using message =
    std::variant<register_request, register_ok, register_reject, heartbeat, heartbeat_ack,
                 roster_update, kv_set, kv_get, kv_wait, kv_reply, status_request, status_reply,
                 stop, leave, exit_notice, ping, pong, job_spec, worker_ready, step_open, step_vote,
                 step_result, train_report, fault_order, admin_request, admin_reply, scale_order,
                 telemetry, host_beat, host_beat_ack>;

/// Type id of whichever message M holds.
inline msg_type type_of(const message& m) {
  return std::visit([](const auto& x) { return std::decay_t<decltype(x)>::type; }, m);
}

/// Lower-case name of a type id ("heartbeat_ack"); "unknown" for ids outside the protocol.
const char* type_name(msg_type t);

namespace detail {
template <class T, class = void>
struct has_fields : std::false_type {};
template <class T>
struct has_fields<T, std::void_t<decltype(T::fields(std::declval<T&>()))>> : std::true_type {};
}  // namespace detail

/// Field-wise equality of any protocol struct (used by round-trip tests and dedup).
template <class T, class = std::enable_if_t<detail::has_fields<T>::value>>
bool operator==(const T& a, const T& b) {
  return T::fields(a) == T::fields(b);
}
template <class T, class = std::enable_if_t<detail::has_fields<T>::value>>
bool operator!=(const T& a, const T& b) {
  return !(a == b);
}

}  // namespace cohort::net
