// runtime/obs/plot: the rows extracted from a synthetic summary and trace (closed form), the
// pictures gnuplot draws from them, and the errors a bad input or a broken gnuplot gives.
#include <doctest/doctest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "runtime/core/error.hpp"
#include "runtime/obs/plot.hpp"

namespace fs = std::filesystem;
using namespace cohort::obs;
using json = nlohmann::json;

namespace {

// A fresh folder, removed with everything in it.
struct temp_dir {
  fs::path path;
  temp_dir() {
    std::string tmpl = (fs::temp_directory_path() / "cohort_plot_XXXXXX").string();
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::string write_text(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
  return p.string();
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Step i = 1..4 commits at t_s = i/4 after a 0.25 s step; loss 3 - i/2; two replicas until
// worker-1 is killed during step 2 (t_s 0.375), one after, so samples/s halves.
int replicas_at(int i) { return i <= 2 ? 2 : 1; }

json synthetic_summary() {
  json curve = json::array();
  for (int i = 1; i <= 4; ++i)
    curve.push_back({{"step", i},
                     {"t_s", 0.25 * i},
                     {"loss", 3.0 - 0.5 * i},
                     {"step_s", 0.25},
                     {"samples_per_s", 128.0 * replicas_at(i)},
                     {"replicas", replicas_at(i)}});
  return {
      {"model", "mlp"},
      {"dp", 2},
      {"wall_s", 1.5},
      {"steps_completed", 4},
      {"curve", curve},
      {"evals", {{{"step", 4}, {"t_s", 1.0}, {"loss", 1.25}, {"accuracy", 0.75}}}},
      {"events",
       {{{"kind", "kill"},
         {"worker", "worker-1"},
         {"step", 2},
         {"t_s", 0.375},
         {"detect_ms", 40.0},
         {"recover_ms", -1}}}},
      {"workers",
       {{{"name", "worker-0"},
         {"compute_s", 1.5},
         {"comm_wait_s", 0.25},
         {"idle_s", 0.125},
         {"allreduce_s", 0.25},
         {"setup_s", 0.5}},
        {{"name", "worker-1"},
         {"compute_s", 1.0},
         {"comm_wait_s", 0.5},
         {"idle_s", 0.25},
         {"allreduce_s", 0.5},
         {"setup_s", 0.5}}}},
      {"pipeline", {{"stages", {{{"worker", "worker-1"}, {"stage", 1}, {"bubble_s", 0.375}}}}}}};
}

// GPipe over 2 stages and 2 micro-batches, in ms from the step's start: forward 1 ms,
// backward 2 ms. worker-1 (pid 1) runs stage 1 and worker-0 (pid 2) stage 0, so lane order
// (by stage) is not pid order.
struct planned {
  int pid;
  const char* name;
  int mb;
  double start_ms, end_ms;
};
const std::vector<planned> k_gpipe = {
    {2, "forward", 0, 0, 1},  {2, "forward", 1, 1, 2},  {2, "bubble", -1, 2, 5},
    {2, "backward", 1, 5, 7}, {2, "backward", 0, 7, 9}, {1, "bubble", -1, 0, 1},
    {1, "forward", 0, 1, 2},  {1, "forward", 1, 2, 3},  {1, "backward", 1, 3, 5},
    {1, "backward", 0, 5, 7}, {1, "bubble", -1, 7, 9}};

json span(const planned& p, int step, double base_us) {
  const int stage = p.pid == 2 ? 0 : 1;
  json args = {{"step", step}};
  if (p.mb >= 0) args.update({{"mb", p.mb}, {"stage", stage}});
  return {{"name", p.name},
          {"cat", p.mb >= 0 ? "compute" : "pipeline"},
          {"ph", "X"},
          {"ts", base_us + 1000.0 * p.start_ms},
          {"dur", 1000.0 * (p.end_ms - p.start_ms)},
          {"pid", p.pid},
          {"tid", 0},
          {"args", args}};
}

// Steps 1 and 2 whole; step 3 cut off after stage 0's first forward.
json synthetic_trace() {
  json ev = json::array();
  ev.push_back(
      {{"ph", "M"}, {"name", "process_name"}, {"pid", 0}, {"args", {{"name", "coordinator"}}}});
  ev.push_back(
      {{"ph", "M"}, {"name", "process_name"}, {"pid", 1}, {"args", {{"name", "worker-1"}}}});
  ev.push_back(
      {{"ph", "M"}, {"name", "process_name"}, {"pid", 2}, {"args", {{"name", "worker-0"}}}});
  for (int step = 1; step <= 2; ++step) {
    const double base = 5e6 + 20000.0 * step;
    ev.push_back({{"name", "step"},
                  {"cat", "control"},
                  {"ph", "X"},
                  {"ts", base - 500},
                  {"dur", 10000},
                  {"pid", 0},
                  {"tid", 0},
                  {"args", {{"step", step}}}});
    for (const planned& p : k_gpipe) ev.push_back(span(p, step, base));
    ev.push_back({{"name", "allreduce"},
                  {"cat", "comm"},
                  {"ph", "X"},
                  {"ts", base + 9000},
                  {"dur", 300},
                  {"pid", 2},
                  {"tid", 1},
                  {"args", {{"bytes", 4096}, {"bucket", 0}}}});
  }
  ev.push_back(span(k_gpipe[0], 3, 5e6 + 60000.0));
  return {{"traceEvents", ev}, {"otherData", {{"job", "synthetic"}}}};
}

std::vector<schedule_span> expected_spans() {
  std::vector<schedule_span> s;
  for (const planned& p : k_gpipe)
    s.push_back({p.pid == 2 ? 0 : 1, p.name, p.mb, p.start_ms, p.end_ms});
  std::sort(s.begin(), s.end(), [](const schedule_span& a, const schedule_span& b) {
    return std::tie(a.lane, a.start_ms) < std::tie(b.lane, b.start_ms);
  });
  return s;
}

// The usage_error that F throws; fails the test when F throws none.
template <class F>
std::string usage_message(F f) {
  try {
    f();
  } catch (const cohort::usage_error& e) {
    CHECK(e.exit_status() == 2);
    return e.what();
  }
  FAIL("no usage_error");
  return {};
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("plot: summary rows are the closed-form curve, eval, event and split rows") {
  const summary_rows r = summary_rows_of(synthetic_summary(), "run.json");
  CHECK(r.title == "mlp, dp=2");
  REQUIRE(r.curve.size() == 4);
  for (int i = 1; i <= 4; ++i) {
    CAPTURE(i);
    CHECK(r.curve[i - 1] ==
          curve_row{i, 0.25 * i, 3.0 - 0.5 * i, 0.25, 128.0 * replicas_at(i), replicas_at(i)});
  }
  CHECK(r.evals == std::vector<eval_row>{{4, 1.0, 1.25, 0.75}});
  CHECK(r.events == std::vector<event_row>{{"kill", "worker-1", 2, 0.375, "kill worker-1"}});
  CHECK(r.split == std::vector<split_row>{{"worker-0", 1.5, 0.25, 0.0, 0.125},
                                          {"worker-1", 1.0, 0.5, 0.375, 0.25}});
}

TEST_CASE(
    "plot: an event without t_s takes the curve's time at its step and no accuracy stays absent") {
  json s = synthetic_summary();
  s["events"] = {{{"kind", "joined"}, {"worker", "worker-2"}, {"step", 3}},
                 {{"kind", "scale"}, {"step", 9}},
                 {{"kind", "scale"}, {"worker", ""}, {"step", 2}, {"t_s", 0.5}, {"target", 4}}};
  s["evals"] = {{{"step", 2}, {"t_s", 0.5}, {"loss", 2.5}}};
  const summary_rows r = summary_rows_of(s, "run.json");
  CHECK(r.events == std::vector<event_row>{{"joined", "worker-2", 3, 0.75, "joined worker-2"},
                                           {"scale", "", 9, 1.0, "scale"},
                                           {"scale", "", 2, 0.5, "scale to 4"}});
  CHECK(r.evals == std::vector<eval_row>{{2, 0.5, 2.5, std::nullopt}});
  s["events"] = json::array();
  s.erase("evals");
  const summary_rows none = summary_rows_of(s, "run.json");
  CHECK(none.events.empty());
  CHECK(none.evals.empty());
}

TEST_CASE("plot: trace rows are the schedule of the last step every stage ran") {
  const schedule_rows r = schedule_rows_of(synthetic_trace(), "trace.json");
  CHECK(r.step == 2);
  CHECK(r.lanes == std::vector<schedule_lane>{{2, "worker-0", 0, "worker-0 (stage 0)"},
                                              {1, "worker-1", 1, "worker-1 (stage 1)"}});
  CHECK(r.spans == expected_spans());
}

TEST_CASE("plot: --step picks another step and a step without spans is a usage_error") {
  const schedule_rows one = schedule_rows_of(synthetic_trace(), "trace.json", 1);
  CHECK(one.step == 1);
  CHECK(one.spans == expected_spans());  // times are relative to the step's first span
  const std::string msg =
      usage_message([] { schedule_rows_of(synthetic_trace(), "trace.json", 7); });
  CHECK(contains(msg, "trace.json"));
  CHECK(contains(msg, "step 7"));
  CHECK(contains(msg, "steps 1..3 with --step N"));
}

TEST_CASE("plot: malformed inputs are usage errors naming the file and how to get a good one") {
  temp_dir tmp;
  const std::string not_json = write_text(tmp.path / "notjson.json", "{\"curve\": [");
  std::string m = usage_message([&] { read_plot_json(not_json); });
  CHECK(contains(m, not_json));
  CHECK(contains(m, "not JSON"));
  CHECK(contains(m, "--summary"));

  m = usage_message([&] { read_plot_json((tmp.path / "absent.json").string()); });
  CHECK(contains(m, "absent.json: cannot open"));

  m = usage_message([] { detect_plot_input(json{{"hello", 1}}, "other.json"); });
  CHECK(contains(m, "other.json: neither a run summary"));
  CHECK(contains(m, "--trace"));
  m = usage_message([] { detect_plot_input(json::array(), "array.json"); });
  CHECK(contains(m, "array.json"));

  json s = synthetic_summary();
  s.erase("curve");
  CHECK(detect_plot_input(s, "old.json") == plot_input::summary);
  m = usage_message([&] { summary_rows_of(s, "old.json"); });
  CHECK(contains(m, "old.json: the summary has no \"curve\" entries"));
  CHECK(contains(m, "--summary"));

  s = synthetic_summary();
  s["curve"][1].erase("loss");
  m = usage_message([&] { summary_rows_of(s, "bad.json"); });
  CHECK(contains(m, "bad.json: curve[1] has no number \"loss\""));

  json t = synthetic_trace();
  json kept = json::array();
  for (const json& e : t["traceEvents"])
    if (e["name"] != "forward") kept.push_back(e);
  t["traceEvents"] = kept;
  CHECK(detect_plot_input(t, "t.json") == plot_input::trace);
  m = usage_message([&] { schedule_rows_of(t, "t.json"); });
  CHECK(contains(m, "t.json: the trace has no \"forward\" spans"));
  CHECK(contains(m, "--trace"));

  // Through plot_file too: nothing is drawn and the file is named.
  const std::string empty_curve =
      write_text(tmp.path / "empty.json", json{{"curve", json::array()}}.dump());
  m = usage_message([&] { plot_file(empty_curve, (tmp.path / "out").string()); });
  CHECK(contains(m, empty_curve));
  CHECK_FALSE(fs::exists(tmp.path / "out" / "loss.png"));
}

TEST_CASE("plot: gp_quote doubles quotes and keeps a string on one line") {
  CHECK(gp_quote("plain") == "'plain'");
  CHECK(gp_quote("it's") == "'it''s'");
  CHECK(gp_quote("a\nb\tc") == "'a b c'");
  CHECK(gp_quote("`rm x` $HOME \\n") == "'`rm x` $HOME \\n'");
}

namespace {

void check_png(const fs::path& p, uint32_t width, uint32_t height) {
  CAPTURE(p.string());
  const std::optional<png_size> size = read_png_size(p.string());
  REQUIRE(size.has_value());
  CHECK(size->width == width);
  CHECK(size->height == height);
}

std::vector<std::string> names_in(const std::vector<std::string>& files, const fs::path& dir) {
  std::vector<std::string> names;
  for (const std::string& f : files) {
    CHECK(fs::path(f).parent_path() == dir);
    names.push_back(fs::path(f).filename().string());
  }
  return names;
}

}  // namespace

TEST_CASE("plot: a summary in a path with a space and a quote gives PNGs with their .dat and .gp") {
  temp_dir tmp;
  const fs::path dir = tmp.path / "it's a run" / "plots";  // created by the plot
  const std::string input = write_text(tmp.path / "run's summary.json", synthetic_summary().dump());
  const plot_result r = plot_file(input, dir.string());
  CHECK(names_in(r.files, dir) ==
        std::vector<std::string>{"loss.dat", "loss_eval.dat", "loss.gp", "loss.png",
                                 "throughput.dat", "throughput.gp", "throughput.png",
                                 "step_split.dat", "step_split.gp", "step_split.png"});
  for (const std::string& f : r.files) CHECK(fs::file_size(f) > 0);
  check_png(dir / "loss.png", 1000, 560);
  check_png(dir / "throughput.png", 1000, 560);
  check_png(dir / "step_split.png", 800, 560);
  CHECK(read_text(dir / "loss.dat") == "# step t_s loss\n1 0.25 2.5\n2 0.5 2\n3 0.75 1.5\n4 1 1\n");
  CHECK(read_text(dir / "loss_eval.dat") ==
        "# step t_s loss accuracy (NaN: none)\n4 1 1.25 0.75\n");
  CHECK(read_text(dir / "step_split.dat") ==
        "# worker compute_s comm_wait_s bubble_s idle_s\n"
        "\"worker-0\" 1.5 0.25 0 0.125\n\"worker-1\" 1 0.5 0.375 0.25\n");
  const std::string tp = read_text(dir / "throughput.gp");
  CHECK(contains(tp, "set arrow from 0.375, graph 0 to 0.375, graph 1"));
  CHECK(contains(tp, "set label 'kill worker-1' at 0.375"));
  CHECK(contains(tp, "title 'kill event'"));
  CHECK(contains(read_text(dir / "loss.gp"), "axes x1y2"));  // accuracy on the second axis
}

TEST_CASE("plot: a summary without events or evals still draws, with no event lines") {
  temp_dir tmp;
  json s = synthetic_summary();
  s["events"] = json::array();
  s.erase("evals");
  const plot_result r = plot_summary(summary_rows_of(s, "run.json"), tmp.path.string());
  CHECK(names_in(r.files, tmp.path) == std::vector<std::string>{"loss.dat", "loss.gp", "loss.png",
                                                                "throughput.dat", "throughput.gp",
                                                                "throughput.png", "step_split.dat",
                                                                "step_split.gp", "step_split.png"});
  check_png(tmp.path / "throughput.png", 1000, 560);
  CHECK_FALSE(contains(read_text(tmp.path / "throughput.gp"), "set arrow"));
  CHECK_FALSE(contains(read_text(tmp.path / "loss.gp"), "loss_eval.dat"));
}

TEST_CASE("plot: a trace gives pipeline.png with its .dat and .gp") {
  temp_dir tmp;
  const fs::path dir = tmp.path / "sched 'x'";
  const std::string input = write_text(tmp.path / "trace.json", synthetic_trace().dump());
  const plot_result r = plot_file(input, dir.string());
  CHECK(names_in(r.files, dir) ==
        std::vector<std::string>{"pipeline.dat", "pipeline.gp", "pipeline.png"});
  check_png(dir / "pipeline.png", 1100, 360);
  CHECK(read_text(dir / "pipeline.dat") ==
        "# one block per kind of span; columns: lane start_ms end_ms micro_batch\n"
        "# bubble\n0 2 5 -1\n1 0 1 -1\n1 7 9 -1\n\n\n"
        "# forward\n0 0 1 0\n0 1 2 1\n1 1 2 0\n1 2 3 1\n\n\n"
        "# backward\n0 5 7 1\n0 7 9 0\n1 3 5 1\n1 5 7 0\n");
  const std::string gp = read_text(dir / "pipeline.gp");
  CHECK(contains(gp, "set ytics ('worker-0 (stage 0)' 0, 'worker-1 (stage 1)' 1)"));
  CHECK(contains(gp, "set title 'Pipeline schedule of step 2'"));
}

TEST_CASE("plot: a gnuplot error carries gnuplot's message") {
  temp_dir tmp;
  write_text(tmp.path / "bad.gp", "set terminal pngcairo\nthis_is_no_command 1\n");
  try {
    run_gnuplot(tmp.path.string(), "bad.gp");
    FAIL("no error");
  } catch (const cohort::error& e) {
    const std::string m = e.what();
    CHECK(e.exit_status() == 1);
    CHECK(contains(m, "gnuplot failed on " + (tmp.path / "bad.gp").string() + " (exit 1)"));
    CHECK(contains(m, "line 2"));
  }
  CHECK_FALSE(read_png_size((tmp.path / "bad.gp").string()).has_value());
}

TEST_CASE("plot: a missing gnuplot is an error that says to run tools/setup.sh") {
  temp_dir tmp;
  const char* old = std::getenv("PATH");
  const std::string saved = old ? old : "";
  setenv("PATH", tmp.path.string().c_str(), 1);  // a folder without gnuplot
  std::string m;
  try {
    run_gnuplot(tmp.path.string(), "none.gp");
  } catch (const cohort::error& e) {
    m = e.what();
  }
  setenv("PATH", saved.c_str(), 1);
  CHECK(contains(m, "gnuplot is not installed"));
  CHECK(contains(m, "tools/setup.sh"));
}
