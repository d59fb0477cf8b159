// One coordinator candidate of a run with standbys (ha.standbys >= 1): while it stands by,
// it binds its endpoint and answers every registration with the leader's endpoint and term
// (register_reject.standby), campaigns for the run's etcd key, and keeps a presence record
// so that the leader can list its standbys. Once it leads, it hands the endpoint to the
// coordinator proper (coordinator_node, bound again at the same address) and keeps the
// run's small records in etcd: the job's id, the coordinator faults already carried out,
// the failovers and the end of the run. Every record it writes is sealed with the run's
// record key and every record it reads is opened before it is acted on: a record that does
// not open (a stranger's) is logged once and ignored, and a leader record that does not open
// is deleted so that the run's candidates can campaign. Leadership, terms and fencing are
// runtime/ha/election's; what a leader does is the coordinator's (docs/architecture.md,
// "Coordinator standbys"); what holds against whom is docs/security.md's.
//
//   start --bind, print endpoint--> STANDBY --won the key (term T)--> LEADER --run over--> done
//                                     |  ^ registrations answered            |
//                                     |  | with the leader's endpoint        | lease lost
//                                     v  |                                   v
//                                 run over (done record): exit 0        exit 75 (deposed:
//                                                                        launch restarts it
//                                                                        as a standby)
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/core/faults.hpp"
#include "runtime/ha/election.hpp"
#include "runtime/ha/etcd_client.hpp"
#include "runtime/ha/record_key.hpp"
#include "runtime/net/curve.hpp"
#include "runtime/net/zmq_bridge.hpp"

namespace cohort::ha {

/// Exit code of a coordinator that lost its leadership (its lease ran out or was revoked).
inline constexpr int exit_deposed = 75;

struct ha_candidate_options {
  std::vector<std::string> etcd;  ///< client URLs of the etcd cluster
  std::string name;               ///< the run's name: its keys live under /cohort/NAME/
  int ttl_s = 1;                  ///< the leader's lease (ha.lease_ttl_s)
  std::string bind;               ///< endpoint to bind (the same one again as leader)
  size_t max_message_bytes = 64u << 20;
  std::shared_ptr<const net::server_keys> keys;
  std::shared_ptr<const ha::record_key> record_key;  ///< seals and opens the run's records
  ha::etcd_tls tls;  ///< the client certificate for https endpoints (empty: http only)
};

/// What a leader learns of the run from etcd when it takes over.
struct ha_run_record {
  std::optional<uint64_t> job_id;         ///< set: an earlier leader led this run
  std::vector<std::size_t> fired;         ///< coordinator faults already carried out
  std::optional<int64_t> fault_at_ns;     ///< when the last one was (CLOCK_REALTIME)
  std::vector<nlohmann::json> events;     ///< earlier leaders' events, failovers among them
  std::vector<std::string> added_faults;  ///< faults `ctl inject` added, in order
  std::vector<faults::fault_fired> worker_faults; ///< worker faults that acted (job_actions)
  std::optional<std::string> stop;        ///< a stop with a checkpoint asked (by whom)
};

class ha_candidate {
 public:
  /// Binds the endpoint and starts standing by. Throws io_error / usage_error.
  explicit ha_candidate(ha_candidate_options o);
  ~ha_candidate();
  ha_candidate(const ha_candidate&) = delete;
  ha_candidate& operator=(const ha_candidate&) = delete;

  /// The endpoint bound (real port): the same as a standby and as the leader.
  const std::string& endpoint() const { return endpoint_; }
  /// Blocks until this candidate leads (true), or stop_waiting() was called or the run is
  /// over (false; run_over() says which). The standby's bridge is closed before it returns
  /// true, so the coordinator can bind the endpoint.
  bool wait_for_leadership();
  /// Ends wait_for_leadership (thread-safe; e.g. from a signal thread).
  void stop_waiting() { quit_ = true; }
  bool run_over() const { return done_.load(); }
  int64_t term() const { return election_->term(); }
  ha::leader_election& election() { return *election_; }

