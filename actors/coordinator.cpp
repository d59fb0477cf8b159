// Coordinator actor: translates wire messages into membership / store decisions and sends
// what they decide. Every membership change ends in the same place (on_new_generation):
// broadcast the roster, drop the store's older generations. Admin commands are in
// coordinator_admin.cpp, store requests in coordinator_store.cpp, the process around the
// actor in coordinator_node.cpp.
#include "actors/coordinator.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <functional>

#include "actors/coordinator_internal.hpp"
#include "runtime/core/config.hpp"
#include "runtime/core/faults.hpp"
#include "runtime/core/process.hpp"
#include "runtime/net/relay.hpp"

namespace cohort::actors {

using namespace coord;  // the moves this file shares with coordinator_admin.cpp

namespace {

using std::chrono::milliseconds;

// Injected control-plane faults (the job's frame filter, runtime/step/control_faults.hpp)
// act on frames between the coordinator and its members only.
bool drop_frame(self_ptr self, const std::string& peer, net::msg_type t) {
  auto& st = self->state;
  return st.opts.control_filter && st.member_at.count(peer) != 0 && st.opts.control_filter->drop(t);
}

}  // namespace

mb::mono_time coord::now(self_ptr self) {
  auto& io = self->state.io;
  return io.clock ? io.clock() : std::chrono::steady_clock::now();
}

double coord::now_s(self_ptr self) {
  return std::chrono::duration<double>(now(self).time_since_epoch()).count();
}

void coord::warn_peer(self_ptr self, const std::string& text) {
  if (const auto l = self->state.peer_warnings.admit())
    spdlog::warn("coordinator: {}{}", text, log_limiter::suffix(*l, "such warnings"));
}

void coord::send(self_ptr self, const std::string& peer, const net::message& m) {
  if (drop_frame(self, peer, net::type_of(m))) return;
  self->state.io.send(peer, m);
}

namespace {

net::coords to_wire(const mb::grid_coord& c) { return net::coords{c.d, c.p, c.t}; }

void do_stop(self_ptr self, const std::string& reason);

// Tells each live member what changed since the generation it was last told: who left,
// its rank, the world size (a full copy for a new member, or one older than the log).
// Members told the same base share one list of departures. Returns who left since the
// last announcement.
std::vector<mb::member_id> announce(self_ptr self) {
  auto& st = self->state;
  const uint64_t g = st.roster.generation;
  std::vector<mb::member_id> ids = mb::ids_of(st.roster);
  std::vector<mb::member_id> left = mb::left_between(st.announced, ids);
  if (g > st.changes.newest()) st.changes.record(g, left);
  st.announced = std::move(ids);
  std::unordered_map<uint64_t, std::optional<std::vector<mb::member_id>>> since;
  net::roster_update ru;
  ru.generation = g;
  ru.world_size = static_cast<uint32_t>(st.roster.members.size());
  std::unordered_map<mb::member_id, uint64_t> held;
  held.reserve(st.roster.members.size());
  for (const auto& m : st.roster.members) {
    auto h = st.held.find(m.id);
    const uint64_t base = h == st.held.end() ? 0 : h->second;
    auto it = since.find(base);
    if (it == since.end()) it = since.emplace(base, st.changes.left_since(base)).first;
    ru.base_generation = it->second ? base : 0;
    ru.left = it->second ? *it->second : std::vector<mb::member_id>{};
    ru.rank = m.rank;
    ru.at = to_wire(m.at);
    send(self, st.peer_of[m.id], ru);
    held.emplace(m.id, g);
  }
  // Only live members are told anything: the departed drop out of the map.
  st.held = std::move(held);
  return left;
}

// Forgets the connections of members that are neither live nor among the tombstones (which
// are bounded), so a long run's churn does not grow the coordinator. The transport forgets
// such a connection too (back to register-only): it holds no member any more, and nothing
// it sends may pass as that member's.
void prune_peers(self_ptr self) {
  auto& st = self->state;
  if (st.peer_of.size() <= st.roster.members.size() + st.roster.departed.size()) return;
  std::unordered_set<mb::member_id> keep;
  keep.reserve(st.roster.members.size() + st.roster.departed.size());
  for (const auto& m : st.roster.members) keep.insert(m.id);
  for (const auto& t : st.roster.departed) keep.insert(t.id);
  for (auto it = st.peer_of.begin(); it != st.peer_of.end();) {
    if (keep.count(it->first) != 0) {
      ++it;
      continue;
    }
    auto at = st.member_at.find(it->second);
    if (at != st.member_at.end() && at->second == it->first) {
      st.member_at.erase(at);
      if (st.io.forget && st.clients.count(it->second) == 0) st.io.forget(it->second);
    }
    it = st.peer_of.erase(it);
  }
}

}  // namespace

// Sends what the job decided, tells the host, and acts on an abort (new generation) or the
// end of the job (stop the cluster).
void coord::run_job(self_ptr self, job_actions a) {
  auto& st = self->state;
  if (!st.opts.job) return;
  if (a.coordinator_fault && st.opts.on_coordinator_fault)
    st.opts.on_coordinator_fault(*a.coordinator_fault, a.coordinator_fault_index);
  if (!a.fired_faults.empty() && st.opts.on_worker_faults) st.opts.on_worker_faults(a.fired_faults);
  for (auto& s : a.sends) {
    auto it = st.peer_of.find(s.to);
    if (it != st.peer_of.end()) send(self, it->second, s.m);
  }
  st.step = st.opts.job->progress();
  if (st.opts.on_job) st.opts.on_job(a, *st.opts.job);
  if (!a.failed.empty()) {
    spdlog::error("coordinator: training failed: {}", a.failed);
    do_stop(self, "training failed: " + a.failed);
    return;
  }
  if (a.finished) {
    do_stop(self, st.opts.job->stopped_early()
                      ? "stopped early with a checkpoint at step " +
                            std::to_string(st.opts.job->steps())
                      : std::string("training complete"));
    return;
  }
  if (!a.leave.empty() && !st.stopping) {
    // Drained members leave between steps: told to stop (they exit 0), then out of the
    // roster in one new generation; the next step opens without them.
    bool grew = false;
    for (const mb::member_id id : a.leave) {
      send(self, st.peer_of[id], net::stop{"drained: leaving at a step boundary"});
      grew |= adopt(self, mb::on_leave(st.roster, now(self), id, st.opts.membership));
    }
    if (grew) on_new_generation(self);
  }
  for (const mb::member_id id : a.drain)  // a straggler (elastic.straggler_factor)
    if (!st.stopping && st.roster.find(id) != nullptr) drain(self, id);
  if (a.scale_to > 0 && !st.stopping) {
    const std::string err = scale_to(self, a.scale_to, a.scale_spec);
    if (!err.empty()) spdlog::warn("coordinator: '{}': {}", a.scale_spec, err);
  }
  if (!a.bump.empty() && !st.stopping) {
    adopt(self, mb::bump_generation(st.roster, a.bump));
    on_new_generation(self);
  }
}

void coord::on_new_generation(self_ptr self) {
  auto& st = self->state;
  seat_spares(self);
  st.formed = st.formed || !st.roster.members.empty();
  const std::vector<mb::member_id> left = announce(self);
  if (st.io.beats) st.io.beats->publish(st.roster, st.peer_of);
  spdlog::info("coordinator: generation {} with {} member(s)", st.roster.generation,
               st.roster.members.size());
  // The job first: it aborts an open step that lost a voter. Then rendezvous keys of older
  // generations can never complete a group again, except the open step's when it goes on
  // (the roster only grew; joiners enter after it): their waiters are answered superseded
  // now, so a member waiting for a rank that died builds the new generation at once
  // instead of at its rendezvous timeout.
  const bool run = st.opts.job && !st.stopping;
  job_actions actions;
  if (run) actions = st.opts.job->on_generation(st.roster, now_s(self));
  uint64_t keep_from = st.roster.generation;
  if (st.opts.job) {
    if (auto open = st.opts.job->open_step()) keep_from = std::min(keep_from, open->first);
  }
  for (const auto& r : st.store.drop_generations_below(keep_from)) {
    answer_waiter(self, r);
  }
  // Nobody may fill or pre-set the store of a generation that is not announced yet, and a
  // member that left has nobody waiting on its pending waits (only live members reach the
  // store, so the departures since the last announcement are all there is to cancel).
  st.store.set_ceiling(st.roster.generation);
  for (const mb::member_id id : left) {
    const auto peer = st.peer_of.find(id);
    if (peer == st.peer_of.end()) continue;
    for (const auto w : st.store.cancel_owner(store_owner(peer->second))) st.kv_waiters.erase(w);
  }
  prune_peers(self);
  if (run) run_job(self, std::move(actions));
}

// The caller broadcasts after any direct reply, so a joiner hears register_ok before the
// roster that contains it.
bool coord::adopt(self_ptr self, mb::decision&& d) {
  auto& st = self->state;
  if (d.kind != mb::decision_kind::refreshed && d.kind != mb::decision_kind::unchanged &&
      !d.reason.empty()) {
    spdlog::info("coordinator: {}", d.reason);
  }
  st.roster = std::move(d.next);
  return d.new_generation;
}

namespace {

void on_heartbeat(self_ptr self, const std::string& peer, const net::heartbeat& hb) {
  auto& st = self->state;
  // Only the socket that registered a member beats for it: another peer naming its id (a
  // spoof, or a confused process) would otherwise keep a dead member alive or, claiming a
  // generation to come, evict a live one.
  if (auto it = st.peer_of.find(hb.member_id); it != st.peer_of.end() && it->second != peer) {
    warn_peer(self, "a heartbeat for member " + std::to_string(hb.member_id) +
                        " from a peer that did not register it is ignored");
    return;
  }
  // The common case touches the member's own entry: no copy of the roster per heartbeat.
  bool rejoin = false, grew = false;
  const mb::refresh_result done =
      mb::refresh_member(st.roster, now(self), hb.member_id, hb.generation);
  if (done == mb::refresh_result::became_alive && st.io.beats)
    st.io.beats->mark_alive(hb.member_id);
  if (done == mb::refresh_result::other) {
    mb::decision d =
        mb::on_heartbeat(st.roster, now(self), hb.member_id, hb.generation, st.opts.membership);
    rejoin = d.kind == mb::decision_kind::rejoin_required;
    grew = adopt(self, std::move(d));
  }
  send(self, peer, net::heartbeat_ack{hb.member_id, st.roster.generation, hb.seq, rejoin});
  if (grew) {
    on_new_generation(self);
  } else if (st.opts.job && !st.stopping && !rejoin) {
    // A member's first heartbeat makes it alive: the step it was missing may open now.
    run_job(self, st.opts.job->on_heartbeat(st.roster, now_s(self)));
  }
}

void do_stop(self_ptr self, const std::string& reason) {
  auto& st = self->state;
  if (st.stopping) return;
  st.stopping = true;
  spdlog::info("coordinator: stopping ({})", reason);
  const net::stop s{reason};
  for (const auto& m : st.roster.members) send(self, st.peer_of[m.id], s);
  // Clients get the same stop as an acknowledgement (ctl waits for it).
  for (const auto& c : st.clients) send(self, c, s);
  // Spares and joiners still waiting end with the job like every member (exit 0).
  stop_joiners(self, s);
  if (st.bench) st.bench->promise.deliver(caf::make_error(caf::sec::request_receiver_down));
  st.bench.reset();
  self->quit();
}

net::status_reply make_status(self_ptr self, uint64_t request_id) {
  auto& st = self->state;
  if (st.io.beats) st.io.beats->refresh(st.roster);
  const mb::status_view v = mb::status(st.roster, now(self), st.opts.membership);
  net::status_reply out;
  out.request_id = request_id;
  out.generation = v.generation;
  out.step = st.step;
  for (const auto& m : v.members) {
    net::worker_status w;
    w.member = net::member_info{
        m.id, m.name, m.rank, to_wire(m.at), static_cast<net::member_state>(m.state), m.pid};
    w.heartbeat_age_ms = m.heartbeat_age_ms;
    w.silent_ms = m.silent_ms;
    // With a job, the seat is the job's (pipeline and TP jobs seat by replica, not by rank);
    // a member the job has not seated yet (a joiner) shows (-1, -1, -1).
    if (st.opts.job) {
      const auto seat = st.opts.job->seat_of(m.id);
      w.member.at =
          seat ? net::coords{(*seat)[0], (*seat)[1], (*seat)[2]} : net::coords{-1, -1, -1};
    }
    out.workers.push_back(std::move(w));
  }
  if (st.io.drop_counts) out.dropped = st.io.drop_counts();
  if (st.opts.control_filter)
    for (auto& c : st.opts.control_filter->counters()) out.dropped.push_back(std::move(c));
  if (st.opts.job) out.job = st.opts.job->live(st.roster).dump();
  if (st.opts.coordinator_status) out.coordinator = st.opts.coordinator_status();
  return out;
}

// Whether the worker named NAME (a member, or a registration waiting in the join window)
// reached this coordinator through the host agent AGENT.
bool relays_member(const coordinator_state& st, const std::string& agent, const std::string& name) {
  if (const auto* m = st.roster.find_name(name)) {
    const auto it = st.peer_of.find(m->id);
    if (it != st.peer_of.end() && net::relayed_by(it->second, agent)) return true;
  }
  return std::any_of(st.joiners.begin(), st.joiners.end(), [&](const auto& j) {
    return j.name == name && net::relayed_by(j.peer, agent);
  });
}

void on_pong(self_ptr self, const std::string& peer, const net::pong& p) {
  auto& st = self->state;
  if (!st.bench || peer != st.bench->peer || p.seq != st.bench->seq) return;
  st.bench->result.rtt_ns.push_back(net::now_ns() - p.sent_ns);
  if (--st.bench->left == 0) {
    st.bench->promise.deliver(std::move(st.bench->result));
    st.bench.reset();
    return;
  }
  send(self, peer, net::ping{++st.bench->seq, net::now_ns()});
}

void on_inbound(self_ptr self, const net::sender& from, const net::message& m) {
  auto& st = self->state;
  const std::string& peer = from.peer;
  // The bridge drops what a key's role may not send before it is decoded; the coordinator
  // holds to the same rule where it decides, whatever transport fed it.
  if (from.role) {
    if (!net::role_may_send(*from.role, static_cast<int>(net::type_of(m)))) return;
    if (const auto* r = std::get_if<net::register_request>(&m)) {
      if (const std::string why = net::registration_problem(*from.role, *r); !why.empty())
        return send(self, peer, net::register_reject{"refused: " + why, 0});
    }
  }
  if (drop_frame(self, peer, net::type_of(m))) return;
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, net::register_request>) {
          on_register(self, peer, x);
        } else if constexpr (std::is_same_v<T, net::heartbeat>) {
          on_heartbeat(self, peer, x);
        } else if constexpr (std::is_same_v<T, net::leave>) {
          // Only the socket that registered a member may take it out.
          auto it = st.peer_of.find(x.member_id);
          if (it == st.peer_of.end() || it->second != peer) return;
          if (adopt(self, mb::on_leave(st.roster, now(self), x.member_id, st.opts.membership))) {
            on_new_generation(self);
          }
        } else if constexpr (std::is_same_v<T, net::exit_notice>) {
          // Only the launcher sees its children exit, and it always names the pid it reaped;
          // a host agent speaks for the workers it relays only (its children, or one it
          // found hung).
          const bool from_launcher = !st.launcher.empty() && peer == st.launcher;
          const bool agent = st.agents.count(peer) != 0;
          const bool from_agent = agent && relays_member(st, peer, x.name);
          // An agent's worker that died before it registered names nobody: nothing to do.
          if (agent && !from_agent && st.roster.find_name(x.name) == nullptr) return;
          if (!(from_launcher || from_agent) || x.pid <= 0) {
            warn_peer(self, "exit notice for '" + x.name +
                                "' ignored: not from the launcher or the worker's host agent, "
                                "or without a pid");
            return;
          }
          // A worker that died while its registration waited in the join window.
          auto& js = st.joiners;
          js.erase(
              std::remove_if(js.begin(), js.end(),
                             [&](const auto& j) { return j.name == x.name && j.pid == x.pid; }),
              js.end());
          const std::string detail = x.exit_code == net::exit_code_hung
                                         ? "silent past the timeout at its host agent (hung)"
                                         : proc::describe_exit_code(x.exit_code);
          if (adopt(self, mb::on_exit_notice_by_name(st.roster, now(self), x.name, x.pid, detail,
                                                     st.opts.membership))) {
            on_new_generation(self);
          }
        } else if constexpr (std::is_same_v<T, net::status_request>) {
          send(self, peer, make_status(self, x.request_id));
          // launch asks from the connection it uses: if a registration of an earlier
          // attempt of its came in after this one's, the launcher is this one again, and
          // an order sent to the other (closed) one goes out again here.
          if (peer != st.launcher && st.launch_peers.count(peer) != 0) {
            st.launcher = peer;
            resend_scale(self);
          }
        } else if constexpr (std::is_same_v<T, net::stop>) {
          do_stop(self, x.reason.empty() ? "stop requested" : x.reason);
        } else if constexpr (std::is_same_v<T, net::kv_set> || std::is_same_v<T, net::kv_get> ||
                             std::is_same_v<T, net::kv_wait>) {
          on_kv(self, peer, m);
        } else if constexpr (std::is_same_v<T, net::worker_ready> ||
                             std::is_same_v<T, net::step_vote> ||
                             std::is_same_v<T, net::train_report> ||
                             std::is_same_v<T, net::telemetry>) {
          // Only the socket that registered a member speaks for it.
          auto it = st.peer_of.find(x.member_id);
          if (!st.opts.job || st.stopping || it == st.peer_of.end() || it->second != peer) return;
          if constexpr (std::is_same_v<T, net::worker_ready>) {
            run_job(self, st.opts.job->on_ready(st.roster, x, now_s(self)));
          } else if constexpr (std::is_same_v<T, net::step_vote>) {
            run_job(self, st.opts.job->on_vote(st.roster, x, now_s(self)));
          } else if constexpr (std::is_same_v<T, net::telemetry>) {
            st.opts.job->on_telemetry(st.roster, x, now_s(self));
          } else {
            run_job(self, st.opts.job->on_report(st.roster, x, now_s(self)));
          }
        } else if constexpr (std::is_same_v<T, net::admin_request>) {
          on_admin(self, from, x);
        } else if constexpr (std::is_same_v<T, net::ping>) {
          // A worker's clock probe (tracing) reads our clock in reply_ns.
          send(self, peer, net::pong{x.seq, x.sent_ns, net::now_ns()});
        } else if constexpr (std::is_same_v<T, net::pong>) {
          on_pong(self, peer, x);
        } else {
          // Coordinator-to-worker messages arriving here mean a confused peer.
          warn_peer(self,
                    std::string("ignoring unexpected ") + net::type_name(T::type) + " from a peer");
        }
      },
      m);
}

}  // namespace

