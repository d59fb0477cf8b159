// Every control-plane wire message, one struct each: here, but for the worker's telemetry
// (runtime/net/telemetry.hpp); the type ids are in msg_types.hpp. The byte layout lives in
// codec.hpp and the meaning of each exchange in docs/protocol.md. Knows nothing of sockets
// or actors.
#pragma once
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <variant>
#include <vector>

#include "runtime/net/msg_types.hpp"
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

/// Coordinator to worker, right after register_ok: the job to run. The worker builds its
/// model and data from this config (so `cohort worker --join` needs no file of its own).
struct job_spec {
  static constexpr msg_type type = msg_type::job_spec;
  std::string config_yaml;        ///< the coordinator's resolved config (dump_config)
  std::string config_hash;        ///< sha256 of config_yaml, echoed in reports
  std::string resume_checkpoint;  ///< non-empty: load this checkpoint before the first step
  /// Random per run: marks the shards this run writes, so that a checkpoint several
  /// workers complete together never vouches for a shard an earlier run left behind.
  uint64_t job_id = 0;
  bool trace = false;  ///< record trace spans and ship them with telemetry (--trace)
  template <class S>
  static auto fields(S& s) {
    return std::tie(s.config_yaml, s.config_hash, s.resume_checkpoint, s.job_id, s.trace);
  }
};

/// Worker to coordinator: the model is built and the worker stands at a step boundary.
/// next_step: the first step its parameters have not applied (what a donor must supply).
struct worker_ready {
  static constexpr msg_type type = msg_type::worker_ready;
  uint64_t member_id = 0;
  uint64_t generation = 0;
  int64_t next_step = 0;
  template <class S>
  static auto fields(S& s) {
    return std::tie(s.member_id, s.generation, s.next_step);
  }
};

/// Coordinator to every member of GENERATION: run STEP. The DP replica of rank r among
/// `replicas` computes micro-batches i with i % replicas == r. donor_rank >= 0: before
/// computing, every member receives the donor's parameters and optimizer state over the
/// generation's communicator (some member is behind); restore >= 0 (= step): every member
/// loads its part of that step's checkpoint instead (a rollback). through >= step: a commit
/// window (docs/protocol.md): steps step..through commit in the data, each applied by a
/// member once its DP sum completes, the next one run without a step_open; -1: the member
/// waits for step_result after its vote.
struct step_open {
  static constexpr msg_type type = msg_type::step_open;
  uint64_t generation = 0;
  int64_t step = 0;
  int32_t replicas = 0;
  int32_t donor_rank = -1;
  int32_t rank = -1;  ///< the receiving member's DP rank (its replica) in `generation`
  /// Pipeline stage and tensor-parallel rank of the member (its seat in the replica; fixed
  /// for the member's life). 0 and 0 when pp = tp = 1.
  int32_t stage = 0;
  int32_t tp_rank = 0;
  int64_t through = -1, restore = -1;
  /// train.balance: measured: the micro-batches each DP rank computes (one count per rank,
  /// summing to the step's micro-batches; contiguous ranges in rank order). Empty: equal
  /// shares, round robin (runtime/step/balance.hpp).
  std::vector<int32_t> shares = {};
  /// A rollback from memory (fault_tolerance.memory_every): restore is the step of a
  /// rollback point every member kept, and part p of its error memory (p < size: the
  /// point's group) comes from the member of rank restore_parts[p] now. Empty: restore
  /// names a checkpoint on disk.
  std::vector<int32_t> restore_parts = {};
  /// The newest rollback point the coordinator holds good (its step committed): members
  /// drop older ones. -1: none.
  int64_t point = -1;
  template <class S>
  static auto fields(S& s) {
    return std::tie(s.generation, s.step, s.replicas, s.donor_rank, s.rank, s.stage, s.tp_rank,
                    s.through, s.restore, s.shares, s.restore_parts, s.point);
  }
};

