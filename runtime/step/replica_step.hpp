// One DP replica's step as a worker carries it out (docs/protocol.md, "Training"): the seat,
// the links of the generation, state from a donor, a rollback, the gradients and their DP
// sum, the vote, the commit with its checkpoint / evaluation cadence, telemetry and the final
// report. Which open or result to act on is worker_step's (pure, runtime/step/worker_step.hpp);
// the thread, the mailbox and the sockets are the group actor's (actors/dp_group.cpp), and
// everything from outside comes through replica_io, so a test drives it with a fake seat and
// a fake communicator.
//
//   job(spec) ─► config parsed; the whole model's seat built now (and resumed), a stage's at
//                its first open; answer worker_ready(next_step)
//
//   open(g, s, through, donor, restore) with rank r, as worker_step::on_open plans it:
//     resend_vote ─► the last vote again, nothing else
//     commit_first ─► commit(pending s - 1)          (its step_result was lost)
//     run: seat (a stage: built at its first open) ─► links of g (built unless current)
//          ─► restore >= 0: load checkpoint `restore`, or its point in memory
//             (restore_parts) ─► donor >= 0: state from the donor
//          ─► next_step == s, else refuse ─► s % memory_every == 0: keep a rollback point
//          ─► gradients, bucketed while backward runs
//          ─► DP sum ─► finish_gradients ─► vote (failed: links dropped)
//     vote ok and through >= s (a commit window) ─► commit(s) before the vote goes out,
//          the vote marked applied; the window's next step is queued (continue_window)
//   result(g, s, commit) ─► commit(pending)         result(abort) ─► worker_ready
//
//   commit(p): the ONE commit path, whichever side opened the step (window, coordinator, a
//   lost result):
//     apply s; next = s + 1
//     checkpoint   if (rank 0 or seat saves every rank) and (next == steps or
//                     checkpoint_every > 0 and next % checkpoint_every == 0)
//     evaluate     if rank 0 and eval_every > 0 and next % eval_every == 0 and next < steps
//                     (told to the coordinator as telemetry after the next vote)
//     report       if next == steps (rank 0 adds the final evaluation, tag steps + 1)
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "runtime/core/clock_sync.hpp"
#include "runtime/net/protocol.hpp"
#include "runtime/step/dp_links.hpp"
#include "runtime/step/step_faults.hpp"
#include "runtime/step/worker_step.hpp"

namespace cohort {
struct config;
}
namespace cohort::train {
class checkpoint_writer;
class trainer;
}

namespace cohort::step {

/// What building one generation's links needs (step::build_links's arguments).
struct link_request {
  const config& cfg;
  const std::string& data_host;  ///< where this worker's pairs and channel listen
  const net::step_open& open;
  int rank;
  train::seat& seat;
  bool staged;
  uint64_t member_id;  ///< this worker, as the coordinator numbers it (the device check's name)
};

/// What a replica's step needs from outside. Every member must be set (tests set them all).
struct replica_io {
  using clock_type = std::chrono::steady_clock;
  /// To the coordinator: worker_ready, step_vote, telemetry, train_report.
  std::function<void(const net::message&)> send;
  /// The job cannot run in this process (bad config, missing data, a failed apply).
  std::function<void(const std::string& why)> fatal;
  /// The seat: the whole model (staged false), or pipeline stage STAGE / TP rank TP_RANK.
  std::function<std::unique_ptr<train::seat>(const config&, bool staged, int stage, int tp_rank)>
      make_seat;
  /// Where the data plane listens for this job (resolves comm.interface); may throw.
  std::function<std::string(const config&)> data_host;
  /// Drops L's links and builds the request's generation (step::build_links over the
  /// coordinator's store); may throw comm_error.
  std::function<void(dp_links& l, const link_request& r)> build_links;
  /// Queues the window's next step behind whatever the mailbox holds (an abort first); the
  /// queued call comes back as on_next.
  std::function<void(const net::step_open&, uint64_t member_id, int rank)> continue_window;
  /// The step's clock (timings, idle time, the telemetry period).
  std::function<clock_type::time_point()> now;
  /// The coordinator's clock against this process's (telemetry's trace spans); may be empty.
  std::function<clock_sync::estimate()> clock;
  /// How an injected fault reaches the heartbeat and the control link.
  fault_hooks faults;
};

class replica_step {
 public:
  using clock_type = replica_io::clock_type;
  /// A step this worker cannot run as opened: a comm_error (invalid) naming WHY, which
  /// fails the step and drops the links.
  [[noreturn]] static void refuse(const std::string& why);
  /// D in whole microseconds (the step_timing figures).
  static uint64_t micros(clock_type::duration d) {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(d).count());
  }
  /// SHARED: through it the worker actor aborts the links when a newer generation comes.
  replica_step(replica_io io, std::shared_ptr<dp_group_shared> shared);
  /// Aborts and drops the links (uninstalling them from the shared handle).
  ~replica_step();
  replica_step(const replica_step&) = delete;
  replica_step& operator=(const replica_step&) = delete;

