// Pure membership decisions; see membership.hpp and docs/membership.md.
#include "runtime/net/membership.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "runtime/core/config.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/rules.hpp"
#include "runtime/net/membership_internal.hpp"

namespace cohort::net::membership {

namespace detail {

std::int64_t ms_between(mono_time from, mono_time to) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(to - from).count();
}

std::string who(member_id id, const std::string& name) {
  return "'" + name + "' (member " + std::to_string(id) + ")";
}

// Ranks follow join order, which is id order because ids only grow. Keeping the order in
// one place lets the elastic policy replace it without touching the decisions.
void assign_ranks(std::vector<member>& members, const options& opts) {
  std::sort(members.begin(), members.end(),
            [](const member& a, const member& b) { return a.id < b.id; });
  for (std::size_t i = 0; i < members.size(); ++i) {
    members[i].rank = static_cast<int>(i);
    members[i].at = coord_of(members[i].rank, opts);
  }
}

}  // namespace detail

namespace {

using detail::assign_ranks;
using detail::ms_between;
using detail::who;

// Moves the members in IDS from the live list into the tombstones, bumps the generation
// once and recomputes the ranks. Returns the ids removed, in their old rank order.
std::vector<member_id> remove_members(roster& r, const std::vector<member_id>& ids, mono_time now,
                                      departure cause, const std::vector<std::string>& reasons,
                                      const options& opts) {
  std::vector<member_id> removed;
  const std::uint64_t gen = r.generation + 1;
  std::vector<member> kept;
  kept.reserve(r.members.size());
  for (auto& m : r.members) {
    auto it = std::find(ids.begin(), ids.end(), m.id);
    if (it == ids.end()) {
      kept.push_back(std::move(m));
      continue;
    }
    tombstone t;
    t.id = m.id;
    t.name = m.name;
    t.pid = m.pid;
    t.last_rank = m.rank;
    t.last_at = m.at;
    t.last_heartbeat = m.last_heartbeat;
    t.removed_at = now;
    t.removed_in = gen;
    t.cause = cause;
    t.reason = reasons[static_cast<std::size_t>(it - ids.begin())];
    r.departed.push_back(std::move(t));
    removed.push_back(m.id);
  }
  COHORT_CHECK(!removed.empty());
  r.members = std::move(kept);
  r.generation = gen;
  if (r.departed.size() > opts.max_tombstones) {
    r.departed.erase(r.departed.begin(),
                     r.departed.end() - static_cast<std::ptrdiff_t>(opts.max_tombstones));
  }
  assign_ranks(r.members, opts);
  return removed;
}

decision unchanged(const roster& r, std::string reason, member_id id = 0) {
  decision d;
  d.kind = decision_kind::unchanged;
  d.reason = std::move(reason);
  d.next = r;
  d.member = id;
  return d;
}

// Removes one member for CAUSE; the shared tail of exit notices, leaves and protocol faults.
decision remove_one(const roster& r, mono_time now, const member& m, departure cause,
                    const std::string& why, const options& opts) {
  decision d;
  d.next = r;
  d.kind = decision_kind::removed;
  d.member = m.id;
  d.reason = who(m.id, m.name) + " removed: " + why + "; generation " +
             std::to_string(r.generation) + " -> " + std::to_string(r.generation + 1);
  d.removed = remove_members(d.next, {m.id}, now, cause, {why}, opts);
  d.new_generation = true;
  return d;
}

}  // namespace

const char* to_string(member_state s) {
  switch (s) {
    case member_state::joining:
      return "joining";
    case member_state::alive:
      return "alive";
    case member_state::leaving:
      return "leaving";
    case member_state::dead:
      return "dead";
  }
  return "unknown";
}

const char* to_string(departure d) {
  switch (d) {
    case departure::timeout:
      return "timeout";
    case departure::exited:
      return "exited";
    case departure::left:
      return "left";
    case departure::protocol:
      return "protocol";
  }
  return "unknown";
}

const char* to_string(decision_kind k) {
  switch (k) {
    case decision_kind::accepted:
      return "accepted";
    case decision_kind::rejected:
      return "rejected";
    case decision_kind::refreshed:
      return "refreshed";
    case decision_kind::rejoin_required:
      return "rejoin_required";
    case decision_kind::removed:
      return "removed";
    case decision_kind::leaving:
      return "leaving";
    case decision_kind::unchanged:
      return "unchanged";
  }
  return "unknown";
}

