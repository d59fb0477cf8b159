// The run report (docs/data_parallel.md, "The summary"): events as the job reports its
// actions, the commits and the workers' reports as they come; the JSON made from them is
// run_report_json.cpp.
#include "runtime/step/run_report.hpp"

#include <algorithm>
#include <cstdio>

namespace cohort::step {

namespace {

// A fault whose cost is still being counted: ordered, and its victim's replacement has not
// yet committed a step.
bool costing(const job_event& e) {
  return (e.kind == "kill" || e.kind == "hang" || e.kind == "partition") && e.cost.whole_s < 0;
}

}  // namespace

run_report::run_report(const config& cfg, int64_t start_step)
    : cfg_(cfg),
      start_step_(start_step),
      steps_done_(start_step),
      units_per_sample_(cfg.model.kind == "gpt" ? cfg.model.context : 1),
      seat_size_(cfg.parallel.pp * cfg.parallel.tp) {}

job_event& run_report::add_event(const std::string& kind, const std::string& worker,
                                 const job_moment& at, const std::string& detail, double detect_ms,
                                 int target) {
  job_event e;
  e.kind = kind;
  e.worker = worker;
  e.step = at.step;
  e.generation = at.generation;
  e.at_s = at.now_s;
  e.detail = detail;
  e.detect_ms = detect_ms;
  e.target = target;
  last_now_s_ = std::max(last_now_s_, at.now_s);
  events_.push_back(std::move(e));
  // The watch sees the event whole: every field is set above.
  const bool fault = kind == "kill" || kind == "hang" || kind == "slow" || kind == "partition";
  if (watch_) watch_->event(fault ? "fault" : kind, events_.back(), at.now_s);
  return events_.back();
}

void run_report::roster_seen(const mb::roster& r, const job_moment& at, bool running,
                             const std::set<mb::member_id>& drained,
                             std::vector<std::string>& notes) {
  std::map<mb::member_id, std::string> now;
  for (const auto& m : r.members) now[m.id] = m.name;
  for (const auto& [id, name] : last_members_) {
    if (now.count(id) != 0 || drained.count(id) != 0) continue;
    // An injected fault of this worker not yet detected: this is its detection.
    bool injected = false;
    for (auto& e : events_) {
      if (e.worker == name && e.detect_ms < 0 &&
          (e.kind == "kill" || e.kind == "hang" || e.kind == "partition")) {
        e.detect_ms = 1000.0 * (at.now_s - e.at_s);
        e.cost.removed_s = at.now_s;
        injected = true;
        if (watch_) watch_->event("detected", e, at.now_s);
        notes.push_back(e.kind + " of " + name + " detected after " +
                        std::to_string(static_cast<long>(e.detect_ms)) + " ms");
        break;
      }
    }
    if (!injected && running) {
      // The departure is what the coordinator saw; the fault time is unknown.
      add_event("departed", name, at, "", 0);
      notes.push_back(name + " left the roster at step " + std::to_string(at.step) +
                      " (generation " + std::to_string(r.generation) + ", " +
                      std::to_string(r.members.size()) + " workers)");
    }
  }
  if (running) {
    for (const auto& [id, name] : now) {
      if (last_members_.count(id) != 0) continue;
      // A respawn under the victim's name replaces it; any other newcomer (a spare seated
      // in the departure's own roster, a worker started by hand) replaces the oldest
      // removed victim still without one.
      job_event* replaced = nullptr;
      for (auto& e : events_)
        if (costing(e) && e.worker == name && e.cost.removed_s >= 0 && e.cost.registered_s < 0)
          replaced = &e;
      for (auto e = events_.begin(); replaced == nullptr && e != events_.end(); ++e)
        if (costing(*e) && e->cost.removed_s >= 0 && e->cost.registered_s < 0) replaced = &*e;
      if (replaced != nullptr) {
        replaced->cost.registered_s = at.now_s;
        replaced->cost.replacement = name;
      }
      add_event("joined", name, at);
      notes.push_back(name + " joined at step " + std::to_string(at.step) + " (generation " +
                      std::to_string(r.generation) + ", " + std::to_string(r.members.size()) +
                      " workers)");
    }
  }
  last_members_ = std::move(now);
}

void run_report::step_opened(int replicas, double now_s) {
  replicas_ = replicas;
  if (first_open_s_ < 0) first_open_s_ = now_s;
  if (last_close_s_ >= 0)
    for (auto& e : events_)
      if (costing(e))
        e.cost.stalled_ms += 1e3 * std::max(0.0, now_s - std::max(last_close_s_, e.at_s));
  last_open_s_ = now_s;
  last_now_s_ = std::max(last_now_s_, now_s);
  if (watch_) watch_->step_opened(replicas, now_s);
}

void run_report::step_aborted() {
  // A rebuild its voters reported is its own event: the next generation rebuilds again.
  regroup_event(steps_done_, last_now_s_);
  ++aborted_;
  last_close_s_ = last_now_s_;
  if (watch_) watch_->step_aborted(last_now_s_);
}

void run_report::generation_seen(uint64_t generation, int members, double now_s) {
  // Its own time: the generations that form the first roster come before any step, when
  // no other call has carried a time yet.
  last_now_s_ = std::max(last_now_s_, now_s);
  if (watch_ && generation != generation_) watch_->generation(generation, members, now_s);
  generation_ = generation;
}

void run_report::eval_seen(int64_t step, double loss, double accuracy, double now_s) {
  last_now_s_ = std::max(last_now_s_, now_s);
  evals_.push_back({step, first_open_s_ >= 0 ? now_s - first_open_s_ : 0.0, loss, accuracy});
  if (watch_) watch_->eval(evals_.back());
}

void run_report::fault_ordered(const std::string& kind, const std::string& worker,
                               const std::string& spec, const job_moment& at) {
  add_event(kind, worker, at, spec).cost.aborted_at_order = aborted_;
}

void run_report::step_members(const std::set<std::string>& names, double now_s) {
  for (auto& e : events_) {
    fault_cost& c = e.cost;
    if (!costing(e) || c.registered_s < 0 || c.entered_s >= 0) continue;
    if (names.count(c.replacement) != 0) c.entered_s = now_s;
  }
}

void run_report::member_ready(const std::string& worker, double now_s) {
  last_now_s_ = std::max(last_now_s_, now_s);
  for (auto& e : events_) {
    fault_cost& c = e.cost;
    if (costing(e) && c.replacement == worker && c.registered_s >= 0 && c.ready_s < 0)
      c.ready_s = now_s;
  }
}

double run_report::median_step_s() const {
  const std::size_t n = std::min<std::size_t>(curve_.size(), 256);
  if (n == 0) return 0;
  std::vector<double> v;
  for (std::size_t i = curve_.size() - n; i < curve_.size(); ++i) v.push_back(curve_[i].step_s);
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(n / 2), v.end());
  return v[n / 2];
}

