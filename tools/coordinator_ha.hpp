// `cohort coordinator` with standbys (ha.standbys >= 1): standing by until this candidate
// leads, what a new leader takes from etcd (the job's id, the coordinator faults already
// carried out, the failovers so far), carrying out coordinator faults on itself, and the
// failover's event (fault to the new leader's first commit). The candidate itself is
// runtime/ha/ha_candidate.hpp.
#pragma once
#include <atomic>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "actors/coordinator.hpp"
#include "runtime/ha/ha_candidate.hpp"
#include "runtime/core/config.hpp"

namespace cohort::cli {

/// What `cohort coordinator`'s command line says of the run's etcd (launch passes it all).
struct ha_flags {
  std::vector<std::string> etcd;  ///< --ha-etcd (empty: ha.etcd's list)
  std::string name;               ///< --ha-name (empty: run-<config hash>)
  /// --ha-tls: the folder with etcd-ca.crt, etcd-client.crt and etcd-client.key for https
  /// endpoints (empty: the --keys folder).
  std::string tls_dir;
  /// --ha-record-key: the run's record key (empty: derived from --keys' coordinator.key).
  std::string record_key_file;
  std::string keys_dir;  ///< --keys
};

/// Binds BIND as a standby, prints "coordinator listening on EP", and waits until this
/// candidate leads: then its record of the run goes into RECORD and the candidate is
/// returned. Null when the run is over or SIGINT / SIGTERM came first. A leader that loses
/// its lease exits at once with actors::exit_deposed. usage_error when the run's record
/// key or the client certificate an https etcd needs cannot be found.
std::unique_ptr<ha::ha_candidate> stand_by(const config& c, const ha_flags& flags,
                                               const std::string& bind,
                                               std::shared_ptr<const net::server_keys> keys,
                                               ha::ha_run_record* record);

/// The leader's term, its status block and its coordinator faults, wired into CO. NODE is
/// the coordinator node once it exists (a partition cuts it off). FAILOVER_FROM_NS: when
/// this leader's predecessor went (its recorded fault; else this leader's election), kept
/// until the first commit makes the failover's event.
void ha_wire(ha::ha_candidate& cand, const ha::ha_run_record& record,
             actors::coordinator_options& co, std::atomic<actors::coordinator_node*>& node,
             std::optional<int64_t>& failover_from_ns);

/// The faults `ctl inject` added under earlier leaders, back into JOB (after set_faults,
/// before take_over).
void ha_added_faults(const ha::ha_run_record& record, step::training_job& job);

/// The run's job id: the one an earlier leader recorded, else FRESH, recorded now.
uint64_t ha_job_id(ha::ha_candidate& cand, const ha::ha_run_record& record, uint64_t fresh);

/// A step committed: the first one under a new leader ends its failover (recorded in etcd).
void ha_first_commit(ha::ha_candidate& cand, const step::job_actions& a,
                     std::optional<int64_t>& failover_from_ns);

/// The job's events changed (a fault, a join...): recorded in etcd for the next leaders.
void ha_events(ha::ha_candidate& cand, const step::training_job& job);

/// The summary gains every failover of the run (events) and the coordinator block.
void ha_summary(ha::ha_candidate& cand, const ha::ha_run_record& record,
                nlohmann::json& summary);

}  // namespace cohort::cli