/// A pipeline stage's time and memory over a run (train_report; stage -1: the whole model).
struct stage_stats {
  int32_t stage = -1;
  int32_t tp_rank = 0;
  int32_t replica = 0;            ///< DP rank in the last step
  uint64_t schedule_us = 0;       ///< wall time inside micro-batch schedules
  uint64_t compute_us = 0;        ///< forward and backward passes
  uint64_t forward_us = 0;        ///< forward passes alone
  uint64_t forwards = 0;          ///< micro-batches forwarded
  uint64_t wait_us = 0;           ///< blocked receiving from a neighbour
  uint64_t p2p_bytes = 0;         ///< activations / gradients sent to neighbours
  uint64_t tp_us = 0;             ///< inside the TP group's allreduce
  uint64_t activation_bytes = 0;  ///< most activation bytes held at once (measured)
  int32_t peak_held = 0;          ///< most micro-batches held between forward and backward
  int32_t micro_batches = 0;      ///< micro-batches per step in the last step (this replica)
  template <class S>
  static auto fields(S& s) {
    return std::tie(s.stage, s.tp_rank, s.replica, s.schedule_us, s.compute_us, s.forward_us,
                    s.forwards, s.wait_us, s.p2p_bytes, s.tp_us, s.activation_bytes, s.peak_held,
                    s.micro_batches);
  }
};

/// Where a worker's time went during one step (or a whole run), microseconds.
struct step_timing {
  uint64_t compute_us = 0;    ///< forward, backward, optimizer
  uint64_t comm_wait_us = 0;  ///< blocked waiting for collectives (not hidden by backward)
  uint64_t allreduce_us = 0;  ///< time the communication thread spent in allreduce
  uint64_t setup_us = 0;      ///< communicator rendezvous and state transfer
  uint64_t idle_us = 0;       ///< waiting for the coordinator (open, commit)
  uint64_t bytes_sent = 0;    ///< DP collectives' bytes posted to the transport (measured)
  uint64_t bytes_recv = 0;    ///< DP collectives' bytes received (measured)
  uint64_t state_bytes = 0;   ///< training state received from a donor (joiner), bytes
  uint64_t state_us = 0;      ///< time that transfer took
  /// train.zero: the re-cut of the sharded state this step opened with (0: none): its time
  /// here, and the bytes of state and parameters this member received in it
  uint64_t reshard_us = 0;
  uint64_t reshard_bytes = 0;
  /// fault_tolerance.memory_every: the rollback points this member took or rolled back to
  /// this step, their time and the bytes of error memory it received in them
  uint64_t points = 0;
  uint64_t point_us = 0;
  uint64_t point_bytes = 0;
  template <class S>
  static auto fields(S& s) {
    return std::tie(s.compute_us, s.comm_wait_us, s.allreduce_us, s.setup_us, s.idle_us,
                    s.bytes_sent, s.bytes_recv, s.state_bytes, s.state_us, s.reshard_us,
                    s.reshard_bytes, s.points, s.point_us, s.point_bytes);
  }
};

/// Worker to coordinator: its gradients for (generation, step) are reduced (ok) or the
/// step failed here (reason says why). loss_rows: sum over its micro-batches of mean loss
/// times rows; rows: samples it computed.
struct step_vote {
  static constexpr msg_type type = msg_type::step_vote;
  uint64_t member_id = 0;
  uint64_t generation = 0;
  int64_t step = 0;
  bool ok = false;
  bool fatal = false;  ///< failed for a reason a retry cannot fix (diverged, bad data)
  /// Failed because a peer's data-plane address could not be connected (every rank had
  /// arrived): the coordinator fails the job when this repeats instead of looping.
  bool unreachable = false;
  /// The member applied the step in a commit window (its DP sum completed, so every member
  /// computed the step), and every step of the window before it.
  bool applied = false;
  std::string reason;
  double loss_rows = 0;
  int64_t rows = 0;
  step_timing timing;
  /// Failed because training state is gone from memory (train.zero: a shard whose holders
  /// all left at once): the coordinator rolls every member back to the last checkpoint.
  bool lost_state = false;
  /// The step took a rollback point (fault_tolerance.memory_every): its ring (rank at each
  /// position; the copy of a rank's error memory is at the next position). Empty: none.
  std::vector<int32_t> point_ring = {};
  template <class S>
  static auto fields(S& s) {
    return std::tie(s.member_id, s.generation, s.step, s.ok, s.fatal, s.unreachable, s.applied,
                    s.reason, s.loss_rows, s.rows, s.timing, s.lost_state, s.point_ring);
  }
};

