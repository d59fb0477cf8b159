// Trace alignment where the true clock offset is known and not 0: each worker runs in its own
// Linux time namespace (`unshare --time --monotonic N --boottime N --fork`), so its
// CLOCK_MONOTONIC reads N seconds off the coordinator's while everything else is shared. The
// merged trace must put every worker span where it happened on the coordinator's clock, each
// estimated offset must lie within its bound of -N, and the metrics' clock error must be the
// round trip's bound, not the offset. Label netns: time namespaces need root (else exit 77).
#include <doctest/doctest.h>
#include <httplib.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "tests/mp/dp_util.hpp"

using namespace cohort;
using namespace cohort::mp;
using std::chrono::milliseconds;

namespace {

// Skips the case (exit 77, the reason on stdout) when this machine cannot make a time
// namespace (not root, or a kernel before 5.6).
void require_time_namespaces() {
  std::string out;
  if (run_shell("unshare --time --monotonic 1 --boottime 1 --fork true 2>&1", &out) == 0) return;
  std::printf("skipped: cannot make a time namespace (needs root and Linux >= 5.6): %s\n",
              out.c_str());
  std::fflush(stdout);
  std::_Exit(77);
}

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A worker and the seconds its clocks run ahead of the coordinator's (negative: behind).
struct shifted {
  std::string name;
  int seconds;
};

// `cohort_clock_error_seconds{worker="NAME"} V` lines of an exposition: name -> V.
std::map<std::string, double> clock_errors(const std::string& exposition) {
  static const std::regex line(
      R"re(cohort_clock_error_seconds\{worker="([^"]+)"\} ([0-9.e+-]+))re");
  std::map<std::string, double> out;
  for (std::sregex_iterator it(exposition.begin(), exposition.end(), line), end; it != end; ++it)
    out[(*it)[1].str()] = std::stod((*it)[2].str());
  return out;
}

}  // namespace

TEST_CASE("workers whose clocks run seconds ahead or behind land on the coordinator's clock") {
  require_time_namespaces();
  const std::vector<shifted> workers = {{"ahead", 7}, {"behind", -4}, {"level", 0}};
  // A clock moved back must stay positive (the kernel refuses otherwise).
  REQUIRE(steady_ns() > 10'000'000'000LL);
  temp_dir dir;
  // commit_window 0: every step opens and commits by the coordinator's own messages, so a
  // step's forward and backward lie between its open and its commit on the true clock. A
  // long run, stopped by SIGTERM once the metrics were read mid-run.
  std::string yaml = small_yaml(dir.path(), "fast", 100000);
  yaml.replace(yaml.find("timeout_ms: 2000"), 16, "timeout_ms: 20000\n  commit_window: 0");
  const std::string cfg = dir.write("cfg.yaml", yaml);
  const std::string trace_path = dir.path() + "/trace.json";
  const int64_t before_ns = steady_ns();
  child_process coord({"coordinator", "--config", cfg, "-q", "--trace", trace_path, "--metrics",
                       "127.0.0.1:0", "--set", "cluster.workers=3"},
                      dir.path(), "coordinator");
  const auto ep = coord.wait_line("coordinator listening on ", milliseconds(30000));
  const auto url = coord.wait_line("coordinator metrics at ", milliseconds(30000));
  REQUIRE_MESSAGE((ep.has_value() && url.has_value()), coord.err());
  std::vector<std::unique_ptr<child_process>> procs;
  for (const shifted& w : workers) {
    const std::string n = std::to_string(w.seconds);
    procs.push_back(std::make_unique<child_process>(
        std::vector<std::string>{"worker", "--join", *ep, "--name", w.name}, dir.path(), w.name,
        std::vector<std::string>{},
        std::vector<std::string>{"/usr/bin/unshare", "--time", "--monotonic=" + n,
                                 "--boottime=" + n, "--fork"}));
  }
  // Mid-run: every worker's clock error is on the scrape, and the trace being written
  // (FILE.partial) holds a dozen steps' backward passes of every worker (spans recorded after
  // the last shipment are lost to the SIGTERM).
  const std::regex parts("http://([0-9.]+):([0-9]+)/metrics");
  std::smatch m;
  REQUIRE(std::regex_match(*url, m, parts));
  httplib::Client client(m[1].str(), std::stoi(m[2].str()));
  client.set_read_timeout(5, 0);
  std::map<std::string, double> errors;
  auto backward_per_worker = [&] {
    static const std::regex pass(R"re("name":"backward".*"pid":([0-9]+))re");
    const std::string text = read_file(trace_path + ".partial");
    std::map<std::string, int> n;
    for (std::sregex_iterator it(text.begin(), text.end(), pass), end; it != end; ++it)
      ++n[(*it)[1].str()];
    return n;
  };
  const bool scraped = eventually(milliseconds(120000), [&] {
    const auto res = client.Get("/metrics");
    if (!res || res->status != 200) return false;
    errors = clock_errors(res->body);
    if (errors.size() != workers.size()) return false;
    const auto passes = backward_per_worker();
    if (passes.size() != workers.size()) return false;
    for (const auto& [pid, n] : passes)
      if (n < 12) return false;
    return true;
  });
  REQUIRE_MESSAGE(scraped, coord.err());
  coord.signal(SIGTERM);
  const auto code = coord.wait_exit(milliseconds(60000));
  REQUIRE_MESSAGE(code.has_value(), coord.err());
  CHECK_MESSAGE(*code == 0, coord.err());
  const int64_t after_ns = steady_ns();

  const nlohmann::json trace = read_json(trace_path);
  REQUIRE_MESSAGE(trace.is_object(), "no trace: " << coord.err());
  const nlohmann::json& meta = trace["otherData"];
  const int64_t zero_ns = meta["clock_zero_ns"];
  // The bound the docs state: half the best probe's round trip; the largest any telemetry
  // carried bounds every span shipped with it.
  REQUIRE(meta["max_clock_error_us"].is_number());
  const double bound_us = meta["max_clock_error_us"];
  // Each estimate lies within its bound of the true offset: add -N s to the worker's clock.
  std::map<std::string, int> shift_of;
  for (const shifted& w : workers) {
    CAPTURE(w.name);
    shift_of[w.name] = w.seconds;
    const auto& c = meta["worker_clocks"][w.name];
    REQUIRE(c.is_object());
    const int64_t off = c["offset_ns"], err = c["error_ns"];
    const int64_t truth = -int64_t{w.seconds} * 1'000'000'000;
    CHECK(err >= 0);
    CHECK(err <= bound_us * 1e3);
    CHECK_MESSAGE(std::llabs(off - truth) <= err, "offset " << off << " ns, truth " << truth);
    // The metric is that bound, the round trip's, never the offset it corrects (the
    // smallest shift here is 4 s).
    REQUIRE(errors.count(w.name) == 1);
    CHECK(errors[w.name] >= 0.0);
    CHECK(errors[w.name] * 1e9 <= bound_us * 1e3 + 1.0);  // a nanosecond of rounding
  }

  // The coordinator's committed steps, [open, commit] in microseconds of the trace.
  std::map<std::string, int> pid_of;
  std::map<int64_t, std::pair<double, double>> step_at;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name")
      pid_of[e["args"]["name"].get<std::string>()] = e["pid"];
    if (e["ph"] == "X" && e["pid"] == 0 && e["name"] == "step") {
      const double ts = e["ts"];
      step_at[e["args"]["step"].get<int64_t>()] = {ts, ts + e["dur"].get<double>()};
    }
  }
  REQUIRE(step_at.size() >= 12);
  std::map<int, std::string> name_of;
  for (const auto& [name, pid] : pid_of) name_of[pid] = name;
  // Every event happened while the test ran, on the one clock the test, the coordinator and
  // its trace share; a step's passes after the coordinator opened it and before it saw the
  // votes. Counted, with the first few that miss, so a wrong shift reads as one line.
  std::map<std::string, int> spans, placed;
  int misplaced = 0;
  std::string first_misplaced;
  auto miss = [&](const nlohmann::json& e, const std::string& why) {
    if (++misplaced <= 3) first_misplaced += why + ": " + e.dump() + "\n";
  };
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "M") continue;
    const double ts = e["ts"], end = ts + (e["ph"] == "X" ? e["dur"].get<double>() : 0.0);
    const bool coordinator = e["pid"] == 0;
    // The coordinator's own events carry its clock: no estimate between.
    const double slack_us = coordinator ? 0.0 : bound_us;
    if (zero_ns + ts * 1e3 < before_ns - slack_us * 1e3) miss(e, "before the test started it");
    if (zero_ns + end * 1e3 > after_ns + slack_us * 1e3) miss(e, "after the coordinator ended");
    if (coordinator) continue;
    const std::string who = name_of.at(e["pid"].get<int>());
    REQUIRE(shift_of.count(who) == 1);
    ++spans[who];
    const std::string name = e["name"];
    if ((name == "forward" || name == "backward") && e["args"].contains("step")) {
      const auto at = step_at.find(e["args"]["step"].get<int64_t>());
      if (at == step_at.end()) continue;  // the step SIGTERM cut short: never committed
      if (ts < at->second.first - bound_us) miss(e, "before its step opened");
      if (end > at->second.second + bound_us) miss(e, "after its step committed");
      ++placed[who];
    }
  }
  CHECK_MESSAGE(misplaced == 0, misplaced << " events out of place, the first:\n"
                                          << first_misplaced);
  for (const shifted& w : workers) {
    CAPTURE(w.name);
    CHECK(spans[w.name] > 0);
    // The dozen backward passes seen mid-run, less one step perhaps not committed, and their
    // forward passes.
    CHECK(placed[w.name] >= 2 * 11);
  }
  MESSAGE("largest clock error " << bound_us << " us; spans " << spans["ahead"] << " / "
                                 << spans["behind"] << " / " << spans["level"]);
}
