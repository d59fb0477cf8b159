// The coordinator's side of data-parallel training: when a step opens, what the votes
// decide (commit only when every member of the generation voted ok, otherwise abort and
// a new generation), which member donates state to one that is behind, and where each
// member sits (pp * tp > 1). With pp = tp = 1 a step opens a commit window of up to
// fault_tolerance.commit_window steps that the members commit in the data (each applies a
// step once its DP sum completes, and its vote marked applied says so); an abort of a
// window asks every member where it stands (worker_ready) before the next opens. The
// run's events and summary are its run_report's (runtime/step/run_report.hpp), its faults'
// timing its fault_schedule's. Pure: no clock, no sockets, no CAF, no randomness. The
// coordinator actor feeds it events with the current roster and the time, and sends what
// it returns.
//
// The machine (pp = tp = 1; with pp * tp > 1 the same states, the guard of an open being
// open_hybrid's in training_job_seats.cpp: whole replicas, a donor per seat). state()
// names the state; tests/step/test_training_job_machine.cpp has one table row per arrow.
//
//                T1 guard              T5 all ok, T6 a failed vote, T7 a voter lost
//   [waiting s] ─────────► [open g,s] ────────────────────────────────► [waiting]
//    ⟲ T20 T21 │            ⟲ T4 T22 T23 T24
//              │ T2 guard, windows on
//              ├─────────► [window g,s..t] ──T10 every member through t──► [waiting]
//              │            ⟲ T9     │ T11 a failed vote, a voter lost
//              │ T12 take_over       ▼
//              └─────────────────► [resync] ⟲ T13
//                                    │ T14 every member ready: at the newest step
//                                    └─────────────► [open] or [window]
//   [open g,last] ──T8 all ok──► [reporting] ◄──T15 all ready at the end── [resync]
//                                 ⟲ T16 T25 │ T17 the last report
//                                           ▼
//   [waiting] ──T3 T18──────────────────► [done] ⟲ T26 ◄──T19── [open]
//
//   The guard (try_open: run by on_ready, on_generation, on_heartbeat, on_drain, on_tick
//   and after a commit that leaves no step open): every member alive and ready
//   (worker_ready), at least elastic.min_workers of them, none leaving. Joiners still
//   loading (not ready) do not fail it when the others are exactly the last step's members
//   (same ranks, at least min_workers): T1 then opens for those, in the last step's
//   generation, over their links (stepping_without_joiners).
//
//   T1  waiting  guard holds                  → open     step_open(g, s) to every member
//                                                        (donor: the first rank at s when
//                                                        some are behind; faults due fire)
//   T2  waiting  guard holds, windows on       → window  step_open(g, s, through t)
//   T3  waiting  guard holds, every member behind s → done   failed: restart from a checkpoint
//   T4  open     on_vote ok, others still out  → open     counted
//   T5  open     on_vote ok, every voter ok    → waiting  step_result(commit), s + 1; T1 at once
//   T6  open     on_vote failed                → waiting  step_result(abort) to the voters,
//                                                         bump (the actor moves the roster on)
//   T7  open     on_generation without a voter → waiting  step_result(abort) to those left;
//                (or with the same members)               T1 at once if the guard holds
//   T8  open     on_vote ok, every voter ok, s the last → reporting  step_result(commit)
//   T9  window   on_vote applied, some not through t → window  the steps all applied commit
//   T10 window   on_vote applied, every member through t → waiting  commits; T1/T2 at once
//   T11 window   on_vote failed / on_generation without a voter → resync  step_result(abort)
//                (bump for a vote); every member must say where it stands again
//   T12 waiting  take_over (a new leader)      → resync
//   T13 resync   on_ready, some still silent   → resync
//   T14 resync   on_ready, the last            → open / window at the newest step, a donor
//   T15 resync   on_ready, the last, newest = the end → reporting  step_result(commit) of the
//                                                        last step again: the reports again
//   T16 reporting on_report, others still out  → reporting
//   T17 reporting on_report of the last voter  → done     finished
//   T18 waiting  on_tick, below min_workers past elastic.pause_timeout_ms → done  failed
//   T19 open     on_vote failed: fatal, the 3rd unreachable or the 51st abort in a row
//                                              → done     step_result(abort), failed
//   T20 waiting  guard fails (too few ready)   → waiting  a note once (not at the start)
//   T21 waiting  a member leaving (on_drain)   → waiting  leave: stop it at the boundary
//   T22 open     on_generation that only grew the roster → open  (joiners wait for s + 1)
//   T23 open     on_tick, resend_interval_s quiet → open  step_open again to non-voters
//   T24 open     a stale or foreign vote       → open     ignored
//   T25 reporting on_tick, resend_interval_s quiet → reporting  the last commit again to
//                                                        members that have not reported
//   T26 done     any event                     → done     nothing
//   T27 waiting, open, window, resync  stop_early → the same state; the next step that
//                opens is the last: its step_open.end is step + 1, and its commit is T8's
//   Any state: on_scale and on_telemetry are only recorded (run_report); on_heartbeat
//   runs the guard; on_tick also sends job_spec again to members not ready.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "runtime/core/config.hpp"
#include "runtime/core/faults.hpp"
#include "runtime/net/membership.hpp"
#include "runtime/net/protocol.hpp"
#include "runtime/step/balance.hpp"
#include "runtime/step/fault_schedule.hpp"
#include "runtime/step/job_actions.hpp"
#include "runtime/step/run_report.hpp"