/// Coordinator to members: commit (apply the optimizer) or abort (drop the gradients) of
/// (generation, step). loss: mean loss over the global batch (commits only).
struct step_result {
  static constexpr msg_type type = msg_type::step_result;
  uint64_t generation = 0;
  int64_t step = 0;
  bool commit = false;
  double loss = 0;
  std::string reason;
  template <class S>
  static auto fields(S& s) {
    return std::tie(s.generation, s.step, s.commit, s.loss, s.reason);
  }
};

/// Worker to coordinator after applying the job's last step: its final state and its
/// whole-run time split. Rank 0 also evaluates (has_eval).
struct train_report {
  static constexpr msg_type type = msg_type::train_report;
  uint64_t member_id = 0;
  uint64_t generation = 0;
  int64_t next_step = 0;
  std::string params_sha256;
  bool has_eval = false;
  double eval_loss = 0;
  double eval_accuracy = 0;
  int64_t eval_count = 0;
  int64_t steps_computed = 0;  ///< steps this worker computed and applied
  double overlap = 0;          ///< share of DP collective time inside backward; 0 if none ran
  int64_t peak_pool_bytes = 0;
  std::string checkpoint;  ///< final checkpoint written (rank 0), else empty
  int64_t num_params = 0;
  step_timing timing;
  /// "name:sha256\n" per parameter this worker holds (a pipeline stage's part of the model)
  std::string param_digests;
  stage_stats stage;
  int64_t compressed_steps = 0;        ///< of steps_computed, those whose sum was compressed
  uint64_t compressed_bytes_sent = 0;  ///< the bytes sent in them (within timing.bytes_sent)
  /// Model-state bytes at the end (runtime/train/trainer.hpp, model_state_bytes): the
  /// parameters, gradients, optimizer state held, and the replica of a neighbour's shard
  /// (train.zero)
  int64_t state_params = 0, state_grads = 0, state_optimizer = 0, state_replica = 0;
  int64_t reshards = 0;  ///< re-cuts of sharded state this member took part in that moved data
  int64_t point_held_bytes = 0;  ///< fault_tolerance.memory_every: what its points hold now
  template <class S>
  static auto fields(S& s) {
    return std::tie(s.member_id, s.generation, s.next_step, s.params_sha256, s.has_eval,
                    s.eval_loss, s.eval_accuracy, s.eval_count, s.steps_computed, s.overlap,
                    s.peak_pool_bytes, s.checkpoint, s.num_params, s.timing, s.param_digests,
                    s.stage, s.compressed_steps, s.compressed_bytes_sent, s.state_params,
                    s.state_grads, s.state_optimizer, s.state_replica, s.reshards,
                    s.point_held_bytes);
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
  template <class S>
  static auto fields(S& s) {
    return std::tie(s.start_workers, s.reason);
  }
};

/// Any wire message. The alternative order is free; the type id is what goes on the wire.
using message =
    std::variant<register_request, register_ok, register_reject, heartbeat, heartbeat_ack,
                 roster_update, kv_set, kv_get, kv_wait, kv_reply, status_request, status_reply,
                 stop, leave, exit_notice, ping, pong, job_spec, worker_ready, step_open, step_vote,
                 step_result, train_report, fault_order, admin_request, admin_reply, scale_order,
                 telemetry>;

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
