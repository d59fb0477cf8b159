// The coordinator's roster as pure decisions: who is a member, with which rank and grid
// coordinates, in which generation, and who was declared dead or left and why. Each
// decision is a function of (roster, now, input, options) that returns the next roster and a
// reason. No clock, sockets, threads or CAF here: the coordinator actor owns the roster,
// reads the clock, calls these functions and sends what they decide (docs/membership.md).
#pragma once
#include <chrono>
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace cohort {
struct config;
}

/// Usage from the coordinator actor (the roster is a plain value in its state):
///
///   namespace mb = cohort::net::membership;
///   mb::options opts = mb::options_from(cfg);     // throws usage_error on bad values
///   mb::roster roster;                            // generation 0, nobody
///   auto now = std::chrono::steady_clock::now();
///   mb::decision d = mb::on_register(roster, now, "w0", pid, opts);
///   if (d.kind == mb::decision_kind::rejected) reply register_reject{d.reason};
///   roster = std::move(d.next);                   // always adopt next (== roster if unchanged)
///   if (d.new_generation) broadcast the roster of d.next.generation to every live member;
///   ...
///   // every heartbeat_ms (or at mb::next_timeout(roster, opts)):
///   d = mb::check_timeouts(roster, now, opts);     // kind removed + reason, or unchanged
///
/// A heartbeat answered with decision_kind::rejoin_required tells the worker to drop all
/// state of its old generation and register again; it gets a new member id.
namespace cohort::net::membership {

using mono_time = std::chrono::steady_clock::time_point;  ///< the injected clock
using member_id = std::uint64_t;  ///< unique for the coordinator's lifetime, never reused

/// Same values as net::member_state in protocol.hpp, so a static_cast converts.
enum class member_state : std::uint8_t { joining = 0, alive = 1, leaving = 2, dead = 3 };
/// "joining", "alive", "leaving", "dead".
const char* to_string(member_state s);

/// Position (d, p, t) of a rank in the dp x pp x tp grid.
struct grid_coord {
  int d = 0;
  int p = 0;
  int t = 0;
  bool operator==(const grid_coord& o) const { return d == o.d && p == o.p && t == o.t; }
  bool operator!=(const grid_coord& o) const { return !(*this == o); }
};

/// Timing and world shape. min/max default to dp*pp*tp; elastic runs will widen them.
struct options {
  int heartbeat_ms = 100;  ///< period workers send heartbeats at (handed to them)
  int timeout_ms = 500;    ///< silent for >= this long: declared dead
  int dp = 1;
  int pp = 1;
  int tp = 1;
  int min_workers = 0;                ///< alive members needed before training runs; 0: dp*pp*tp
  int max_workers = 0;                ///< registrations beyond this are rejected; 0: dp*pp*tp
  std::size_t max_tombstones = 1024;  ///< departed records kept for diagnosis (oldest dropped)
  /// Registrations this close together enter one generation (join_window_closed); 0: each
  /// registration is its own generation.
  int join_window_ms = 0;

  int expected() const { return dp * pp * tp; }
  int min() const { return min_workers > 0 ? min_workers : expected(); }
  int max() const { return max_workers > 0 ? max_workers : expected(); }
};

/// Throws usage_error naming the bad field when OPTS cannot describe a working roster.
void validate(const options& opts);

/// Options from a resolved config (fault_tolerance.*, parallel.*), validated.
options options_from(const config& cfg);

/// Grid coordinates of RANK: t = r % tp, p = (r / tp) % pp, d = r / (tp * pp).
grid_coord coord_of(int rank, const options& opts);

/// One live (joining, alive or leaving) member of the roster.
struct member {
  member_id id = 0;
  std::string name;
  std::int64_t pid = 0;  ///< OS pid the worker reported; lets an exit notice name it
  int rank = -1;         ///< 0..n-1, dense, by join order
  grid_coord at;
  member_state state = member_state::joining;
  mono_time joined_at{};
  mono_time last_heartbeat{};  ///< registration counts as the first sign of life
};

/// Why a member left the roster.
enum class departure : std::uint8_t {
  timeout,  ///< silent for timeout_ms
  exited,   ///< the launcher saw its process exit
  left,     ///< graceful leave
  protocol  ///< sent something only a broken or restarted peer sends (e.g. a future generation)
};
/// "timeout", "exited", "left", "protocol".
const char* to_string(departure d);

/// Record of a member that is no longer live, so a late heartbeat from it is recognised.
struct tombstone {
  member_id id = 0;
  std::string name;
  std::int64_t pid = 0;
  int last_rank = -1;
  grid_coord last_at;
  mono_time last_heartbeat{};
  mono_time removed_at{};
  std::uint64_t removed_in = 0;  ///< the generation its removal created
  departure cause = departure::timeout;
  std::string reason;
};

/// The whole membership state; a plain value the coordinator keeps and replaces.
struct roster {
  std::uint64_t generation = 0;     ///< +1 at every membership change and aborted step
  member_id next_id = 1;            ///< ids start at 1; 0 means "none"
  std::vector<member> members;      ///< live members, in rank order
  std::vector<tombstone> departed;  ///< oldest first, at most options::max_tombstones

