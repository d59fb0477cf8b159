// The coordinator's admin commands (docs/architecture.md, "Elasticity"): `cohort ctl drain
// NAME | scale N | inject SPEC | stop --checkpoint` and a worker's own drain (or, under
// fault_tolerance.on_sigterm: checkpoint, the run's stop with a checkpoint) on SIGTERM, each decided by the role
// of the key that opened the asking connection and answered with an admin_reply; and the
// drains and launcher requests they start.
#include <spdlog/spdlog.h>

#include "actors/coordinator_internal.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/faults.hpp"

namespace cohort::actors::coord {
namespace {

// The workers a scale counts: live members and those waiting in the join window (they are
// members at its close; a scale that left them out would start their number again).
int counted_for_scale(const coordinator_state& st) {
  return live_members(st.roster) + static_cast<int>(st.joiners.size());
}

// Why the workers cannot be counted yet (empty: they can). A leader that took over a
// running job knows its workers only as they re-attach: until they form its first
// generation, a count would start again the ones on their way back.
std::string not_countable(const coordinator_state& st) {
  if (!st.opts.taking_over || st.formed) return {};
  return "this coordinator took over the run moments ago and its workers are still "
         "re-attaching (" +
         std::to_string(st.joiners.size()) +
         " so far); ask again once `cohort ctl ... status` lists them";
}

// Whose authority a request carries: the role of the key that opened its connection.
// Without keys there are no roles (docs/security.md): a connection that holds a member
// speaks as that worker, any other as an admin.
net::key_role authority(const coordinator_state& st, const net::sender& from) {
  if (from.role) return *from.role;
  return st.member_at.count(from.peer) != 0 ? net::key_role::worker : net::key_role::admin;
}

// The live member FROM's connection registered, or nullptr (none, or it left).
const mb::member* own_member(const coordinator_state& st, const std::string& peer) {
  const auto it = st.member_at.find(peer);
  return it == st.member_at.end() ? nullptr : st.roster.find(it->second);
}

}  // namespace

void drain(self_ptr self, mb::member_id id) {
  auto& st = self->state;
  adopt(self, mb::on_leave_intent(st.roster, now(self), id, st.opts.membership));
  if (st.opts.job) {
    run_job(self, st.opts.job->on_drain(st.roster, id, now_s(self)));
    return;
  }
  send(self, st.peer_of[id], net::stop{"drained"});
  if (adopt(self, mb::on_leave(st.roster, now(self), id, st.opts.membership)))
    on_new_generation(self);
}

std::string scale_to(self_ptr self, int target, const std::string& spec) {
  auto& st = self->state;
  const int live = counted_for_scale(st);
  if (target > live && st.launcher.empty())
    return "no launcher is attached to this coordinator to start workers; start " +
           std::to_string(target - live) + " with `cohort worker --join <endpoint>`";
  if (st.opts.job) st.opts.job->on_scale(st.roster, target, spec, now_s(self));
  st.scale_awaited = target > live ? target : 0;
  if (target > live) {
    spdlog::info("coordinator: {}: asking the launcher for {} more worker(s)", spec, target - live);
    st.last_scale = net::scale_order{target - live, spec, st.opts.term, st.last_scale.seq + 1};
    send(self, st.launcher, st.last_scale);
    return {};
  }
  std::vector<mb::member_id> victims;
  // Whole replicas leave with pp * tp > 1 (highest seats first); otherwise the highest ranks.
  std::vector<mb::member_id> order;
  if (st.opts.job && st.opts.membership.pp * st.opts.membership.tp > 1) {
    order = st.opts.job->drain_order(st.roster);
  } else {
    for (auto it = st.roster.members.rbegin(); it != st.roster.members.rend(); ++it)
      order.push_back(it->id);
  }
  for (const mb::member_id id : order) {
    if (static_cast<int>(victims.size()) >= live - target) break;
    const mb::member* m = st.roster.find(id);
    if (m != nullptr && m->state != mb::member_state::leaving) victims.push_back(id);
  }
  for (const mb::member_id id : victims) drain(self, id);
  return {};
}

void resend_scale(self_ptr self) {
  auto& st = self->state;
  const int missing = st.scale_awaited - counted_for_scale(st);
  if (st.last_scale.seq == 0 || missing <= 0 || st.launcher.empty()) return;
  spdlog::info("coordinator: {}: {} worker(s) still missing; the order again to the launcher",
               st.last_scale.reason, missing);
  net::scale_order again = st.last_scale;
  again.start_workers = missing;
  send(self, st.launcher, again);
}

std::string checkpoint_stop(self_ptr self, const std::string& by) {
  auto& st = self->state;
  if (!st.opts.job) return "this coordinator runs no training job";
  if (st.stopping) return "the coordinator is stopping";
  step::training_job& job = *st.opts.job;
  if (job.stopping_early()) return {};  // asked already: the same stop
  if (!job.can_stop_early())
    return "the run is at its last step already: it ends with its final checkpoint";
  // ha: recorded first, so that a leader taking over mid-stop carries it out too.
  if (st.opts.record_stop) {
    const std::string why = st.opts.record_stop(by);
    if (!why.empty()) return why;
  }
  job.stop_early(by, now_s(self));
  job_actions a;
  a.notes.push_back("stopping with a checkpoint (asked by " + by +
                    "): the next step that opens is the run's last");
  run_job(self, std::move(a));
  return {};
}

void on_admin(self_ptr self, const net::sender& from, const net::admin_request& a) {
  auto& st = self->state;
  auto reply = [&](bool ok, const std::string& text) {
    send(self, from.peer, net::admin_reply{a.request_id, ok, text});
  };
  if (st.stopping) return reply(false, "the coordinator is stopping");
  // A worker (SIGTERM to a training worker) may drain the member its own connection holds
  // and nothing else; scale and inject are the admin's. Decided by the key, so a worker
  // key's connection that holds no member (it left, its record was pruned) gains nothing.
  const net::key_role who = authority(st, from);
  // SIGTERM to a worker under fault_tolerance.on_sigterm: checkpoint (a preemption reaches
  // every process of the job): the whole run stops with a checkpoint.
  if (a.command == "preempt" && who == net::key_role::worker && st.opts.job &&
      st.opts.job->spec().sigterm_checkpoints) {
    const mb::member* own = own_member(st, from.peer);
    if (own == nullptr) return reply(false, "this connection holds no live worker");
    const std::string why = checkpoint_stop(self, own->name + " (SIGTERM)");
    return reply(why.empty(), why.empty() ? "the run stops with a checkpoint" : why);
  }
  if (who == net::key_role::worker && a.command != "drain")
    return reply(false, "a worker may only drain itself");
  if (who != net::key_role::worker && who != net::key_role::admin)
    return reply(false, std::string("a ") + net::to_string(who) +
                            " key may not drain, scale or inject (the admin key may)");
  const mb::options& mo = st.opts.membership;
  if (a.command == "drain") {
    const mb::member* m = st.roster.find_name(a.argument);
    if (m == nullptr)
      return reply(false, "no live worker named '" + a.argument +
                              "' (`cohort ctl ... status` lists the workers)");
    if (who == net::key_role::worker) {
      const mb::member* own = own_member(st, from.peer);
      if (own == nullptr)
        return reply(false,
                     "a worker may only drain itself, and this connection holds no live "
                     "worker");
      if (own->id != m->id) return reply(false, "a worker may only drain itself");
    }
    const int live = live_members(st.roster);
    if (st.opts.job && live - 1 < mo.min())
      spdlog::warn(
          "coordinator: draining {} leaves {} worker(s), below elastic.min_workers {}: "
          "training pauses until workers join",
          m->name, live - 1, mo.min());
    const std::string name = m->name;
    drain(self, m->id);
    return reply(true, name + " leaves at the next step boundary");
  }
  if (a.command == "scale") {
    int n = 0;
    std::size_t used = 0;
    try {
      n = std::stoi(a.argument, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != a.argument.size() || n < 1)
      return reply(false,
                   "scale: '" + a.argument + "' is not a worker count (a whole number >= 1)");
    if (n < mo.min() || n > mo.max())
      return reply(false, "scale " + std::to_string(n) + ": outside the elastic bounds [" +
                              std::to_string(mo.min()) + ", " + std::to_string(mo.max()) +
                              "]; change elastic.min_workers / elastic.max_workers in the config");
    const int seat = mo.pp * mo.tp;
    if (n % seat != 0)
      return reply(false, "scale " + std::to_string(n) +
                              ": a replica is pp * tp = " + std::to_string(seat) +
                              " workers; scale to a multiple of " + std::to_string(seat));
    if (const std::string why = not_countable(st); !why.empty())
      return reply(false, "scale " + std::to_string(n) + " not done: " + why);
    const int live = counted_for_scale(st);
    if (n == live) return reply(true, "already " + std::to_string(n) + " workers");
    const std::string spec = "scale to=" + std::to_string(n);
    if (st.opts.confirm_scale) {
      const std::string why = st.opts.confirm_scale(spec);
      if (!why.empty()) return reply(false, "scale " + std::to_string(n) + " not done: " + why);
    }
    const std::string err = scale_to(self, n, spec);
    if (!err.empty()) return reply(false, err);
    return reply(true,
                 "scaling from " + std::to_string(live) + " to " + std::to_string(n) + " workers");
  }
  if (a.command == "inject") {
    if (!st.opts.job) return reply(false, "this coordinator runs no training job");
    try {
      faults::fault_spec f = faults::parse_fault(a.argument);
      const std::string text = faults::to_string(f);
      if (f.kind == faults::fault_kind::scale && f.to_workers % (mo.pp * mo.tp) != 0)
        return reply(false, "fault '" + text + "': a replica is pp * tp = " +
                                std::to_string(mo.pp * mo.tp) + " workers; scale to a multiple");
      if (f.kind == faults::fault_kind::scale &&
          (f.to_workers < mo.min() || f.to_workers > mo.max()))
        return reply(
            false, "fault '" + text + "': outside the elastic bounds [" + std::to_string(mo.min()) +
                       ", " + std::to_string(mo.max()) +
                       "]; change elastic.min_workers / elastic.max_workers in the config");
      // Checked by the job before it is recorded: a fault the job refuses is not kept.
      st.opts.job->check_fault(f);
      if (st.opts.record_added_fault) {
        const std::string why = st.opts.record_added_fault(text);
        if (!why.empty()) return reply(false, "fault '" + text + "' not added: " + why);
      }
      st.opts.job->append_fault(std::move(f));
      spdlog::info("coordinator: fault '{}' added by ctl", text);
      return reply(true, "fault '" + text + "' added");
    } catch (const usage_error& e) {
      return reply(false, e.what());
    }
  }
  if (a.command == "preempt") {
    const std::string why = checkpoint_stop(self, "ctl");
    return reply(why.empty(), why.empty() ? "the run stops with a checkpoint at the next step "
                                            "boundary it can reach, then exits 3"
                                          : why);
  }
  reply(false, "unknown command '" + a.command + "' (drain, scale, inject, preempt)");
}

}  // namespace cohort::actors::coord
