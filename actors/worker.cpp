// The worker actor: it decides (register, rejoin, re-attach to the next leader, stop); the
// heartbeat thread only beats. Rejoin resets everything tied to the old generation before
// registering, so nothing learnt as the dead incarnation leaks into the new one. Its
// process wiring (bridge, heartbeats, store calls) is worker_node.cpp.
#include "actors/worker.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "actors/coordinator.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/trace.hpp"
#include "runtime/net/host_address.hpp"

namespace cohort::actors {

namespace {

using self_ptr = caf::stateful_actor<worker_state>*;
using std::chrono::milliseconds;
/// A SIGTERM this soon after the one that asked for a stop with a checkpoint is its echo.
constexpr milliseconds stop_echo{2000};

void finish(self_ptr self, int code) {
  auto& st = self->state;
  if (st.ph == worker_state::phase::done) return;
  st.ph = worker_state::phase::done;
  st.shared->member_id = 0;
  if (st.group) {
    // A collective or build the group is blocked in returns at once; then the group ends.
    st.group_shared->shut();
    self->send_exit(st.group, caf::exit_reason::user_shutdown);
    st.group = nullptr;
  }
  if (st.io.on_exit) st.io.on_exit(code);
  self->quit();
}

// Graceful leave now: the coordinator hears `leave` (one new generation), exit 0.
void leave_now(self_ptr self) {
  auto& st = self->state;
  if (st.ph == worker_state::phase::active) st.io.send(net::leave{st.member_id, st.generation});
  spdlog::info("worker {}: leaving", st.opts.name);
  finish(self, 0);
}

// Draining (SIGTERM): asks the leader to let this member leave at a step boundary, and
// leaves on its own if no `stop` comes within the coordinator timeout.
void ask_drain(self_ptr self) {
  auto& st = self->state;
  st.io.send(net::admin_request{0, "drain", st.opts.name});
  self->delayed_send(self, milliseconds(st.opts.coordinator_timeout_ms), co_dleft_atom::value,
                     st.incarnation);
}

// Everything learnt as a member (id, generation, rank, roster) is void; the training state
// stays. Whatever the group is doing belongs to a generation that no longer includes us.
void forget_generation(worker_state& st) {
  st.member_id = 0;
  st.generation = 0;
  st.rank = -1;
  st.at = net::coords{};
  st.roster_generation = 0;
  st.world_size = 0;
  st.shared->generation = 0;
  st.group_shared->abort_all();
}

// With ha a candidate tried blindly (the next in the list) that does not answer is soon
// given up for the next one; the first candidate and a leader a standby named get longer
// (a join window, a loaded machine).
int registration_timeout_ms(const worker_state& st) {
  if (!st.opts.ha()) return st.opts.coordinator_timeout_ms;
  return std::min(st.opts.coordinator_timeout_ms, st.probing ? 300 : 2000);
}

void start_registration(self_ptr self) {
  auto& st = self->state;
  st.ph = worker_state::phase::registering;
  st.shared->member_id = 0;
  ++st.incarnation;
  st.io.send(net::register_request{net::peer_role::worker, st.opts.name, st.opts.pid,
                                   st.prev_member, st.prev_generation});
  self->delayed_send(self, milliseconds(registration_timeout_ms(st)), co_regto_atom::value,
                     st.incarnation);
}

// ha: true (and the worker ends, exit 1) once it has looked for a leader for reattach_ms.
bool gave_up(self_ptr self) {
  auto& st = self->state;
  if (!st.reattach_since ||
      std::chrono::steady_clock::now() - *st.reattach_since < milliseconds(st.opts.reattach_ms))
    return false;
  std::string all;
  for (const auto& c : st.opts.candidates) all += (all.empty() ? "" : ", ") + c;
  spdlog::error("worker {}: no coordinator led within {} ms (candidates: {}); giving up",
                st.opts.name, st.opts.reattach_ms, all);
  finish(self, 1);
  return true;
}

// ha: speak to ENDPOINT, or to the next candidate when it is empty.
void switch_to(self_ptr self, const std::string& endpoint) {
  auto& st = self->state;
  const auto& c = st.opts.candidates;
  st.probing = endpoint.empty();
  if (endpoint.empty()) {
    st.candidate = (st.candidate + 1) % c.size();
  } else {
    const auto at = std::find(c.begin(), c.end(), endpoint);
    if (at != c.end()) st.candidate = static_cast<size_t>(at - c.begin());
  }
  st.io.reconnect(endpoint.empty() ? c[st.candidate] : endpoint);
}

// ha: the leader is lost (silent): keep the model, the optimizer and the data position,
// drop everything learnt from the old leader, and register with the next one as who this
// worker was there (its member id and generation: the new leader continues above them).
void reattach(self_ptr self, const std::string& why) {
  auto& st = self->state;
  if (!st.reattach_since) st.reattach_since = std::chrono::steady_clock::now();
  if (st.member_id != 0) st.prev_member = st.member_id;
  st.prev_generation = std::max(st.prev_generation, st.generation);
  st.lost_term = st.io.term ? st.io.term() : 0;
  spdlog::warn("worker {}: {}; looking for the next leader, training state kept", st.opts.name,
               why);
  forget_generation(st);
  switch_to(self, "");
  start_registration(self);
}

// Declared dead: everything learnt in the old generation is void.
void rejoin(self_ptr self) {
  auto& st = self->state;
  spdlog::warn("worker {}: coordinator declared member {} dead (generation {}); registering again",
               st.opts.name, st.member_id, st.generation);
  forget_generation(st);
  start_registration(self);
}

void adopt_roster(self_ptr self, const net::roster_update& ru) {
  auto& st = self->state;
  if (ru.generation <= st.roster_generation) return;  // late: a newer roster is already held
  // A roster that only grew (joiners) leaves the step in flight alone: the joiners enter
  // at the next step. Anyone gone, or the same members again (an aborted step), ends it.
  // A change from the roster this worker holds says who left; a full copy, or a change from
  // a roster it never got (a lost frame), cannot say, so the step in flight ends.
  const bool exact = ru.base_generation != 0 && ru.base_generation == st.roster_generation;
  const bool lost = exact ? !ru.left.empty() : st.roster_generation != 0;
  const bool grew = ru.world_size > st.world_size;
  st.roster_generation = ru.generation;
  st.world_size = ru.world_size;
  st.generation = std::max(st.generation, ru.generation);
  st.shared->generation = st.generation;
  st.rank = ru.rank;
  st.at = ru.at;
  spdlog::info("worker {}: generation {} ({} members{}), rank {}", st.opts.name, ru.generation,
               ru.world_size,
               ru.left.empty() ? "" : ", " + std::to_string(ru.left.size()) + " left", st.rank);
  // A collective of an older generation can never complete now: fail it at once.
  if (lost || !grew) st.group_shared->abort_below(ru.generation);
}

void on_job(self_ptr self, const net::job_spec& spec, uint64_t member_id) {
  auto& st = self->state;
  if (!st.io.kv_call) {
    spdlog::warn("worker {}: ignoring a job: this worker has no data plane", st.opts.name);
    return;
  }
  // --trace on the coordinator: record spans from now on (they go out with telemetry).
  if (spec.trace && !trace::enabled()) trace::enable(true);
  st.sigterm_checkpoints = spec.sigterm_checkpoints;
  if (!st.group) {
    dp_group_io gio;
    gio.send = st.io.send;
    gio.kv_call = st.io.kv_call;
    gio.data_host = st.io.data_host;
    gio.keys = st.opts.keys;
    gio.clock = [shared = st.shared] { return shared->clock.current(); };
    caf::actor me = caf::actor_cast<caf::actor>(self);
    gio.fatal = [me](const std::string& why) { caf::anon_send(me, co_fatal_atom::value, why); };
    auto shared = st.shared;
    gio.mute_heartbeats = [shared](uint32_t ms) { shared->link.mute_for(milliseconds(ms)); };
    gio.cut_off = [shared](uint32_t ms) { shared->link.cut_for(milliseconds(ms)); };
    st.group = self->spawn<caf::detached>(dp_group_actor, gio, st.group_shared);
  }
  self->send(st.group, co_job_atom::value, spec, member_id, st.generation);
}

void on_step_open(self_ptr self, const net::step_open& o) {
  auto& st = self->state;
  if (!st.group) return;
  self->send(st.group, co_open_atom::value, o, st.member_id, o.rank);
}

void on_inbound(self_ptr self, const net::message& m) {
  auto& st = self->state;
  if (st.ph == worker_state::phase::done) return;
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, net::register_ok>) {
          if (st.ph != worker_state::phase::registering) return;
          st.ph = worker_state::phase::active;
          st.spare = false;
          st.member_id = x.member_id;
          st.opts.name = x.name;  // keep the assigned name across rejoins
          st.rank = x.rank;
          st.at = x.at;
          st.generation = x.generation;
          ++st.registrations;
          if (st.opts.ha()) {
            st.shared->lost_after_ms = x.timeout_ms;
            if (st.reattach_since && st.prev_member != 0)
              spdlog::info("worker {}: re-attached to the leader of term {} after {} ms", x.name,
                           st.io.term ? st.io.term() : 0,
                           std::chrono::duration_cast<milliseconds>(
                               std::chrono::steady_clock::now() - *st.reattach_since)
                               .count());
            st.reattach_since.reset();
          }
          st.shared->generation = x.generation;
          st.shared->heartbeat_ms = x.heartbeat_ms;
          st.shared->member_id = x.member_id;  // last: heartbeats start with a full picture
          // The rank only: the seat (dp, pp, tp) is the job's to give (`cohort ctl status`).
          std::printf("worker %s registered: member %llu, rank %d, generation %llu\n",
                      x.name.c_str(), static_cast<unsigned long long>(x.member_id), x.rank,
                      static_cast<unsigned long long>(x.generation));
          std::fflush(stdout);
          if (st.draining) {
            // SIGTERM asked to drain, and the leader was lost (or declared this member dead)
            // before its stop came: ask again here, with a new deadline (the old one lapsed
            // with the old registration).
            spdlog::info("worker {}: draining: asking again after registering anew", x.name);
            ask_drain(self);
          }
        } else if constexpr (std::is_same_v<T, net::register_reject>) {
          if (st.ph != worker_state::phase::registering) return;
          if (x.standby && st.opts.ha()) {
            // A standby: go to the leader it names, unless that is the one just lost (its
            // lease has not run out yet); then ask the next candidate a little later.
            if (gave_up(self)) return;
            ++st.incarnation;  // answered: this attempt's timeout no longer applies
            const bool fresh = !x.leader.empty() && x.leader_term > st.lost_term;
            switch_to(self, fresh ? x.leader : std::string());
            self->delayed_send(self, milliseconds(fresh ? 1 : 50), co_retry_atom::value,
                               st.incarnation);
            return;
          }
          if (x.retry_ms > 0) {
            // The world is full: wait as a spare and ask again until a seat is free.
            if (!st.spare) {
              std::printf("worker %s: waiting as a spare (%s)\n", st.opts.name.c_str(),
                          x.reason.c_str());
              std::fflush(stdout);
            }
            st.spare = true;
            // The reject is an answer: the registration timeout of this incarnation no longer
            // applies (a retry period longer than it must not end the spare). The retry
            // re-arms it. The coordinator may also seat the spare before the retry is due.
            ++st.incarnation;
            self->delayed_send(self, milliseconds(x.retry_ms), co_retry_atom::value,
                               st.incarnation);
            return;
          }
          spdlog::error("worker {}: registration refused: {}", st.opts.name, x.reason);
          finish(self, 1);
        } else if constexpr (std::is_same_v<T, net::heartbeat_ack>) {
          // Acks for an earlier incarnation (sent before we re-registered) say nothing now.
          if (st.ph != worker_state::phase::active || x.member_id != st.member_id) return;
          if (x.rejoin_required) {
            rejoin(self);
          } else if (x.generation > st.generation) {
            st.generation = x.generation;
            st.shared->generation = x.generation;
          }
        } else if constexpr (std::is_same_v<T, net::roster_update>) {
          if (st.ph == worker_state::phase::active) adopt_roster(self, x);
        } else if constexpr (std::is_same_v<T, net::stop>) {
          spdlog::info("worker {}: stop from coordinator ({})", st.opts.name, x.reason);
          finish(self, 0);
        } else if constexpr (std::is_same_v<T, net::ping>) {
          st.io.send(net::pong{x.seq, x.sent_ns, net::now_ns()});
        } else if constexpr (std::is_same_v<T, net::admin_reply>) {
          // Only the drain this worker asked for on SIGTERM gets an answer here.
          if (st.asked_stop && !st.draining && !x.ok)
            spdlog::info("worker {}: stop with a checkpoint: {}", st.opts.name, x.text);
          if (st.draining && !x.ok) {
            spdlog::warn("worker {}: drain refused ({}); leaving now", st.opts.name, x.text);
            leave_now(self);
          }
        } else if constexpr (std::is_same_v<T, net::job_spec>) {
          // A spare gets the job while it waits and loads it ahead (member 0: no member
          // yet, so no worker_ready); seated, it gets it again and is ready at once.
          if (st.ph == worker_state::phase::active) on_job(self, x, st.member_id);
          if (st.ph == worker_state::phase::registering && st.spare) on_job(self, x, 0);
        } else if constexpr (std::is_same_v<T, net::step_open>) {
          if (st.ph == worker_state::phase::active) on_step_open(self, x);
        } else if constexpr (std::is_same_v<T, net::fault_order>) {
          if (st.ph == worker_state::phase::active && st.group)
            self->send(st.group, co_fault_atom::value, x);
        } else if constexpr (std::is_same_v<T, net::step_result>) {
          if (st.ph == worker_state::phase::active && st.group)
            self->send(st.group, co_res_atom::value, x);
        } else {
          // kv replies and the rest belong to parts (communicators) not built yet.
        }
      },
      m);
}

}  // namespace