void validate(const options& o) {
  auto fail = [](const std::string& what) { throw usage_error("membership options: " + what); };
  if (o.heartbeat_ms <= 0)
    fail("heartbeat_ms must be > 0 (got " + std::to_string(o.heartbeat_ms) + ")");
  if (!rules::timeout_outlasts_heartbeat(o.heartbeat_ms, o.timeout_ms))
    fail("timeout_ms (" + std::to_string(o.timeout_ms) + ") must exceed heartbeat_ms (" +
         std::to_string(o.heartbeat_ms) + "), or every worker looks dead between two beats");
  if (o.dp < 1 || o.pp < 1 || o.tp < 1)
    fail("grid dp x pp x tp must be at least 1 x 1 x 1 (got " + std::to_string(o.dp) + " x " +
         std::to_string(o.pp) + " x " + std::to_string(o.tp) + ")");
  if (o.min_workers < 0 || o.max_workers < 0) fail("min_workers and max_workers must be >= 0");
  if (o.join_window_ms < 0) fail("join_window_ms must be >= 0");
  if (o.min() > o.max())
    fail("min_workers (" + std::to_string(o.min()) + ") exceeds max_workers (" +
         std::to_string(o.max()) + ")");
}

options options_from(const config& cfg) {
  options o;
  o.heartbeat_ms = cfg.fault_tolerance.heartbeat_ms;
  o.timeout_ms = cfg.fault_tolerance.timeout_ms;
  o.pp = cfg.parallel.pp;
  o.tp = cfg.parallel.tp;
  o.dp = cfg.parallel.dp > 0 ? cfg.parallel.dp
                             : cfg.cluster.workers / std::max(1, cfg.parallel.pp * cfg.parallel.tp);
  // elastic.* (0 in a config built in code means cluster.workers, as the loader resolves).
  o.min_workers = cfg.elastic.min_workers;
  o.max_workers = cfg.elastic.max_workers;
  o.join_window_ms = cfg.fault_tolerance.join_window_ms;
  validate(o);
  return o;
}

grid_coord coord_of(int rank, const options& o) {
  COHORT_CHECK(rank >= 0 && o.tp > 0 && o.pp > 0);
  grid_coord c;
  c.t = rank % o.tp;
  c.p = (rank / o.tp) % o.pp;
  c.d = rank / (o.tp * o.pp);
  return c;
}

const member* roster::find(member_id id) const {
  // Every decision leaves the members in id order (assign_ranks): a binary search, with a
  // scan for a roster built some other way (a test's).
  const auto it = std::lower_bound(members.begin(), members.end(), id,
                                   [](const member& m, member_id x) { return m.id < x; });
  if (it != members.end() && it->id == id) return &*it;
  for (const auto& m : members)
    if (m.id == id) return &m;
  return nullptr;
}

const member* roster::find_name(std::string_view name) const {
  for (const auto& m : members)
    if (m.name == name) return &m;
  return nullptr;
}

const tombstone* roster::find_departed(member_id id) const {
  for (auto it = departed.rbegin(); it != departed.rend(); ++it)
    if (it->id == id) return &*it;
  return nullptr;
}

int roster::count(member_state state) const {
  return static_cast<int>(std::count_if(members.begin(), members.end(),
                                        [&](const member& m) { return m.state == state; }));
}

std::string name_problem(const std::string& name) {
  std::string shown;
  for (std::size_t i = 0; i < name.size() && i < 32; ++i) {
    const unsigned char c = static_cast<unsigned char>(name[i]);
    shown += (c >= 0x20 && c < 0x7f) ? static_cast<char>(c) : '?';
  }
  if (name.size() > 32) shown += "...";
  if (name.empty()) return "the name is empty";
  if (name.size() > max_name_length)
    return "the name '" + shown + "' is " + std::to_string(name.size()) +
           " characters long (at most " + std::to_string(max_name_length) + ")";
  for (const char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok)
      return "the name '" + shown +
             "' has a character other than A-Z a-z 0-9 . _ - (use e.g. worker-3 or node7.gpu0)";
  }
  return "";
}

refresh_result refresh_member(roster& r, mono_time now, member_id id, std::uint64_t generation) {
  const member* found = r.find(id);
  if (found == nullptr || generation > r.generation) return refresh_result::other;
  member& m = r.members[static_cast<std::size_t>(found - r.members.data())];
  m.last_heartbeat = std::max(m.last_heartbeat, now);
  if (m.state != member_state::joining) return refresh_result::refreshed;
  m.state = member_state::alive;
  return refresh_result::became_alive;
}

