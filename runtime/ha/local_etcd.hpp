// One etcd server process for a run (`ha.etcd: local`): a single-member cluster on
// 127.0.0.1 with ports the OS picked, its data, log and TLS files in a private folder we are
// given. Both of its listeners speak TLS and admit only the client certificate made for it
// (etcd_certs), so another user of the host cannot reach it. It owns that process; it is not
// a cluster manager (no members, auth or backups), and it does not talk etcd's API beyond
// waiting for /health (etcd_client does).
#pragma once
#include <sys/types.h>

#include <string>

#include "runtime/ha/etcd_certs.hpp"

namespace cohort::ha {

/// How to start the server.
///
/// Timing defaults (heartbeat 10 ms, election 100 ms) suit one member on one machine: etcd
/// then honours a 1 s lease TTL and deletes an expired lease's keys 1.2-1.5 s after the last
/// keepalive, against a TTL raised to 2 s and 2.25-2.5 s with etcd's defaults (100/1000 ms),
/// and it is healthy ~0.1 s after start instead of ~1.1 s. Measured 2026-12-03, etcd 3.4.23,
/// the 2-core dev container: grant TTL 1, put a key on it, poll /v3/kv/range every 5 ms
/// until it is empty (6 runs each). etcd checks for expired leases every 500 ms, hence the
/// spread above the TTL.
struct local_etcd_options {
  /// Created if missing and made 0700; etcd's data in DIR/data, log DIR/etcd.log, the TLS
  /// files (etcd_certs.hpp's names) in DIR. Must not hold TLS files already.
  std::string dir;
  std::string binary;            ///< etcd executable; empty: /usr/bin/etcd, else `etcd` on PATH
  int heartbeat_ms = 10;         ///< --heartbeat-interval
  int election_ms = 100;         ///< --election-timeout (etcd wants >= 5 heartbeats)
  int start_timeout_ms = 10000;  ///< until /health says healthy
  int stop_grace_ms = 3000;      ///< after SIGTERM, before SIGKILL
};

/// The running server. Starts in the constructor, stops in stop() or the destructor.
/// The child carries PR_SET_PDEATHSIG(SIGKILL): the kernel kills it when the thread that
/// constructed this object ends (construct it on a thread that lives as long as the run,
/// e.g. the main thread), so even a SIGKILLed owner leaves no etcd behind.
class local_etcd {
 public:
  /// Starts etcd and waits until it is healthy. cohort::error when the binary is missing
  /// ("etcd not found: ..."), exits early, or is not healthy within start_timeout_ms (the
  /// message quotes the end of DIR/etcd.log). Retries with new ports if one was taken.
  explicit local_etcd(local_etcd_options opts);
  ~local_etcd();
  local_etcd(const local_etcd&) = delete;
  local_etcd& operator=(const local_etcd&) = delete;

  /// "https://127.0.0.1:PORT", the client URL.
  const std::string& endpoint() const { return endpoint_; }
  /// What a client presents to it (files in DIR, 0600).
  const etcd_tls& client_tls() const { return tls_; }
  /// The server's process id; 0 once stopped.
  pid_t pid() const { return pid_; }
  /// DIR/etcd.log.
  std::string log_path() const;
  /// SIGTERM, then SIGKILL after stop_grace_ms; reaps the process. Idempotent.
  void stop();

  /// The etcd executable this machine would run (BINARY if given), or cohort::error
  /// "etcd not found: ..." saying how to install it.
  static std::string find_binary(const std::string& binary = "");

 private:
  // One attempt at ports picked now; false when etcd exited because a port was taken.
  bool try_start(const std::string& exe);

  local_etcd_options opts_;
  std::string endpoint_;
  etcd_tls tls_;
  pid_t pid_ = 0;
};

}  // namespace cohort::ha
