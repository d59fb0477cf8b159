// What the coordinator shows of a run beyond its summary: the job's Chrome trace (--trace
// FILE: the coordinator's own track of steps, faults, detections, recoveries, joins and
// drains, and every worker's spans shifted onto the coordinator's clock) and its Prometheus
// metrics (--metrics HOST:PORT). It watches the run report (runtime/step/run_report.hpp: a
// job_watch) and the workers' telemetry; it decides nothing. docs/observability.md says
// how to read both.
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "runtime/step/run_report.hpp"
#include "runtime/obs/metrics.hpp"
#include "runtime/obs/metrics_server.hpp"
#include "runtime/obs/trace_file.hpp"

namespace cohort::step {

struct telemetry_options {
  std::string trace_path;    ///< empty: no trace
  std::string metrics_addr;  ///< HOST:PORT; empty: no metrics
};

class job_telemetry : public job_watch {
 public:
  /// Opens the trace file and starts the metrics server (usage_error for a bad path or
  /// address, cohort::error when the port cannot be bound), so that a command fails before
  /// its job starts. NOW_NS: the coordinator's clock now, the trace's zero.
  job_telemetry(const telemetry_options& o, int64_t now_ns);
  ~job_telemetry() override;

  /// Whether workers must record and ship trace spans (a trace is written, or metrics
  /// read the checkpoint spans).
  bool wants_spans() const { return trace_ != nullptr || metrics_ != nullptr; }
  /// The metrics' address as served ("http://127.0.0.1:9400/metrics"); empty without.
  std::string metrics_url() const { return server_ ? server_->url() : std::string(); }
  /// Writes the trace's last events and closes it (idempotent); returns its path, or empty.
  std::string finish();

  // job_watch
  void step_opened(int replicas, double now_s) override;
  void step_aborted(double now_s) override;
  void step_committed(const curve_point& p, double opened_s, double now_s) override;
  void event(const std::string& what, const job_event& e, double now_s) override;
  void generation(uint64_t generation, int members, double now_s) override;
  void vote(const std::string& worker, const net::step_timing& t) override;
  void eval(const eval_point& e) override;
  void telemetry(const std::string& worker, const net::telemetry& t, double now_s) override;
  void balance(const nlohmann::json& j) override;

 private:
  int pid_of(const std::string& worker);
  void coordinator_event(const std::string& name, const char* cat, char ph, double start_s,
                         double end_s, uint32_t tid, std::string args = {});
  void declare_metrics();

  std::unique_ptr<obs::trace_file> trace_;
  std::unique_ptr<obs::metrics> metrics_;
  std::unique_ptr<obs::metrics_server> server_;
  std::map<std::string, int> pids_;  ///< worker name -> its process track
  /// Per worker: the clock offset and error bound of its latest telemetry.
  std::map<std::string, std::pair<int64_t, int64_t>> clocks_;
  int64_t max_error_ns_ = -1;
  bool started_ = false;  ///< a step opened: the trace has something to show
};

}  // namespace cohort::step
