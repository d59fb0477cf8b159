// The rendezvous key-value store the coordinator hosts (Gloo's rendezvous::Store and the
// NCCL unique-id exchange sit on it): keys scoped by generation, size limits, and blocking
// waits modelled as pending requests the caller answers later. Pure logic: no clock, sockets,
// threads or CAF; the caller passes the time in and sends the replies this returns.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

/// Usage from the coordinator actor (requests carry the caller's generation; ids are the
/// caller's, unique among its pending waits):
///
///   namespace kv = cohort::net::kv;
///   kv::store store_;                                    // member of the actor's state
///   kv::set_result s = store_.set(gen, "rank0/addr", bytes);
///   reply s.result to the setter; reply each of s.woken to its waiter (by request id);
///   kv::reply w = store_.wait(req_id, gen, {"rank0/addr", "rank1/addr"}, now,
///                             now + std::chrono::milliseconds(timeout_ms));
///   if (w.code != kv::status::pending) reply w now; else keep req_id -> requester;
///   on a timer: for (auto& r : store_.expire(now)) reply r;        // status timeout
///   on a new generation g: for (auto& r : store_.drop_generations_below(g)) reply r;
///   when a requester is gone: store_.cancel(req_id);               // nobody to answer
///   when a peer is gone: store_.cancel_owner(peer);                // all of its waits
///   on every new roster: store_.set_ceiling(roster.generation);
namespace cohort::net::kv {

using mono_time = std::chrono::steady_clock::time_point;  ///< the injected clock
using generation_t = std::uint64_t;
using request_id = std::uint64_t;

/// Outcome of an operation. Everything but ok and pending carries a reason.
enum class status : std::uint8_t {
  ok = 0,          ///< done; value holds the value for get / get_or_wait
  pending = 1,     ///< registered as a waiter; answered later by set, expire or a drop
  not_found = 2,   ///< get of a key not set (yet)
  timeout = 3,     ///< the wait's deadline passed before every key was set
  superseded = 4,  ///< the generation was dropped: rebuild for the current generation
  invalid = 5,     ///< over a limit (key length, value size, store size, waiters) or malformed
};
/// "ok", "pending", ...
const char* to_string(status s);

/// The longest wait the store accepts by default: whoever sizes a rendezvous wait (the
/// collective timeout, runtime/step/dp_links) keeps below it.
inline constexpr std::chrono::milliseconds longest_wait = std::chrono::minutes(30);

/// Limits, so a confused or hostile peer gets an error value instead of exhausting memory.
struct options {
  std::size_t max_key_bytes = 512;
  std::size_t max_value_bytes = 1 << 20;  ///< Gloo addresses and NCCL ids are ~100 bytes
  /// Budget of everything stored: keys + values of all generations, the keys pending waits
  /// name, and entry_overhead_bytes for each entry, each pending wait and each key it names.
  std::size_t max_total_bytes = 64 << 20;
  /// What an entry or a waiter costs beyond its bytes (map node, string headers): charged so
  /// that millions of one-byte keys cannot hold memory the budget does not see.
  std::size_t entry_overhead_bytes = 96;
  std::size_t max_waiters = 4096;
  /// Pending waits one owner (a connected peer) may hold at once; owner 0 is not limited.
  std::size_t max_waiters_per_owner = 64;
  std::size_t max_keys_per_wait = 4096;
  /// Longest wait accepted: a later deadline is refused (Gloo's rendezvous waits for at
  /// most the collective timeout, seconds to minutes).
  std::chrono::milliseconds max_wait = longest_wait;
  /// Test seam, empty in production: runs on the caller's thread when a get or wait is left
  /// pending (tests make a set that must complete a waiter, not find none).
  std::function<void()> on_pending;
};

/// Answer to one request.
struct reply {
  request_id id = 0;  ///< the waiter's id; 0 for set and get
  status code = status::ok;
  std::string reason;  ///< why, for everything but ok and pending
  std::string value;   ///< get / get_or_wait value (opaque bytes)
  bool ok() const { return code == status::ok; }
};

/// Result of set: its own answer plus the waiters it completed, in request-id order.
struct set_result {
  reply result;
  std::vector<reply> woken;
};

/// The store. Not thread-safe: one actor owns it.
class store {
 public:
  explicit store(options opts = {});