namespace cohort::step {

class training_job {
 public:
  /// `config_yaml` is what workers receive (dump_config of `cfg`). Training starts at
  /// `start_step`: 0, or the step of `resume_checkpoint`, which every worker then loads.
  /// `job_id` tells this run's checkpoint shards from an earlier run's (job_spec.job_id):
  /// the caller draws it at random once per run.
  training_job(const config& cfg, std::string config_yaml, int64_t start_step = 0,
               std::string resume_checkpoint = {}, uint64_t job_id = 0);

  /// Faults to inject (docs/faults.md): kill / hang once when their step opens, slow on
  /// every step of its range, random kill on the steps its seed picks. Throws usage_error
  /// for a kind this runtime does not carry out yet.
  void set_faults(std::vector<faults::fault_spec> f);
  /// This job continues a run an earlier leader led (ha): the members that re-attach
  /// hold its state, so the first step opens, once every one has said where it stands
  /// (worker_ready), at the newest of them; faults FIRED (places in set_faults' list, with
  /// the step for random kills) already acted under an earlier leader and act no more there.
  void take_over(const std::vector<faults::fault_fired>& fired) {
    resync_ = true;
    took_over_ = true;
    for (const faults::fault_fired& f : fired) faults_.mark_fired(f);
  }
  /// Whether F may join the running job (`cohort ctl inject`, then append_fault): throws
  /// usage_error for an unsupported kind or a step that has already opened.
  void check_fault(const faults::fault_spec& f) const;
  /// A fault checked by check_fault, at the next place in the list. Also a fault `ctl
  /// inject` added under an earlier leader (ha): call before take_over, in the order they
  /// were added, so each keeps its place.
  void append_fault(faults::fault_spec f) {
    faults_.append(std::move(f));
    if (faults_.drop_control() != nullptr) report_.drops_control();
  }
  /// Member ID (already marked leaving in R) is drained: it leaves at the next step
  /// boundary. Records the event; returns the leave now if no step is open.
  job_actions on_drain(const mb::roster& r, mb::member_id id, double now_s);
  /// Stop the run early with a checkpoint (a preemption: SIGTERM under
  /// fault_tolerance.on_sigterm: checkpoint, or `cohort ctl stop --checkpoint`; BY names
  /// who asked). The next step that opens is the last: its step_open.end says so, and its
  /// members write the final checkpoint and report as at train.steps (T27). A step or window
  /// open now runs to its end first. Returns whether this call started it (false: the run
  /// was already stopping early, is past its last open, or is done).
  bool stop_early(const std::string& by, double now_s);
  /// Whether stop_early would start a stop now (not asked yet, and steps left to cut).
  bool can_stop_early() const;
  /// Whether the run is stopping (or stopped) before train.steps with a checkpoint.
  bool stopping_early() const { return early_.asked; }
  /// The run ended early at a checkpoint: finished, and its end below train.steps.
  bool stopped_early() const { return finished_ && early_.asked && steps_ < cfg_.train.steps; }
  /// A scale to TARGET members was asked for (ctl scale or a scale fault): an event whose
  /// recover_ms is the time to the first committed step with TARGET members.
  void on_scale(const mb::roster& r, int target, const std::string& spec, double now_s);

  /// The newest complete checkpoint of this run at or before a step, with every DP rank's
  /// error-feedback part (nullopt: none). The caller reads the folder; the job stays pure.
  using checkpoint_lookup = std::function<std::optional<int64_t>(int64_t at_most)>;
  /// With error feedback in bitwise mode, a member that left mid-run (killed, hung, cut off,
  /// or drained by a scale-down) held memory no one else has: once the group may run again,
  /// the next step opens at the newest checkpoint LOOKUP finds, every member loading its part
  /// of it (step_open.restore; at another size the parts regroup, none lost), and the steps
  /// since are replayed. Without a checkpoint the run goes on from where it was (the memory
  /// is lost; a note says so).
  void set_checkpoints(checkpoint_lookup lookup) { checkpoints_ = std::move(lookup); }