decision on_heartbeat(const roster& r, mono_time now, member_id id, std::uint64_t generation,
                      const options& opts) {
  const member* m = r.find(id);
  if (m == nullptr) {
    decision d;
    d.kind = decision_kind::rejoin_required;
    d.next = r;
    d.member = id;
    if (const tombstone* t = r.find_departed(id)) {
      d.reason = who(t->id, t->name) + " departed in generation " + std::to_string(t->removed_in) +
                 " (" + t->reason + "); it must register again as a new member";
    } else if (id != 0 && id < r.next_id) {
      d.reason = "member " + std::to_string(id) +
                 " departed long ago (record forgotten); it must register again";
    } else {
      d.reason = "member " + std::to_string(id) +
                 " was never registered with this coordinator (restarted?); register first";
    }
    return d;
  }
  if (generation > r.generation) {
    // Only a worker that outlived a coordinator restart or a corrupted peer claims a future
    // generation; it cannot share a group with anyone, so it leaves and starts over.
    const std::string why = "claimed generation " + std::to_string(generation) +
                            " but the roster is at " + std::to_string(r.generation);
    decision d = remove_one(r, now, *m, departure::protocol, why, opts);
    d.kind = decision_kind::rejoin_required;
    d.reason += "; it must register again";
    return d;
  }
  decision d;
  d.kind = decision_kind::refreshed;
  d.next = r;
  d.member = id;
  refresh_member(d.next, now, id, generation);
  const member_state state = d.next.find(id)->state;
  d.reason = who(m->id, m->name) + " " + to_string(state) + " after " +
             std::to_string(ms_between(m->last_heartbeat, now)) + " ms";
  if (generation < r.generation)
    d.reason += "; it is behind (generation " + std::to_string(generation) + " < " +
                std::to_string(r.generation) + ")";
  return d;
}

std::chrono::milliseconds silence_allowed(const member& m, const options& opts) {
  return std::chrono::milliseconds(opts.timeout_ms) * (m.state == member_state::joining ? 2 : 1);
}

decision check_timeouts(const roster& r, mono_time now, const options& opts,
                        std::chrono::milliseconds lag) {
  std::vector<member_id> ids;
  std::vector<std::string> whys;
  std::string list;
  for (const auto& m : r.members) {
    const auto allowed = silence_allowed(m, opts);
    if (now - m.last_heartbeat < allowed + lag) continue;
    const std::string why =
        "silent for " + std::to_string(ms_between(m.last_heartbeat, now)) + " ms (timeout " +
        std::to_string(allowed.count()) + " ms" +
        (m.state == member_state::joining ? ", twice timeout_ms before a first heartbeat" : "") +
        (lag.count() > 0 ? ", + " + std::to_string(lag.count()) + " ms of the coordinator's lag"
                         : "") +
        ")";
    ids.push_back(m.id);
    whys.push_back(why);
    list += (list.empty() ? "" : ", ") + who(m.id, m.name) + " " + why;
  }
  if (ids.empty())
    return unchanged(r, "no member silent for " + std::to_string(opts.timeout_ms) + " ms");
  decision d;
  d.kind = decision_kind::removed;
  d.next = r;
  d.removed = remove_members(d.next, ids, now, departure::timeout, whys, opts);
  d.member = d.removed.front();
  d.new_generation = true;
  d.reason = "declared dead: " + list + "; generation " + std::to_string(r.generation) + " -> " +
             std::to_string(d.next.generation) + ", " + std::to_string(d.next.members.size()) +
             " live";
  return d;
}

std::optional<mono_time> next_timeout(const roster& r, const options& opts) {
  std::optional<mono_time> first;
  for (const auto& m : r.members) {
    const mono_time at = m.last_heartbeat + silence_allowed(m, opts);
    if (!first || at < *first) first = at;
  }
  return first;
}

decision on_exit_notice(const roster& r, mono_time now, member_id id, const std::string& detail,
                        const options& opts) {
  const member* m = r.find(id);
  if (m == nullptr) {
    return unchanged(r,
                     "exit notice for member " + std::to_string(id) +
                         ", which is not live (already removed?): " + detail,
                     id);
  }
  return remove_one(r, now, *m, departure::exited, "process exited: " + detail, opts);
}

