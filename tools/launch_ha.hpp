// `cohort launch` with coordinator standbys (ha.standbys >= 1): the etcd of the run
// (ha.etcd: local starts one in a private folder; a list names an existing cluster), the
// run's name in it, the leader as etcd names it (launch's client follows it), and a dead
// leader's lease revoked the moment launch sees its process exit, so a standby takes over
// without waiting for the lease to run out.
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

namespace cohort::cli {

class launch_ha {
 public:
  /// Starts the run's etcd (ha.etcd: local) and names the run. Throws io_error / error.
  explicit launch_ha(const config& cfg);
  /// Stops the etcd it started and removes its folder.
  ~launch_ha();
  launch_ha(const launch_ha&) = delete;
  launch_ha& operator=(const launch_ha&) = delete;

  const std::vector<std::string>& etcd_urls() const { return urls_; }
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
  std::string name_;
  std::string dir_;  // the local etcd's folder (empty: an existing cluster)
  std::unique_ptr<ha::local_etcd> etcd_;
  std::vector<std::string> urls_;
  std::unique_ptr<ha::etcd_client> client_;
  std::unique_ptr<ha::leader_election> watch_;  // observes and deposes; never campaigns
};

}  // namespace cohort::cli
