// Step protocol decisions (docs/protocol.md, "Training"). Every rule that keeps survivors
// consistent lives here: a step commits only when every member of its generation voted ok
// (by result, or in the data within a commit window: a vote marked applied), and any
// failure aborts it for everyone and moves to a new generation.
#include "runtime/step/training_job.hpp"

#include <algorithm>

#include "runtime/core/sha256.hpp"

namespace cohort::step {

namespace {

std::string who(const mb::member& m) { return m.name + " (member " + std::to_string(m.id) + ")"; }

// Appends what a nested decision (try_open) concluded to OUT.
void merge(job_actions& out, job_actions&& more) {
  out.sends.insert(out.sends.end(), more.sends.begin(), more.sends.end());
  out.notes.insert(out.notes.end(), more.notes.begin(), more.notes.end());
  out.leave.insert(out.leave.end(), more.leave.begin(), more.leave.end());
  out.drain.insert(out.drain.end(), more.drain.begin(), more.drain.end());
  if (more.scale_to > 0) {
    out.scale_to = more.scale_to;
    out.scale_spec = more.scale_spec;
  }
  out.fired_faults.insert(out.fired_faults.end(), more.fired_faults.begin(),
                          more.fired_faults.end());
  if (more.coordinator_fault) {
    out.coordinator_fault = std::move(more.coordinator_fault);
    out.coordinator_fault_index = more.coordinator_fault_index;
  }
  if (!more.failed.empty()) out.failed = more.failed;
  out.finished = out.finished || more.finished;
}

}  // namespace

std::set<std::string> training_job::names_of(const mb::roster& r,
                                             const std::map<mb::member_id, bool>& votes) {
  std::set<std::string> out;
  for (const auto& [id, ok] : votes)
    if (const mb::member* m = r.find(id)) out.insert(m->name);
  return out;
}

training_job::training_job(const config& cfg, std::string config_yaml, int64_t start_step,
                           std::string resume_checkpoint, uint64_t job_id)
    : cfg_(cfg),
      yaml_(std::move(config_yaml)),
      hash_(sha256_hex(yaml_)),
      resume_(std::move(resume_checkpoint)),
      job_id_(job_id),
      steps_(cfg.train.steps),
      next_step_(start_step),
      start_step_(start_step),
      units_per_sample_(cfg.model.kind == "gpt" ? cfg.model.context : 1),
      seat_size_(cfg.parallel.pp * cfg.parallel.tp),
      report_(cfg, start_step),
      balance_(cfg.train.balance == "measured" && cfg.parallel.pp * cfg.parallel.tp == 1,
               (cfg.train.global_batch + cfg.train.micro_batch - 1) / cfg.train.micro_batch,
               cfg.train.micro_batch, cfg.elastic.straggler_factor) {}

std::optional<std::pair<uint64_t, int64_t>> training_job::open_step() const {
  if (!open_) return std::nullopt;
  return std::make_pair(open_->generation, open_->step);
}

void training_job::abort_open(const mb::roster& r, const std::string& why, job_actions& out) {
  if (!open_) return;
  report_.step_aborted();
  stepped_.generation = 0;  // the links of an aborted step are gone: the next step rebuilds
  if (open_->restore >= 0) rollback_ = true;  // not every member may have loaded it yet
  const net::step_result res{open_->generation, open_->step, false, 0.0, why};
  for (const auto& [id, ok] : open_->votes) {
    if (r.find(id) != nullptr) out.sends.push_back({id, res});
  }
  out.notes.push_back("step " + std::to_string(open_->step) + " of generation " +
                      std::to_string(open_->generation) + " aborted: " + why);
  if (windows()) {
    // Members of a window may have applied different steps of it (also the window before
    // this step: a member whose last collective there broke is behind): each says where it
    // stands (worker_ready, its answer to an abort) before anything opens again.
    for (const auto& [id, ok] : open_->votes) ready_.erase(id);
    resync_ = true;
  }
  open_.reset();
}

training_job::phase training_job::state() const {
  if (finished_) return phase::done;
  if (open_) return open_->through >= 0 ? phase::window : phase::open;
  if (resync_) return phase::resync;
  return next_step_ >= steps_ ? phase::reporting : phase::waiting;
}

int64_t training_job::window_end() const {
  const int w = cfg_.fault_tolerance.commit_window;
  if (!windows()) return -1;
  // The job's last step commits by result, so every member has applied it before the
  // reports are awaited (a member whose last collective broke would otherwise be left
  // behind with no step to catch up on).
  int64_t last = std::min(steps_ - 2, next_step_ + w - 1);
  if (last < next_step_) return -1;
  // A step a fault acts on opens by itself: its opening carries the fault's order. So does
  // a step that takes a rollback point, so that its opening says which point is good.
  if (keeps_points()) {
    const int64_t k = cfg_.fault_tolerance.memory_every;
    last = std::min(last, (next_step_ / k + 1) * k - 1);
  }
  return faults_.next_acting_step(next_step_ + 1, last) - 1;
}

job_actions training_job::on_generation(const mb::roster& r, double now_s) {
  job_actions out;
  if (finished_) return out;
  // A roster that only grew leaves the open step alone: joiners enter at the next step
  // boundary. A member of the step gone (or the same members again: an aborted step's
  // bump) means the step cannot complete.
  if (rolls_back()) {
    // A member that held error memory left (lost, or drained by a scale-down): only the
    // checkpoint has its memory.
    std::set<mb::member_id> held = last_voters_;
    if (open_)
      for (const auto& [id, ok] : open_->votes) held.insert(id);
    for (const mb::member_id id : held) rollback_ = rollback_ || r.find(id) == nullptr;
  }
  if (open_ && open_->generation < r.generation) {
    bool lost = false;
    for (const auto& [id, ok] : open_->votes) lost = lost || r.find(id) == nullptr;
    const bool grew = r.members.size() > open_->votes.size();
    // With pp * tp > 1 members of broken replicas do not vote: only a lost voter matters.
    if (lost || (!grew && seat_size_ == 1))
      abort_open(r, "the roster moved to generation " + std::to_string(r.generation), out);
  }
  report_.generation_seen(r.generation, static_cast<int>(r.members.size()), now_s);
  track_membership(r, now_s, out);
  for (auto it = ready_.begin(); it != ready_.end();) {
    it = r.find(it->first) == nullptr ? ready_.erase(it) : std::next(it);
  }
  job_actions more = try_open(r, now_s);
  merge(out, std::move(more));
  return out;
}

job_actions training_job::on_ready(const mb::roster& r, const net::worker_ready& w, double now_s) {
  const mb::member* m = finished_ ? nullptr : r.find(w.member_id);
  if (m == nullptr) return {};
  if (ready_.count(w.member_id) == 0) report_.member_ready(m->name, now_s);
  ready_[w.member_id] = w.next_step;
  return try_open(r, now_s);
}

job_actions training_job::try_open(const mb::roster& r, double now_s) {
  job_actions out;
  if (finished_ || open_ || next_step_ >= steps_) return out;
  // A fixed world in this version: every configured worker, alive and built.
  // Steps run with every live member once at least elastic.min_workers are alive and built
  // (min_workers defaults to cluster.workers: the fixed world). A member still loading
  // (alive but not ready) is waited for rather than left out.
  // Drained members leave here, between steps, so that no step is aborted for them.
  for (const auto& m : r.members)
    if (m.state == mb::member_state::leaving) out.leave.push_back(m.id);
  if (!out.leave.empty()) return out;
  std::map<mb::member_id, net::step_open> opens;
  if (seat_size_ > 1) {
    if (!open_hybrid(r, now_s, out, opens)) return out;
    settle_end();
    waiting_.noted = false;
    waiting_.paused_since_s = -1;
    track_membership(r, now_s, out);
    faults_.inject_due(r, next_step_, now_s, out, report_);
    open_state o;
    o.generation = r.generation;
    o.step = next_step_;
    for (auto& [id, m] : opens) {
      m.end = steps_;
      o.votes[id] = false;
      o.sent[id] = m;
      out.sends.push_back({id, m});
      ready_[id] = next_step_;
      replicas_ = m.replicas;
    }
    o.sent_s = now_s;
    if (first_open_s_ < 0) first_open_s_ = now_s;
    report_.step_opened(replicas_, now_s);
    report_.step_members(names_of(r, o.votes), now_s);
    open_ = std::move(o);
    return out;
  }
  const int expected = min_workers();
  int ready = 0;
  for (const auto& m : r.members) {
    if (m.state == mb::member_state::alive && ready_.count(m.id) != 0) ++ready;
  }
  // Joiners still loading the job do not hold the group up (docs/data_parallel.md, "A join").
  const std::optional<mb::roster> without =
      static_cast<int>(r.members.size()) != ready ? stepping_without_joiners(r) : std::nullopt;
  if (without) return open_step_on(r, *without, now_s);
  if (ready < expected || static_cast<int>(r.members.size()) != ready) {
    if (!waiting_.noted && next_step_ > start_step_ && !resync_) {
      out.notes.push_back(ready < expected
                              ? "waiting for workers: " + std::to_string(ready) + " ready, " +
                                    std::to_string(expected) + " needed (elastic.min_workers)"
                              : "waiting for " + std::to_string(r.members.size() - ready) +
                                    " joining worker(s) to load the job");
      waiting_.noted = true;
    }
    if (ready < expected && was_training() && waiting_.paused_since_s < 0)
      waiting_.paused_since_s = now_s;
    return out;
  }
  waiting_.noted = false;
  waiting_.paused_since_s = -1;
  if (resync_) {
    // After an aborted window the job goes on from the newest state a live member holds
    // (a step some applied but whose votes did not all come in counts as done: those who
    // applied it were given every member's gradients for it).
    for (const auto& m : r.members) next_step_ = std::max(next_step_, ready_[m.id]);
    resync_ = false;
    if (next_step_ >= steps_) {
      // Taken over after the last step (the old leader died collecting the final reports):
      // the last step's commit, sent again, asks every member for its report again.
      reporting_.last_commit = net::step_result{r.generation, steps_ - 1, true, 0.0, ""};
      reporting_.last_commit_sent_s = now_s;
      last_voters_.clear();
      for (const auto& m : r.members) {
        last_voters_.insert(m.id);
        out.sends.push_back({m.id, *reporting_.last_commit});
      }
      return out;
    }
  }
  // A rollback: every member goes back to the newest state that holds the lost memory, a
  // rollback point in memory or a checkpoint.
  std::vector<int32_t> restore_parts;
  const int64_t restore = rollback_ ? roll_back(r, restore_parts, out) : -1;
  settle_end();
  // Members behind the job (a worker that rejoined after being declared dead) get the
  // state of the step from a member that has it, over the new generation's communicator.
  int donor = -1;
  bool behind = false;
  for (const auto& m : r.members) {
    if (restore >= 0 && restore_parts.empty()) break;  // every member loads the checkpoint
    if (restore >= 0) {
      // A point in memory: the members that kept it hold its state, the others are behind.
      if (point_.ranks.count(m.id) == 0)
        behind = true;
      else if (donor < 0)
        donor = m.rank;
      continue;
    }
    const int64_t at = ready_[m.id];
    if (at == next_step_) {
      if (donor < 0) donor = m.rank;
    } else {
      behind = true;
    }
  }
  if (behind && donor < 0) {
    out.failed = "no live worker holds the training state of step " + std::to_string(next_step_) +
                 " (every member is behind); restart from a checkpoint";
    finished_ = true;
    return out;
  }
  if (!behind) donor = -1;
  track_membership(r, now_s, out);  // the roster a step runs on is the one faults refer to
  faults_.inject_due(r, next_step_, now_s, out, report_);
  open_state o;
  o.generation = r.generation;
  o.step = next_step_;
  for (const auto& m : r.members) o.votes[m.id] = false;
  replicas_ = static_cast<int>(r.members.size());
  o.donor = donor;
  o.restore = restore;
  o.sent_s = now_s;
  o.through = window_end();
  const std::vector<int32_t> shares = shares_for_step(r, now_s, out);
  for (const auto& m : r.members) {
    o.sent[m.id] = net::step_open{r.generation, next_step_, replicas_, donor, m.rank};
    o.sent[m.id].through = o.through;
    o.sent[m.id].restore = restore;
    o.sent[m.id].restore_parts = restore_parts;
    o.sent[m.id].point = point_.step;
    o.sent[m.id].shares = shares;
    o.sent[m.id].end = steps_;
    out.sends.push_back({m.id, o.sent[m.id]});
    ready_[m.id] = next_step_;  // after the transfer every member holds this step's state
  }
  stepped_.generation = r.generation;
  stepped_.ranks.clear();
  for (const auto& m : r.members) stepped_.ranks[m.id] = m.rank;
  if (donor >= 0) {
    out.notes.push_back("step " + std::to_string(next_step_) + ": state sent from rank " +
                        std::to_string(donor) + " to the members behind it");
  }
  if (first_open_s_ < 0) first_open_s_ = now_s;
  report_.step_opened(replicas_, now_s);
  report_.step_members(names_of(r, o.votes), now_s);
  open_ = std::move(o);
  return out;
}

nlohmann::json training_job::live(const mb::roster& r) const {
  nlohmann::json j = report_.live();
  j["balance"] = balance_.json();
  for (const auto& m : r.members)
    if (m.state != mb::member_state::leaving && ready_.count(m.id) == 0)
      j["loading"].push_back(m.name);
  return j;
}

job_actions training_job::on_vote(const mb::roster& r, const net::step_vote& v, double now_s) {
  if (v.ok && v.applied) return on_applied(r, v, now_s);
  job_actions out;
  if (!open_ || v.generation != open_->generation) return out;
  // In a window only failures are voted by result, for any of its steps (a member may fail
  // a step another member already applied: it is behind, and the abort finds that out).
  if (open_->through >= 0 ? v.ok || v.step > open_->through : v.step != open_->step) return out;
  auto it = open_->votes.find(v.member_id);
  if (it == open_->votes.end() || it->second) return out;
  const mb::member* m = r.find(v.member_id);
  if (v.ok) note_point_ring(v);
  if (!v.ok) {
    const std::string why =
        (m != nullptr ? who(*m) : "member " + std::to_string(v.member_id)) + " failed: " + v.reason;
    abort_open(r, why, out);
    if (v.lost_state) {
      // Sharded state whose holders all left at once: only a checkpoint has it.
      if (checkpoints_ && checkpoints_(next_step_)) {
        rollback_ = true;
      } else {
        out.failed = "step " + std::to_string(v.step) + ": " + why +
                     " (no checkpoint to roll back to: set fault_tolerance.checkpoint_every)";
        finished_ = true;
        return out;
      }
    }
    if (v.fatal) {
      out.failed = "step " + std::to_string(v.step) + ": " + why;
      finished_ = true;
      return out;
    }
    // A peer that every rank found in the store but nobody could connect to will not
    // become reachable by trying again: after a few tries the job fails and says why.
    if (v.unreachable && ++streak_.unreachable >= max_unreachable_attempts) {
      out.failed = "step " + std::to_string(v.step) + ": the data plane could not connect " +
                   std::to_string(streak_.unreachable) +
                   " times in a row (check comm.interface and the firewall between the "
                   "hosts); last: " +
                   why;
      finished_ = true;
      return out;
    }
    if (++streak_.aborts > max_consecutive_aborts) {
      out.failed = "step " + std::to_string(v.step) + " aborted " + std::to_string(streak_.aborts) +
                   " times in a row; last: " + why;
      finished_ = true;
      return out;
    }
    out.bump = "step " + std::to_string(v.step) + " aborted (" + why + ")";
    return out;
  }
  it->second = true;
  measure(v);
  if (m != nullptr) report_.vote_counted(m->name, v.timing);
  open_->loss_rows += v.loss_rows;
  open_->rows += v.rows;
  for (const auto& [id, ok] : open_->votes) {
    if (!ok) return out;
  }
  // Every member voted ok: commit.
  const double loss = open_->loss_rows / static_cast<double>(cfg_.train.global_batch);
  const net::step_result res{open_->generation, open_->step, true, loss, ""};
  for (const auto& [id, ok] : open_->votes) out.sends.push_back({id, res});
  if (open_->step + 1 == steps_) {
    reporting_.last_commit = res;
    reporting_.last_commit_sent_s = now_s;
  }
  commit(r, open_->step, loss, now_s, out);
  open_.reset();
  job_actions more = try_open(r, now_s);
  merge(out, std::move(more));
  return out;
}

job_actions training_job::on_applied(const mb::roster& r, const net::step_vote& v, double now_s) {
  job_actions out;
  const mb::member* m = r.find(v.member_id);
  if (finished_ || m == nullptr) return out;
  report_.vote_counted(m->name, v.timing);
  // A vote of a window an abort ended: the members' worker_ready says where each stands.
  if (!open_ || open_->through < 0 || open_->generation != v.generation) return out;
  auto voted = open_->votes.find(v.member_id);
  if (voted == open_->votes.end()) return out;
  measure(v);
  if (v.step == open_->step) note_point_ring(v);
  // A member that applied step s applied every step of the window before it (a vote that
  // a lost frame overtook is counted by the later one, without its loss).
  auto [at, fresh] = open_->reached.emplace(v.member_id, v.step);
  if (!fresh) {
    if (v.step <= at->second) return out;  // a repeat
    at->second = v.step;
  }
  open_->loss_rows_at[v.step] += v.loss_rows;
  if (v.step >= open_->through) voted->second = true;  // through with the window
  // Steps every member has applied are committed, in order. (Each member applied a step
  // the moment its DP sum completed, which it does only once every member's gradients
  // are in; the coordinator learns it from the votes and needs them all only for the
  // loss and for knowing that nobody is left inside the window's collectives.)
  int64_t all = open_->through;
  for (const auto& [id, done] : open_->votes) {
    auto it = open_->reached.find(id);
    all = std::min(all, it == open_->reached.end() ? next_step_ - 1 : it->second);
  }
  while (next_step_ <= all) {
    const int64_t s = next_step_;
    commit(r, s, open_->loss_rows_at[s] / static_cast<double>(cfg_.train.global_batch), now_s, out);
    open_->loss_rows_at.erase(s);
  }
  if (next_step_ <= open_->through) {
    open_->step = next_step_;
    open_->sent_s = now_s;
    return out;
  }
  // Every member is through with the window: the next one (or a leave, or a joiner's
  // generation, whose roster makes workers abort the old collectives) can come now
  // without cutting off a member still inside the last collective.
  open_.reset();
  merge(out, try_open(r, now_s));
  return out;
}

void training_job::commit(const mb::roster& r, int64_t step, double loss, double now_s,
                          job_actions& out) {
  next_step_ = step + 1;
  // Every member of the step took its rollback point (docs/compression.md): it is the one
  // to roll back to now. A step replayed from its own point took none.
  // (Without the ring, which travels in the point step's votes, a group of several cannot
  // say who holds which copy: the older point stays the good one.)
  if (keeps_points() && step % cfg_.fault_tolerance.memory_every == 0 && point_.step != step &&
      (open_->votes.size() == 1 || !open_->point_ring.empty())) {
    point_.step = step;
    point_.replicas = static_cast<int>(open_->votes.size());
    point_.ranks.clear();
    for (const auto& [id, sent] : open_->sent) point_.ranks[id] = sent.rank;
    point_.ring = open_->point_ring;
  }
  last_voters_.clear();
  for (const auto& [id, ok] : open_->votes) {
    last_voters_.insert(id);
    if (ready_.count(id) != 0) ready_[id] = next_step_;
  }
  streak_.aborts = 0;
  streak_.unreachable = 0;
  report_.step_committed(next_step_, loss, r, last_voters_, now_s, out.notes);
  out.committed = true;
  out.step = next_step_;
  out.loss = loss;
  const double span = now_s - first_open_s_;
  out.rate = span > 0 ? static_cast<double>(next_step_ - start_step_) * cfg_.train.global_batch *
                            units_per_sample_ / span
                      : 0;
}

void training_job::on_telemetry(const mb::roster& r, const net::telemetry& t, double now_s) {
  if (const mb::member* m = r.find(t.member_id)) report_.telemetry_seen(m->name, t, now_s);
}

job_actions training_job::on_report(const mb::roster& r, const net::train_report& rep,
                                    double now_s) {
  job_actions out;
  const mb::member* m = r.find(rep.member_id);
  if (finished_ || m == nullptr || next_step_ < steps_ || rep.next_step != steps_) return out;
  // A report sent again (the frame was doubled) says nothing new.
  if (!reporting_.reported.insert(rep.member_id).second) return out;
  report_.report_received(*m, rep);
  // Every member of the last step reports (a broken replica's members never ran it).
  for (const auto& mem : r.members) {
    if (reporting_.reported.count(mem.id) == 0 && last_voters_.count(mem.id) != 0) return out;
  }
  finished_ = true;
  if (early_.asked) report_.stop_done(steps_, now_s);
  out.finished = true;
  return out;
}

void training_job::set_faults(std::vector<faults::fault_spec> f) {
  faults_.set(std::move(f), cfg_.ha.standbys);
  if (faults_.drop_control() != nullptr) report_.drops_control();
}

double training_job::resend_interval_s() const {
  if (faults_.drop_control() != nullptr)
    return std::max(0.02, 1.5e-3 * cfg_.fault_tolerance.heartbeat_ms);
  return std::max(2.0, 4e-3 * cfg_.fault_tolerance.timeout_ms);
}

void training_job::resend(const mb::roster& r, double now_s, job_actions& out) {
  const double every = resend_interval_s();
  if (open_ && now_s - open_->sent_s >= every) {
    // In a window (where ok means through with it) a quiet member may have voted for a
    // later step than the open one (that vote was lost) or never heard the open: it answers
    // either way.
    for (const auto& [id, ok] : open_->votes) {
      const mb::member* m = r.find(id);
      if (ok || m == nullptr) continue;
      out.sends.push_back({id, open_->sent[id]});
    }
    open_->sent_s = now_s;
  }
  for (const auto& m : r.members) {
    if (ready_.count(m.id) != 0 || m.state == mb::member_state::leaving) {
      spec_sent_s_.erase(m.id);
      continue;
    }
    auto [it, fresh] = spec_sent_s_.emplace(m.id, now_s);
    if (!fresh && now_s - it->second >= every) {
      out.sends.push_back({m.id, spec()});
      it->second = now_s;
    }
  }
  if (reporting_.last_commit && next_step_ >= steps_ &&
      now_s - reporting_.last_commit_sent_s >= every) {
    for (const auto& m : r.members)
      if (reporting_.reported.count(m.id) == 0)
        out.sends.push_back({m.id, *reporting_.last_commit});
    reporting_.last_commit_sent_s = now_s;
  }
}

void training_job::check_fault(const faults::fault_spec& f) const {
  faults_.check(f, next_step_, first_unopened());
}

int64_t training_job::progress() const {
  int64_t at = next_step_;
  if (resync_)
    for (const auto& [id, step] : ready_) at = std::max(at, step);
  return at;
}

job_actions training_job::on_drain(const mb::roster& r, mb::member_id id, double now_s) {
  const mb::member* m = r.find(id);
  if (finished_ || m == nullptr || drained_.count(id) != 0) return {};
  drained_.insert(id);
  report_.drain_asked(m->name, moment(r, now_s));
  job_actions out = try_open(r, now_s);
  out.notes.insert(out.notes.begin(), m->name + " is draining: it leaves after step " +
                                          std::to_string(open_ ? open_->step : progress() - 1));
  return out;
}

void training_job::on_scale(const mb::roster& r, int target, const std::string& spec,
                            double now_s) {
  report_.scale_asked(target, spec, moment(r, now_s));
}

void training_job::track_membership(const mb::roster& r, double now_s, job_actions& out) {
  report_.roster_seen(r, moment(r, now_s), first_open_s_ >= 0, drained_, out.notes);
}

int training_job::min_workers() const {
  return cfg_.elastic.min_workers > 0 ? cfg_.elastic.min_workers : cfg_.cluster.workers;
}

job_actions training_job::on_tick(const mb::roster& r, double now_s) {
  job_actions out = try_open(r, now_s);
  if (!finished_) resend(r, now_s, out);
  if (finished_ || open_ || waiting_.paused_since_s < 0) return out;
  const double waited_ms = 1000.0 * (now_s - waiting_.paused_since_s);
  if (waited_ms > static_cast<double>(cfg_.elastic.pause_timeout_ms)) {
    out.failed = "fewer than elastic.min_workers (" + std::to_string(min_workers()) +
                 ") workers for " + std::to_string(static_cast<long>(waited_ms)) +
                 " ms (elastic.pause_timeout_ms " + std::to_string(cfg_.elastic.pause_timeout_ms) +
                 "); start more workers or lower elastic.min_workers";
    finished_ = true;
  }
  return out;
}

}  // namespace cohort::step
