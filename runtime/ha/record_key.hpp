// The run's records in etcd, sealed: every value cohort writes there that steers the job
// (the leader, the end of the run, faults added or carried out, the job id, the events,
// the candidates) carries an HMAC-SHA256 under the run's record key, over the etcd key
// name and the value, and is opened (checked) before it is acted on. It owns the key (made,
// loaded, derived), the record's encoding and how a refused record is logged; which records
// exist is runtime/ha/ha_candidate's.
#pragma once
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "runtime/core/log_limiter.hpp"

namespace cohort::ha {

/// A record as read: its value when its seal holds, else why not.
struct opened_record {
  std::optional<std::string> value;  ///< set when the record is the job's
  std::string problem;               ///< why it is not (when value is empty)
};

/// The secret that seals a run's records. Whoever holds it can write records the run acts
/// on: only the run's coordinators (and the launcher, which reads the leader) hold it.
class record_key {
 public:
  /// At least 32 bytes of secret; usage_error otherwise.
  explicit record_key(std::string secret);

  /// The key of a run whose coordinators hold CURVE keys: derived from the coordinator's
  /// secret key (Z85), which every candidate of the run loads anyway and no worker holds.
  static record_key from_coordinator_secret(const std::string& secret_z85);
  /// The key in FILE (64 hex characters, as write_new writes it). usage_error naming the
  /// file and the fix when it is missing, malformed, or readable by group or others.
  static record_key load(const std::string& file);
  /// Writes a fresh random key (OpenSSL RAND_bytes) to FILE, 0600, never over an existing
  /// file (usage_error naming it).
  static void write_new(const std::string& file);

  /// NAME's record holding VALUE: "cohort-rec-v1 " + 64 hex of the HMAC + " " + VALUE. The
  /// MAC covers NAME, so a record moved under another key does not open.
  std::string seal(const std::string& name, const std::string& value) const;
  /// RECORD read under NAME: its value when sealed by this key for NAME.
  opened_record open(const std::string& name, const std::string& record) const;

 private:
  std::string mac(const std::string& name, const std::string& value) const;
  std::string secret_;
};

/// Says a refused record once: the first refusal of each (key, revision) is logged as a
/// warning, at most one line per PERIOD (log_limiter: the ones held back are counted in the
/// next line), so a stranger writing in a loop cannot flood the log. Thread-safe.
class refusal_log {
 public:
  explicit refusal_log(std::chrono::milliseconds period = std::chrono::milliseconds(1000))
      : limiter_(log_limiter::options{1, period}) {}
  /// WHO (e.g. "coordinator") refuses KEY at REVISION for WHY.
  void refuse(const char* who, const std::string& key, long long revision, const std::string& why);
  /// How many refusals were logged (tests).
  long long logged() const;

 private:
  mutable std::mutex mu_;
  log_limiter limiter_;
  std::map<std::string, long long> seen_;  // key -> revision refused last
  long long logged_ = 0;
};

}  // namespace cohort::ha
