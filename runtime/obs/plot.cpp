// `cohort plot`'s input side: reads a summary or a trace and turns it into the table rows
// the pictures draw. Every complaint names the file, what is missing and how to get it.
#include "runtime/obs/plot.hpp"

#include <algorithm>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "runtime/core/error.hpp"

namespace cohort::obs {

bool curve_row::operator==(const curve_row& o) const {
  return std::tie(step, t_s, loss, step_s, samples_per_s, replicas) ==
         std::tie(o.step, o.t_s, o.loss, o.step_s, o.samples_per_s, o.replicas);
}
bool eval_row::operator==(const eval_row& o) const {
  return std::tie(step, t_s, loss, accuracy) == std::tie(o.step, o.t_s, o.loss, o.accuracy);
}
bool event_row::operator==(const event_row& o) const {
  return std::tie(kind, worker, step, t_s, label) ==
         std::tie(o.kind, o.worker, o.step, o.t_s, o.label);
}
bool split_row::operator==(const split_row& o) const {
  return std::tie(worker, compute_s, comm_wait_s, bubble_s, idle_s) ==
         std::tie(o.worker, o.compute_s, o.comm_wait_s, o.bubble_s, o.idle_s);
}
bool schedule_lane::operator==(const schedule_lane& o) const {
  return std::tie(pid, name, stage, label) == std::tie(o.pid, o.name, o.stage, o.label);
}
bool schedule_span::operator==(const schedule_span& o) const {
  return std::tie(lane, kind, mb, start_ms, end_ms) ==
         std::tie(o.lane, o.kind, o.mb, o.start_ms, o.end_ms);
}

namespace {

using json = nlohmann::json;

const char* const k_summary_hint =
    "write one with `cohort launch CFG --summary run.json` (this version's summaries carry a "
    "per-step \"curve\")";
const char* const k_trace_hint = "write one with `cohort launch CFG --trace trace.json`";

[[noreturn]] void bad(const std::string& path, const std::string& what, const std::string& hint) {
  throw usage_error(path + ": " + what + "; " + hint);
}

// The number at KEY of entry J (WHERE says which, "curve[3]"): absent or not a number is a
// usage_error, since a picture drawn from a guessed value would mislead.
double number(const json& j, const char* key, const std::string& where, const std::string& path) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number())
    bad(path, where + " has no number \"" + key + "\"", k_summary_hint);
  return it->get<double>();
}

double number_or(const json& j, const char* key, double fallback) {
  const auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : fallback;
}

std::string string_or(const json& j, const char* key, const std::string& fallback) {
  const auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : fallback;
}

// The entries of array KEY; absent means none, anything but an array (or an entry that is no
// object) is malformed.
const json& entries(const json& j, const char* key, const std::string& path) {
  static const json none = json::array();
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return none;
  if (!it->is_array()) bad(path, std::string("\"") + key + "\" is not an array", k_summary_hint);
  for (std::size_t i = 0; i < it->size(); ++i)
    if (!(*it)[i].is_object())
      bad(path, std::string(key) + "[" + std::to_string(i) + "] is not an object", k_summary_hint);
  return *it;
}

std::string at(const char* key, std::size_t i) {
  return std::string(key) + "[" + std::to_string(i) + "]";
}

std::vector<curve_row> curve_of(const json& s, const std::string& path) {
  const json& c = entries(s, "curve", path);
  if (c.empty())
    bad(path, "the summary has no \"curve\" entries (one per committed step)", k_summary_hint);
  std::vector<curve_row> rows;
  for (std::size_t i = 0; i < c.size(); ++i) {
    const std::string w = at("curve", i);
    curve_row r;
    r.step = static_cast<int64_t>(number(c[i], "step", w, path));
    r.t_s = number(c[i], "t_s", w, path);
    r.loss = number(c[i], "loss", w, path);
    r.step_s = number(c[i], "step_s", w, path);
    r.samples_per_s = number(c[i], "samples_per_s", w, path);
    r.replicas = static_cast<int>(number(c[i], "replicas", w, path));
    rows.push_back(r);
  }
  return rows;
}