coordinator_options coordinator_options_from(const config& cfg) {
  coordinator_options o;
  o.membership = mb::options_from(cfg);
  // Half a heartbeat: a death is seen at most timeout + heartbeat/2 after the last beat.
  o.tick_ms = std::max(5, cfg.fault_tolerance.heartbeat_ms / 2);
  return o;
}

caf::behavior coordinator_actor(caf::stateful_actor<coordinator_state>* self,
                                coordinator_options opts, coordinator_io io) {
  if (!opts.control_filter) opts.control_filter = step::job_frame_filter(opts.job);
  self->state.opts = opts;
  self->state.io = std::move(io);
  self->state.store = net::kv::store(opts.kv);
  self->state.tick_due = now(self) + milliseconds(opts.tick_ms);
  self->delayed_send(self, milliseconds(opts.tick_ms), co_tick_atom::value);
  return {
      [=](co_in_atom, const net::sender& from, const net::message& m) {
        on_inbound(self, from, m);
      },
      [=](co_tick_atom) {
        auto& st = self->state;
        const auto t = now(self);
        // A tick that arrives well after it was due means this actor (or its timer) ran
        // late: heartbeats that reached the process meanwhile wait in the mailbox behind
        // this tick. Look again after them (a message to self queues behind everything
        // already queued), so the coordinator's own lag is not blamed on the workers.
        // Once only: a coordinator that stays late still declares the silent dead.
        const auto lag_allowed =
            milliseconds(std::max<int64_t>(st.opts.tick_ms, st.opts.membership.timeout_ms / 4));
        if (!st.tick_deferred && t - st.tick_due > lag_allowed) {
          st.tick_deferred = true;
          st.tick_queued = t;
          self->send(self, co_tick_atom::value);
          return;
        }
        // What reached the mailbox after this tick was queued waits behind it (first beats
        // of a burst of joiners, say): silence counts only up to when it was queued.
        const auto queued = st.tick_deferred ? st.tick_queued : st.tick_due;
        st.tick_deferred = false;
        // Silence counts only up to where the transport has read what arrived: a beat still
        // queued in it is not the member's fault. The bridge's beats join the roster first.
        if (st.io.beats) st.io.beats->refresh(st.roster);
        // And beats that came late say the coordinator itself is behind: the others' silence
        // may be the same delay (heartbeat_table::lag).
        const auto heard =
            std::min(queued, st.io.caught_up ? std::min(t, st.io.caught_up()) : t);
        const auto lag = st.io.beats ? st.io.beats->lag(t) : milliseconds(0);
        if (adopt(self, mb::check_timeouts(st.roster, heard, st.opts.membership, lag))) {
          on_new_generation(self);
        }
        for (const auto& r : st.store.expire(t)) answer_waiter(self, r);
        if (st.opts.job && !st.stopping)
          run_job(self, st.opts.job->on_tick(st.roster, now_s(self)));
        st.tick_due = now(self) + milliseconds(st.opts.tick_ms);
        self->delayed_send(self, milliseconds(st.opts.tick_ms), co_tick_atom::value);
      },
      [=](co_joins_atom) { close_joins(self); },
      [=](co_status_atom) -> net::status_reply { return make_status(self, 0); },
      [=](co_stop_atom, const std::string& reason) { do_stop(self, reason); },
      [=](co_ckstop_atom, const std::string& by) { checkpoint_stop(self, by); },
      [=](co_bench_atom, const std::string& name, uint32_t n) -> caf::result<bench_result> {
        auto& st = self->state;
        const mb::member* m = st.roster.find_name(name);
        if (m == nullptr || n == 0 || st.bench) {
          return caf::make_error(caf::sec::invalid_argument);
        }
        st.bench = std::make_unique<coordinator_state::bench_run>();
        st.bench->promise = self->make_response_promise();
        st.bench->peer = st.peer_of[m->id];
        st.bench->left = n;
        st.bench->seq = 1;
        send(self, st.bench->peer, net::ping{1, net::now_ns()});
        return caf::delegated<bench_result>();
      },
  };
}

}  // namespace cohort::actors
