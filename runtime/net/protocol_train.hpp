// The training job's wire messages (docs/protocol.md, "Training"): the job a worker is
// given, where it stands, a step's opening, its vote and timing, the result, and the final
// report. Part of protocol.hpp, which every user includes; the byte layout is codec.hpp's.
#pragma once
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "runtime/net/msg_types.hpp"

namespace cohort::net {

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
  /// fault_tolerance.on_sigterm: checkpoint. SIGTERM to the worker asks the coordinator to
  /// stop the whole run with a checkpoint (admin_request "preempt") instead of draining.
  bool sigterm_checkpoints = false;
  template <class S>
  static auto fields(S& s) {
    return std::tie(s.config_yaml, s.config_hash, s.resume_checkpoint, s.job_id, s.trace,
                    s.sigterm_checkpoints);
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
  /// The run's end as the coordinator sees it now: the step after the last. train.steps
  /// unless the run is stopping early (a preemption, `ctl stop --checkpoint`): the member
  /// that applies step end - 1 writes the final checkpoint and reports, as at train.steps.
  /// 0: train.steps.
  int64_t end = 0;
  template <class S>
  static auto fields(S& s) {
    return std::tie(s.generation, s.step, s.replicas, s.donor_rank, s.rank, s.stage, s.tp_rank,
                    s.through, s.restore, s.shares, s.restore_parts, s.point, s.end);
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
  /// model.moe: tokens the MoE layers routed here (kept assignments, summed over the layers)
  /// and assignments dropped over capacity; parallel.ep: the experts' all-to-all calls, the
  /// bytes this member sent in them and their time (on the compute thread, inside compute_us)
  uint64_t moe_tokens = 0;
  uint64_t moe_dropped = 0;
  uint64_t alltoall_calls = 0;
  uint64_t alltoall_bytes = 0;
  uint64_t alltoall_us = 0;
  /// comm.backend: nccl: the DP group's communicators were rebuilt for this step's generation
  /// (0: not this step, or a host backend): how (1 a new init from a unique id, 2 a shrink of
  /// the ones held, 3 a new init after a failed shrink) and this member's time for it
  uint64_t regroup_path = 0;
  uint64_t regroup_us = 0;
  template <class S>
  static auto fields(S& s) {
    return std::tie(s.compute_us, s.comm_wait_us, s.allreduce_us, s.setup_us, s.idle_us,
                    s.bytes_sent, s.bytes_recv, s.state_bytes, s.state_us, s.reshard_us,
                    s.reshard_bytes, s.points, s.point_us, s.point_bytes, s.moe_tokens,
                    s.moe_dropped, s.alltoall_calls, s.alltoall_bytes, s.alltoall_us,
                    s.regroup_path, s.regroup_us);
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
  std::string cpus;  ///< the processing units it ran on (cluster.bind; "0-3,8"), "" unknown
  /// model.moe: tokens each expert computed for this member's micro-batches over the run
  /// (summed over the MoE layers, steps this member applied); empty without experts
  std::vector<int64_t> moe_expert_tokens = {};
  template <class S>
  static auto fields(S& s) {
    return std::tie(s.member_id, s.generation, s.next_step, s.params_sha256, s.has_eval,
                    s.eval_loss, s.eval_accuracy, s.eval_count, s.steps_computed, s.overlap,
                    s.peak_pool_bytes, s.checkpoint, s.num_params, s.timing, s.param_digests,
                    s.stage, s.compressed_steps, s.compressed_bytes_sent, s.state_params,
                    s.state_grads, s.state_optimizer, s.state_replica, s.reshards,
                    s.point_held_bytes, s.cpus, s.moe_expert_tokens);
  }
};

}  // namespace cohort::net