  /// The run's records (read once, right after winning).
  ha_run_record read_run();
  /// This leader starts the run: records its job id (fenced). False if deposed meanwhile.
  bool record_job(uint64_t job_id);
  /// Coordinator fault I is carried out now (fenced; before it acts). False if deposed.
  bool record_fault(std::size_t index);
  /// Records worker faults that acted (fenced, as record_fault): false when deposed.
  bool record_worker_faults(const std::vector<faults::fault_fired>& fired);
  /// A fault `ctl inject` added (SPEC), after those read_run found: the next leader adds it
  /// too. False when this candidate no longer leads; throws cohort::error when etcd fails.
  bool record_added_fault(const std::string& spec);
  /// `ctl scale` (SPEC) is about to act: recorded (fenced, the newest only) so that only the
  /// leader acts on it. False when this candidate no longer leads; throws cohort::error when
  /// etcd fails.
  bool record_scale(const std::string& spec);
  /// A stop with a checkpoint (fault_tolerance.on_sigterm, `ctl stop --checkpoint`), asked
  /// BY, is about to act: recorded (fenced) so that a leader taking over mid-stop carries
  /// it out too. False when this candidate no longer leads; throws cohort::error when etcd
  /// fails.
  bool record_stop(const std::string& by);
  /// The stop is carried out (its checkpoint is complete): its record goes, so that a
  /// resumed run under the same name is not stopped again. Failures are logged.
  void clear_stop();
  /// This leader's events so far (the job's, in the summary's form) and its own failover:
  /// kept in etcd, one record per term, for the leaders after it. Written in the
  /// background (the step is not held up), fenced, the newest only.
  void record_events(nlohmann::json job_events);
  void record_failover(nlohmann::json event);
  /// This leader's failover event, once recorded.
  std::optional<nlohmann::json> failover() const {
    std::lock_guard<std::mutex> lock(mu_);
    return failover_;
  }
  /// The run ended: every candidate that still stands by exits (fenced).
  void record_done();
  /// status_reply.coordinator: {"leader", "term", "pid", "standbys": [endpoints]}.
  std::string status_json() const;

 private:
  /// How long a starting candidate waits for etcd to answer before it gives up.
  static constexpr int etcd_patience_s = 10;
  void wait_for_etcd();
  void stand_by_loop();
  void answer(const std::string& peer, const net::message& m);
  std::string key(const std::string& rest) const { return "/cohort/" + o_.name + "/" + rest; }
  // Sealed writes of the run's records: plain, and fenced by our term.
  void put_sealed(const std::string& k, const std::string& value, int64_t lease = 0);
  bool fenced_sealed(const std::string& k, const std::string& value);
  // KV's value when its seal holds under its own key name; otherwise refused (logged once).
  std::optional<std::string> opened(const ha::kv& kv);
  // Whether the run is over: a done record that opens.
  bool done_recorded();
  // The leader's endpoint as its record names it; a leader record that does not open is
  // deleted (unless it changed meanwhile) and names nobody.
  std::string verified_leader(const std::optional<ha::leader_info>& leader);

  ha_candidate_options o_;
  std::unique_ptr<ha::etcd_client> client_;
  std::unique_ptr<ha::leader_election> election_;
  std::unique_ptr<net::zmq_bridge> standby_;
  std::atomic<net::zmq_bridge*> standby_out_{nullptr};  // the bridge thread's view of it
  std::string endpoint_;
  std::atomic<bool> done_{false};
  std::atomic<bool> leading_{false};
  std::atomic<bool> stopping_{false};  // set under mu_ (the events writer waits on it)
  std::atomic<bool> quit_{false};      // wait_for_leadership gives up: stopped, or run over
  mutable std::mutex mu_;
  std::string leader_endpoint_;  // guarded by mu_: as etcd names it now
  int64_t leader_term_ = 0;
  std::vector<std::string> standbys_;
  int64_t presence_lease_ = 0;  // this candidate's presence record's lease
  std::thread watcher_;         // keeps the leader, the standbys and our presence fresh
  void publish_events();        // with mu_ held: hands the newest events to the writer
  nlohmann::json job_events_ = nlohmann::json::array();  // guarded by mu_
  std::optional<nlohmann::json> failover_;               // guarded by mu_
  std::string events_pending_;    // guarded by mu_: the newest events not yet written
  std::string events_written_;    // guarded by mu_: the last events handed over
  std::size_t added_faults_ = 0;  // faults ctl added so far in this run (read_run, then ours)
  ha::refusal_log refusals_;
  std::condition_variable events_cv_;
  std::thread events_writer_;
};

/// CLOCK_REALTIME in ns: the one clock two coordinators of a host share (failover times).
int64_t ha_now_realtime_ns();

}  // namespace cohort::ha