double run_report::ettr() const {
  if (curve_.empty() || first_open_s_ < 0) return -1;
  const double span = last_now_s_ - first_open_s_;
  return span > 0 ? std::min(1.0, step_time_s_ / span) : -1;
}

void run_report::decided(const std::string& kind, const std::string& worker,
                         const std::string& detail, const job_moment& at) {
  add_event(kind, worker, at, detail, -1);  // nothing to detect
}

void run_report::drain_asked(const std::string& worker, const job_moment& at) {
  add_event("drained", worker, at, "", 0);
}

void run_report::scale_asked(int target, const std::string& spec, const job_moment& at) {
  add_event("scale", "", at, spec, 0, target);
}

void run_report::stop_asked(const std::string& by, int64_t step, double now_s) {
  add_event("stop", by, {step, generation_, now_s}, "stop with a checkpoint", 0);
  last_now_s_ = std::max(last_now_s_, now_s);
}

void run_report::stop_settled(int64_t end) {
  for (auto& e : events_)
    if (e.kind == "stop") e.target = static_cast<int>(end);
}

void run_report::stop_done(int64_t end, double now_s) {
  for (auto& e : events_) {
    if (e.kind != "stop") continue;
    e.target = static_cast<int>(end);
    e.recover_ms = 1000.0 * (now_s - e.at_s);
    if (watch_) watch_->event("recovered", e, now_s);
  }
}