  /// What every new worker is sent after register_ok.
  net::job_spec spec() const {
    return net::job_spec{yaml_,   hash_, resume_, job_id_,
                         trace_, cfg_.fault_tolerance.on_sigterm == "checkpoint"};
  }

  /// The roster moved to a new generation: an open step of an older one is aborted (its
  /// members are told), departed members are forgotten, and a step opens if it can.
  job_actions on_generation(const mb::roster& r, double now_s);
  /// A worker built its model and stands at a step boundary.
  job_actions on_ready(const mb::roster& r, const net::worker_ready& w, double now_s);
  /// A vote for the open step (stale votes of older generations or steps are ignored).
  job_actions on_vote(const mb::roster& r, const net::step_vote& v, double now_s);
  /// A member may have become alive (its first heartbeat): opens a step if one can open.
  job_actions on_heartbeat(const mb::roster& r, double now_s) { return try_open(r, now_s); }
  /// Timer: opens a step if one can open; fails the job once training has waited below
  /// elastic.min_workers for longer than elastic.pause_timeout_ms. Also sends again what a
  /// lost frame left unanswered (resend_interval_s): the open step to members that have not
  /// voted, the job to members not ready, the last result to members that have not
  /// reported. Workers answer duplicates from what they already did.
  job_actions on_tick(const mb::roster& r, double now_s);
  /// A worker's final report after the last step.
  job_actions on_report(const mb::roster& r, const net::train_report& rep, double now_s);
  /// A member's telemetry (evaluations, trace spans): recorded, never acted on.
  void on_telemetry(const mb::roster& r, const net::telemetry& t, double now_s);
  /// Who else watches the run (the coordinator's trace and metrics).
  void set_watch(std::shared_ptr<job_watch> w) { report_.set_watch(std::move(w)); }
  /// Workers record trace spans and ship them with their telemetry (--trace).
  void set_trace(bool on) { trace_ = on; }

  /// The state of the machine drawn above.
  enum class phase {
    waiting,    ///< no step open: the next opens once its guard holds
    open,       ///< step (g, s) open, committed by step_result
    window,     ///< a commit window (g, s..t) open, committed in the data
    resync,     ///< after take_over or an aborted window: waiting for every worker_ready
    reporting,  ///< the last step committed: waiting for the final reports
    done,       ///< finished, or failed
  };
  phase state() const;

  int64_t next_step() const { return next_step_; }
  /// The first step not yet committed, as `ctl status` shows it: while a job taken over
  /// (or resynced after an aborted window) waits for its members, the newest state any
  /// member has reported, not the step it will open at (that is decided at the open).
  int64_t progress() const;
  int64_t steps() const { return steps_; }
  bool finished() const { return finished_; }
  /// The run's events and summary, as far as it has gone.
  const run_report& report() const { return report_; }
  /// The balancer's figures for the summary and `ctl status` (balancer::json).
  nlohmann::json balance_json() const { return balance_.json(); }
  /// `ctl status`'s job figures (run_report::live), and "loading": the members of R that
  /// registered but have not loaded the job yet (no worker_ready): the joiners the group
  /// steps on without, each entering at the first step boundary once ready.
  nlohmann::json live(const mb::roster& r) const;
  /// The `drop control` fault, if the job has one (the coordinator drops frames).
  const faults::fault_spec* drop_control() const { return faults_.drop_control(); }
  /// The coordinator dropped a frame for `drop control` (counted in the summary).
  void note_dropped_frame() { report_.frame_dropped(); }
  /// Quiet time after which on_tick sends again: 1.5 heartbeats with drop control, otherwise
  /// max(2 s, 4 x timeout_ms) (a safety net for frames a socket lost).
  double resend_interval_s() const;
  /// DP replicas of the last step opened.
  int replicas() const { return replicas_; }
  /// Members in the order a scale-down drains them with pp * tp > 1: members without a
  /// seat or in broken replicas first, then whole replicas from the highest seat down, so
  /// the replicas left stay whole.
  std::vector<mb::member_id> drain_order(const mb::roster& r) const;
  /// Seat of a member (pp * tp > 1): (replica slot, stage, TP rank), or nullopt.
  std::optional<std::array<int, 3>> seat_of(mb::member_id id) const;
  /// The generation and step open now, if any.
  std::optional<std::pair<uint64_t, int64_t>> open_step() const;

