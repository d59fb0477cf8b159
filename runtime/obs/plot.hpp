// `cohort plot`: PNG pictures of a run, drawn by gnuplot from the run's summary JSON (loss,
// throughput with fault events, per-worker time split) or its Chrome trace (one step's
// pipeline schedule). Owns the JSON -> table rows extraction (plot.cpp), the gnuplot
// scripts and data files (plot_draw.cpp) and running gnuplot (plot_gnuplot.cpp).
// Does not own the summary or the trace: runtime/step/run_report and runtime/obs/trace_file write them.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace cohort::obs {

// ---- rows extracted from a summary ----

/// One committed step of the summary's "curve".
struct curve_row {
  int64_t step = 0;  ///< steps done after this commit
  double t_s = 0;    ///< seconds since the job's first step opened
  double loss = 0;
  double step_s = 0;
  double samples_per_s = 0;
  int replicas = 0;
  bool operator==(const curve_row&) const;
};

/// One evaluation ("evals"); accuracy is absent for language models.
struct eval_row {
  int64_t step = 0;
  double t_s = 0;
  double loss = 0;
  std::optional<double> accuracy;
  bool operator==(const eval_row&) const;
};

/// One membership or fault event ("events"), placed on the curve's time axis.
struct event_row {
  std::string kind;    ///< kill, hang, slow, partition, departed, joined, drained, scale
  std::string worker;  ///< empty when the event names none (scale)
  int64_t step = 0;
  double t_s = 0;     ///< the event's own t_s, else the t_s of the curve at its step
  std::string label;  ///< "kill worker-1"
  bool operator==(const event_row&) const;
};

/// Where one worker's time went, in seconds (bubble: its pipeline stage's, else 0).
struct split_row {
  std::string worker;
  double compute_s = 0;
  double comm_wait_s = 0;
  double bubble_s = 0;
  double idle_s = 0;
  bool operator==(const split_row&) const;
};

/// Everything the summary pictures draw.
struct summary_rows {
  std::string title;  ///< "mlp, dp=2" (empty parts left out)
  std::vector<curve_row> curve;
  std::vector<eval_row> evals;
  std::vector<event_row> events;
  std::vector<split_row> split;
};

// ---- rows extracted from a trace ----

/// One row of the schedule chart: a worker process.
struct schedule_lane {
  int pid = 0;
  std::string name;  ///< the process name ("worker-1"), else "pid N"
  int stage = 0;
  std::string label;  ///< "worker-1 (stage 1)"
  bool operator==(const schedule_lane&) const;
};

/// One span of the chosen step, in ms from the step's first span.
struct schedule_span {
  int lane = 0;      ///< index into schedule_rows::lanes
  std::string kind;  ///< "forward", "backward" or "bubble"
  int mb = -1;       ///< micro-batch; -1 for a bubble or when the span names none
  double start_ms = 0;
  double end_ms = 0;
  bool operator==(const schedule_span&) const;
};

/// One step's pipeline schedule: lanes ordered by (stage, pid), spans by (lane, start).
struct schedule_rows {
  int64_t step = 0;
  std::vector<schedule_lane> lanes;
  std::vector<schedule_span> spans;
};

// ---- reading and extraction (usage_error on bad input: names PATH, what is missing, how to
// get it) ----

enum class plot_input { summary, trace };

/// Parses PATH as JSON. A missing file or text that is not JSON is a usage_error.
nlohmann::json read_plot_json(const std::string& path);
/// A trace has "traceEvents"; a summary is an object with "curve", "workers" or
/// "steps_completed". Anything else is a usage_error naming PATH.
plot_input detect_plot_input(const nlohmann::json& j, const std::string& path);
/// The summary's rows. No "curve" entries (or a malformed one) is a usage_error.
summary_rows summary_rows_of(const nlohmann::json& summary, const std::string& path);
/// The schedule of STEP (default: the last step with forward spans from every stage seen in
/// the trace). No forward spans, or none at STEP, is a usage_error.
schedule_rows schedule_rows_of(const nlohmann::json& trace, const std::string& path,
                               std::optional<int64_t> step = std::nullopt);

// ---- drawing ----

/// What a plot call wrote (every PNG, .dat and .gp path, in order) and what it skipped or
/// what gnuplot warned about.
struct plot_result {
  std::vector<std::string> files;
  std::vector<std::string> notes;
};

/// Writes loss.png, throughput.png and step_split.png (step_split is skipped, with a note,
/// when the summary lists no workers) with their .dat and .gp files into DIR (created).
plot_result plot_summary(const summary_rows& rows, const std::string& dir);
/// Writes pipeline.png with its .dat and .gp files into DIR (created).
plot_result plot_schedule(const schedule_rows& rows, const std::string& dir);
/// `cohort plot`: reads INPUT, detects its kind and draws everything it allows into DIR.
plot_result plot_file(const std::string& input, const std::string& dir,
                      std::optional<int64_t> step = std::nullopt);

// ---- gnuplot and PNG helpers (plot_gnuplot.cpp) ----

/// TEXT as a gnuplot single-quoted string: '' for a quote, control characters as spaces
/// (a string cannot span lines).
std::string gp_quote(const std::string& text);
/// Runs `gnuplot SCRIPT` in folder DIR as a child process (no shell) and returns what it wrote
/// on stderr. A failed run is a cohort::error with gnuplot's message; gnuplot missing is a
/// cohort::error saying to run tools/setup.sh.
std::string run_gnuplot(const std::string& dir, const std::string& script);

/// Width and height from a PNG's IHDR chunk.
struct png_size {
  uint32_t width = 0;
  uint32_t height = 0;
};
/// Reads PATH's PNG signature and IHDR; nullopt when it is no PNG (or cannot be read).
std::optional<png_size> read_png_size(const std::string& path);

}  // namespace cohort::obs