void run_report::vote_counted(const std::string& worker, const net::step_timing& t) {
  if (watch_) watch_->vote(worker, t);
  recent_votes_.push_back(t);
  while (recent_votes_.size() > 64) recent_votes_.pop_front();
  if (t.reshard_us > 0) {  // train.zero: this voter took part in a re-cut of the state
    ++reshard_.members;
    reshard_.bytes += t.reshard_bytes;
    reshard_.ms = std::max(reshard_.ms, static_cast<double>(t.reshard_us) / 1e3);
  }
  if (t.regroup_path != 0) {  // comm.backend: nccl: this voter rebuilt its DP communicators
    ++regroup_.members;
    regroup_.path = std::max(regroup_.path, t.regroup_path);
    regroup_.ms = std::max(regroup_.ms, static_cast<double>(t.regroup_us) / 1e3);
  }
  if (t.state_bytes == 0 || t.state_us == 0) return;
  for (auto& e : events_)
    if (costing(e) && e.cost.replacement == worker && e.cost.entered_s >= 0 &&
        e.cost.transfer_ms < 0)
      e.cost.transfer_ms = static_cast<double>(t.state_us) / 1e3;
  // The joiner's view of the state it received from the donor.
  for (auto e = events_.rbegin(); e != events_.rend(); ++e) {
    if (e->kind == "joined" && e->worker == worker) {
      if (e->transfer_mb_s < 0)
        e->transfer_mb_s = static_cast<double>(t.state_bytes) /
                           static_cast<double>(t.state_us);  // bytes/us == MB/s
      break;
    }
  }
}

