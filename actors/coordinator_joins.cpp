// Registrations at the coordinator: clients are answered at once; workers enter a join window
// and are admitted together, one generation for all who arrived close together
// (mb::on_register_batch, mb::join_window_closed); a full world keeps them as spares (each
// loading the job while it waits), seated the moment a member leaves. The roster that admits them
// goes out in on_new_generation.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "actors/coordinator.hpp"
#include "actors/coordinator_internal.hpp"
#include "runtime/net/relay.hpp"

namespace cohort::actors {

using namespace coord;

namespace {

using std::chrono::milliseconds;

net::register_ok ok_for(self_ptr self, const mb::member* m) {
  const auto& st = self->state;
  net::register_ok ok;
  if (m != nullptr) {
    ok.member_id = m->id;
    ok.name = m->name;
    ok.rank = m->rank;
    ok.at = net::coords{m->at.d, m->at.p, m->at.t};
  }
  ok.generation = st.roster.generation;
  ok.heartbeat_ms = static_cast<uint32_t>(st.opts.membership.heartbeat_ms);
  ok.timeout_ms = static_cast<uint32_t>(st.opts.membership.timeout_ms);
  return ok;
}

// How long a spare waits between registrations (it also asks again on its own, so a
// coordinator that lost track of it still sees it).
uint32_t spare_retry_ms(const coordinator_state& st) {
  return static_cast<uint32_t>(std::max(200, 5 * st.opts.membership.heartbeat_ms));
}

// Spares that stopped asking (their process died) lose their place.
void drop_stale_spares(coordinator_state& st, mb::mono_time t) {
  const auto stale = milliseconds(3 * spare_retry_ms(st));
  auto& q = st.spares;
  q.erase(std::remove_if(q.begin(), q.end(), [&](const auto& s) { return t - s.asked > stale; }),
          q.end());
}

// Member ID (admitted, its roster adopted) registered from PEER: admit the connection and
// send register_ok and the job. The caller announces the new generation; the member's
// first roster_update is a full copy (it was told no generation before).
void admit_member(self_ptr self, const std::string& peer, mb::member_id id) {
  auto& st = self->state;
  st.io.admit(peer);
  st.peer_of[id] = peer;
  st.member_at[peer] = id;
  send(self, peer, ok_for(self, st.roster.find(id)));
  if (st.opts.job) send(self, peer, st.opts.job->spec());
}

// Keeps PEER as a spare (or refreshes its place) and tells it to ask again.
void keep_spare(self_ptr self, const std::string& peer, const std::string& name, int64_t pid,
                const std::string& reason) {
  auto& st = self->state;
  auto queued = std::find_if(st.spares.begin(), st.spares.end(),
                             [&](const auto& s) { return s.peer == peer; });
  const bool fresh = queued == st.spares.end();
  if (fresh) {
    spdlog::info("coordinator: '{}' waits as a spare: {}", name, reason);
    st.spares.push_back(coordinator_state::spare{peer, name, pid, now(self)});
  } else {
    queued->name = name;
    queued->pid = pid;
    queued->asked = now(self);
  }
  send(self, peer, net::register_reject{reason, spare_retry_ms(st)});
  // A new spare loads the job while it waits, so that the seat it takes (a member's death,
  // in the departure's own roster) costs the group one round trip, not a load.
  if (fresh && st.opts.job) send(self, peer, st.opts.job->spec());
}

void register_client(self_ptr self, const std::string& peer, const net::register_request& r) {
  auto& st = self->state;
  if (const std::string problem = mb::name_problem(r.name); !problem.empty()) {
    send(self, peer, net::register_reject{"client refused: " + problem});
    return;
  }
  st.io.admit(peer);
  if (net::is_agent_name(r.name)) {
    // A host agent (with keys, the bridge let only a launcher key's connection register
    // so): kept for the run, as the launcher is; bounded like the roster it relays.
    if (st.agents.size() >= max_agents && !st.agents.count(peer)) {
      send(self, peer, net::register_reject{"agent refused: " + std::to_string(max_agents) +
                                            " host agents are registered already"});
      if (st.io.forget) st.io.forget(peer);
      return;
    }
    if (st.agents.insert(peer).second)
      spdlog::info("coordinator: host agent '{}' registered (pid {})", r.name, r.pid);
    if (st.io.relay) st.io.relay(peer);
    net::register_ok ok = ok_for(self, nullptr);
    ok.name = r.name;
    return send(self, peer, ok);
  }
  if (st.clients.insert(peer).second) st.client_order.push_back(peer);
  if (r.name == "launch") {
    st.launcher = peer;
    st.launch_peers.insert(peer);
  }
  // Each `cohort ctl` call is a new client: keep the newest, so that a stream of them (or
  // of hostile registrations) cannot grow the coordinator without bound.
  while (st.clients.size() > max_clients) {
    const std::string old = st.client_order.front();
    st.client_order.pop_front();
    if (old == st.launcher) {
      st.client_order.push_back(old);
      continue;
    }
    st.clients.erase(old);
    st.launch_peers.erase(old);
    if (st.io.forget) st.io.forget(old);
  }
  net::register_ok ok = ok_for(self, nullptr);
  ok.name = r.name;
  send(self, peer, ok);
  if (peer == st.launcher) resend_scale(self);  // after the ok, which register_as waits for
}

// Whether nobody else could enter with the open window's registrations.
bool window_complete(const coordinator_state& st) {
  return mb::join_window_complete(static_cast<int>(st.roster.members.size()),
                                  live_members(st.roster), static_cast<int>(st.joiners.size()),
                                  st.scale_awaited, st.opts.membership);
}

}  // namespace

void coord::seat_spares(self_ptr self) {
  auto& st = self->state;
  if (st.stopping || st.spares.empty()) return;
  const auto t = now(self);
  drop_stale_spares(st, t);
  auto& q = st.spares;
  while (!q.empty() && static_cast<int>(st.roster.members.size()) < st.opts.membership.max()) {
    const coordinator_state::spare s = q.front();
    q.erase(q.begin());
    if (st.member_at.count(s.peer) && st.roster.find(st.member_at[s.peer])) continue;
    mb::decision d = mb::on_register(st.roster, t, s.name, s.pid, st.opts.membership);
    if (d.kind == mb::decision_kind::rejected) {
      // Its name is taken now (a restarted worker of that name): it must pick another.
      send(self, s.peer, net::register_reject{d.reason, 0});
      continue;
    }
    spdlog::info("coordinator: spare '{}' takes a free seat", s.name);
    const mb::member_id id = d.member;
    adopt(self, std::move(d));
    admit_member(self, s.peer, id);
  }
}

void coord::on_register(self_ptr self, const std::string& peer, const net::register_request& r) {
  auto& st = self->state;
  if (st.stopping) {
    send(self, peer, net::register_reject{"coordinator is stopping"});
    return;
  }
  if (r.role == net::peer_role::client) {
    register_client(self, peer, r);
    return;
  }
  const auto t = now(self);
  // A worker re-attaching after a leader change (ha): ids and generations go on above what
  // the old leader gave out.
  if (st.opts.term > 0) mb::continue_after(st.roster, r.prev_member, r.prev_generation);
  // The same socket registering again means its process restarted its worker state:
  // the old incarnation leaves first so the name is free and the roster stays honest.
  // Announced now: the registration itself waits for its join window.
  if (auto it = st.member_at.find(peer); it != st.member_at.end() && st.roster.find(it->second)) {
    if (adopt(self, mb::on_leave(st.roster, t, it->second, st.opts.membership)))
      on_new_generation(self);
  }
  // Asked again while waiting in the window: the newest name and pid count.
  auto waiting = std::find_if(st.joiners.begin(), st.joiners.end(),
                              [&](const auto& j) { return j.peer == peer; });
  if (waiting != st.joiners.end()) {
    waiting->name = r.name;
    waiting->pid = r.pid;
    return;
  }
  if (!r.name.empty()) {
    if (const std::string problem = mb::name_problem(r.name); !problem.empty()) {
      warn_peer(self, "registration refused: " + problem);
      send(self, peer, net::register_reject{problem, 0});
      return;
    }
  }
  drop_stale_spares(st, t);
  auto queued = std::find_if(st.spares.begin(), st.spares.end(),
                             [&](const auto& s) { return s.peer == peer; });
  // Spares queued before this one get free seats first; the window's joiners hold theirs.
  const bool behind = !st.spares.empty() && queued != st.spares.begin();
  const int taken = static_cast<int>(st.roster.members.size() + st.joiners.size());
  if (behind || taken >= st.opts.membership.max()) {
    // A name held by a live member is final, whether or not there is room.
    if (!r.name.empty() && st.roster.find_name(r.name) != nullptr) {
      const mb::decision d = mb::on_register(st.roster, t, r.name, r.pid, st.opts.membership);
      warn_peer(self, "registration of '" + r.name + "' refused: " + d.reason);
      send(self, peer, net::register_reject{d.reason, 0});
      return;
    }
    keep_spare(self, peer, r.name, r.pid,
               behind ? "spares who asked before '" + r.name + "' take the free seats first"
                      : "roster full: " + std::to_string(taken) + " of " +
                            std::to_string(st.opts.membership.max()) +
                            " workers registered or joining; '" + r.name + "' was not admitted");
    return;
  }
  if (queued != st.spares.end()) st.spares.erase(queued);
  if (st.joiners.empty()) st.join_first = t;
  st.join_last = t;
  st.joiners.push_back(coordinator_state::joiner{peer, r.name, r.pid});
  if (st.opts.membership.join_window_ms <= 0 || window_complete(st)) {
    close_joins(self);
  } else if (!st.join_timer) {
    st.join_timer = true;
    self->delayed_send(self, milliseconds(st.opts.membership.join_window_ms), co_joins_atom::value);
  }
}

void coord::close_joins(self_ptr self) {
  auto& st = self->state;
  st.join_timer = false;
  if (st.joiners.empty() || st.stopping) return;
  const auto t = now(self);
  const auto& mo = st.opts.membership;
  if (!window_complete(st) && !mb::join_window_closed(st.join_first, st.join_last, t, mo)) {
    // Look again when it would close if nobody else arrives.
    const auto at = mb::join_window_closes(st.join_first, st.join_last, mo);
    st.join_timer = true;
    self->delayed_send(self,
                       std::max(milliseconds(1), std::chrono::duration_cast<milliseconds>(at - t)),
                       co_joins_atom::value);
    return;
  }
  std::vector<coordinator_state::joiner> joiners;
  joiners.swap(st.joiners);
  if (live_members(st.roster) + static_cast<int>(joiners.size()) >= st.scale_awaited)
    st.scale_awaited = 0;  // the scale's workers are here
  std::vector<mb::candidate> cs;
  cs.reserve(joiners.size());
  for (const auto& j : joiners) cs.push_back(mb::candidate{j.name, j.pid});
  mb::batch_decision b = mb::on_register_batch(st.roster, t, cs, mo);
  if (b.new_generation) spdlog::info("coordinator: {}", b.reason);
  st.roster = std::move(b.next);
  for (size_t i = 0; i < joiners.size(); ++i) {
    const mb::admission& a = b.each[i];
    if (a.id != 0) {
      admit_member(self, joiners[i].peer, a.id);
    } else if (a.full) {
      // The roster filled while the window was open (a waiting spare took a seat that a
      // departure freed): this one waits like any joiner of a full world.
      keep_spare(self, joiners[i].peer, joiners[i].name, joiners[i].pid, a.reason);
    } else {
      warn_peer(self, "registration of '" + joiners[i].name + "' refused: " + a.reason);
      send(self, joiners[i].peer, net::register_reject{a.reason, 0});
    }
  }
  if (b.new_generation) on_new_generation(self);
}

void coord::stop_joiners(self_ptr self, const net::stop& s) {
  auto& st = self->state;
  for (const auto& sp : st.spares) send(self, sp.peer, s);
  st.spares.clear();
  for (const auto& j : st.joiners) send(self, j.peer, s);
  st.joiners.clear();
}

}  // namespace cohort::actors