  /// The job (once; a repeat only re-announces where this member stands): worker_ready.
  /// MEMBER_ID 0: a spare loading the job ahead of its seat, which announces nothing.
  void on_job(const net::job_spec& spec, uint64_t member_id, uint64_t generation);
  /// A step_open: run the step at DP rank RANK and vote (see the drawing above).
  void on_open(const net::step_open& o, uint64_t member_id, int rank);
  /// The window's next step, queued by continue_window: run unless an abort came between.
  void on_next(const net::step_open& o, uint64_t member_id, int rank);
  /// A step_result: commit, abort, or a repeat.
  void on_result(const net::step_result& r);
  /// An injected fault for a later step (armed on the seat, or once the seat exists).
  void on_fault(const net::fault_order& f);

  /// The first step whose update the parameters lack.
  int64_t next_step() const { return next_step_; }

 private:
  using pending_step = worker_step::pending_step;
  void begin_handler();
  void end_handler() { last_end_ = io_.now(); }
  void make_seat(bool staged, int stage, int tp_rank);
  void seat_stage(const net::step_open& o, net::step_vote& v);
  void receive_state(int donor, int64_t step, net::step_timing& t);
  /// train.zero: the re-cut of the sharded state when the group changed (replica_zero.cpp).
  void reshard(train::trainer& z, const net::step_open& o, net::step_timing& t);
  /// train.zero: the parameters' gather after applying step P (train.zero: 3 only before
  /// what reads them whole: a checkpoint, an evaluation, the final digest); false when it
  /// failed.
  bool gather(train::trainer& z, const pending_step& p);
  /// train.zero: 3: hands the seat's trainer the group's communicator for the blocks'
  /// gathers during step O, and how many passes the busiest member runs; that trainer (the
  /// caller takes the communicator back after the step), or null without sharded parameters.
  train::trainer* lend_params(const net::step_open& o);
  /// parallel.ep (replica_moe.cpp): hands the seat's trainer this worker's EP group for the
  /// MoE layers' exchanges during step O and how many passes the group's busiest member runs
  /// (none for a group of one), and with sharded parameters every member's EP place; that
  /// trainer (the caller takes both back after the step), or null.
  train::trainer* lend_experts(const net::step_open& o, int rank);
  /// The most micro-batches one of DP ranks [FIRST, FIRST + COUNT) computes in step O.
  int most_micro_batches(const net::step_open& o, int first, int count) const;
  /// model.moe: the MoE layers' counters of W's step into T; its tokens per expert wait for
  /// the step's commit (expert_tokens_applied) to join the run's.
  void count_moe(train::trainer& w, net::step_timing& t);
  void expert_tokens_applied();
  /// train.zero: 2 and 3: ENGINE sums each bucket to its two holders in a group of REPLICAS
  /// and the seat's trainer gives back the rest once summed; that trainer, or null (ENGINE
  /// allreduces again).
  train::trainer* sum_to_holders(comm::bucket_engine& engine, int replicas);
  void restore(const net::step_open& o);
  /// A rollback to the point in memory of step o.restore (o.restore_parts names who holds
  /// each part of its error memory).
  void restore_from_memory(const net::step_open& o, net::step_timing& t);
  /// At a step of fault_tolerance.memory_every: every member keeps a rollback point.
  void take_point(const net::step_open& o, net::step_vote& v, net::step_timing& t);
  /// This worker's host as the transports tell "same host" (comm.host_id, else the detected
  /// identity), hashed: what the rings of the zero shards and of the points place by.
  uint64_t host_key() const;
  void run_step(const net::step_open& o, int rank, net::step_vote& v, net::step_timing& t);
  void commit(const pending_step& p);
  std::string checkpoint(int64_t step);
  void evaluate(int64_t step);
  void tell(uint64_t generation, int64_t step, bool now = false);
  void report(const pending_step& p, const std::string& ckpt);