void run_report::step_committed(int64_t steps_done, double loss, const mb::roster& r,
                                const std::set<mb::member_id>& voters, double now_s,
                                std::vector<std::string>& notes) {
  // The step ran since it opened, or (in a commit window, where steps follow each other
  // without an open) since the previous commit.
  const double started_s = std::max(last_open_s_, last_commit_s_);
  curve_point p;
  p.step = steps_done;
  p.t_s = first_open_s_ >= 0 ? now_s - first_open_s_ : 0.0;
  p.loss = loss;
  p.step_s = std::max(0.0, now_s - started_s);
  // Over the last (up to) 10 steps: in a commit window several steps commit together, and
  // one step's own time says little.
  const std::size_t k = std::min<std::size_t>(curve_.size(), 9);
  const double span_s =
      k > 0 ? p.t_s - curve_[curve_.size() - k].t_s + curve_[curve_.size() - k].step_s : p.step_s;
  p.samples_per_s =
      span_s > 0 ? static_cast<double>((k + 1) * cfg_.train.global_batch) / span_s : 0.0;
  p.replicas = static_cast<int>(voters.size());
  step_time_s_ += p.step_s;
  last_now_s_ = std::max(last_now_s_, now_s);
  curve_.push_back(p);
  curve_.back().ettr = p.ettr = ettr();
  if (watch_) watch_->step_committed(p, started_s, now_s);
  steps_done_ = steps_done;
  last_loss_ = loss;
  last_commit_s_ = now_s;
  last_close_s_ = now_s;
  last_now_s_ = std::max(last_now_s_, now_s);
  const int members = static_cast<int>(voters.size());
  std::set<std::string> names;
  for (const mb::member_id id : voters)
    if (const mb::member* x = r.find(id)) names.insert(x->name);
  for (auto& e : events_) {
    if (!costing(e)) continue;
    fault_cost& c = e.cost;
    ++c.steps;
    if (c.recovered_s < 0) c.recovered_s = now_s;
    if (c.entered_s >= 0 && names.count(c.replacement) != 0) {
      c.whole_s = now_s;
      c.aborted = aborted_ - c.aborted_at_order;
      c.step_ms = 1e3 * median_step_s();
    }
  }
  for (auto& e : events_) {
    if (e.recover_ms >= 0 || e.kind == "slow" || e.kind == "balance" || e.kind == "straggler" ||
        e.kind == "stop")
      continue;
    if (e.kind == "scale" && e.target != members) continue;
    // A joiner counts from joining to the first committed step it took part in.
    if (e.kind == "joined" && names.count(e.worker) == 0) continue;
    // A drained worker counts until the first committed step without it.
    if (e.kind == "drained" && names.count(e.worker) != 0) continue;
    e.recover_ms = 1000.0 * (now_s - e.at_s);
    if (watch_) watch_->event("recovered", e, now_s);
    if (e.kind == "scale") {
      notes.push_back("'" + e.detail + "': the first step on " + std::to_string(members) +
                      " workers committed " + std::to_string(static_cast<long>(e.recover_ms)) +
                      " ms after the request");
    } else if (e.kind != "joined") {
      notes.push_back(e.kind + " of " + e.worker + ": training recovered " +
                      std::to_string(static_cast<long>(e.recover_ms)) + " ms after it (step " +
                      std::to_string(steps_done) + " committed)");
    }
  }
  reshard_committed(steps_done, now_s);
  regroup_event(steps_done - 1, now_s);
}

void run_report::regroup_event(int64_t step, double now_s) {
  if (regroup_.members == 0) return;
  // The members agree on the path (runtime/comm/regroup.hpp); the highest code is the one
  // that says most (a failed shrink over a plain new init).
  const char* how = regroup_.path == 2   ? "shrink (ncclCommShrink)"
                    : regroup_.path == 3 ? "new init after a failed shrink"
                                         : "new init (a unique id)";
  char detail[200];
  std::snprintf(detail, sizeof detail, "%s of the DP group's communicators: %d members, the longest %.1f ms",
                how, regroup_.members, regroup_.ms);
  job_event& e = add_event("regroup", "", {step, generation_, now_s}, detail, -1,
                           regroup_.members);
  e.recover_ms = regroup_.ms;  // the longest member's rebuild
  regroup_ = {};
}

void run_report::reshard_committed(int64_t steps_done, double now_s) {
  if (reshard_.members == 0) return;
  char detail[160];
  std::snprintf(detail, sizeof detail, "%d members: %.2f MB received in all, the longest %.1f ms",
                reshard_.members, static_cast<double>(reshard_.bytes) / 1e6, reshard_.ms);
  job_event& e = add_event("reshard", "", {steps_done - 1, generation_, now_s}, detail, -1,
                           reshard_.members);
  e.recover_ms = reshard_.ms;  // the longest member's re-cut
  e.bytes = reshard_.bytes;
  reshard_ = {};
}

void run_report::report_received(const mb::member& m, const net::train_report& rep) {
  reports_[m.id] = report{m.name, m.rank, rep};
  if (rep.has_eval)  // the final evaluation ends the curve of evaluations too
    eval_seen(rep.next_step, rep.eval_loss, units_per_sample_ > 1 ? -1.0 : rep.eval_accuracy,
              last_now_s_);
}

void run_report::telemetry_seen(const std::string& worker, const net::telemetry& t, double now_s) {
  if (t.eval_step >= 0) eval_seen(t.eval_step, t.eval_loss, t.eval_accuracy, now_s);
  if (watch_) watch_->telemetry(worker, t, now_s);
}

}  // namespace cohort::step