std::vector<eval_row> evals_of(const json& s, const std::string& path) {
  const json& e = entries(s, "evals", path);
  std::vector<eval_row> rows;
  for (std::size_t i = 0; i < e.size(); ++i) {
    const std::string w = at("evals", i);
    eval_row r;
    r.step = static_cast<int64_t>(number(e[i], "step", w, path));
    r.t_s = number(e[i], "t_s", w, path);
    r.loss = number(e[i], "loss", w, path);
    if (e[i].contains("accuracy") && e[i]["accuracy"].is_number())
      r.accuracy = e[i]["accuracy"].get<double>();
    rows.push_back(r);
  }
  return rows;
}

// The curve's t_s at STEP: the first commit that reached it (the last commit if none did), so
// an event written without its own time still lands near its dip.
double curve_time_at(const std::vector<curve_row>& curve, int64_t step) {
  for (const curve_row& r : curve)
    if (r.step >= step) return r.t_s;
  return curve.back().t_s;
}

std::vector<event_row> events_of(const json& s, const std::vector<curve_row>& curve,
                                 const std::string& path) {
  const json& e = entries(s, "events", path);
  std::vector<event_row> rows;
  for (std::size_t i = 0; i < e.size(); ++i) {
    const std::string w = at("events", i);
    event_row r;
    r.kind = string_or(e[i], "kind", "");
    if (r.kind.empty()) bad(path, w + " has no \"kind\"", k_summary_hint);
    r.worker = string_or(e[i], "worker", "");
    r.step = static_cast<int64_t>(number(e[i], "step", w, path));
    r.t_s = number_or(e[i], "t_s", curve_time_at(curve, r.step));
    r.label = r.worker.empty() ? r.kind : r.kind + " " + r.worker;
    if (e[i].contains("target") && e[i]["target"].is_number_integer())  // a scale names no worker
      r.label += " to " + std::to_string(e[i]["target"].get<int64_t>());
    rows.push_back(r);
  }
  return rows;
}

std::vector<split_row> split_of(const json& s, const std::string& path) {
  std::map<std::string, double> bubble;  // by worker name; a worker may hold several stages
  if (s.contains("pipeline") && s["pipeline"].is_object())
    for (const json& st : entries(s["pipeline"], "stages", path))
      bubble[string_or(st, "worker", "")] += number_or(st, "bubble_s", 0.0);
  const json& w = entries(s, "workers", path);
  std::vector<split_row> rows;
  for (std::size_t i = 0; i < w.size(); ++i) {
    const std::string where = at("workers", i);
    split_row r;
    r.worker = string_or(w[i], "name", "");
    if (r.worker.empty()) bad(path, where + " has no \"name\"", k_summary_hint);
    r.compute_s = number(w[i], "compute_s", where, path);
    r.comm_wait_s = number(w[i], "comm_wait_s", where, path);
    r.idle_s = number(w[i], "idle_s", where, path);
    const auto b = bubble.find(r.worker);
    r.bubble_s = b == bubble.end() ? 0.0 : b->second;
    rows.push_back(r);
  }
  return rows;
}

std::string title_of(const json& s) {
  std::string t = string_or(s, "model", "");
  if (s.contains("dp") && s["dp"].is_number_integer())
    t += (t.empty() ? "" : ", ") + std::string("dp=") + std::to_string(s["dp"].get<int64_t>());
  return t;
}

}  // namespace

nlohmann::json read_plot_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw usage_error(path +
                      ": cannot open it; give a run's summary (`cohort launch CFG "
                      "--summary run.json`) or trace (`--trace trace.json`)");
  std::stringstream text;
  text << in.rdbuf();
  try {
    return json::parse(text.str());
  } catch (const json::parse_error& e) {
    throw usage_error(path + ": not JSON (" + e.what() +
                      "); give a run's summary (`cohort launch CFG --summary run.json`) or "
                      "trace (`--trace trace.json`)");
  }
}

