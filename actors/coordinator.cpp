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
#include "runtime/core/rng.hpp"

namespace cohort::actors {

using namespace coord;  // the moves this file shares with coordinator_admin.cpp

namespace {

using std::chrono::milliseconds;

// drop control (fault injection, docs/faults.md): frames of the step protocol, rosters
// and heartbeats between the coordinator and its members are lost with probability p, a
// pure function of (seed, frame number). Registration, the rendezvous store, stop and the
// admin channel are never dropped.
bool drop_frame(self_ptr self, const std::string& peer, net::msg_type t) {
  auto& st = self->state;
  const faults::fault_spec* d = st.opts.job ? st.opts.job->drop_control() : nullptr;
  if (d == nullptr || st.member_at.count(peer) == 0) return false;
  switch (t) {
    case net::msg_type::roster_update:
    case net::msg_type::heartbeat:
    case net::msg_type::heartbeat_ack:
    case net::msg_type::job_spec:
    case net::msg_type::worker_ready:
    case net::msg_type::step_open:
    case net::msg_type::step_vote:
    case net::msg_type::step_result:
    case net::msg_type::train_report:
    case net::msg_type::fault_order:
      break;
    default:
      return false;
  }
  const uint64_t h = hash_coords(d->seed, 0x64726f70u, st.drop_draws++);
  if (static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0) >= d->p) return false;
  st.opts.job->note_dropped_frame();
  return true;
}

}  // namespace

mb::mono_time coord::now(self_ptr self) {
  auto& io = self->state.io;
  return io.clock ? io.clock() : std::chrono::steady_clock::now();
}

double coord::now_s(self_ptr self) {
  return std::chrono::duration<double>(now(self).time_since_epoch()).count();
}

void coord::send(self_ptr self, const std::string& peer, const net::message& m) {
  if (drop_frame(self, peer, net::type_of(m))) return;
  self->state.io.send(peer, m);
}

namespace {

net::coords to_wire(const mb::grid_coord& c) { return net::coords{c.d, c.p, c.t}; }

net::member_info info_of(const mb::member& m) {
  return net::member_info{
      m.id, m.name, m.rank, to_wire(m.at), static_cast<net::member_state>(m.state), m.pid};
}

void do_stop(self_ptr self, const std::string& reason);
void seat_spares(self_ptr self);

}  // namespace

