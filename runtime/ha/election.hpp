// Leader election among coordinator candidates on one etcd key, with fencing terms: the
// leader holds KEY on a lease it keeps alive; its term is the key's create revision, which
// grows with every new leader. It owns one candidate's lease and keepalive thread; it does
// not decide what a leader or standby does (the coordinator does), and it does not watch.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "runtime/ha/etcd_client.hpp"

namespace cohort::ha {

/// The leader as etcd sees it.
struct leader_info {
  std::string value;  ///< what the leader wrote, e.g. "tcp://host:port pid"
  int64_t term = 0;   ///< the key's create revision
  int64_t lease = 0;  ///< the leader's lease
};

/// One candidate. States:
///
///   idle, resigned, lost --campaign()--> campaigning --created the key on our lease--> leader
///   campaigning --stop flag set--> (campaign() returns nullopt; state as before)
///   leader --resign()--> resigned                       (lease revoked, key gone at once)
///   leader --lease gone | key not ours | no renewal for ttl - period--> lost  (on_lost, once)
///
/// Keepalive errors alone do not end a term: only the deadline does, so a leader rides out
/// an etcd hiccup shorter than ttl - period. Make the client's read timeout shorter than
/// that, or a hung call delays the verdict.
///
/// A term is used once: campaign() after resigned or lost grants a new lease and, if it wins,
/// gets a new, higher term. Because each term has its own lease, revoking the lease a term
/// was won on ends that term and no other (depose relies on it).
///
/// Safety comes from fenced_put, not from lost(): a leader learns of its loss up to one
/// keepalive period late, so writes that must not come from a deposed leader go through
/// fenced_put (applied only while the key still carries our term).
class leader_election {
 public:
  /// CLIENT outlives this object. KEY: the election's key; MY_VALUE: what observers of the
  /// leader read. TTL_S: the lease TTL (etcd may raise it to its minimum); a leader not
  /// renewed for TTL_S*1000 - KEEPALIVE_MS ms counts itself lost. usage_error unless
  /// 0 < keepalive_ms < ttl_s*1000.
  leader_election(etcd_client& client, std::string key, std::string my_value, int ttl_s,
                  int keepalive_ms);
  /// Stops the keepalive thread and revokes a lease still held (as resign()).
  ~leader_election();
  leader_election(const leader_election&) = delete;
  leader_election& operator=(const leader_election&) = delete;

  /// Blocks until this candidate holds the key; its term. While another holds it, looks
  /// again every POLL_MS; returns nullopt once STOP is set. etcd errors propagate as
  /// cohort::error (the caller decides whether to campaign again).
  std::optional<int64_t> campaign(const std::atomic<bool>& stop, int poll_ms);

  /// ON_LOST runs once, on the keepalive thread, when leadership is lost (not on resign()).
  /// It may call resign() but must not destroy this object. Set it before campaign().
  void on_lost(std::function<void()> f);

  /// Whether we are leader now, as far as the last keepalive knows.
  bool leading() const { return leading_.load(); }
  /// Whether leadership was lost involuntarily (on_lost fired).
  bool lost() const { return lost_.load(); }
  /// Our term (create revision of our key), 0 before the first win.
  int64_t term() const { return term_.load(); }
  /// Our lease, 0 when none.
  int64_t lease() const { return lease_.load(); }

  /// The current leader, nullopt when nobody holds the key.
  std::optional<leader_info> observe();

  /// Ends our leadership at once: stops renewing and revokes our lease (deleting the key).
  /// Idempotent; does nothing when not leading.
  void resign();

  /// Revokes the lease of the leader of TERM if that leader still holds the key; whether it
  /// did. A newer leader (higher term) is never touched. For a standby that saw the leader
  /// of TERM die and does not want to wait for its lease to expire.
  bool depose(int64_t term);

  /// Fault injection (`partition coordinator`): for MS milliseconds no renewal is sent, as
  /// if etcd could not be reached; past the deadline the leader counts itself lost.
  void cut_off(std::chrono::milliseconds ms) {
    cut_until_ = (std::chrono::steady_clock::now() + ms).time_since_epoch().count();
  }
  /// Puts KEY = VALUE only while the election key still carries our term; whether applied.
  bool fenced_put(const std::string& key, const std::string& value);

 private:
  void keepalive_loop(int64_t lease, int64_t term, std::chrono::steady_clock::time_point renewed);
  void stop_keepalive();
  void declare_lost();

  etcd_client& client_;
  const std::string key_;
  const std::string value_;
  const int ttl_s_;
  const int keepalive_ms_;

  std::atomic<bool> leading_{false};
  std::atomic<bool> lost_{false};
  std::atomic<int64_t> term_{0};
  std::atomic<int64_t> lease_{0};
  std::atomic<std::chrono::steady_clock::rep> cut_until_{0};

  std::mutex mutex_;  // guards on_lost_, stopping_ and the thread handle
  std::condition_variable wake_;
  bool stopping_ = false;
  std::function<void()> on_lost_;
  std::thread keepalive_;
};

}  // namespace cohort::ha