plot_input detect_plot_input(const nlohmann::json& j, const std::string& path) {
  if (j.is_object() && j.contains("traceEvents")) return plot_input::trace;
  if (j.is_object() &&
      (j.contains("curve") || j.contains("workers") || j.contains("steps_completed")))
    return plot_input::summary;
  throw usage_error(path +
                    ": neither a run summary (no \"curve\", \"workers\" or \"steps_completed\") "
                    "nor a Chrome trace (no \"traceEvents\"); write one with `cohort launch CFG "
                    "--summary run.json` or `--trace trace.json`");
}

summary_rows summary_rows_of(const nlohmann::json& summary, const std::string& path) {
  if (!summary.is_object()) bad(path, "the summary is not a JSON object", k_summary_hint);
  summary_rows rows;
  rows.title = title_of(summary);
  rows.curve = curve_of(summary, path);
  rows.evals = evals_of(summary, path);
  rows.events = events_of(summary, rows.curve, path);
  rows.split = split_of(summary, path);
  return rows;
}

// ---- the trace's schedule ----

namespace {

// One complete span of a worker, as the schedule chart needs it.
struct trace_span {
  int pid = 0;
  std::string kind;  // forward, backward, bubble
  std::optional<int64_t> step;
  int mb = -1;
  int stage = 0;
  double ts_us = 0;
  double dur_us = 0;
};

std::optional<int64_t> int_arg(const json& ev, const char* key) {
  const auto a = ev.find("args");
  if (a == ev.end() || !a->is_object()) return std::nullopt;
  const auto v = a->find(key);
  if (v == a->end() || !v->is_number()) return std::nullopt;
  return static_cast<int64_t>(v->get<double>());
}

// The spans the chart draws; other events (comm, p2p, the coordinator's steps) are skipped.
std::vector<trace_span> schedule_spans(const json& events) {
  std::vector<trace_span> out;
  for (const json& ev : events) {
    if (!ev.is_object() || string_or(ev, "ph", "") != "X") continue;
    const std::string name = string_or(ev, "name", "");
    if (name != "forward" && name != "backward" && name != "bubble") continue;
    trace_span s;
    s.pid = static_cast<int>(number_or(ev, "pid", 0));
    s.kind = name;
    s.step = int_arg(ev, "step");
    s.mb = static_cast<int>(int_arg(ev, "mb").value_or(-1));
    s.stage = static_cast<int>(int_arg(ev, "stage").value_or(0));
    s.ts_us = number_or(ev, "ts", 0);
    s.dur_us = number_or(ev, "dur", 0);
    out.push_back(s);
  }
  return out;
}

std::map<int, std::string> process_names(const json& events) {
  std::map<int, std::string> names;
  for (const json& ev : events) {
    if (!ev.is_object() || string_or(ev, "ph", "") != "M" ||
        string_or(ev, "name", "") != "process_name")
      continue;
    const auto a = ev.find("args");
    if (a != ev.end() && a->is_object())
      names[static_cast<int>(number_or(ev, "pid", 0))] = string_or(*a, "name", "");
  }
  return names;
}

// The last step whose forward spans come from every stage the trace has: an earlier step may
// be cut off at the start of the recording, the last one at its end.
int64_t default_step(const std::vector<trace_span>& spans) {
  std::set<int> stages;
  std::map<int64_t, std::set<int>> stages_of_step;
  for (const trace_span& s : spans) {
    if (s.kind != "forward" || !s.step) continue;
    stages.insert(s.stage);
    stages_of_step[*s.step].insert(s.stage);
  }
  for (auto it = stages_of_step.rbegin(); it != stages_of_step.rend(); ++it)
    if (it->second == stages) return it->first;
  return stages_of_step.rbegin()->first;  // no step has them all (a cut recording): the last
}

std::string step_range(const std::vector<trace_span>& spans) {
  int64_t lo = std::numeric_limits<int64_t>::max(), hi = std::numeric_limits<int64_t>::min();
  for (const trace_span& s : spans)
    if (s.kind == "forward" && s.step) lo = std::min(lo, *s.step), hi = std::max(hi, *s.step);
  return std::to_string(lo) + ".." + std::to_string(hi);
}

// Lanes: the processes with a forward or backward span in the step, by (stage, pid).
std::vector<schedule_lane> lanes_of(const std::vector<const trace_span*>& compute,
                                    const std::map<int, std::string>& names) {
  std::map<int, int> stage_of;  // pid -> stage
  for (const trace_span* s : compute) stage_of.emplace(s->pid, s->stage);
  std::vector<schedule_lane> lanes;
  for (const auto& [pid, stage] : stage_of) {
    schedule_lane l;
    l.pid = pid;
    const auto n = names.find(pid);
    l.name = n != names.end() && !n->second.empty() ? n->second : "pid " + std::to_string(pid);
    l.stage = stage;
    l.label = l.name + " (stage " + std::to_string(stage) + ")";
    lanes.push_back(l);
  }
  std::sort(lanes.begin(), lanes.end(), [](const schedule_lane& a, const schedule_lane& b) {
    return std::tie(a.stage, a.pid) < std::tie(b.stage, b.pid);
  });
  return lanes;
}

}  // namespace