 private:
  struct open_state {
    uint64_t generation = 0;
    int64_t step = 0;      ///< the open step (in a window: the first not yet committed)
    int64_t through = -1;  ///< last step of the commit window; -1: none (commit by result)
    /// In a window: the last step each member voted applied, and the loss of each step.
    std::map<mb::member_id, int64_t> reached;
    std::map<int64_t, double> loss_rows_at;
    int32_t donor = -1;
    int64_t restore = -1;                          ///< a rollback to this step's checkpoint
    double sent_s = 0;                             ///< when step_open last went out
    std::map<mb::member_id, bool> votes;           ///< members expected; true once voted ok
    std::map<mb::member_id, net::step_open> sent;  ///< what each member was sent (resends)
    double loss_rows = 0;
    int64_t rows = 0;
    std::vector<int32_t> point_ring;  ///< a vote's point_ring at a point's step
  };
  /// Keeps V's point_ring in the open step when it is a ring of the step's ranks.
  void note_point_ring(const net::step_vote& v);

  job_actions try_open(const mb::roster& r, double now_s);
  /// pp * tp > 1: the opens of a step over the whole replicas (docs/pipeline.md,
  /// "Elasticity"), or why it waits (note) / cannot run (failed).
  bool open_hybrid(const mb::roster& r, double now_s, job_actions& out,
                   std::map<mb::member_id, net::step_open>& opens);
  /// Gives every member without one a seat (d, p, t): the free seat of the most nearly whole
  /// replica, so a joiner completes a broken replica first. Seats are kept for life.
  void assign_seats(const mb::roster& r);
  void abort_open(const mb::roster& r, const std::string& why, job_actions& out);
  /// Step STEP of the open step or window committed with mean LOSS: its members hold the
  /// next step now; the report, the counters, OUT's progress.
  void commit(const mb::roster& r, int64_t step, double loss, double now_s, job_actions& out);
  /// A vote marked applied (a commit window): the steps every member applied commit.
  job_actions on_applied(const mb::roster& r, const net::step_vote& v, double now_s);
  /// The last step a window opened at next_step_ may run to, or -1 for no window.
  int64_t window_end() const;
  /// Steps open in commit windows: pp = tp = 1, fault_tolerance.commit_window > 0, and the
  /// optimizer state not sharded (train.zero: a step every member applies by the result, so
  /// that no member is a step ahead of a shard's other holder: docs/sharding.md).
  bool windows() const {
    return cfg_.fault_tolerance.commit_window > 0 && seat_size_ == 1 && cfg_.train.zero == 0;
  }