decision on_exit_notice_by_name(const roster& r, mono_time now, const std::string& name,
                                std::int64_t pid, const std::string& detail, const options& opts) {
  const member* m = r.find_name(name);
  if (m == nullptr)
    return unchanged(
        r, "exit notice for '" + name + "', which is not live (already removed?): " + detail);
  if (pid != 0 && m->pid != pid)
    return unchanged(r,
                     "exit notice for '" + name + "' pid " + std::to_string(pid) +
                         " ignored: the live member of that name is pid " + std::to_string(m->pid) +
                         " (a restarted process)",
                     m->id);
  return on_exit_notice(r, now, m->id, detail, opts);
}

decision on_leave_intent(const roster& r, mono_time now, member_id id, const options& opts) {
  const member* m = r.find(id);
  if (m == nullptr)
    return unchanged(r, "leave intent from member " + std::to_string(id) + ", which is not live",
                     id);
  decision d;
  d.kind = decision_kind::leaving;
  d.next = r;
  d.member = id;
  for (auto& x : d.next.members) {
    if (x.id != id) continue;
    x.state = member_state::leaving;
    x.last_heartbeat = std::max(x.last_heartbeat, now);
  }
  d.reason = who(m->id, m->name) + " will leave after its current step; it keeps rank " +
             std::to_string(m->rank) + " in generation " + std::to_string(r.generation);
  return d;
}

decision on_leave(const roster& r, mono_time now, member_id id, const options& opts) {
  const member* m = r.find(id);
  if (m == nullptr)
    return unchanged(r, "leave from member " + std::to_string(id) + ", which is not live", id);
  return remove_one(r, now, *m, departure::left, "left gracefully", opts);
}

readiness check_ready(const roster& r, const options& opts) {
  readiness out;
  const int alive = r.count(member_state::alive);
  out.ready = alive >= opts.min();
  if (out.ready) {
    out.reason = std::to_string(alive) + " alive, " + std::to_string(opts.min()) + " needed";
  } else {
    out.reason = "waiting for " + std::to_string(opts.min() - alive) +
                 " more alive worker(s): " + std::to_string(alive) + " alive, " +
                 std::to_string(r.count(member_state::joining)) + " joining, " +
                 std::to_string(opts.min()) + " needed";
  }
  return out;
}

status_view status(const roster& r, mono_time now, const options& opts) {
  status_view s;
  s.generation = r.generation;
  s.expected = opts.expected();
  s.alive = r.count(member_state::alive);
  s.ready = check_ready(r, opts);
  for (const auto& m : r.members) {
    member_view v;
    v.id = m.id;
    v.name = m.name;
    v.pid = m.pid;
    v.rank = m.rank;
    v.at = m.at;
    v.state = m.state;
    v.heartbeat_age_ms = ms_between(m.last_heartbeat, now);
    s.members.push_back(std::move(v));
  }
  for (auto it = r.departed.rbegin(); it != r.departed.rend(); ++it) {
    member_view v;
    v.id = it->id;
    v.name = it->name;
    v.pid = it->pid;
    v.rank = -1;
    v.at = it->last_at;
    v.state = member_state::dead;
    v.heartbeat_age_ms = ms_between(it->last_heartbeat, now);
    v.silent_ms = ms_between(it->last_heartbeat, it->removed_at);
    v.reason = std::string(to_string(it->cause)) + ": " + it->reason;
    s.members.push_back(std::move(v));
  }
  return s;
}

void to_json(nlohmann::json& j, const status_view& s) {
  j = nlohmann::json::object();
  j["generation"] = s.generation;
  j["expected"] = s.expected;
  j["alive"] = s.alive;
  j["ready"] = s.ready.ready;
  j["ready_reason"] = s.ready.reason;
  auto& arr = j["members"] = nlohmann::json::array();
  for (const auto& m : s.members) {
    arr.push_back({{"id", m.id},
                   {"name", m.name},
                   {"pid", m.pid},
                   {"rank", m.rank},
                   {"coords", {{"d", m.at.d}, {"p", m.at.p}, {"t", m.at.t}}},
                   {"state", to_string(m.state)},
                   {"heartbeat_age_ms", m.heartbeat_age_ms},
                   {"silent_ms", m.silent_ms},
                   {"reason", m.reason}});
  }
}

decision bump_generation(const roster& r, const std::string& why) {
  decision d;
  d.next = r;
  d.next.generation += 1;
  d.new_generation = true;
  d.reason = why + "; generation " + std::to_string(r.generation) + " -> " +
             std::to_string(d.next.generation);
  return d;
}

}  // namespace cohort::net::membership
