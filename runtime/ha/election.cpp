// Leader election on one etcd key (see election.hpp for the states). Waiting candidates poll
// the key rather than watch it: the gateway's watch is a long-lived stream that cpp-httplib
// cannot read incrementally, and a poll every few hundred ms is cheap for a handful of
// standbys.
#include "runtime/ha/election.hpp"

#include <algorithm>

#include "runtime/core/error.hpp"

namespace cohort::ha {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

leader_election::leader_election(etcd_client& client, std::string key, std::string my_value,
                                 int ttl_s, int keepalive_ms)
    : client_(client),
      key_(std::move(key)),
      value_(std::move(my_value)),
      ttl_s_(ttl_s),
      keepalive_ms_(keepalive_ms) {
  if (key_.empty()) throw usage_error("leader election: the election key is empty");
  if (ttl_s_ < 1 || keepalive_ms_ < 1 || keepalive_ms_ >= ttl_s_ * 1000)
    throw usage_error("leader election on '" + key_ + "': keepalive period (" +
                      std::to_string(keepalive_ms_) + " ms) must be > 0 and below the lease TTL (" +
                      std::to_string(ttl_s_) + " s); e.g. TTL 3 s, keepalive 1000 ms");
}

leader_election::~leader_election() {
  stop_keepalive();
  const int64_t lease = lease_.exchange(0);
  if (leading_.exchange(false) && lease != 0) {
    try {
      client_.revoke(lease);
    } catch (const std::exception&) {
      // etcd unreachable: the lease expires by itself within its TTL.
    }
  }
}

void leader_election::on_lost(std::function<void()> f) {
  const std::lock_guard<std::mutex> lock(mutex_);
  on_lost_ = std::move(f);
}

std::optional<int64_t> leader_election::campaign(const std::atomic<bool>& stop, int poll_ms) {
  if (leading_.load()) return term_.load();
  stop_keepalive();  // the thread of a lost term, if any
  const milliseconds nap(std::clamp(poll_ms, 1, 50));
  while (!stop.load()) {
    if (!client_.get(key_)) {
      // Renewal deadlines count from before the grant: the lease cannot expire earlier.
      const auto granted_at = steady_clock::now();
      const int64_t lease = client_.grant(ttl_s_);
      txn_result r;
      try {
        r = client_.create_if_absent(key_, value_, lease);
      } catch (...) {
        try {
          client_.revoke(lease);
        } catch (const std::exception&) {
        }
        throw;
      }
      if (r.created) {
        term_ = r.current ? r.current->create_revision : r.revision;
        lease_ = lease;
        lost_ = false;
        leading_ = true;
        const std::lock_guard<std::mutex> lock(mutex_);
        stopping_ = false;
        keepalive_ = std::thread(
            [this, lease, t = term_.load(), granted_at] { keepalive_loop(lease, t, granted_at); });
        return term_.load();
      }
      client_.revoke(lease);  // another candidate won the race
    }
    const auto until = steady_clock::now() + milliseconds(std::max(poll_ms, 1));
    while (!stop.load() && steady_clock::now() < until) std::this_thread::sleep_for(nap);
  }
  return std::nullopt;
}

void leader_election::keepalive_loop(int64_t lease, int64_t term,
                                     steady_clock::time_point renewed) {
  // RENEWED: the last renewal etcd confirmed, as the time its request was sent (etcd renewed
  // the lease after that), so our deadline passes before etcd's does.
  const milliseconds budget(ttl_s_ * 1000 - keepalive_ms_);
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    wake_.wait_for(lock, milliseconds(keepalive_ms_), [this] { return stopping_; });
    if (stopping_) return;
    lock.unlock();
    const auto sent = steady_clock::now();
    bool gone = false;
    try {
      if (sent.time_since_epoch().count() < cut_until_.load()) {
        // Cut off from etcd (fault injection): no renewal reaches it; the deadline decides.
      } else if (client_.keepalive(lease) <= 0) {
        gone = true;
      } else {
        // The key too: someone may have deleted it, and then another candidate may hold it.
        const auto cur = client_.get(key_);
        gone = !cur || cur->create_revision != term || cur->lease != lease;
        if (!gone) renewed = sent;
      }
    } catch (const std::exception&) {
      // etcd unreachable or slow: the deadline below decides.
    }
    if (gone || steady_clock::now() - renewed >= budget) {
      declare_lost();
      return;
    }
    lock.lock();
  }
}

void leader_election::declare_lost() {
  if (!leading_.exchange(false)) return;  // resign() got there first
  lost_ = true;
  std::function<void()> f;
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    f = on_lost_;
  }
  if (f) f();
  // A lease that still lives (the key was taken from us) must not outlast the term.
  const int64_t lease = lease_.exchange(0);
  if (lease != 0) {
    try {
      client_.revoke(lease);
    } catch (const std::exception&) {
    }
  }
}

void leader_election::stop_keepalive() {
  std::thread t;
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    // Called from on_lost (the keepalive thread itself): it is about to exit; the owner's
    // next campaign() or the destructor joins it.
    if (keepalive_.get_id() == std::this_thread::get_id()) return;
    t = std::move(keepalive_);
  }
  wake_.notify_all();
  if (t.joinable()) t.join();
}

void leader_election::resign() {
  const bool was_leading = leading_.exchange(false);
  stop_keepalive();
  const int64_t lease = lease_.exchange(0);
  if (was_leading && lease != 0) client_.revoke(lease);
}

std::optional<leader_info> leader_election::observe() {
  const auto cur = client_.get(key_);
  if (!cur) return std::nullopt;
  return leader_info{cur->value, cur->create_revision, cur->lease};
}

bool leader_election::depose(int64_t term) {
  const auto cur = client_.get(key_);
  // A key on no lease was not written by a leader_election: it is left alone.
  if (!cur || cur->create_revision != term || cur->lease == 0) return false;
  // Each term has its own lease, so this ends term TERM and nothing newer.
  client_.revoke(cur->lease);
  return true;
}

bool leader_election::fenced_put(const std::string& key, const std::string& value) {
  const int64_t term = term_.load();
  if (term == 0) return false;  // never led
  return client_.put_if_created_at(key, value, key_, term);
}

}  // namespace cohort::ha
