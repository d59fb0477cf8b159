#include "runtime/step/job_telemetry.hpp"

#include <cmath>

namespace cohort::step {

namespace {

constexpr int coordinator_pid = 0;
constexpr uint32_t steps_tid = 0;   // the coordinator's steps
constexpr uint32_t events_tid = 1;  // faults, detections, recoveries, membership

int64_t ns_of(double s) { return static_cast<int64_t>(std::llround(s * 1e9)); }

obs::labels worker_label(const std::string& w) { return {{"worker", w}}; }

}  // namespace

job_telemetry::job_telemetry(const telemetry_options& o, int64_t now_ns) {
  // The endpoint first: a taken port fails the command before a trace file exists.
  if (!o.metrics_addr.empty()) {
    const auto [host, port] = obs::metrics_server::parse_host_port(o.metrics_addr);
    metrics_ = std::make_unique<obs::metrics>();
    declare_metrics();
    obs::metrics* m = metrics_.get();
    server_ = std::make_unique<obs::metrics_server>([m] { return m->exposition(); });
    server_->start(host, port);
  }
  if (!o.trace_path.empty()) {
    trace_ = std::make_unique<obs::trace_file>(o.trace_path, now_ns);
    trace_->name_process(coordinator_pid, "coordinator", 0);
    trace_->name_thread(coordinator_pid, steps_tid, "steps");
    trace_->name_thread(coordinator_pid, events_tid, "events");
    trace_->set_meta("clock", "the coordinator's steady clock; ts 0 is clock_zero_ns");
  }
}

job_telemetry::~job_telemetry() {
  try {
    // A job that never opened a step (the coordinator could not start) leaves no trace;
    // one that failed later leaves what it saw.
    if (trace_ && !started_) trace_->abandon();
    finish();
  } catch (const std::exception&) {
    // finish() reports a trace it could not write when called on purpose.
  }
}

void job_telemetry::declare_metrics() {
  obs::metrics& m = *metrics_;
  m.gauge("cohort_step", "Steps committed so far (the next step to run).");
  m.counter("cohort_steps_total", "Steps committed by this coordinator.");
  m.histogram("cohort_step_seconds", "Wall time of each committed step, open to commit.",
              {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10});
  m.gauge("cohort_samples_per_second", "Global batch over the last step's wall time.");
  m.gauge("cohort_comm_wait_ratio",
          "Share of a worker's last step spent blocked on collectives (comm wait / (compute + "
          "comm wait)).");
  m.gauge("cohort_bubble_ratio",
          "Pipeline jobs: share of a stage worker's compute track spent waiting for its "
          "neighbours (bubble spans over the span of its last telemetry, about 250 ms).");
  m.gauge("cohort_workers", "Workers in the current roster, by state.");
  m.gauge("cohort_generation", "The roster's generation.");
  m.counter("cohort_aborted_steps_total", "Steps aborted (a member lost, a collective failed).");
  m.counter("cohort_faults_total", "Faults injected, by kind.");
  m.histogram("cohort_recovery_seconds",
              "From a fault (or a join, drain or scale) to the next committed step.",
              {0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60});
  m.histogram("cohort_checkpoint_seconds",
              "Workers' checkpoint writes to disk (in the background).",
              {0.001, 0.01, 0.05, 0.1, 0.5, 1, 5, 30});
  m.gauge("cohort_pool_bytes", "The most bytes a worker's memory pool has held so far.");
  m.gauge("cohort_model_state_bytes",
          "A worker's model state: parameters, gradients, optimizer state and its replica "
          "(train.zero).");
  m.counter("cohort_bytes_sent_total", "Bytes a worker's data-parallel collectives sent.");
  m.counter("cohort_moe_tokens_total",
            "Tokens a worker's MoE layers routed to an expert and kept (model.moe).");
  m.counter("cohort_moe_dropped_total",
            "Assignments a worker's MoE layers dropped over an expert's capacity.");
  m.counter("cohort_alltoall_bytes_total",
            "Bytes a worker sent the others in the experts' all-to-all (parallel.ep).");
  m.counter("cohort_alltoall_seconds_total",
            "Time a worker spent in the experts' all-to-all (parallel.ep).");
  m.gauge("cohort_loss", "Mean training loss of the last committed step.");
  m.gauge("cohort_balance_micro_batches",
          "Micro-batches a step gives each worker (train.balance; equal: the round robin's).");
  m.gauge("cohort_balance_samples_per_second",
          "Each worker's measured compute rate, as the balancer filters it.");
  m.gauge("cohort_ettr",
          "Effective training time ratio: committed steps' time over the time since the first "
          "step opened.");
  m.gauge("cohort_eval_accuracy", "Held-out accuracy of the last evaluation (classifiers).");
  m.gauge("cohort_eval_loss", "Held-out loss of the last evaluation.");
  m.gauge("cohort_clock_error_seconds",
          "Bound on a worker's clock offset estimate (half its best probe's round trip).");
}

std::string job_telemetry::finish() {
  if (!trace_) return {};
  nlohmann::json clocks = nlohmann::json::object();
  for (const auto& [w, c] : clocks_) clocks[w] = {{"offset_ns", c.first}, {"error_ns", c.second}};
  trace_->set_meta("worker_clocks", clocks);
  trace_->set_meta("max_clock_error_us",
                   max_error_ns_ < 0 ? nlohmann::json() : nlohmann::json(max_error_ns_ / 1e3));
  const std::string path = trace_->path();
  std::unique_ptr<obs::trace_file> t = std::move(trace_);
  t->close();
  return path;
}

int job_telemetry::pid_of(const std::string& worker) {
  auto it = pids_.find(worker);
  if (it != pids_.end()) return it->second;
  const int pid = static_cast<int>(pids_.size()) + 1;
  pids_[worker] = pid;
  if (trace_) {
    trace_->name_process(pid, worker, pid);
    for (uint32_t t : {trace::compute, trace::comm, trace::p2p, trace::control})
      trace_->name_thread(pid, t, trace::track_name(t));
  }
  return pid;
}

void job_telemetry::coordinator_event(const std::string& name, const char* cat, char ph,
                                      double start_s, double end_s, uint32_t tid,
                                      std::string args) {
  if (!trace_) return;
  trace::event e{
      name,           cat, ph, ns_of(start_s), ph == 'X' ? ns_of(end_s) - ns_of(start_s) : 0, tid,
      std::move(args)};
  trace_->add(coordinator_pid, e);
}

void job_telemetry::step_opened(int, double) { started_ = true; }

void job_telemetry::step_aborted(double now_s) {
  coordinator_event("step aborted", "job", 'i', now_s, now_s, events_tid);
  if (metrics_) metrics_->add("cohort_aborted_steps_total", {}, 1);
}

void job_telemetry::step_committed(const curve_point& p, double opened_s, double now_s) {
  coordinator_event(
      "step", "job", 'X', opened_s, now_s, steps_tid,
      "\"step\":" + std::to_string(p.step - 1) + ",\"replicas\":" + std::to_string(p.replicas));
  if (trace_) {
    char loss[64];
    std::snprintf(loss, sizeof loss, "\"loss\":%.6g", p.loss);
    coordinator_event("loss", "job", 'C', now_s, now_s, steps_tid, loss);
  }
  if (!metrics_) return;
  obs::metrics& m = *metrics_;
  m.set("cohort_step", {}, static_cast<double>(p.step));
  m.add("cohort_steps_total", {}, 1);
  m.observe("cohort_step_seconds", {}, p.step_s);
  m.set("cohort_samples_per_second", {}, p.samples_per_s);
  m.set("cohort_loss", {}, p.loss);
  if (p.ettr >= 0) m.set("cohort_ettr", {}, p.ettr);
}

void job_telemetry::event(const std::string& what, const job_event& e, double now_s) {
  const std::string who = e.worker.empty() ? e.detail : e.kind + " " + e.worker;
  if (what == "fault") {
    coordinator_event(who, "fault", 'i', e.at_s, e.at_s, events_tid,
                      "\"step\":" + std::to_string(e.step));
    if (metrics_) metrics_->add("cohort_faults_total", {{"kind", e.kind}}, 1);
  } else if (what == "detected") {
    coordinator_event("detect " + who, "fault", 'X', e.at_s, now_s, events_tid);
  } else if (what == "recovered") {
    // From the detection (or the request, for joins, drains and scales) to the commit.
    const double from = e.detect_ms >= 0 ? e.at_s + e.detect_ms / 1000.0 : e.at_s;
    coordinator_event("recover " + who, "fault", 'X', from, now_s, events_tid);
    if (metrics_) metrics_->observe("cohort_recovery_seconds", {}, e.recover_ms / 1000.0);
  } else {  // departed, joined, drained, scale, and balance's re-plans
    coordinator_event(e.kind == "scale" ? "scale: " + e.detail : who,
                      e.kind == "balance" ? "balance" : "membership", 'i', e.at_s, e.at_s,
                      events_tid, "\"step\":" + std::to_string(e.step));
  }
}

void job_telemetry::balance(const nlohmann::json& j) {
  if (!metrics_) return;
  for (const auto& [name, n] : j["shares"].items())
    metrics_->set("cohort_balance_micro_batches", {{"worker", name}}, n.get<double>());
  for (const auto& [name, r] : j["samples_per_s"].items())
    metrics_->set("cohort_balance_samples_per_second", {{"worker", name}}, r.get<double>());
}

void job_telemetry::generation(uint64_t generation, int members, double now_s) {
  coordinator_event("generation " + std::to_string(generation), "membership", 'i', now_s, now_s,
                    events_tid, "\"workers\":" + std::to_string(members));
  if (!metrics_) return;
  metrics_->set("cohort_generation", {}, static_cast<double>(generation));
  metrics_->set("cohort_workers", {{"state", "alive"}}, members);
}

void job_telemetry::vote(const std::string& worker, const net::step_timing& t) {
  if (!metrics_) return;
  const double busy = static_cast<double>(t.compute_us + t.comm_wait_us);
  if (busy > 0)
    metrics_->set("cohort_comm_wait_ratio", worker_label(worker),
                  static_cast<double>(t.comm_wait_us) / busy);
  metrics_->add("cohort_bytes_sent_total", worker_label(worker), static_cast<double>(t.bytes_sent));
  if (t.moe_tokens + t.moe_dropped > 0) {
    metrics_->add("cohort_moe_tokens_total", worker_label(worker), static_cast<double>(t.moe_tokens));
    metrics_->add("cohort_moe_dropped_total", worker_label(worker),
                  static_cast<double>(t.moe_dropped));
  }
  if (t.alltoall_calls > 0) {
    metrics_->add("cohort_alltoall_bytes_total", worker_label(worker),
                  static_cast<double>(t.alltoall_bytes));
    metrics_->add("cohort_alltoall_seconds_total", worker_label(worker),
                  static_cast<double>(t.alltoall_us) * 1e-6);
  }
}

void job_telemetry::eval(const eval_point& e) {
  if (trace_) {
    char a[96];
    std::snprintf(a, sizeof a, "\"step\":%lld,\"loss\":%.6g", static_cast<long long>(e.step),
                  e.loss);
    std::string args = a;
    if (e.accuracy >= 0) args += ",\"accuracy\":" + std::to_string(e.accuracy);
    trace::event ev{"eval", "job", 'i', trace::now_ns(), 0, events_tid, args};
    trace_->add(coordinator_pid, ev);
  }
  if (!metrics_) return;
  metrics_->set("cohort_eval_loss", {}, e.loss);
  if (e.accuracy >= 0) metrics_->set("cohort_eval_accuracy", {}, e.accuracy);
}

void job_telemetry::telemetry(const std::string& worker, const net::telemetry& t, double) {
  const int pid = pid_of(worker);
  // No probe answered yet (a final report sent at once): the worker's last known offset.
  int64_t offset = t.clock_offset_ns;
  if (t.clock_error_ns < 0) {
    const auto known = clocks_.find(worker);
    if (known != clocks_.end()) offset = known->second.first;
  }
  if (metrics_ && t.peak_pool_bytes > 0)
    metrics_->set("cohort_pool_bytes", worker_label(worker),
                  static_cast<double>(t.peak_pool_bytes));
  if (metrics_ && t.model_state_bytes > 0)
    metrics_->set("cohort_model_state_bytes", worker_label(worker),
                  static_cast<double>(t.model_state_bytes));
  if (t.clock_error_ns >= 0) {
    clocks_[worker] = {t.clock_offset_ns, t.clock_error_ns};
    max_error_ns_ = std::max(max_error_ns_, t.clock_error_ns);
    if (metrics_)
      metrics_->set("cohort_clock_error_seconds", worker_label(worker), t.clock_error_ns / 1e9);
  }
  int64_t step_begin = -1, step_end = -1, bubble_ns = 0;
  for (const net::trace_span& s : t.spans) {
    if (metrics_ && s.name == "checkpoint write")
      metrics_->observe("cohort_checkpoint_seconds", {}, s.dur_ns / 1e9);
    if (s.name == "bubble") bubble_ns += s.dur_ns;
    if (s.cat == "compute" || s.cat == "pipeline") {
      step_begin = step_begin < 0 ? s.ts_ns : std::min(step_begin, s.ts_ns);
      step_end = std::max(step_end, s.ts_ns + s.dur_ns);
    }
    if (trace_) {
      const trace::event e{s.name, s.cat, static_cast<char>(s.ph), s.ts_ns + offset, s.dur_ns,
                           s.tid,  s.args};
      trace_->add(pid, e);
    }
  }
  if (metrics_ && step_end > step_begin && step_begin >= 0)
    metrics_->set("cohort_bubble_ratio", worker_label(worker),
                  static_cast<double>(bubble_ns) / static_cast<double>(step_end - step_begin));
}

}  // namespace cohort::step
