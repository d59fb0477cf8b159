// The run's report: the event table (injected faults and membership changes, with when each
// was detected and recovered from) and the summary JSON (cohort train's keys plus the time
// split per worker, the events and, with pp * tp > 1, the pipeline's stages). It observes
// the training job: runtime/step/training_job.cpp calls one method per thing it did, and reads
// nothing back to decide. Pure: no clock, no sockets; times are the job's coordinator clock.
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "runtime/core/config.hpp"
#include "runtime/net/membership.hpp"
#include "runtime/net/protocol.hpp"

namespace cohort::step {

namespace mb = net::membership;

/// Where a fault's time went (kill, hang, partition): the coordinator's stamps from the
/// fault's order to the first committed step with the victim's replacement (a respawn under
/// the same name) voting in it. -1: not (yet) reached. Each part is the time from the
/// stamp before it in time order (a respawn can register before the survivors' rerun
/// commits), so the parts sum to whole_ms.
struct fault_cost {
  double removed_s = -1;     ///< the roster without the victim (detection)
  double recovered_s = -1;   ///< the first commit after the fault (recover_ms)
  double registered_s = -1;  ///< the replacement joined the roster (respawn, registration)
  double ready_s = -1;       ///< the replacement loaded the job (worker_ready)
  double entered_s = -1;     ///< the first step with the replacement opened
  double whole_s = -1;       ///< that step committed: the group is whole again
  int aborted_at_order = 0;  ///< the run's aborted steps when the fault was ordered
  int aborted = 0;           ///< steps aborted between the order and whole_s
  int64_t steps = 0;         ///< steps committed between the order and whole_s
  double stalled_ms = 0;     ///< time with no step open (from a commit or abort to the next open)
  double transfer_ms = -1;   ///< the replacement's state transfer (inside the entering step)
  double step_ms = -1;       ///< the run's median committed step time when whole
  /// Who took the victim's seat: its respawn (same name) or a spare / joiner (run_report's
  /// roster_seen); empty until registered_s.
  std::string replacement;
};

/// One line of the run's event table: an injected fault or a membership change.
struct job_event {
  std::string kind;    ///< kill, hang, slow, partition, departed, joined, drained, scale, reshard, regroup, ...
  std::string worker;  ///< name
  int64_t step = 0;
  uint64_t generation = 0;
  double at_s = 0;         ///< when it happened (coordinator clock)
  double detect_ms = -1;   ///< fault -> coordinator removed the member (-1: n/a)
  double recover_ms = -1;  ///< fault -> next committed step (-1: not yet / n/a)
  std::string detail;
  double transfer_mb_s = -1;  ///< joined: state received from the donor, MB/s (-1: none)
  int target = 0;             ///< scale: the member count asked for; reshard: the members
  uint64_t bytes = 0;         ///< reshard: bytes the members received in it, all together
  fault_cost cost;            ///< kill, hang, partition: where its time went
};

/// COST's parts in ms (detect, rerun, respawn, load, admit, enter: each from the stamp
/// before it in time order), with whole_ms (order -> whole) and what else is known; null for a part
/// not reached. AT_S: the fault's order.
nlohmann::json cost_json(const fault_cost& cost, double at_s);

/// Where in the run something happened: the job's next step and the roster's generation.
struct job_moment {
  int64_t step = 0;
  uint64_t generation = 0;
  double now_s = 0;
};

/// One committed step as the summary's loss curve holds it.
struct curve_point {
  int64_t step = 0;  ///< steps done after this commit
  double t_s = 0;    ///< since the job's first step opened
  double loss = 0;
  double step_s = 0;         ///< since the step opened (or the previous commit, in a commit window)
  double samples_per_s = 0;  ///< over the last (up to) 10 steps
  int replicas = 0;
  double ettr = -1;  ///< the run's ETTR after this commit (run_report::ettr; not in to_json)
};

/// A curve point as the summary's "curve" holds it (`cohort plot` reads these keys); `cohort
/// train` writes its curve with the same function.
nlohmann::json to_json(const curve_point& p);

/// A held-out evaluation a worker ran (telemetry).
struct eval_point {
  int64_t step = 0;
  double t_s = 0;
  double loss = 0;
  double accuracy = -1;  ///< -1: none (a language model)
};

/// What else watches the run as the report records it: the coordinator's trace and
/// metrics (runtime/step/job_telemetry.hpp). Times are the job's coordinator clock, in seconds.
class job_watch {
 public:
  virtual ~job_watch() = default;
  virtual void step_opened(int replicas, double now_s) {}
  virtual void step_aborted(double now_s) {}
  virtual void step_committed(const curve_point& p, double opened_s, double now_s) {}
  /// WHAT: "fault" (ordered), "detected", "recovered", "departed", "joined", "drained",
  /// "scale" (asked), for event E.
  virtual void event(const std::string& what, const job_event& e, double now_s) {}
  virtual void generation(uint64_t generation, int members, double now_s) {}
  virtual void vote(const std::string& worker, const net::step_timing& t) {}
  virtual void eval(const eval_point& e) {}
  /// WORKER's telemetry (its trace spans, on its own clock, with the offset to ours).
  virtual void telemetry(const std::string& worker, const net::telemetry& t, double now_s) {}
  /// train.balance's figures after a plan (balancer::json: shares and samples/s by worker).
  virtual void balance(const nlohmann::json& j) {}
};

class run_report {
 public:
  /// The report of a run of CFG that starts at START_STEP (0, or its checkpoint's step).
  run_report(const config& cfg, int64_t start_step);