schedule_rows schedule_rows_of(const nlohmann::json& trace, const std::string& path,
                               std::optional<int64_t> step) {
  const auto ev = trace.find("traceEvents");
  if (ev == trace.end() || !ev->is_array())
    bad(path, "\"traceEvents\" is not an array of trace events", k_trace_hint);
  const std::vector<trace_span> spans = schedule_spans(*ev);
  const bool any_forward = std::any_of(spans.begin(), spans.end(), [](const trace_span& s) {
    return s.kind == "forward" && s.step.has_value();
  });
  if (!any_forward)
    bad(path,
        "the trace has no \"forward\" spans with a step (pipeline.png draws the workers' "
        "forward and backward passes)",
        "write one with `cohort launch CFG --trace trace.json` and let it run at least one step");
  schedule_rows rows;
  rows.step = step ? *step : default_step(spans);

  std::vector<const trace_span*> compute;  // forward/backward of the step
  double t0 = std::numeric_limits<double>::max(), t1 = std::numeric_limits<double>::lowest();
  for (const trace_span& s : spans)
    if (s.kind != "bubble" && s.step == rows.step) {
      compute.push_back(&s);
      t0 = std::min(t0, s.ts_us), t1 = std::max(t1, s.ts_us + s.dur_us);
    }
  if (compute.empty())
    bad(path, "the trace has no forward or backward span of step " + std::to_string(rows.step),
        "pick one of steps " + step_range(spans) + " with --step N");
  rows.lanes = lanes_of(compute, process_names(*ev));

  std::map<int, int> lane_of;
  for (std::size_t i = 0; i < rows.lanes.size(); ++i)
    lane_of[rows.lanes[i].pid] = static_cast<int>(i);
  // A bubble belongs to the step it names, or, naming none, to the step's time window.
  std::vector<const trace_span*> drawn = compute;
  for (const trace_span& s : spans)
    if (s.kind == "bubble" && lane_of.count(s.pid) &&
        (s.step ? *s.step == rows.step : s.ts_us >= t0 && s.ts_us + s.dur_us <= t1)) {
      drawn.push_back(&s);
      t0 = std::min(t0, s.ts_us);
    }
  for (const trace_span* s : drawn) {
    schedule_span r;
    r.lane = lane_of.at(s->pid);
    r.kind = s->kind;
    r.mb = s->kind == "bubble" ? -1 : s->mb;
    r.start_ms = (s->ts_us - t0) / 1000.0;
    r.end_ms = (s->ts_us + s->dur_us - t0) / 1000.0;
    rows.spans.push_back(r);
  }
  std::sort(rows.spans.begin(), rows.spans.end(),
            [](const schedule_span& a, const schedule_span& b) {
              return std::tie(a.lane, a.start_ms, a.kind) < std::tie(b.lane, b.start_ms, b.kind);
            });
  return rows;
}

}  // namespace cohort::obs