  replica_io io_;
  std::shared_ptr<dp_group_shared> shared_;
  uint64_t member_id_ = 0;
  std::unique_ptr<config> cfg_;
  /// pp * tp > 1: the seat is a pipeline stage / TP shard, built at the first step_open
  /// (which names it); otherwise the whole model, built with the job.
  bool staged_ = false;
  std::unique_ptr<fault_seat> seat_;
  std::optional<net::fault_order> early_fault_;  ///< armed before the seat exists
  std::string resume_;                           ///< checkpoint a stage loads once built
  uint64_t job_id_ = 0;  ///< the run's id (job_spec), written into each shard
  int last_micro_ = 0;   ///< micro-batches of this replica in the last step
  dp_links links_;       ///< of the current generation
  /// Rank 0's checkpoints, written in the background (training does not wait for disk).
  std::unique_ptr<train::checkpoint_writer> writer_;
  std::string data_host_;  ///< where this worker's Gloo pairs and p2p channel listen
  int64_t next_step_ = 0;
  /// The run's end as the last step_open said (step_open.end; 0 until one did): a run
  /// stopping early (a preemption) ends before train.steps, with the same final checkpoint
  /// and report. The learning-rate schedule stays on train.steps.
  int64_t end_ = 0;
  std::string cpus_;  ///< where this worker runs (cluster.bind; train_report.cpus)
  int64_t end_step() const { return end_ > 0 ? end_ : cfg_->train.steps; }
  /// train.zero: the generation whose re-cut ran last (0: none yet), and the re-cuts that
  /// moved data.
  uint64_t resharded_generation_ = 0;
  int64_t reshards_ = 0;

  worker_step protocol_;  ///< which open / result to act on, and how (pure)
  /// The last vote and the final report, sent again when the coordinator repeats the
  /// message they answer (a frame was lost: drop control, or a socket).
  std::optional<net::step_vote> last_vote_;
  std::optional<net::train_report> last_report_;

  net::step_timing total_;  ///< whole run
  int64_t steps_computed_ = 0;
  /// model.moe: tokens per expert of the applied steps, and of the step voted on last
  std::vector<int64_t> moe_expert_tokens_, pending_expert_tokens_;
  // Steps whose DP sum travelled compressed (computed without error) and their bytes sent.
  int64_t compressed_steps_ = 0;
  uint64_t compressed_bytes_sent_ = 0;
  /// Whole run, DP collectives only: seconds the DP group's collectives ran, and the part
  /// of them that fell inside the steps' backward windows: the overlap's terms.
  double collective_s_ = 0, hidden_s_ = 0;
  std::optional<clock_type::time_point> last_end_;  ///< end of the last handler (idle clock)
  uint64_t idle_before_us_ = 0;  ///< idle time before the current handler (the vote's)
  /// A held-out evaluation not yet told to the coordinator (telemetry after the next vote).
  std::optional<net::telemetry> eval_to_tell_;
  static constexpr std::chrono::milliseconds telemetry_period{250};
  clock_type::time_point next_tell_{};  ///< spans go out with the first vote after this
};

}  // namespace cohort::step
