// The run report's JSON (docs/data_parallel.md, "The summary"; docs/observability.md): the
// live status, the pipeline block, the events and the summary, read from what
// run_report.cpp collected as the job ran.
#include <algorithm>
#include <cstdio>
#include <tuple>

#include "runtime/step/run_report.hpp"
#include "runtime/train/param_stats.hpp"
#include "runtime/train/pipeline_schedule.hpp"

namespace cohort::step {

namespace {

double seconds(uint64_t us) { return static_cast<double>(us) * 1e-6; }

}  // namespace

nlohmann::json to_json(const curve_point& p) {
  return {{"step", p.step},
          {"t_s", p.t_s},
          {"loss", p.loss},
          {"step_s", p.step_s},
          {"samples_per_s", p.samples_per_s},
          {"replicas", p.replicas}};
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

// The mixture of experts over the workers that reported (each over the steps it applied):
// tokens each expert computed, summed over the MoE layers, assignments dropped, the experts'
// all-to-all (parallel.ep).
nlohmann::json run_report::moe_summary() const {
  std::vector<int64_t> tokens(static_cast<std::size_t>(cfg_.model.moe_experts), 0);
  uint64_t kept = 0, dropped = 0, calls = 0, bytes = 0, us = 0;
  for (const auto& [id, rep] : reports_) {
    const auto& r = rep.r;
    for (std::size_t e = 0; e < r.moe_expert_tokens.size() && e < tokens.size(); ++e)
      tokens[e] += r.moe_expert_tokens[e];
    kept += r.timing.moe_tokens;
    dropped += r.timing.moe_dropped;
    calls += r.timing.alltoall_calls;
    bytes += r.timing.alltoall_bytes;
    us += r.timing.alltoall_us;
  }
  int64_t most = 0, sum = 0;
  for (int64_t n : tokens) most = std::max(most, n), sum += n;
  nlohmann::json m = {{"experts", cfg_.model.moe_experts},
                      {"top_k", cfg_.model.moe_top_k},
                      {"ep", cfg_.parallel.ep},
                      {"tokens_per_expert", tokens},
                      {"tokens", kept},
                      {"dropped", dropped},
                      {"dropped_share", kept + dropped > 0 ? static_cast<double>(dropped) /
                                                                 static_cast<double>(kept + dropped)
                                                           : 0.0},
                      {"alltoall", {{"calls", calls}, {"bytes_sent", bytes}, {"time_s", seconds(us)}}}};
  // The busiest expert against an even share: 1 is perfect balance.
  if (sum > 0)
    m["imbalance"] = static_cast<double>(most) * static_cast<double>(tokens.size()) /
                     static_cast<double>(sum);
  return m;
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
    if (cfg_.model.moe_experts > 0)
      workers.back()["moe"] = {{"tokens", t.moe_tokens},
                               {"dropped", t.moe_dropped},
                               {"alltoall_calls", t.alltoall_calls},
                               {"alltoall_bytes_sent", t.alltoall_bytes},
                               {"alltoall_s", seconds(t.alltoall_us)}};
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
  if (cfg_.model.moe_experts > 0) j["moe"] = moe_summary();
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