  config cfg_;
  std::string yaml_;
  std::string hash_;
  std::string resume_;  ///< checkpoint every worker loads first (empty: fresh start)
  uint64_t job_id_ = 0;
  bool trace_ = false;  ///< workers record trace spans (job_spec.trace)
  int64_t steps_ = 0;
  int64_t next_step_ = 0;
  int64_t start_step_ = 0;
  int64_t units_per_sample_ = 1;            ///< tokens per sample for a language model, else 1
  std::map<mb::member_id, int64_t> ready_;  ///< member -> first step its state lacks
  /// The generation and ranks (member -> rank) the last step (pp = tp = 1) opened with:
  /// while joiners load the job, the group goes on with them (stepping_without_joiners).
  struct stepped_with {
    uint64_t generation = 0;
    std::map<mb::member_id, int> ranks;
  } stepped_;
  /// R, less its members still loading the job, at the last step's generation: when R is
  /// the last step's members (same ranks, each ready) plus joiners not yet ready, the group
  /// steps on over its links and the joiners enter at the first boundary once ready.
  std::optional<mb::roster> stepping_without_joiners(const mb::roster& r) const;
  /// Opens the next step on S (stepping_without_joiners of the roster R).
  job_actions open_step_on(const mb::roster& r, const mb::roster& s, double now_s);
  /// The names of the members a step runs with (its votes' keys).
  static std::set<std::string> names_of(const mb::roster& r,
                                        const std::map<mb::member_id, bool>& votes);
  /// train.balance's shares for a step over S's members (their ranks); a new plan is noted
  /// in OUT and the events table (training_job_open.cpp).
  std::vector<int32_t> shares_for_step(const mb::roster& s, double now_s, job_actions& out);
  /// A vote's compute time, for the balancer's speeds (the open step's count for its member).
  void measure(const net::step_vote& v);
  /// A commit window was aborted: its members stand at different steps. The next step
  /// opens once each has said where (worker_ready), at the newest of them.
  bool resync_ = false;
  /// take_over: the run was training before this leader, so a wait for workers is a pause
  /// (elastic.pause_timeout_ms) from its start, not the run's first formation.
  bool took_over_ = false;
  /// Whether a wait for workers now is a pause that elastic.pause_timeout_ms bounds.
  bool was_training() const { return first_open_s_ >= 0 || took_over_; }
  /// A member whose error-feedback memory is needed was lost: the next open rolls back.
  bool rollback_ = false;
  checkpoint_lookup checkpoints_;
  /// Rollbacks restore error feedback: bitwise mode, memory kept, checkpoints or rollback
  /// points in memory on, pp = tp = 1.
  bool rolls_back() const;
  /// fault_tolerance.memory_every: the newest rollback point every member of its step took
  /// (its step committed), with the members' ranks then (-1: none yet).
  struct point_held {
    int64_t step = -1;
    int replicas = 0;
    std::map<mb::member_id, int> ranks;
    /// The point's ring (its votes' point_ring): the copy of rank RING[P]'s error memory is
    /// at rank RING[P + 1] (ranks of then). Empty: the ranks' order.
    std::vector<int32_t> ring;
  } point_;
  bool keeps_points() const { return rolls_back() && cfg_.fault_tolerance.memory_every > 0; }
  /// For a rollback to point_ with the members of R: for each part p of its error memory,
  /// the rank in R of a member holding it (p's own member, else its successor, which kept a
  /// copy); nullopt when a part's two holders are both gone.
  std::optional<std::vector<int32_t>> point_holders(const mb::roster& r) const;
  /// The rollback the next open carries (rollback_ set): the step every member goes back to
  /// (-1: none, training goes on without the lost memory), with PARTS the holders of a
  /// point's error memory when it is a point in memory (empty: a checkpoint); notes in OUT.
  /// Sets next_step_ to it. (training_job_rollback.cpp)
  int64_t roll_back(const mb::roster& r, std::vector<int32_t>& parts, job_actions& out);
  std::optional<open_state> open_;
  int replicas_ = 0;
  double first_open_s_ = -1;
  int min_workers() const;
  /// [waiting] (T18, T20): since when training waits below min_workers, and whether the
  /// operator was told what it waits for.
  struct waiting_state {
    double paused_since_s = -1;  ///< -1: not paused
    bool noted = false;
  };
  waiting_state waiting_;
  /// T19's guard: aborts in a row since the last commit, and those among them whose vote
  /// said a peer's data-plane address could not be connected (a route does not appear by
  /// retrying).
  struct abort_streak {
    int aborts = 0;
    int unreachable = 0;
  };
  static constexpr int max_consecutive_aborts = 50;
  static constexpr int max_unreachable_attempts = 3;
  abort_streak streak_;
  /// [reporting] (T8, T15..T17, T25): the last step's commit, sent again to members that
  /// have not reported, and the members whose final report is in.
  struct reporting_state {
    std::optional<net::step_result> last_commit;
    double last_commit_sent_s = 0;
    std::set<mb::member_id> reported;
  };
  reporting_state reporting_;
  bool finished_ = false;  ///< [done]
  /// stop_early: asked (by whom, when); the end (steps_) moves to the next step opened + 1
  /// as it opens (settle_end).
  struct early_stop {
    bool asked = false;
    std::string by;
    double at_s = 0;
  } early_;
  /// With a stop asked: the step about to open (next_step_) is the last.
  void settle_end();
  fault_schedule faults_;
  std::set<mb::member_id> drained_;              ///< members that left by drain (not "departed")
  std::map<mb::member_id, double> spec_sent_s_;  ///< members not ready: when the job went out
  int seat_size_ = 1;                            ///< pp * tp: workers of one replica
  std::map<mb::member_id, int> seat_;            ///< member -> d * seat_size_ + p * tp + t
  std::set<mb::member_id> last_voters_;          ///< members of the last committed step
  run_report report_;
  balancer balance_;  ///< train.balance (off: equal shares)
  void resend(const mb::roster& r, double now_s, job_actions& out);
  /// The job's progress and R's generation at NOW_S, for the report.
  int64_t first_unopened() const {
    return open_ ? std::max(open_->step, open_->through) + 1 : next_step_;
  }
  job_moment moment(const mb::roster& r, double now_s) const {
    return job_moment{progress(), r.generation, now_s};
  }
  /// The roster a step runs on (or a new generation) to the report, its lines into OUT.
  void track_membership(const mb::roster& r, double now_s, job_actions& out);
};

}  // namespace cohort::step