  /// Live member with this id, or nullptr. O(log n): decisions keep members in id order.
  const member* find(member_id id) const;
  /// Live member with this name, or nullptr.
  const member* find_name(std::string_view name) const;
  /// Most recent departed record with this id, or nullptr.
  const tombstone* find_departed(member_id id) const;
  /// Number of live members in STATE.
  int count(member_state state) const;
};

/// What a decision concluded.
enum class decision_kind : std::uint8_t {
  accepted,         ///< on_register: new member, new generation
  rejected,         ///< on_register: refused (reason says why); roster unchanged
  refreshed,        ///< on_heartbeat: live member, heartbeat recorded
  rejoin_required,  ///< on_heartbeat: unknown or departed member; it must register again
  removed,          ///< members left the roster (see removed); new generation
  leaving,          ///< on_leave_intent: member marked leaving; same generation
  unchanged         ///< nothing to do (no one timed out, notice about someone already gone)
};
/// "accepted", "rejected", ...
const char* to_string(decision_kind k);

/// Result of every decision function.
struct decision {
  decision_kind kind = decision_kind::unchanged;
  std::string reason;           ///< one line for logs and replies; says who, why, and for how long
  roster next;                  ///< roster after the decision (equal to the input when unchanged)
  bool new_generation = false;  ///< next.generation grew: broadcast the new roster
  member_id member = 0;         ///< the member concerned (the new id when accepted)
  std::vector<member_id> removed;  ///< members removed by this decision, in rank order
};

/// Longest name a peer may register under.
constexpr std::size_t max_name_length = 64;

/// Empty when NAME may name a peer (1..max_name_length of A-Z a-z 0-9 . _ -), else what is
/// wrong with it, quoting it safely (no control characters, at most 32 of its characters):
/// names reach logs, summaries and fault specs, so a newline or a megabyte must not.
std::string name_problem(const std::string& name);

/// A worker asks to join. Accepted: new id, state joining, generation +1, ranks recomputed.
/// Rejected (roster unchanged): NAME not a valid name (name_problem), held by a live
/// member, or max_workers reached. An empty NAME gets "worker-<id>". A batch of one
/// (on_register_batch).
decision on_register(const roster& r, mono_time now, const std::string& name, std::int64_t pid,
                     const options& opts);

/// One registration waiting in a join window.
struct candidate {
  std::string name;  ///< empty: the roster names it worker-<id>
  std::int64_t pid = 0;
};

/// What became of one candidate of a batch.
struct admission {
  member_id id = 0;   ///< the new member's id; 0 when refused
  bool full = false;  ///< refused because the roster is full (the candidate may wait as a spare)
  std::string
      reason;  ///< refused: why; admitted: "'name' (member id) joined as rank r at (d, p, t)"
};

/// Result of on_register_batch.
struct batch_decision {
  roster next;                  ///< roster after the batch (equal to the input when none admitted)
  bool new_generation = false;  ///< at least one admitted: next.generation is the input's + 1
  std::string reason;           ///< one line for the log (at most a few names)
  std::vector<admission> each;  ///< one per candidate, in order
};

/// Registrations that arrived together enter one new generation: candidates are admitted in
/// order as long as the roster has room (max_workers); each is refused like on_register
/// would refuse it alone (a bad name, a name held by a live member or by an earlier
/// candidate, a full roster). Ranks follow admission order. O(live + candidates).
batch_decision on_register_batch(const roster& r, mono_time now, const std::vector<candidate>& c,
                                 const options& opts);

/// A join window stays open at most this many join_window_ms after it opened, however
/// steadily registrations keep coming: a job's burst of thousands of workers (each one a
/// CURVE handshake) enters as one generation when it arrives within it, and a steady trickle
/// still forms generations.
inline constexpr int join_window_max_windows = 30;

/// When a join window that opened at FIRST and last took a registration at LAST closes
/// if nobody else registers: join_window_ms after LAST, or join_window_max_windows x
/// join_window_ms after FIRST, whichever comes first.
mono_time join_window_closes(mono_time first, mono_time last, const options& opts);

/// Whether that window is closed at NOW. Always true for join_window_ms 0.
bool join_window_closed(mono_time first, mono_time last, mono_time now, const options& opts);

/// Whether a join window is complete before its time, so that nobody else could enter
/// with it: the roster's SEATED members (leaving ones hold their seats) and the window's
/// JOINING registrations fill it (max_workers), or its LIVE members and JOINING reach
/// AWAITED, the worker count a scale asked the launcher for (0: none awaited). A scale-up or
/// a respawn then enters at once instead of join_window_ms later.
bool join_window_complete(int seated, int live, int joining, int awaited, const options& opts);

/// A heartbeat from ID that believes GENERATION is current. A live member is refreshed (a
/// joining one becomes alive) and learns next.generation, whether or not it was behind.
/// An unknown or departed ID gets rejoin_required. A live member claiming a generation newer
/// than the roster's is removed (departure::protocol) and gets rejoin_required.
decision on_heartbeat(const roster& r, mono_time now, member_id id, std::uint64_t generation,
                      const options& opts);

/// What refresh_member did.
enum class refresh_result : std::uint8_t {
  refreshed,     ///< a live member's heartbeat recorded
  became_alive,  ///< the same, and a joining member became alive
  other          ///< not the common case: R untouched, ask on_heartbeat
};

/// The coordinator's hot path for a heartbeat: what adopting on_heartbeat(R, ...).next would
/// do to R, done in place when ID is a live member at or behind the roster's generation
/// (the common case): only its entry is touched (found in O(log n)), with no copy of R and no
/// reason text. Every other case (unknown, departed, ahead of the roster) returns other and
/// leaves R untouched: call on_heartbeat for it.
refresh_result refresh_member(roster& r, mono_time now, member_id id, std::uint64_t generation);

/// How long member M may be silent: timeout_ms, twice that while it is JOINING (its
/// register_ok and its first beat both cross a transport that a burst of joiners keeps
/// busy; a joiner whose process dies is seen by the launcher's exit notice at once).
std::chrono::milliseconds silence_allowed(const member& m, const options& opts);

/// Declares dead every live member silent for >= silence_allowed + LAG: one new generation
/// for the whole batch, ranks recomputed, reason lists who and how long each was silent.
/// LAG is the coordinator's own lag, as its transport shows it (heartbeat_table::lag):
/// beats that reached it late say the silence of others may be its own, not theirs.
decision check_timeouts(const roster& r, mono_time now, const options& opts,
                        std::chrono::milliseconds lag = std::chrono::milliseconds(0));

/// When check_timeouts would next remove someone if no heartbeat arrives; nullopt when the
/// roster is empty. Lets the actor schedule one timer instead of polling.
std::optional<mono_time> next_timeout(const roster& r, const options& opts);

/// The launcher saw member ID's process exit (DETAIL e.g. "exit code 137"): removed now,
/// generation +1. A member already gone gives unchanged, so the three failure sources
/// (exit, timeout, collective error) can all report the same death safely.
decision on_exit_notice(const roster& r, mono_time now, member_id id, const std::string& detail,
                        const options& opts);

/// Same, naming the live member by NAME; a nonzero PID must also match, so a late notice
/// about an old process never removes a restarted worker that reused the name.
decision on_exit_notice_by_name(const roster& r, mono_time now, const std::string& name,
                                std::int64_t pid, const std::string& detail, const options& opts);

/// Member ID will leave once its current step is done: state leaving, same generation (it
/// keeps its rank until on_leave). Unknown or departed ID: unchanged.
decision on_leave_intent(const roster& r, mono_time now, member_id id, const options& opts);

/// Member ID leaves gracefully: removed, generation +1. Unknown or departed ID: unchanged.
decision on_leave(const roster& r, mono_time now, member_id id, const options& opts);

/// A step was aborted with the same members: generation +1 (so every communicator is rebuilt
/// and late messages of the failed attempt are ignored), ranks unchanged. kind unchanged,
/// new_generation true, reason WHY.
decision bump_generation(const roster& r, const std::string& why);

/// Values at or above this in a re-attaching worker's prev_member / prev_generation are
/// ignored: no honest leader hands them out, and a counter there has no room left.
constexpr std::uint64_t max_continued = std::uint64_t{1} << 48;

/// A new leader (coordinator standbys) hears that an earlier leader gave out member ID and
/// generation GENERATION: member ids and generations go on above them, so nothing of the
/// earlier term is reused (workers and the data plane tell generations apart by number).
/// Values >= max_continued are ignored. Only R's two counters change (in place: it runs on
/// every registration a new leader hears, and its members are left alone).
void continue_after(roster& r, member_id id, std::uint64_t generation);

/// Whether enough members are alive to run, and if not what is missing.
struct readiness {
  bool ready = false;
  std::string reason;
};
/// Ready when at least opts.min() members are alive (joining ones have not heartbeat yet).
readiness check_ready(const roster& r, const options& opts);

/// One line of the status view.
struct member_view {
  member_id id = 0;
  std::string name;
  std::int64_t pid = 0;
  int rank = -1;  ///< -1 for departed members
  grid_coord at;  ///< last coordinates for departed members
  member_state state = member_state::alive;
  std::int64_t heartbeat_age_ms = 0;
  /// Departed members: how long it had been silent when it was removed (removal time minus
  /// last heartbeat), the detection latency of a timeout; -1 for live members.
  std::int64_t silent_ms = -1;
  std::string reason;  ///< why it departed; empty for live members
};

/// What `cohort ctl status` shows.
struct status_view {
  std::uint64_t generation = 0;
  int expected = 0;
  int alive = 0;
  readiness ready;
  std::vector<member_view> members;  ///< live in rank order, then departed, newest first
};

/// Snapshot of R at NOW; departed members appear with state dead.
status_view status(const roster& r, mono_time now, const options& opts);

/// JSON form for `cohort ctl status --json` (found by nlohmann::json through ADL).
void to_json(nlohmann::json& j, const status_view& s);

}  // namespace cohort::net::membership