  // ---- what the job did, in the order it did it ----

  /// The roster moved to GENERATION, of MEMBERS workers, at NOW_S (the coordinator's clock).
  void generation_seen(uint64_t generation, int members, double now_s);
  /// A step runs on roster R: members gone since the last roster are departures (or the
  /// detection of an injected kill / hang / partition), new ones joins, each with a line in
  /// NOTES. Before the first step (RUNNING false) only detections count; DRAINED members
  /// left by drain and are no departure.
  void roster_seen(const mb::roster& r, const job_moment& at, bool running,
                   const std::set<mb::member_id>& drained, std::vector<std::string>& notes);
  /// A step opened with REPLICAS data-parallel replicas.
  void step_opened(int replicas, double now_s);
  /// The step just opened runs with the workers NAMES (a replacement's entry).
  void step_members(const std::set<std::string>& names, double now_s);
  /// WORKER loaded the job and is ready to step (worker_ready).
  void member_ready(const std::string& worker, double now_s);
  /// The open step aborted.
  void step_aborted();
  /// Fault KIND (kill, hang, slow, partition) ordered to WORKER on its first step, as SPEC.
  void fault_ordered(const std::string& kind, const std::string& worker, const std::string& spec,
                     const job_moment& at);
  /// WORKER was drained: it leaves at the next step boundary.
  /// A decision of the job about its members: KIND "balance" (train.balance re-planned the
  /// shares; DETAIL: who gets how many, at what speed) or "straggler" (WORKER is drained;
  /// DETAIL: why).
  void decided(const std::string& kind, const std::string& worker, const std::string& detail,
               const job_moment& at);
  void drain_asked(const std::string& worker, const job_moment& at);
  /// A scale to TARGET members was asked for (ctl scale or a scale fault, SPEC): recovered
  /// at the first committed step with TARGET members.
  void scale_asked(int target, const std::string& spec, const job_moment& at);
  /// The run was asked to stop early with a checkpoint (training_job::stop_early) by BY
  /// (SIGTERM, ctl, or the worker whose SIGTERM asked), at STEP: a "stop" event, BY its
  /// worker.
  void stop_asked(const std::string& by, int64_t step, double now_s);
  /// The stop's last step opened: the run ends at END (its checkpoint's step).
  void stop_settled(int64_t end);
  /// Every member reported after the run's last step, END (the checkpoint is written): the
  /// stop event's recover_ms is the time since it was asked.
  void stop_done(int64_t end, double now_s);
  /// WORKER voted ok; T: its step's timing (a joiner's state transfer from the donor).
  void vote_counted(const std::string& worker, const net::step_timing& t);
  /// A step committed: STEPS_DONE steps done, LOSS its mean loss, VOTERS its members (in
  /// R). The events it recovers from get recover_ms, each with a line in NOTES.
  void step_committed(int64_t steps_done, double loss, const mb::roster& r,
                      const std::set<mb::member_id>& voters, double now_s,
                      std::vector<std::string>& notes);
  /// Member M's final report.
  void report_received(const mb::member& m, const net::train_report& rep);
  /// WORKER's telemetry: an evaluation it ran, and its trace spans for the watch.
  void telemetry_seen(const std::string& worker, const net::telemetry& t, double now_s);
  /// A held-out evaluation after STEP steps (a worker's telemetry); ACCURACY -1: none.
  void eval_seen(int64_t step, double loss, double accuracy, double now_s);
  /// Who else sees what the report records (null: nobody).
  void set_watch(std::shared_ptr<job_watch> w) { watch_ = std::move(w); }
  /// Whether a watch is set (its figures need building only then).
  bool watched() const { return watch_ != nullptr; }
  /// Shows the watch train.balance's figures (after each plan).
  void balance_seen(const nlohmann::json& j) {
    if (watch_) watch_->balance(j);
  }
  /// The job drops control frames (drop control): the summary counts them.
  void drops_control() { drops_control_ = true; }
  /// The coordinator dropped a frame for drop control.
  void frame_dropped() { ++dropped_frames_; }

