// Registrations as pure decisions: one candidate (on_register) or a join window's batch
// (on_register_batch), and when a join window closes. See membership.hpp.
#include <algorithm>
#include <string_view>
#include <unordered_map>

#include "runtime/net/membership.hpp"
#include "runtime/net/membership_internal.hpp"

namespace cohort::net::membership {

namespace {

using detail::ms_between;
using detail::who;

std::string at_text(const member& m) {
  return "rank " + std::to_string(m.rank) + " at (" + std::to_string(m.at.d) + ", " +
         std::to_string(m.at.p) + ", " + std::to_string(m.at.t) + ")";
}

}  // namespace

batch_decision on_register_batch(const roster& r, mono_time now, const std::vector<candidate>& cs,
                                 const options& opts) {
  batch_decision b;
  b.next = r;
  b.each.resize(cs.size());
  // Names in use: live members, then the candidates admitted before this one.
  std::unordered_map<std::string_view, const member*> live;
  live.reserve(r.members.size());
  for (const auto& m : r.members) live.emplace(m.name, &m);
  std::unordered_map<std::string, member_id> taken;
  std::vector<std::size_t> admitted;  // indexes into cs
  for (std::size_t i = 0; i < cs.size(); ++i) {
    const candidate& c = cs[i];
    admission& a = b.each[i];
    if (!c.name.empty()) {
      if (std::string problem = name_problem(c.name); !problem.empty()) {
        a.reason = std::move(problem);
        continue;
      }
      if (auto it = live.find(c.name); it != live.end()) {
        const member& m = *it->second;
        a.reason = "name '" + c.name + "' is held by live member " + std::to_string(m.id) + " (" +
                   to_string(m.state) + ", last heartbeat " +
                   std::to_string(ms_between(m.last_heartbeat, now)) +
                   " ms ago); use a unique name, or wait until that member times out (" +
                   std::to_string(opts.timeout_ms) + " ms)";
        continue;
      }
      if (auto it = taken.find(c.name); it != taken.end()) {
        a.reason = "name '" + c.name + "' is taken by member " + std::to_string(it->second) +
                   ", registered at the same time; use a unique name";
        continue;
      }
    }
    const int count = static_cast<int>(b.next.members.size());
    if (count >= opts.max()) {
      a.full = true;
      a.reason = "roster full: " + std::to_string(count) + " of " + std::to_string(opts.max()) +
                 " workers registered; '" + c.name + "' was not admitted";
      continue;
    }
    member m;
    m.id = b.next.next_id++;
    m.name = c.name.empty() ? "worker-" + std::to_string(m.id) : c.name;
    m.pid = c.pid;
    m.state = member_state::joining;
    m.joined_at = now;
    m.last_heartbeat = now;
    a.id = m.id;
    taken.emplace(m.name, m.id);
    b.next.members.push_back(std::move(m));
    admitted.push_back(i);
  }
  if (admitted.empty()) return b;
  b.next.generation += 1;
  b.new_generation = true;
  detail::assign_ranks(b.next.members, opts);
  std::string names;
  for (std::size_t k = 0; k < admitted.size(); ++k) {
    admission& a = b.each[admitted[k]];
    const member* placed = b.next.find(a.id);
    a.reason = who(placed->id, placed->name) + " joined as " + at_text(*placed);
    if (k < 3) names += (k == 0 ? "" : ", ") + who(placed->id, placed->name);
  }
  const std::string gens = "generation " + std::to_string(r.generation) + " -> " +
                           std::to_string(b.next.generation) + ", " +
                           std::to_string(b.next.members.size()) + " live";
  if (admitted.size() == 1) {
    b.reason = b.each[admitted[0]].reason + "; " + gens;
  } else {
    b.reason =
        std::to_string(admitted.size()) + " joined together (" + names +
        (admitted.size() > 3 ? " and " + std::to_string(admitted.size() - 3) + " more" : "") +
        "); " + gens;
  }
  return b;
}

decision on_register(const roster& r, mono_time now, const std::string& name, std::int64_t pid,
                     const options& opts) {
  batch_decision b = on_register_batch(r, now, {candidate{name, pid}}, opts);
  decision d;
  const admission& a = b.each.front();
  d.kind = a.id != 0 ? decision_kind::accepted : decision_kind::rejected;
  d.member = a.id;
  d.reason = a.id != 0 ? std::move(b.reason) : a.reason;
  d.new_generation = b.new_generation;
  d.next = std::move(b.next);
  return d;
}

mono_time join_window_closes(mono_time first, mono_time last, const options& opts) {
  const auto window = std::chrono::milliseconds(opts.join_window_ms);
  return std::min(last + window, first + join_window_max_windows * window);
}

bool join_window_closed(mono_time first, mono_time last, mono_time now, const options& opts) {
  return opts.join_window_ms <= 0 || now >= join_window_closes(first, last, opts);
}

bool join_window_complete(int seated, int live, int joining, int awaited, const options& opts) {
  if (joining <= 0) return false;
  return seated + joining >= opts.max() || (awaited > 0 && live + joining >= awaited);
}

void continue_after(roster& r, member_id id, std::uint64_t generation) {
  if (id < max_continued && id >= r.next_id) r.next_id = id + 1;
  if (generation < max_continued && generation > r.generation) r.generation = generation;
}

}  // namespace cohort::net::membership