  /// Sets KEY in generation G (overwrites), then completes every waiter of G now satisfied.
  set_result set(generation_t g, const std::string& key, std::string value);

  /// Value of KEY in G now: ok, not_found, or an error.
  reply get(generation_t g, const std::string& key) const;

  /// Gloo's wait: ok now if every key of G is set; else a waiter ID until DEADLINE
  /// (pending), or timeout now if DEADLINE <= NOW. No values are returned. OWNER (the
  /// requesting peer, 0: none) is held to max_waiters_per_owner and cancel_owner.
  reply wait(request_id id, generation_t g, std::vector<std::string> keys, mono_time now,
             mono_time deadline, std::uint64_t owner = 0);

  /// Gloo's blocking get: like wait on one key, but the reply carries its value.
  reply get_or_wait(request_id id, generation_t g, const std::string& key, mono_time now,
                    mono_time deadline, std::uint64_t owner = 0);

  /// Removes and returns (status timeout) every waiter whose deadline is <= NOW.
  std::vector<reply> expire(mono_time now);

  /// Drops every generation below G, keys and waiters; returns the waiters (superseded).
  /// Later requests naming a generation below G are answered superseded at once.
  std::vector<reply> drop_generations_below(generation_t g);

  /// Forgets waiter ID without answering it (its requester is gone). False if unknown.
  bool cancel(request_id id);
  /// Forgets every waiter of OWNER (the peer went away); returns their ids.
  std::vector<request_id> cancel_owner(std::uint64_t owner);

  /// The newest generation announced (the roster's): requests naming a later one are
  /// refused (invalid), so nobody can fill or pre-set a generation that does not exist yet.
  /// Never lowered. Until the first call every generation is accepted.
  void set_ceiling(generation_t g);

  /// Earliest waiter deadline, so the owner can arm one timer; nullopt with no waiters.
  std::optional<mono_time> next_deadline() const;

  /// Bytes of keys + values stored (pending waits' keys are counted apart, same budget).
  std::size_t total_bytes() const { return total_bytes_; }
  /// Bytes of the keys pending waits name.
  std::size_t waiting_bytes() const { return waiting_bytes_; }
  /// What the budget (max_total_bytes) is charged: total_bytes() + waiting_bytes() + the
  /// per-entry overhead of every entry, pending wait and key it names.
  std::size_t charged_bytes() const { return total_bytes_ + waiting_bytes_ + overhead_bytes_; }
  std::size_t key_count() const { return entries_.size(); }
  std::size_t waiter_count() const { return waiters_.size(); }
  /// Lowest generation still accepted.
  generation_t floor() const { return floor_; }

 private:
  struct waiter {
    generation_t gen = 0;
    std::vector<std::string> keys;
    bool want_value = false;  // get_or_wait: reply with the (single) key's value
    mono_time since{};
    mono_time deadline{};
    std::size_t bytes = 0;     // sum of key sizes, charged to the byte budget while pending
    std::size_t overhead = 0;  // entry_overhead_bytes * (1 + keys), charged too
    std::uint64_t owner = 0;
  };
  using full_key = std::pair<generation_t, std::string>;

  reply check_generation(generation_t g) const;
  reply check(generation_t g, const std::string& key) const;
  bool ready(const waiter& w) const;
  reply complete(request_id id, const waiter& w) const;
  reply add_waiter(request_id id, waiter w, mono_time now);
  std::map<request_id, waiter>::iterator erase_waiter(std::map<request_id, waiter>::iterator it);

  options opts_;
  std::map<full_key, std::string> entries_;
  std::map<request_id, waiter> waiters_;  // ordered: replies come out in request-id order
  std::size_t total_bytes_ = 0;
  std::size_t waiting_bytes_ = 0;
  std::size_t overhead_bytes_ = 0;                   // of entries and waiters
  std::map<std::uint64_t, std::size_t> waiters_of_;  // owner -> pending waits (owner != 0)
  generation_t floor_ = 0;
  generation_t ceiling_ = ~generation_t{0};
};

}  // namespace cohort::net::kv