  // ---- what the report holds ----

  const std::vector<job_event>& events() const { return events_; }
  /// The events as the summary's "events" holds them.
  nlohmann::json events_json() const;
  const std::vector<curve_point>& curve() const { return curve_; }
  const std::vector<eval_point>& evals() const { return evals_; }
  int aborted_steps() const { return aborted_; }
  uint64_t dropped_frames() const { return dropped_frames_; }
  /// The run as JSON: cohort train's summary keys plus per-worker time split, bytes,
  /// overlap, the DP size and the number of aborted steps. Valid once every report is in.
  nlohmann::json summary(double wall_s) const;
  /// model.moe: the summary's "moe" block (docs/moe.md).
  nlohmann::json moe_summary() const;
  /// Effective training time ratio so far: the committed steps' time over the time since
  /// the first step opened (-1 before the first commit).
  double ettr() const;
  /// The run as `cohort ctl status` shows it now: the running ETTR, steps and samples per second
  /// over the last steps, the mean split of a worker's step (compute, comm wait, idle) over the
  /// last votes, and the last few events.
  nlohmann::json live() const;
  /// pp * tp > 1: per stage compute, bubble and activation memory, with the theoretical
  /// bubble (P-1)/(M+P-1) beside the measured one.
  nlohmann::json pipeline_summary() const;

 private:
  struct report {
    std::string name;
    int rank = -1;
    net::train_report r;
  };

  /// At a commit: the re-cut of sharded state (train.zero) the step's voters reported, as
  /// one "reshard" event (its recover_ms: the longest member's re-cut).
  void reshard_committed(int64_t steps_done, double now_s);
  /// At a commit or an aborted step: one "regroup" event at STEP for the NCCL DP group's
  /// rebuild its voters reported (how: shrink or new init; its recover_ms: the longest
  /// member's rebuild); none when nobody reported one.
  void regroup_event(int64_t step, double now_s);
  /// The median step_s of the last (up to) 256 committed steps (0: none).
  double median_step_s() const;
  job_event& add_event(const std::string& kind, const std::string& worker, const job_moment& at,
                       const std::string& detail = {}, double detect_ms = -1, int target = 0);

  config cfg_;
  int64_t start_step_ = 0;
  int64_t steps_done_ = 0;
  int64_t units_per_sample_ = 1;  ///< tokens per sample for a language model, else 1
  int seat_size_ = 1;             ///< pp * tp
  uint64_t generation_ = 0;
  int replicas_ = 0;
  int aborted_ = 0;
  double first_open_s_ = -1;
  double last_open_s_ = -1;
  double last_commit_s_ = 0;
  double last_now_s_ = 0;     ///< the latest time any call carried (for those that carry none)
  double step_time_s_ = 0;    ///< the committed steps' step_s, summed (ettr())
  double last_close_s_ = -1;  ///< the last commit or abort (a fault's stalled_ms counts from it)
  std::vector<curve_point> curve_;
  std::deque<net::step_timing> recent_votes_;  ///< the last votes' timing (live())
  std::vector<eval_point> evals_;
  std::shared_ptr<job_watch> watch_;
  double last_loss_ = 0;
  bool drops_control_ = false;
  uint64_t dropped_frames_ = 0;
  std::vector<job_event> events_;
  std::map<mb::member_id, std::string> last_members_;  ///< roster of the last step seen
  std::map<mb::member_id, report> reports_;
  /// The re-cut the open step's voters reported so far (train.zero).
  struct {
    int members = 0;
    uint64_t bytes = 0;
    double ms = 0;
  } reshard_;
  /// The NCCL DP group's rebuild the open step's voters reported so far (comm.backend: nccl).
  struct {
    int members = 0;
    uint64_t path = 0;  ///< net::step_timing::regroup_path, the highest reported
    double ms = 0;
  } regroup_;
};

}  // namespace cohort::step
