// `cohort launch` with coordinator standbys (ha.standbys >= 1): the etcd of the run
// (ha.etcd: local starts one in a private folder, reachable with the client certificate
// made there only; a list names an existing cluster, https ones reached with the key
// folder's certificate), the run's name in it, its record key, the leader as its sealed
// record names it (launch's client follows it), and a dead leader's lease revoked the moment
// launch sees its process exit, so a standby takes over without waiting for the lease.
#pragma once
#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/core/config.hpp"
#include "runtime/ha/election.hpp"
#include "runtime/ha/etcd_client.hpp"
#include "runtime/ha/local_etcd.hpp"
#include "runtime/ha/record_key.hpp"

namespace cohort::cli {

class launch_ha {
 public:
  /// Starts the run's etcd (ha.etcd: local) and names the run. KEYS_DIR: the job's key
  /// folder (empty with --insecure): the record key is derived from its coordinator.key and
  /// an https etcd's client certificate is read from it; without it a fresh record key is
  /// written into the private folder. Throws io_error / usage_error.
  launch_ha(const config& cfg, const std::string& keys_dir);
  /// Stops the etcd it started and removes its folder.
  ~launch_ha();
  launch_ha(const launch_ha&) = delete;
  launch_ha& operator=(const launch_ha&) = delete;

  const std::vector<std::string>& etcd_urls() const { return urls_; }
  /// What every coordinator of the run is started with: --ha-etcd, --ha-name, and where
  /// the private folder holds them, --ha-tls and --ha-record-key.
  std::vector<std::string> coordinator_args() const;
  const std::string& name() const { return name_; }
  /// A free TCP port on 127.0.0.1, as an endpoint (a standby's, known before it starts).
  static std::string free_endpoint();

  struct leader {
    std::string endpoint;
    int64_t pid = 0;
    int64_t term = 0;
  };
  /// The leader now; nullopt while none leads or etcd cannot be reached (a warning says so).
  std::optional<leader> leader_now();
  /// Coordinator PID exited: if it led, its lease is revoked now; whether it led.
  std::optional<int64_t> depose_if_leader(pid_t pid);

 private:
  // The constructor's work once the private folder exists.
  void start(const config& cfg, const std::string& keys_dir);

  std::string name_;
  std::string dir_;  // private (0700): the local etcd's data and TLS files, a record key
  std::unique_ptr<ha::local_etcd> etcd_;
  std::vector<std::string> urls_;
  std::string tls_dir_;          // passed as --ha-tls (empty: the coordinators' --keys)
  std::string record_key_file_;  // passed as --ha-record-key (empty: from coordinator.key)
  std::unique_ptr<ha::record_key> record_key_;
  ha::refusal_log refusals_;
  std::unique_ptr<ha::etcd_client> client_;
  std::unique_ptr<ha::leader_election> watch_;  // observes and deposes; never campaigns
};

}  // namespace cohort::cli