caf::behavior worker_actor(caf::stateful_actor<worker_state>* self, worker_options opts,
                           worker_io io, std::shared_ptr<worker_shared> shared) {
  self->state.opts = std::move(opts);
  self->state.io = std::move(io);
  self->state.shared = std::move(shared);
  return {
      [=](co_start_atom) {
        auto& st = self->state;
        if (st.opts.ha()) st.reattach_since = std::chrono::steady_clock::now();
        if (st.incarnation == 0) start_registration(self);
      },
      [=](co_in_atom, const std::string&, const net::message& m) { on_inbound(self, m); },
      [=](co_leave_atom) {
        auto& st = self->state;
        if (st.ph == worker_state::phase::active && st.group && st.sigterm_checkpoints &&
            !st.asked_stop && !st.draining) {
          // A preemption or a time limit signals every process of the job: the whole run
          // stops with a checkpoint, and this worker with it (the coordinator's stop); a
          // second SIGTERM leaves at once.
          st.asked_stop = true;
          st.asked_stop_at = std::chrono::steady_clock::now();
          spdlog::info("worker {}: SIGTERM: asking the coordinator to stop the run with a "
                       "checkpoint",
                       st.opts.name);
          st.io.send(net::admin_request{0, "preempt", st.opts.name});
          return;
        }
        if (st.asked_stop && std::chrono::steady_clock::now() - st.asked_stop_at < stop_echo) {
          spdlog::info("worker {}: SIGTERM again within {} ms: the same stop (send another "
                       "later to leave at once)",
                       st.opts.name, stop_echo.count());
          return;
        }
        if (st.ph == worker_state::phase::active && st.group && !st.draining && !st.asked_stop) {
          // Training: leave at the next step boundary so that no step is aborted. The
          // coordinator answers with `stop`; a second SIGTERM, or no stop in time, leaves
          // at once.
          st.draining = true;
          spdlog::info("worker {}: draining: leaving after the current step", st.opts.name);
          ask_drain(self);
          return;
        }
        leave_now(self);
      },
      [=](co_dleft_atom, uint64_t incarnation) {
        auto& st = self->state;
        if (!st.draining || incarnation != st.incarnation) return;
        spdlog::warn("worker {}: no stop within {} ms of asking to drain; leaving now",
                     st.opts.name, st.opts.coordinator_timeout_ms);
        leave_now(self);
      },
      [=](co_retry_atom, uint64_t incarnation) {
        auto& st = self->state;
        if (st.ph != worker_state::phase::registering || incarnation != st.incarnation) return;
        start_registration(self);
      },
      [=](co_lost_atom) {
        auto& st = self->state;
        if (st.opts.ha() && st.ph == worker_state::phase::active) {
          reattach(self, "the leader is gone (its connection dropped, or it was silent for " +
                             std::to_string(st.shared->lost_after_ms.load()) + " ms)");
          return;
        }
        if (st.opts.ha()) return;  // registering already: the candidates are being tried
        spdlog::error("worker {}: coordinator silent for {} ms; giving up", self->state.opts.name,
                      self->state.opts.coordinator_timeout_ms);
        finish(self, 1);
      },
      [=](co_fatal_atom, const std::string& why) {
        spdlog::error("worker {}: {}", self->state.opts.name, why);
        finish(self, 1);
      },
      [=](co_version_atom, const std::string& why) {
        // Two builds that cannot understand each other: a deployment error, like a bad
        // config (exit 2), not something a retry would mend.
        spdlog::error("worker {}: {}", self->state.opts.name, why);
        finish(self, 2);
      },
      [=](co_regto_atom, uint64_t incarnation) {
        auto& st = self->state;
        if (st.ph != worker_state::phase::registering || incarnation != st.incarnation) return;
        if (st.opts.ha()) {  // that candidate is down: the next one
          if (gave_up(self)) return;
          switch_to(self, "");
          start_registration(self);
          return;
        }
        // A coordinator with keys never completes the handshake of a worker without the
        // job's worker key (or with another job's): from here that looks like silence.
        spdlog::error("worker {}: no answer to registration within {} ms ({})", st.opts.name,
                      st.opts.coordinator_timeout_ms,
                      st.opts.keys ? "is it running, and does it authorize this --keys DIR's "
                                     "worker.key?"
                                   : "is it running? If it was started with keys, pass the "
                                     "same --keys DIR");
        finish(self, 1);
      },
  };
}

}  // namespace cohort::actors
