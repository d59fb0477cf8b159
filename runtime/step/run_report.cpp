// The run report (docs/data_parallel.md, "The summary"): events as the job reports its
// actions, and the summary JSON from the events, the commits and the workers' reports.
#include "runtime/step/run_report.hpp"

#include <algorithm>
#include <cstdio>
#include <tuple>

#include "runtime/train/param_stats.hpp"
#include "runtime/train/pipeline_schedule.hpp"

namespace cohort::step {

namespace {

double seconds(uint64_t us) { return static_cast<double>(us) * 1e-6; }

// A fault whose cost is still being counted: ordered, and its victim's replacement has not
// yet committed a step.
bool costing(const job_event& e) {
  return (e.kind == "kill" || e.kind == "hang" || e.kind == "partition") && e.cost.whole_s < 0;
}

}  // namespace

nlohmann::json to_json(const curve_point& p) {
  return {{"step", p.step},
          {"t_s", p.t_s},
          {"loss", p.loss},
          {"step_s", p.step_s},
          {"samples_per_s", p.samples_per_s},
          {"replicas", p.replicas}};
}

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

nlohmann::json run_report::live() const {
  nlohmann::json j = nlohmann::json::object();
  // Rates over the last (at most) 20 committed steps.
  const std::size_t n = std::min<std::size_t>(curve_.size(), 20);
  if (n >= 2) {
    const curve_point& a = curve_[curve_.size() - n];
    const curve_point& b = curve_.back();
    const double dt = b.t_s - a.t_s;
    if (dt > 0) {
      j["steps_per_s"] = static_cast<double>(b.step - a.step) / dt;
      j["samples_per_s"] = static_cast<double>((b.step - a.step) * cfg_.train.global_batch) / dt;
    }
  }
  if (!curve_.empty()) j["loss"] = curve_.back().loss;
  if (ettr() >= 0) j["ettr"] = ettr();
  if (!recent_votes_.empty()) {
    double compute = 0, wait = 0, idle = 0;
    for (const net::step_timing& t : recent_votes_) {
      compute += seconds(t.compute_us);
      wait += seconds(t.comm_wait_us);
      idle += seconds(t.idle_us);
    }
    const double k = static_cast<double>(recent_votes_.size());
    j["split_ms"] = {{"compute", 1e3 * compute / k},
                     {"comm_wait", 1e3 * wait / k},
                     {"idle", 1e3 * idle / k},
                     {"votes", recent_votes_.size()}};
  }
  nlohmann::json ev = nlohmann::json::array();
  for (std::size_t i = events_.size() > 5 ? events_.size() - 5 : 0; i < events_.size(); ++i) {
    const job_event& e = events_[i];
    nlohmann::json x = {{"kind", e.kind}, {"worker", e.worker}, {"step", e.step}};
    if (e.detect_ms >= 0) x["detect_ms"] = e.detect_ms;
    if (e.recover_ms >= 0) x["recover_ms"] = e.recover_ms;
    if (!e.detail.empty()) x["spec"] = e.detail;
    ev.push_back(x);
  }
  j["events"] = ev;
  return j;
}

nlohmann::json run_report::pipeline_summary() const {
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

nlohmann::json run_report::events_json() const {
  nlohmann::json events = nlohmann::json::array();
  for (const auto& e : events_) {
    nlohmann::json x = {
        {"kind", e.kind}, {"worker", e.worker}, {"step", e.step}, {"generation", e.generation}};
    x["detect_ms"] = e.detect_ms >= 0 ? nlohmann::json(e.detect_ms) : nlohmann::json();
    x["recover_ms"] = e.recover_ms >= 0 ? nlohmann::json(e.recover_ms) : nlohmann::json();
    if (!e.detail.empty()) x["spec"] = e.detail;
    if (e.transfer_mb_s >= 0) x["transfer_mb_s"] = e.transfer_mb_s;
    if (e.kind == "scale") x["target"] = e.target;
    if (e.kind == "stop") x["end_step"] = e.target;
    if (e.kind == "reshard") {
      x["members"] = e.target;
      x["bytes"] = e.bytes;
    }
    if (e.kind == "kill" || e.kind == "hang" || e.kind == "partition")
      x["cost"] = cost_json(e.cost, e.at_s);
    x["t_s"] = first_open_s_ >= 0 ? e.at_s - first_open_s_ : 0.0;  // the curve's time base
    events.push_back(x);
  }
  return events;
}

nlohmann::json run_report::summary(double wall_s) const {
  nlohmann::json j;
  const bool lm = units_per_sample_ > 1;
  j["steps_completed"] = steps_done_;
  j["final_loss"] = last_loss_;
  // Stopped early with a checkpoint (a preemption): where, who asked, how long it took.
  for (const auto& e : events_)
    if (e.kind == "stop" && e.recover_ms >= 0 && e.target < cfg_.train.steps)
      j["stopped_early"] = {{"end_step", e.target},
                            {"asked_at_step", e.step},
                            {"asked_by", e.worker},
                            {"ms", e.recover_ms}};
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
                       {"cpus", r.cpus},
                       {"params_sha256", r.params_sha256}});
    if (cfg_.train.zero > 0 || r.state_params > 0) {
      workers.back()["model_state_bytes"] = {
          {"params", r.state_params},
          {"grads", r.state_grads},
          {"optimizer", r.state_optimizer},
          {"replica", r.state_replica},
          {"total", r.state_params + r.state_grads + r.state_optimizer + r.state_replica}};
      workers.back()["reshards"] = r.reshards;
    }
    if (cfg_.fault_tolerance.memory_every > 0)
      workers.back()["rollback_points"] = {{"taken", t.points},
                                           {"time_s", seconds(t.point_us)},
                                           {"bytes_received", t.point_bytes},
                                           {"held_bytes", r.point_held_bytes}};
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
  // Bytes each worker handed its transport per step it computed (measured by the
  // communicators; 0 where a backend cannot count), split into the steps whose sum travelled
  // compressed and the others (1-bit Adam's warm-up), each averaged over the workers.
  {
    double all = 0, plain = 0, packed = 0;
    int n_all = 0, n_plain = 0, n_packed = 0;
    for (const auto& [id, rep] : reports_) {
      const auto& r = rep.r;
      const double bytes = static_cast<double>(r.timing.bytes_sent);
      const double cb = static_cast<double>(r.compressed_bytes_sent);
      const int64_t cs = r.compressed_steps, ps = r.steps_computed - r.compressed_steps;
      if (r.steps_computed > 0) all += bytes / static_cast<double>(r.steps_computed), ++n_all;
      if (cs > 0) packed += cb / static_cast<double>(cs), ++n_packed;
      if (ps > 0) plain += (bytes - cb) / static_cast<double>(ps), ++n_plain;
    }
    nlohmann::json c = {{"compression", cfg_.train.optimizer == "onebit_adam"
                                            ? std::string("sign (onebit_adam)")
                                            : std::string(to_string(cfg_.comm.compression))},
                        {"error_feedback", keeps_error_feedback(cfg_)},
                        {"bytes_sent_per_step", n_all > 0 ? all / n_all : 0.0}};
    if (n_plain > 0) c["uncompressed_bytes_per_step"] = plain / n_plain;
    if (n_packed > 0) c["compressed_bytes_per_step"] = packed / n_packed;
    if (n_plain > 0 && n_packed > 0 && packed > 0)
      c["ratio"] = (plain / n_plain) / (packed / n_packed);  // both measured in this run
    j["communication"] = c;
  }
  const double units =
      static_cast<double>(steps_done_ - start_step_) * cfg_.train.global_batch * units_per_sample_;
  const double train_s = last_commit_s_ - first_open_s_;
  j["throughput"] = {{lm ? "tokens_per_s" : "samples_per_s", train_s > 0 ? units / train_s : 0.0}};
  int64_t peak = 0;
  for (const auto& [id, rep] : reports_) peak = std::max(peak, rep.r.peak_pool_bytes);
  j["memory"] = {{"peak_pool_bytes", peak}, {"zero", cfg_.train.zero}};
  int64_t state_max = 0;
  for (const auto& [id, rep] : reports_)
    state_max = std::max(state_max, rep.r.state_params + rep.r.state_grads +
                                        rep.r.state_optimizer + rep.r.state_replica);
  if (state_max > 0) j["memory"]["model_state_bytes"] = state_max;  // the largest worker's
  j["wall_s"] = wall_s;
  // The committed steps' time over the span from the first open to the last commit.
  j["ettr"] = train_s > 0 ? step_time_s_ / train_s : 0.0;
  j["model"] = cfg_.model.kind;
  j["config_hash"] = config_hash(cfg_);
  j["dp"] = replicas_;
  j["determinism"] = cfg_.train.determinism;
  j["aborted_steps"] = aborted_;
  j["generation"] = generation_;
  j["workers"] = workers;
  j["events"] = events_json();
  // The loss curve and the evaluations, for `cohort plot` (docs/observability.md).
  nlohmann::json curve = nlohmann::json::array();
  for (const curve_point& p : curve_) curve.push_back(to_json(p));
  j["curve"] = curve;
  nlohmann::json evals = nlohmann::json::array();
  for (const eval_point& e : evals_) {
    nlohmann::json x = {{"step", e.step}, {"t_s", e.t_s}, {"loss", e.loss}};
    if (e.accuracy >= 0) x["accuracy"] = e.accuracy;
    evals.push_back(x);
  }
  j["evals"] = evals;
  if (drops_control_) j["control_frames_dropped"] = dropped_frames_;
  return j;
}

}  // namespace cohort::step
