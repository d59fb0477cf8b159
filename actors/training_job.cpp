// Step protocol decisions (docs/protocol.md, "Training"). Every rule that keeps survivors
// consistent lives here: a step commits only when every member of its generation voted ok,
// and any failure aborts it for everyone and moves to a new generation.
#include "actors/training_job.hpp"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "runtime/core/error.hpp"
#include "runtime/core/sha256.hpp"
#include "runtime/train/param_stats.hpp"
#include "runtime/train/pipeline_schedule.hpp"

namespace cohort::actors {

namespace {

std::string who(const mb::member& m) { return m.name + " (member " + std::to_string(m.id) + ")"; }

double seconds(uint64_t us) { return static_cast<double>(us) * 1e-6; }

// Appends what a nested decision (try_open) concluded to OUT.
void merge(job_actions& out, job_actions&& more) {
  out.sends.insert(out.sends.end(), more.sends.begin(), more.sends.end());
  out.notes.insert(out.notes.end(), more.notes.begin(), more.notes.end());
  out.leave.insert(out.leave.end(), more.leave.begin(), more.leave.end());
  if (more.scale_to > 0) {
    out.scale_to = more.scale_to;
    out.scale_spec = more.scale_spec;
  }
  if (!more.failed.empty()) out.failed = more.failed;
  out.finished = out.finished || more.finished;
}

}  // namespace

training_job::training_job(const config& cfg, std::string config_yaml, int64_t start_step,
                           std::string resume_checkpoint)
    : cfg_(cfg),
      yaml_(std::move(config_yaml)),
      hash_(sha256_hex(yaml_)),
      resume_(std::move(resume_checkpoint)),
      steps_(cfg.train.steps),
      next_step_(start_step),
      start_step_(start_step),
      units_per_sample_(cfg.model.kind == "gpt" ? cfg.model.context : 1),
      seat_size_(cfg.parallel.pp * cfg.parallel.tp) {
  finished_ = false;
}

std::optional<std::array<int, 3>> training_job::seat_of(mb::member_id id) const {
  auto it = seat_.find(id);
  if (it == seat_.end()) return std::nullopt;
  const int tp = cfg_.parallel.tp;
  return std::array<int, 3>{it->second / seat_size_, (it->second % seat_size_) / tp,
                            it->second % tp};
}

std::vector<mb::member_id> training_job::drain_order(const mb::roster& r) const {
  std::map<int, int> filled;  // replica slot -> members seated there
  for (const auto& m : r.members)
    if (auto it = seat_.find(m.id); it != seat_.end()) ++filled[it->second / seat_size_];
  std::vector<std::pair<std::pair<int, int>, mb::member_id>> keyed;  // (broken?, -seat)
  for (const auto& m : r.members) {
    auto it = seat_.find(m.id);
    if (it == seat_.end()) {
      keyed.push_back({{0, 0}, m.id});
      continue;
    }
    const bool whole = filled[it->second / seat_size_] == seat_size_;
    keyed.push_back({{whole ? 1 : 0, -it->second}, m.id});
  }
  std::stable_sort(keyed.begin(), keyed.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<mb::member_id> out;
  for (const auto& k : keyed) out.push_back(k.second);
  return out;
}

void training_job::assign_seats(const mb::roster& r) {
  for (auto it = seat_.begin(); it != seat_.end();)
    it = r.find(it->first) == nullptr ? seat_.erase(it) : std::next(it);
  const int slots = std::max(1, cfg_.elastic.max_workers / seat_size_) * seat_size_;
  std::vector<mb::member_id> holder(static_cast<std::size_t>(slots), 0);
  for (const auto& [id, seat] : seat_)
    if (seat < slots) holder[static_cast<std::size_t>(seat)] = id;
  for (const auto& m : r.members) {
    if (seat_.count(m.id) != 0 || m.state == mb::member_state::leaving) continue;
    // The most nearly whole replica with a free seat (lowest first on a tie): a joiner
    // completes a broken replica before it starts a new one.
    // Among equally full ones, the replica whose members hold the newest state: the stale
    // replica's members would need a donor the other broken replica cannot be.
    int best = -1, best_filled = -1;
    int64_t best_step = -1;
    for (int d = 0; d * seat_size_ < slots; ++d) {
      int filled = 0;
      int64_t newest = -1;
      for (int k = 0; k < seat_size_; ++k) {
        const mb::member_id id = holder[d * seat_size_ + k];
        if (id == 0) continue;
        ++filled;
        auto at = ready_.find(id);
        if (at != ready_.end()) newest = std::max(newest, at->second);
      }
      if (filled < seat_size_ &&
          (filled > best_filled || (filled == best_filled && newest > best_step))) {
        best = d;
        best_filled = filled;
        best_step = newest;
      }
    }
    if (best < 0) continue;  // no free seat: it waits (the roster caps members anyway)
    for (int k = 0; k < seat_size_; ++k) {
      const int seat = best * seat_size_ + k;
      if (holder[seat] == 0) {
        holder[seat] = m.id;
        seat_[m.id] = seat;
        break;
      }
    }
  }
}

bool training_job::open_hybrid(const mb::roster& r, double now_s, job_actions& out,
                               std::map<mb::member_id, net::step_open>& opens) {
  assign_seats(r);
  // Whole replicas, in seat order: their members train; a broken replica's members wait
  // (and fall behind) until a joiner fills the seat.
  std::map<int, std::vector<const mb::member*>> replica;  // d -> members by seat
  for (const auto& m : r.members) {
    auto it = seat_.find(m.id);
    if (it == seat_.end()) continue;
    auto& v = replica[it->second / seat_size_];
    v.resize(static_cast<std::size_t>(seat_size_), nullptr);
    v[static_cast<std::size_t>(it->second % seat_size_)] = &m;
  }
  std::vector<std::vector<const mb::member*>> whole;
  for (auto& [d, v] : replica) {
    bool full = true;
    for (const auto* m : v) full = full && m != nullptr;
    if (full) whole.push_back(v);
  }
  const int needed = std::max(1, min_workers() / seat_size_);
  int not_ready = 0;
  for (const auto& v : whole)
    for (const auto* m : v)
      if (m->state != mb::member_state::alive || ready_.count(m->id) == 0) ++not_ready;
  if (static_cast<int>(whole.size()) < needed || not_ready > 0) {
    if (!waiting_noted_ && next_step_ > start_step_) {
      out.notes.push_back(static_cast<int>(whole.size()) < needed
                              ? "waiting for replicas: " + std::to_string(whole.size()) +
                                    " whole, " + std::to_string(needed) +
                                    " needed (elastic.min_workers / (pp * tp))"
                              : "waiting for " + std::to_string(not_ready) +
                                    " worker(s) of whole replicas to load the job");
      waiting_noted_ = true;
    }
    if (static_cast<int>(whole.size()) < needed && first_open_s_ >= 0 && pause_since_s_ < 0)
      pause_since_s_ = now_s;
    return false;
  }
  // Per DP group (seat k = (p, t)): the first replica holding the step's state donates to
  // members behind it (a joiner, or a member whose replica sat out).
  const int n = static_cast<int>(whole.size());
  for (int k = 0; k < seat_size_; ++k) {
    int donor = -1;
    bool behind = false;
    for (int d = 0; d < n; ++d) {
      const auto* m = whole[d][k];
      if (ready_[m->id] == next_step_) {
        if (donor < 0) donor = d;
      } else {
        behind = true;
      }
    }
    if (behind && donor < 0) {
      // A member of a broken replica may still hold this seat's state: wait for joiners to
      // make its replica whole rather than give up.
      bool held = false;
      for (const auto& [id, seat] : seat_)
        if (seat % seat_size_ == k && r.find(id) != nullptr && ready_.count(id) != 0 &&
            ready_.at(id) == next_step_)
          held = true;
      if (held) {
        if (!waiting_noted_) {
          out.notes.push_back("waiting for a joiner: the state of stage " +
                              std::to_string(k / cfg_.parallel.tp) +
                              " is held only by a replica that is not whole");
          waiting_noted_ = true;
        }
        return false;
      }
      out.failed = "no live worker holds the training state of stage " +
                   std::to_string(k / cfg_.parallel.tp) + " / TP rank " +
                   std::to_string(k % cfg_.parallel.tp) + " at step " + std::to_string(next_step_) +
                   "; restart from a checkpoint";
      finished_ = true;
      return false;
    }
    if (!behind) donor = -1;
    if (donor >= 0)
      out.notes.push_back("step " + std::to_string(next_step_) + ": stage " +
                          std::to_string(k / cfg_.parallel.tp) + " state sent from replica " +
                          std::to_string(donor) + " to the members behind it");
    for (int d = 0; d < n; ++d) {
      const auto* m = whole[d][k];
      opens[m->id] = net::step_open{r.generation,         next_step_,          n, donor, d,
                                    k / cfg_.parallel.tp, k % cfg_.parallel.tp};
    }
  }
  return true;
}

net::job_spec training_job::spec() const { return net::job_spec{yaml_, hash_, resume_, job_id_}; }

std::optional<std::pair<uint64_t, int64_t>> training_job::open_step() const {
  if (!open_) return std::nullopt;
  return std::make_pair(open_->generation, open_->step);
}

void training_job::abort_open(const mb::roster& r, const std::string& why, job_actions& out) {
  if (!open_) return;
  ++aborted_;
  const net::step_result res{open_->generation, open_->step, false, 0.0, why};
  for (const auto& [id, ok] : open_->votes) {
    if (r.find(id) != nullptr) out.sends.push_back({id, res});
  }
  out.notes.push_back("step " + std::to_string(open_->step) + " of generation " +
                      std::to_string(open_->generation) + " aborted: " + why);
  open_.reset();
}

job_actions training_job::on_generation(const mb::roster& r, double now_s) {
  job_actions out;
  if (finished_) return out;
  // A roster that only grew leaves the open step alone: joiners enter at the next step
  // boundary. A member of the step gone (or the same members again: an aborted step's
  // bump) means the step cannot complete.
  if (open_ && open_->generation < r.generation) {
    bool lost = false;
    for (const auto& [id, ok] : open_->votes) lost = lost || r.find(id) == nullptr;
    const bool grew = r.members.size() > open_->votes.size();
    // With pp * tp > 1 members of broken replicas do not vote: only a lost voter matters.
    if (lost || (!grew && seat_size_ == 1))
      abort_open(r, "the roster moved to generation " + std::to_string(r.generation), out);
  }
  last_generation_ = r.generation;
  track_membership(r, now_s, out);
  for (auto it = ready_.begin(); it != ready_.end();) {
    it = r.find(it->first) == nullptr ? ready_.erase(it) : std::next(it);
  }
  job_actions more = try_open(r, now_s);
  merge(out, std::move(more));
  return out;
}

job_actions training_job::on_ready(const mb::roster& r, const net::worker_ready& w, double now_s) {
  if (finished_ || r.find(w.member_id) == nullptr) return {};
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
    waiting_noted_ = false;
    pause_since_s_ = -1;
    track_membership(r, now_s, out);
    inject_due(r, now_s, out);
    open_state o;
    o.generation = r.generation;
    o.step = next_step_;
    for (auto& [id, m] : opens) {
      o.votes[id] = false;
      o.sent[id] = m;
      out.sends.push_back({id, m});
      ready_[id] = next_step_;
      replicas_ = m.replicas;
    }
    o.sent_s = now_s;
    if (first_open_s_ < 0) first_open_s_ = now_s;
    open_ = std::move(o);
    return out;
  }
  const int expected = min_workers();
  int ready = 0;
  for (const auto& m : r.members) {
    if (m.state == mb::member_state::alive && ready_.count(m.id) != 0) ++ready;
  }
  if (ready < expected || static_cast<int>(r.members.size()) != ready) {
    if (!waiting_noted_ && next_step_ > start_step_) {
      out.notes.push_back(ready < expected
                              ? "waiting for workers: " + std::to_string(ready) + " ready, " +
                                    std::to_string(expected) + " needed (elastic.min_workers)"
                              : "waiting for " + std::to_string(r.members.size() - ready) +
                                    " joining worker(s) to load the job");
      waiting_noted_ = true;
    }
    if (ready < expected && first_open_s_ >= 0 && pause_since_s_ < 0) pause_since_s_ = now_s;
    return out;
  }
  waiting_noted_ = false;
  pause_since_s_ = -1;
  // Members behind the job (a worker that rejoined after being declared dead) get the
  // state of the step from a member that has it, over the new generation's communicator.
  int donor = -1;
  bool behind = false;
  for (const auto& m : r.members) {
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
  inject_due(r, now_s, out);
  open_state o;
  o.generation = r.generation;
  o.step = next_step_;
  for (const auto& m : r.members) o.votes[m.id] = false;
  replicas_ = static_cast<int>(r.members.size());
  o.donor = donor;
  o.sent_s = now_s;
  for (const auto& m : r.members) {
    o.sent[m.id] = net::step_open{r.generation, next_step_, replicas_, donor, m.rank};
    out.sends.push_back({m.id, o.sent[m.id]});
    ready_[m.id] = next_step_;  // after the transfer every member holds this step's state
  }
  if (donor >= 0) {
    out.notes.push_back("step " + std::to_string(next_step_) + ": state sent from rank " +
                        std::to_string(donor) + " to the members behind it");
  }
  if (first_open_s_ < 0) first_open_s_ = now_s;
  open_ = std::move(o);
  return out;
}

job_actions training_job::on_vote(const mb::roster& r, const net::step_vote& v, double now_s) {
  job_actions out;
  if (!open_ || v.generation != open_->generation || v.step != open_->step) return out;
  auto it = open_->votes.find(v.member_id);
  if (it == open_->votes.end() || it->second) return out;
  const mb::member* m = r.find(v.member_id);
  if (!v.ok) {
    const std::string why =
        (m != nullptr ? who(*m) : "member " + std::to_string(v.member_id)) + " failed: " + v.reason;
    abort_open(r, why, out);
    if (v.fatal) {
      out.failed = "step " + std::to_string(v.step) + ": " + why;
      finished_ = true;
      return out;
    }
    // A peer that every rank found in the store but nobody could connect to will not
    // become reachable by trying again: after a few tries the job fails and says why.
    if (v.unreachable && ++consecutive_unreachable_ >= max_unreachable_attempts) {
      out.failed = "step " + std::to_string(v.step) + ": the data plane could not connect " +
                   std::to_string(consecutive_unreachable_) +
                   " times in a row (check comm.interface and the firewall between the "
                   "hosts); last: " + why;
      finished_ = true;
      return out;
    }
    if (++consecutive_aborts_ > max_consecutive_aborts) {
      out.failed = "step " + std::to_string(v.step) + " aborted " +
                   std::to_string(consecutive_aborts_) + " times in a row; last: " + why;
      finished_ = true;
      return out;
    }
    out.bump = "step " + std::to_string(v.step) + " aborted (" + why + ")";
    return out;
  }
  it->second = true;
  if (v.timing.state_bytes > 0 && v.timing.state_us > 0 && m != nullptr) {
    // The joiner's view of the state it received from the donor.
    for (auto e = events_.rbegin(); e != events_.rend(); ++e) {
      if (e->kind == "joined" && e->worker == m->name) {
        if (e->transfer_mb_s < 0)
          e->transfer_mb_s = static_cast<double>(v.timing.state_bytes) /
                             static_cast<double>(v.timing.state_us);  // bytes/us == MB/s
        break;
      }
    }
  }
  open_->loss_rows += v.loss_rows;
  open_->rows += v.rows;
  for (const auto& [id, ok] : open_->votes) {
    if (!ok) return out;
  }
  // Every member voted ok: commit.
  const double loss = open_->loss_rows / static_cast<double>(cfg_.train.global_batch);
  const net::step_result res{open_->generation, open_->step, true, loss, ""};
  for (const auto& [id, ok] : open_->votes) out.sends.push_back({id, res});
  next_step_ = open_->step + 1;
  if (next_step_ == steps_) {
    last_commit_ = res;
    last_commit_sent_s_ = now_s;
  }
  for (const auto& [id, ok] : open_->votes) {
    if (ready_.count(id) != 0) ready_[id] = next_step_;
  }
  const int members = static_cast<int>(open_->votes.size());
  last_voters_.clear();
  for (const auto& [id, ok] : open_->votes) last_voters_.insert(id);
  std::set<std::string> voters;
  for (const auto& [id, ok] : open_->votes)
    if (const mb::member* x = r.find(id)) voters.insert(x->name);
  open_.reset();
  consecutive_aborts_ = 0;
  consecutive_unreachable_ = 0;
  last_loss_ = loss;
  last_commit_s_ = now_s;
  for (auto& e : events_) {
    if (e.recover_ms >= 0 || e.kind == "slow") continue;
    if (e.kind == "scale" && e.target != members) continue;
    // A joiner counts from joining to the first committed step it took part in.
    if (e.kind == "joined" && voters.count(e.worker) == 0) continue;
    // A drained worker counts until the first committed step without it.
    if (e.kind == "drained" && voters.count(e.worker) != 0) continue;
    e.recover_ms = 1000.0 * (now_s - e.at_s);
    if (e.kind == "scale") {
      out.notes.push_back("'" + e.detail + "': the first step on " + std::to_string(members) +
                          " workers committed " + std::to_string(static_cast<long>(e.recover_ms)) +
                          " ms after the request");
    } else if (e.kind != "joined") {
      out.notes.push_back(e.kind + " of " + e.worker + ": training recovered " +
                          std::to_string(static_cast<long>(e.recover_ms)) + " ms after it (step " +
                          std::to_string(next_step_) + " committed)");
    }
  }
  out.committed = true;
  out.step = next_step_;
  out.loss = loss;
  const double span = now_s - first_open_s_;
  out.rate = span > 0 ? static_cast<double>(next_step_ - start_step_) * cfg_.train.global_batch *
                            units_per_sample_ / span
                      : 0;
  job_actions more = try_open(r, now_s);
  merge(out, std::move(more));
  return out;
}

job_actions training_job::on_report(const mb::roster& r, const net::train_report& rep,
                                    double /*now_s*/) {
  job_actions out;
  const mb::member* m = r.find(rep.member_id);
  if (finished_ || m == nullptr || next_step_ < steps_ || rep.next_step != steps_) return out;
  reports_[rep.member_id] = report{m->name, m->rank, rep};
  // Every member of the last step reports (a broken replica's members never ran it).
  for (const auto& mem : r.members) {
    if (reports_.count(mem.id) == 0 && last_voters_.count(mem.id) != 0) return out;
  }
  finished_ = true;
  out.finished = true;
  return out;
}

void require_supported(const std::vector<faults::fault_spec>& specs) {
  int drops = 0;
  for (const auto& x : specs) {
    if (x.kind == faults::fault_kind::drop_control && ++drops > 1)
      throw usage_error("fault '" + faults::to_string(x) +
                        "': a second drop control; one probability applies to every control "
                        "frame, so keep one");
  }
}

void training_job::set_faults(std::vector<faults::fault_spec> f) {
  require_supported(f);
  faults_ = std::move(f);
  fired_.assign(faults_.size(), false);
  for (const auto& x : faults_)
    if (x.kind == faults::fault_kind::drop_control) drop_ = x;
}

double training_job::resend_interval_s() const {
  if (drop_) return std::max(0.02, 1.5e-3 * cfg_.fault_tolerance.heartbeat_ms);
  return std::max(2.0, 4e-3 * cfg_.fault_tolerance.timeout_ms);
}

void training_job::resend(const mb::roster& r, double now_s, job_actions& out) {
  const double every = resend_interval_s();
  if (open_ && now_s - open_->sent_s >= every) {
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
  if (last_commit_ && next_step_ >= steps_ && now_s - last_commit_sent_s_ >= every) {
    for (const auto& m : r.members)
      if (reports_.count(m.id) == 0) out.sends.push_back({m.id, *last_commit_});
    last_commit_sent_s_ = now_s;
  }
}

void training_job::add_fault(faults::fault_spec f) {
  require_supported({f});
  const int64_t first = f.kind == faults::fault_kind::slow ? f.to_step : f.at_step;
  // The open step has already had its faults ordered: the first step left is the next.
  const int64_t earliest = next_step_ + (open_ ? 1 : 0);
  const bool always = f.kind == faults::fault_kind::random_kill ||
                      f.kind == faults::fault_kind::drop_control;  // no step of their own
  if (!always && first < earliest)
    throw usage_error("fault '" + f.text + "': step " + std::to_string(first) +
                      " has already opened (the job is at step " + std::to_string(next_step_) +
                      "); name step " + std::to_string(earliest) + " or later");
  if (f.kind == faults::fault_kind::drop_control && drop_)
    throw usage_error("fault '" + f.text + "': the job already drops control frames ('" +
                      drop_->text + "')");
  if (f.kind == faults::fault_kind::drop_control) drop_ = f;
  faults_.push_back(std::move(f));
  fired_.push_back(false);
}

job_actions training_job::on_drain(const mb::roster& r, mb::member_id id, double now_s) {
  const mb::member* m = r.find(id);
  if (finished_ || m == nullptr || drained_.count(id) != 0) return {};
  drained_.insert(id);
  add_event("drained", m->name, r, now_s).detect_ms = 0;
  job_actions out = try_open(r, now_s);
  out.notes.insert(out.notes.begin(), m->name + " is draining: it leaves after step " +
                                          std::to_string(open_ ? open_->step : next_step_ - 1));
  return out;
}

void training_job::on_scale(const mb::roster& r, int target, const std::string& spec,
                            double now_s) {
  job_event& e = add_event("scale", "", r, now_s);
  e.target = target;
  e.detect_ms = 0;
  e.detail = spec;
}

void training_job::inject_due(const mb::roster& r, double now_s, job_actions& out) {
  const int64_t s = next_step_;
  for (std::size_t i = 0; i < faults_.size(); ++i) {
    const faults::fault_spec& f = faults_[i];
    net::fault_order order{r.generation, s, net::fault_action::kill, 0, 1.0};
    int rank = f.worker.rank;
    std::string name = f.worker.name;
    bool first = true;  // the first step a (ranged) fault acts: it makes an event
    switch (f.kind) {
      case faults::fault_kind::kill:
      case faults::fault_kind::hang:
        if (fired_[i] || f.at_step != s) continue;
        fired_[i] = true;
        if (f.kind == faults::fault_kind::hang) {
          order.action = net::fault_action::hang;
          order.duration_ms = static_cast<uint32_t>(f.duration_ms);
        }
        break;
      case faults::fault_kind::partition:
        if (fired_[i] || f.at_step != s) continue;
        fired_[i] = true;
        order.action = net::fault_action::partition;
        order.duration_ms = static_cast<uint32_t>(f.duration_ms);
        break;
      case faults::fault_kind::scale:
        if (fired_[i] || f.at_step != s) continue;
        fired_[i] = true;
        out.scale_to = f.to_workers;
        out.scale_spec = f.text;
        out.notes.push_back("injecting '" + f.text + "' at step " + std::to_string(s));
        continue;
      case faults::fault_kind::slow:
        if (s < f.from_step || s > f.to_step) continue;
        order.action = net::fault_action::slow;
        order.factor = f.factor;
        first = s == f.from_step || !fired_[i];
        fired_[i] = true;
        break;
      case faults::fault_kind::random_kill:
        // Retries of an aborted step must not draw again: once per step.
        if (!faults::random_kill_fires(f, s) || random_fired_.count({i, s}) != 0) continue;
        random_fired_.insert({i, s});
        rank = faults::random_kill_victim(f, s, static_cast<int>(r.members.size()));
        name.clear();
        break;
      default:
        continue;
    }
    const mb::member* target = nullptr;
    for (const auto& m : r.members)
      if ((rank >= 0 && m.rank == rank) || (rank < 0 && m.name == name)) target = &m;
    if (target == nullptr) {
      out.notes.push_back("fault '" + f.text + "': no such worker in generation " +
                          std::to_string(r.generation) + "; skipped");
      continue;
    }
    out.sends.push_back({target->id, order});
    if (!first) continue;
    const char* kind = order.action == net::fault_action::slow        ? "slow"
                       : order.action == net::fault_action::kill      ? "kill"
                       : order.action == net::fault_action::partition ? "partition"
                                                                      : "hang";
    add_event(kind, target->name, r, now_s).detail = f.text;
    out.notes.push_back("injecting '" + f.text + "' into " + target->name + " at step " +
                        std::to_string(s));
  }
}

job_event& training_job::add_event(const std::string& kind, const std::string& worker,
                                   const mb::roster& r, double now_s) {
  job_event e;
  e.kind = kind;
  e.worker = worker;
  e.step = next_step_;
  e.generation = r.generation;
  e.at_s = now_s;
  events_.push_back(std::move(e));
  return events_.back();
}

void training_job::track_membership(const mb::roster& r, double now_s, job_actions& out) {
  std::map<mb::member_id, std::string> now;
  for (const auto& m : r.members) now[m.id] = m.name;
  const bool running = first_open_s_ >= 0;
  for (const auto& [id, name] : last_members_) {
    if (now.count(id) != 0 || drained_.count(id) != 0) continue;
    // An injected fault of this worker not yet detected: this is its detection.
    bool injected = false;
    for (auto& e : events_) {
      if (e.worker == name && e.detect_ms < 0 &&
          (e.kind == "kill" || e.kind == "hang" || e.kind == "partition")) {
        e.detect_ms = 1000.0 * (now_s - e.at_s);
        injected = true;
        out.notes.push_back(e.kind + " of " + name + " detected after " +
                            std::to_string(static_cast<long>(e.detect_ms)) + " ms");
        break;
      }
    }
    if (!injected && running) {
      // The departure is what the coordinator saw; the fault time is unknown.
      add_event("departed", name, r, now_s).detect_ms = 0;
      out.notes.push_back(name + " left the roster at step " + std::to_string(next_step_) +
                          " (generation " + std::to_string(r.generation) + ", " +
                          std::to_string(r.members.size()) + " workers)");
    }
  }
  if (running) {
    for (const auto& [id, name] : now) {
      if (last_members_.count(id) != 0) continue;
      add_event("joined", name, r, now_s);
      out.notes.push_back(name + " joined at step " + std::to_string(next_step_) + " (generation " +
                          std::to_string(r.generation) + ", " + std::to_string(r.members.size()) +
                          " workers)");
    }
  }
  last_members_ = std::move(now);
}

int training_job::min_workers() const {
  return cfg_.elastic.min_workers > 0 ? cfg_.elastic.min_workers : cfg_.cluster.workers;
}

job_actions training_job::on_tick(const mb::roster& r, double now_s) {
  job_actions out = try_open(r, now_s);
  if (!finished_) resend(r, now_s, out);
  if (finished_ || open_ || pause_since_s_ < 0) return out;
  const double waited_ms = 1000.0 * (now_s - pause_since_s_);
  if (waited_ms > static_cast<double>(cfg_.elastic.pause_timeout_ms)) {
    out.failed = "fewer than elastic.min_workers (" + std::to_string(min_workers()) +
                 ") workers for " + std::to_string(static_cast<long>(waited_ms)) +
                 " ms (elastic.pause_timeout_ms " + std::to_string(cfg_.elastic.pause_timeout_ms) +
                 "); start more workers or lower elastic.min_workers";
    finished_ = true;
  }
  return out;
}

nlohmann::json training_job::pipeline_summary() const {
  nlohmann::json p;
  const int P = cfg_.parallel.pp;
  p["pp"] = P;
  p["tp"] = cfg_.parallel.tp;
  p["schedule"] = cfg_.parallel.schedule;
  p["activation_checkpointing"] = cfg_.parallel.activation_checkpointing;
  // A pipeline's makespan is its longest stage window: stage 0 starts the step and runs
  // its last backward. Bubble = makespan - compute per stage, as the simulation and the
  // theory (P-1)/(M+P-1) count it (a later stage's idle tail counts too).
  std::map<std::pair<int, int>, uint64_t> makespan;  // (replica, tp rank) -> schedule us
  for (const auto& [id, rep] : reports_) {
    const net::stage_stats& st = rep.r.stage;
    if (st.stage < 0) continue;
    auto& m = makespan[{st.replica, st.tp_rank}];
    m = std::max(m, st.schedule_us);
  }
  nlohmann::json stages = nlohmann::json::array();
  int M = 0;
  double bubble_sum = 0;
  int counted = 0;
  for (const auto& [id, rep] : reports_) {
    const net::stage_stats& st = rep.r.stage;
    if (st.stage < 0) continue;
    M = std::max(M, static_cast<int>(st.micro_batches));
    const double span = seconds(makespan[{st.replica, st.tp_rank}]);
    const double compute = seconds(st.compute_us);
    const double bubble = std::max(0.0, span - compute);
    const double frac = span > 0 ? bubble / span : 0.0;
    bubble_sum += frac;
    ++counted;
    stages.push_back({{"worker", rep.name},
                      {"replica", st.replica},
                      {"stage", st.stage},
                      {"tp_rank", st.tp_rank},
                      {"schedule_s", seconds(st.schedule_us)},
                      {"makespan_s", span},
                      {"compute_s", compute},
                      {"bubble_s", bubble},
                      {"wait_s", seconds(st.wait_us)},
                      {"bubble_fraction", frac},
                      {"tp_allreduce_s", seconds(st.tp_us)},
                      {"p2p_bytes", st.p2p_bytes},
                      {"activation_bytes", st.activation_bytes},
                      {"peak_held_micro_batches", st.peak_held}});
  }
  std::sort(stages.begin(), stages.end(), [](const nlohmann::json& a, const nlohmann::json& b) {
    return std::make_tuple(a["replica"].get<int>(), a["tp_rank"].get<int>(),
                           a["stage"].get<int>()) <
           std::make_tuple(b["replica"].get<int>(), b["tp_rank"].get<int>(), b["stage"].get<int>());
  });
  p["micro_batches"] = M;
  p["theoretical_bubble"] = M > 0 ? static_cast<double>(P - 1) / (M + P - 1) : 0.0;
  // The best a pipeline of these unequal stages can do: the simulation with each stage's
  // measured mean forward and backward time per micro-batch (replica 0, TP rank 0) and
  // free transfers. Measured above it = the runtime's own overhead.
  std::vector<double> fwd(static_cast<std::size_t>(P), 0.0), bwd(fwd);
  int have = 0;
  for (const auto& [id, rep] : reports_) {
    const net::stage_stats& st = rep.r.stage;
    if (st.stage < 0 || st.stage >= P || st.replica != 0 || st.tp_rank != 0 || st.forwards == 0)
      continue;
    fwd[static_cast<std::size_t>(st.stage)] =
        1e-6 * static_cast<double>(st.forward_us) / st.forwards;
    bwd[static_cast<std::size_t>(st.stage)] =
        1e-6 * static_cast<double>(st.compute_us - st.forward_us) / st.forwards;
    ++have;
  }
  bool positive = have == P && M > 0;
  for (int s = 0; s < P && positive; ++s) positive = fwd[s] > 0 && bwd[s] > 0;
  if (positive) {
    const train::pipe_timeline tl =
        train::simulate(train::parse_schedule(cfg_.parallel.schedule), P, M, fwd, bwd, 0.0);
    p["simulated_bubble"] = tl.bubble_fraction;
  }
  p["bubble_fraction"] = counted > 0 ? bubble_sum / counted : 0.0;
  p["stages"] = stages;
  return p;
}

nlohmann::json training_job::summary(double wall_s) const {
  nlohmann::json j;
  const bool lm = units_per_sample_ > 1;
  j["steps_completed"] = next_step_;
  j["final_loss"] = last_loss_;
  std::string hash;
  bool consistent = true;
  nlohmann::json workers = nlohmann::json::array();
  double compute_s = 0;
  for (const auto& [id, rep] : reports_) {
    const auto& r = rep.r;
    if (r.has_eval) {
      j["eval"] = {{"loss", r.eval_loss}, {"count", r.eval_count}};
      if (!lm) j["eval"]["accuracy"] = r.eval_accuracy;
    }
    if (!r.checkpoint.empty()) j["checkpoint"] = r.checkpoint;
    if (hash.empty()) hash = r.params_sha256;
    consistent = consistent && hash == r.params_sha256;
    j["num_params"] = r.num_params;
    const auto& t = r.timing;
    compute_s = std::max(compute_s, seconds(t.compute_us));
    workers.push_back({{"name", rep.name},
                       {"member_id", id},
                       {"rank", rep.rank},
                       {"steps", r.steps_computed},
                       {"compute_s", seconds(t.compute_us)},
                       {"comm_wait_s", seconds(t.comm_wait_us)},
                       {"allreduce_s", seconds(t.allreduce_us)},
                       {"setup_s", seconds(t.setup_us)},
                       {"idle_s", seconds(t.idle_us)},
                       {"bytes_sent", t.bytes_sent},
                       {"bytes_received", t.bytes_recv},
                       {"overlap", r.overlap},
                       {"peak_pool_bytes", r.peak_pool_bytes},
                       {"params_sha256", r.params_sha256}});
    if (r.stage.stage >= 0) {
      workers.back()["stage"] = r.stage.stage;
      workers.back()["tp_rank"] = r.stage.tp_rank;
    }
  }
  if (seat_size_ > 1) {
    // Each stage reported its parameters' digests: merged, they give the whole model's
    // params_sha256 (the same value `cohort train` computes); replicas of one seat must agree.
    std::map<std::string, std::string> merged;
    consistent = true;  // stages hold different parameters: compare digests by name
    for (const auto& [id, rep] : reports_) {
      std::map<std::string, std::string> d;
      try {
        d = train::parse_param_digests(rep.r.param_digests);
      } catch (const std::exception&) {
        consistent = false;
      }
      for (const auto& [name, digest] : d) {
        auto [it, fresh] = merged.emplace(name, digest);
        if (!fresh && it->second != digest) consistent = false;
      }
    }
    hash = train::combine_param_digests(merged);
    j["pipeline"] = pipeline_summary();
  }
  j["params_sha256"] = hash;
  j["params_consistent"] = consistent;
  const double units =
      static_cast<double>(next_step_ - start_step_) * cfg_.train.global_batch * units_per_sample_;
  const double train_s = last_commit_s_ - first_open_s_;
  j["throughput"] = {{lm ? "tokens_per_s" : "samples_per_s", train_s > 0 ? units / train_s : 0.0}};
  int64_t peak = 0;
  for (const auto& [id, rep] : reports_) peak = std::max(peak, rep.r.peak_pool_bytes);
  j["memory"] = {{"peak_pool_bytes", peak}};
  j["wall_s"] = wall_s;
  j["model"] = cfg_.model.kind;
  j["config_hash"] = config_hash(cfg_);
  j["dp"] = replicas_;
  j["determinism"] = cfg_.train.determinism;
  j["aborted_steps"] = aborted_;
  j["generation"] = last_generation_;
  j["workers"] = workers;
  nlohmann::json events = nlohmann::json::array();
  for (const auto& e : events_) {
    nlohmann::json x = {
        {"kind", e.kind}, {"worker", e.worker}, {"step", e.step}, {"generation", e.generation}};
    x["detect_ms"] = e.detect_ms >= 0 ? nlohmann::json(e.detect_ms) : nlohmann::json();
    x["recover_ms"] = e.recover_ms >= 0 ? nlohmann::json(e.recover_ms) : nlohmann::json();
    if (!e.detail.empty()) x["spec"] = e.detail;
    if (e.transfer_mb_s >= 0) x["transfer_mb_s"] = e.transfer_mb_s;
    if (e.kind == "scale") x["target"] = e.target;
    events.push_back(x);
  }
  j["events"] = events;
  if (drop_) j["control_frames_dropped"] = dropped_frames_;
  return j;
}

}  // namespace cohort::actors
