// The job's keys as `cohort launch` holds them: --keys DIR (written there when DIR holds
// none), else a fresh set in a private folder removed when launch exits; --insecure: none.
// Owns that folder's life and launch's own (launcher) key; not what the keys admit
// (runtime/net/curve.hpp, docs/security.md).
#pragma once
#include <memory>
#include <string>

#include "runtime/net/curve.hpp"

namespace cohort::cli {

class launch_keys {
 public:
  /// Prints where the keys are (ctl needs them), or with INSECURE the warning that anyone
  /// who reaches BIND can join; unsets COHORT_KEYS then, so no child picks keys up.
  launch_keys(const std::string& keys_option, bool insecure, const std::string& bind);
  ~launch_keys();
  launch_keys(const launch_keys&) = delete;
  launch_keys& operator=(const launch_keys&) = delete;

  /// The keys' folder; empty with --insecure.
  const std::string& dir() const { return dir_; }
  /// Launch's own key (role launcher); null with --insecure.
  const net::client_keys* client() const { return client_.get(); }

 private:
  std::string dir_;
  bool temporary_ = false;
  std::unique_ptr<net::client_keys> client_;
};

}  // namespace cohort::cli