// Sends what the job decided, tells the host, and acts on an abort (new generation) or the
// end of the job (stop the cluster).
void coord::run_job(self_ptr self, job_actions a) {
  auto& st = self->state;
  if (!st.opts.job) return;
  for (auto& s : a.sends) {
    auto it = st.peer_of.find(s.to);
    if (it != st.peer_of.end()) send(self, it->second, s.m);
  }
  st.step = st.opts.job->next_step();
  if (st.opts.on_job) st.opts.on_job(a, *st.opts.job);
  if (!a.failed.empty()) {
    spdlog::error("coordinator: training failed: {}", a.failed);
    do_stop(self, "training failed: " + a.failed);
    return;
  }
  if (a.finished) {
    do_stop(self, "training complete");
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
  net::roster_update ru;
  ru.generation = st.roster.generation;
  for (const auto& m : st.roster.members) ru.members.push_back(info_of(m));
  for (const auto& m : st.roster.members) send(self, st.peer_of[m.id], ru);
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
  // peer that left the roster has nobody waiting on its pending waits.
  st.store.set_ceiling(st.roster.generation);
  for (const auto& [member, peer] : st.peer_of) {
    const bool in = std::any_of(st.roster.members.begin(), st.roster.members.end(),
                                [&, m = member](const auto& x) { return x.id == m; });
    if (in) continue;
    for (const auto id : st.store.cancel_owner(store_owner(peer))) st.kv_waiters.erase(id);
  }
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

net::register_ok ok_for(self_ptr self, const mb::member* m) {
  const auto& st = self->state;
  net::register_ok ok;
  if (m != nullptr) {
    ok.member_id = m->id;
    ok.name = m->name;
    ok.rank = m->rank;
    ok.at = to_wire(m->at);
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

// D accepted the registration of PEER: admit it, adopt the roster, send register_ok and the
// job. The caller broadcasts the new generation.
void admit_member(self_ptr self, const std::string& peer, mb::decision&& d) {
  auto& st = self->state;
  const mb::member_id id = d.member;
  st.io.admit(peer);
  st.peer_of[id] = peer;
  st.member_at[peer] = id;
  adopt(self, std::move(d));
  send(self, peer, ok_for(self, st.roster.find(id)));
  if (st.opts.job) send(self, peer, st.opts.job->spec());
}

// Fills free seats with waiting spares, oldest first. Called at every generation change
// before the roster goes out, so a departure and its replacement reach the workers as one
// roster and the job never opens a step in between (whatever the spare's retry timer says).
void seat_spares(self_ptr self) {
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
    admit_member(self, s.peer, std::move(d));
  }
}

void on_register(self_ptr self, const std::string& peer, const net::register_request& r) {
  auto& st = self->state;
  if (st.stopping) {
    send(self, peer, net::register_reject{"coordinator is stopping"});
    return;
  }
  if (r.role == net::peer_role::client) {
    if (const std::string problem = mb::name_problem(r.name); !problem.empty()) {
      send(self, peer, net::register_reject{"client refused: " + problem});
      return;
    }
    st.io.admit(peer);
    if (st.clients.insert(peer).second) st.client_order.push_back(peer);
    if (r.name == "launch") st.launcher = peer;
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
      if (st.io.forget) st.io.forget(old);
    }
    net::register_ok ok = ok_for(self, nullptr);
    ok.name = r.name;
    send(self, peer, ok);
    return;
  }
  const auto t = now(self);
  bool grew = false;
  // The same socket registering again means its process restarted its worker state:
  // the old incarnation leaves first so the name is free and the roster stays honest.
  if (auto it = st.member_at.find(peer); it != st.member_at.end() && st.roster.find(it->second)) {
    grew |= adopt(self, mb::on_leave(st.roster, t, it->second, st.opts.membership));
  }
  drop_stale_spares(st, t);
  auto queued = std::find_if(st.spares.begin(), st.spares.end(),
                             [&](const auto& s) { return s.peer == peer; });
  // Spares queued before this one get free seats first.
  const bool behind = !st.spares.empty() && queued != st.spares.begin();
  mb::decision d = mb::on_register(st.roster, t, r.name, r.pid, st.opts.membership);
  if (behind && d.kind != mb::decision_kind::rejected) {
    d = mb::decision{};
    d.kind = mb::decision_kind::rejected;
    d.next = st.roster;
    d.reason = "spares who asked before '" + r.name + "' take the free seats first";
  }
  // A name held by a live member is final; any other refusal means the world is full.
  const bool full = d.kind == mb::decision_kind::rejected && st.roster.find_name(r.name) == nullptr;
  if (d.kind == mb::decision_kind::rejected) {
    // A full world keeps the joiner as a spare: it is seated as soon as a member leaves, and
    // asks again every retry_ms meanwhile (which keeps its place alive).
    const uint32_t retry = full ? spare_retry_ms(st) : 0;
    if (!full) {
      spdlog::warn("coordinator: registration of '{}' refused: {}", r.name, d.reason);
    } else if (queued == st.spares.end()) {
      spdlog::info("coordinator: '{}' waits as a spare: {}", r.name, d.reason);
      st.spares.push_back(coordinator_state::spare{peer, r.name, r.pid, t});
    } else {
      queued->name = r.name;
      queued->pid = r.pid;
      queued->asked = t;
    }
    send(self, peer, net::register_reject{d.reason, retry});
    if (grew) on_new_generation(self);
    return;
  }
  if (queued != st.spares.end()) st.spares.erase(queued);
  admit_member(self, peer, std::move(d));
  on_new_generation(self);
}

void on_heartbeat(self_ptr self, const std::string& peer, const net::heartbeat& hb) {
  auto& st = self->state;
  // Only the socket that registered a member beats for it: another peer naming its id (a
  // spoof, or a confused process) would otherwise keep a dead member alive or, claiming a
  // generation to come, evict a live one.
  if (auto it = st.peer_of.find(hb.member_id); it != st.peer_of.end() && it->second != peer) {
    spdlog::warn(
        "coordinator: a heartbeat for member {} from a peer that did not register it "
        "is ignored",
        hb.member_id);
    return;
  }
  // The common case touches the member's own entry: no copy of the roster per heartbeat.
  bool rejoin = false, grew = false;
  if (mb::refresh_member(st.roster, now(self), hb.member_id, hb.generation) ==
      mb::refresh_result::other) {
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
  // Spares still waiting end with the job like every member (exit 0).
  for (const auto& sp : st.spares) send(self, sp.peer, s);
  st.spares.clear();
  if (st.bench) st.bench->promise.deliver(caf::make_error(caf::sec::request_receiver_down));
  st.bench.reset();
  self->quit();
}

net::status_reply make_status(self_ptr self, uint64_t request_id) {
  auto& st = self->state;
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
  if (st.opts.job && st.opts.job->drop_control())
    out.dropped.push_back(net::counter{"drop_control", st.opts.job->report().dropped_frames()});
  return out;
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

void on_inbound(self_ptr self, const std::string& peer, const net::message& m) {
  auto& st = self->state;
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
          // Only the launcher sees its children exit, and it always names the pid it reaped.
          if (st.launcher.empty() || peer != st.launcher || x.pid <= 0) {
            spdlog::warn(
                "coordinator: exit notice for '{}' ignored: not from the launcher, or "
                "without a pid",
                x.name);
            return;
          }
          const std::string detail = x.exit_code > 128
                                         ? "killed by signal " + std::to_string(x.exit_code - 128)
                                         : "exit code " + std::to_string(x.exit_code);
          if (adopt(self, mb::on_exit_notice_by_name(st.roster, now(self), x.name, x.pid, detail,
                                                     st.opts.membership))) {
            on_new_generation(self);
          }
        } else if constexpr (std::is_same_v<T, net::status_request>) {
          send(self, peer, make_status(self, x.request_id));
        } else if constexpr (std::is_same_v<T, net::stop>) {
          do_stop(self, x.reason.empty() ? "stop requested" : x.reason);
        } else if constexpr (std::is_same_v<T, net::kv_set> || std::is_same_v<T, net::kv_get> ||
                             std::is_same_v<T, net::kv_wait>) {
          on_kv(self, peer, m);
        } else if constexpr (std::is_same_v<T, net::worker_ready> ||
                             std::is_same_v<T, net::step_vote> ||
                             std::is_same_v<T, net::train_report>) {
          // Only the socket that registered a member speaks for it.
          auto it = st.peer_of.find(x.member_id);
          if (!st.opts.job || st.stopping || it == st.peer_of.end() || it->second != peer) return;
          if constexpr (std::is_same_v<T, net::worker_ready>) {
            run_job(self, st.opts.job->on_ready(st.roster, x, now_s(self)));
          } else if constexpr (std::is_same_v<T, net::step_vote>) {
            run_job(self, st.opts.job->on_vote(st.roster, x, now_s(self)));
          } else {
            run_job(self, st.opts.job->on_report(st.roster, x, now_s(self)));
          }
        } else if constexpr (std::is_same_v<T, net::admin_request>) {
          on_admin(self, peer, x);
        } else if constexpr (std::is_same_v<T, net::ping>) {
          send(self, peer, net::pong{x.seq, x.sent_ns});
        } else if constexpr (std::is_same_v<T, net::pong>) {
          on_pong(self, peer, x);
        } else {
          // Coordinator-to-worker messages arriving here mean a confused peer.
          spdlog::warn("coordinator: ignoring unexpected {} from a peer", net::type_name(T::type));
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
  self->state.opts = opts;
  self->state.io = std::move(io);
  self->state.store = net::kv::store(opts.kv);
  self->state.tick_due = now(self) + milliseconds(opts.tick_ms);
  self->delayed_send(self, milliseconds(opts.tick_ms), co_tick_atom::value);
  return {
      [=](co_in_atom, const std::string& peer, const net::message& m) {
        on_inbound(self, peer, m);
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
          self->send(self, co_tick_atom::value);
          return;
        }
        st.tick_deferred = false;
        if (adopt(self, mb::check_timeouts(st.roster, t, st.opts.membership))) {
          on_new_generation(self);
        }
        for (const auto& r : st.store.expire(t)) answer_waiter(self, r);
        if (st.opts.job && !st.stopping)
          run_job(self, st.opts.job->on_tick(st.roster, now_s(self)));
        st.tick_due = now(self) + milliseconds(st.opts.tick_ms);
        self->delayed_send(self, milliseconds(st.opts.tick_ms), co_tick_atom::value);
      },
      [=](co_status_atom) -> net::status_reply { return make_status(self, 0); },
      [=](co_stop_atom, const std::string& reason) { do_stop(self, reason); },
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
