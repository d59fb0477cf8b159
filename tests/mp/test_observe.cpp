// Seeing a run (docs/observability.md) in real `cohort launch` runs: the merged Chrome trace
// holds every committed step's spans for every worker, on the coordinator's clock (on one
// host every process reads the same CLOCK_MONOTONIC, so each estimated offset must lie
// within its own error bound of 0); a kill shows as the fault, its detection and its
// recovery, in that order; a Prometheus scrape in the middle of a run parses and its step
// counter grows; a keyed coordinator serving metrics beyond loopback says the endpoint is
// unauthenticated, a bare port serves loopback without a word; `cohort plot` draws PNGs from
// a real run's summary and trace.
#include <doctest/doctest.h>
#include <httplib.h>

#include <cmath>
#include <csignal>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/mp/dp_util.hpp"

using namespace cohort;
using namespace cohort::mp;
using std::chrono::milliseconds;

namespace {

struct traced_run {
  nlohmann::json summary;
  nlohmann::json trace;
  std::map<int, std::string> names;  // pid -> process name
};

traced_run launch_traced(const temp_dir& dir, int steps, int workers,
                         const std::vector<std::string>& extra) {
  const std::string cfg = dir.write("cfg.yaml", small_yaml(dir.path(), "fast", steps));
  std::vector<std::string> args = {"launch",
                                   cfg,
                                   "-q",
                                   "--summary",
                                   dir.path() + "/s.json",
                                   "--trace",
                                   dir.path() + "/trace.json",
                                   "--set",
                                   "cluster.workers=" + std::to_string(workers)};
  args.insert(args.end(), extra.begin(), extra.end());
  child_process p(args, dir.path(), "launch");
  const auto code = p.wait_exit(milliseconds(120000));
  REQUIRE_MESSAGE(code.has_value(), "launch did not finish: " << p.err());
  REQUIRE_MESSAGE(*code == 0, p.out() << p.err());
  traced_run r;
  r.summary = read_json(dir.path() + "/s.json");
  r.trace = read_json(dir.path() + "/trace.json");
  REQUIRE(r.summary.is_object());
  REQUIRE_MESSAGE(r.trace.is_object(), "the trace is not JSON");
  for (const auto& e : r.trace["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "process_name")
      r.names[e["pid"].get<int>()] = e["args"]["name"].get<std::string>();
  return r;
}

}  // namespace

TEST_CASE("a traced run holds every step's spans for every worker, on the coordinator's clock") {
  temp_dir dir;
  const int steps = 12, workers = 2;
  const traced_run r = launch_traced(dir, steps, workers, {});
  REQUIRE(r.names.size() == 1 + workers);
  CHECK(r.names.at(0) == "coordinator");
  // Per worker: the steps each kind of span names, and how many collectives ran.
  std::map<std::string, std::map<std::string, std::set<int64_t>>> seen;
  std::map<std::string, int> collectives;
  std::set<int64_t> coordinator_steps;
  double last_ts = -1;
  for (const auto& e : r.trace["traceEvents"]) {
    if (e["ph"] == "M") continue;
    CHECK(e["ts"].is_number());
    if (e["ph"] == "X") CHECK(e["dur"].get<double>() >= 0);
    const std::string who = r.names.at(e["pid"].get<int>());
    const std::string name = e["name"];
    if (who == "coordinator") {
      if (name == "step") coordinator_steps.insert(e["args"]["step"].get<int64_t>());
      continue;
    }
    if (name == "allreduce") {
      ++collectives[who];
      CHECK(e["args"]["bytes"].get<int64_t>() > 0);
    }
    if (e.contains("args") && e["args"].contains("step"))
      seen[who][name].insert(e["args"]["step"].get<int64_t>());
    last_ts = std::max(last_ts, e["ts"].get<double>());
  }
  std::set<int64_t> all;
  for (int64_t s = 0; s < steps; ++s) all.insert(s);
  CHECK(coordinator_steps == all);
  REQUIRE(seen.size() == static_cast<std::size_t>(workers));
  for (const auto& [who, kinds] : seen) {
    CAPTURE(who);
    CHECK(kinds.at("forward") == all);
    CHECK(kinds.at("backward") == all);
    CHECK(kinds.at("optimizer") == all);
    CHECK(collectives.at(who) >= steps);  // at least one bucket a step
  }
  // On one host the true offset is 0: every estimate lies within its bound of it.
  const auto& clocks = r.trace["otherData"]["worker_clocks"];
  REQUIRE(clocks.size() == static_cast<std::size_t>(workers));
  for (const auto& [who, c] : clocks.items()) {
    CAPTURE(who);
    const int64_t err = c["error_ns"], off = c["offset_ns"];
    CHECK(err >= 0);
    CHECK(std::llabs(off) <= err);
  }
  CHECK(r.trace["otherData"]["events_dropped"] == 0);
  // The summary carries the curve the plots draw: one point per committed step.
  REQUIRE(r.summary["curve"].size() == static_cast<std::size_t>(steps));
  CHECK(r.summary["curve"].back()["step"] == steps);
  CHECK(last_ts > 0);
}

TEST_CASE("a kill in a traced run shows the fault, then its detection, then its recovery") {
  temp_dir dir;
  const traced_run r = launch_traced(
      dir, 16, 3, {"--inject", "kill rank=1 at step=6", "--set", "elastic.min_workers=2"});
  double fault = -1, detect_begin = -1, detect_end = -1, recover_begin = -1, recover_end = -1;
  std::string victim;
  for (const auto& e : r.trace["traceEvents"]) {
    if (e["ph"] == "M" || e["pid"] != 0) continue;
    const std::string name = e["name"];
    const double ts = e["ts"];
    if (e["cat"] == "fault" && e["ph"] == "i" && name.rfind("kill ", 0) == 0) {
      fault = ts;
      victim = name.substr(5);
    } else if (name.rfind("detect kill ", 0) == 0) {
      detect_begin = ts;
      detect_end = ts + e["dur"].get<double>();
    } else if (name.rfind("recover kill ", 0) == 0) {
      recover_begin = ts;
      recover_end = ts + e["dur"].get<double>();
    }
  }
  REQUIRE_MESSAGE(fault >= 0, r.trace["traceEvents"].dump().substr(0, 2000));
  CHECK(victim.rfind("worker-", 0) == 0);
  REQUIRE(detect_begin >= 0);
  REQUIRE(recover_begin >= 0);
  // Detection runs from the fault to the roster's change; recovery from there to the next
  // committed step (times in microseconds; a microsecond of rounding allowed).
  CHECK(std::fabs(detect_begin - fault) <= 1.0);
  CHECK(detect_end >= detect_begin);
  CHECK(std::fabs(recover_begin - detect_end) <= 1.0);
  CHECK(recover_end >= recover_begin);
  const auto kills = events_of(r.summary, "kill");
  REQUIRE(kills.size() == 1);
  CHECK((detect_end - detect_begin) / 1000.0 ==
        doctest::Approx(kills[0]["detect_ms"].get<double>()).epsilon(0.001));
  CHECK((recover_end - fault) / 1000.0 ==
        doctest::Approx(kills[0]["recover_ms"].get<double>()).epsilon(0.001));
  // The plots of this run: every file a PNG (the signature) or the data and script beside it.
  int rc = -1;
  const std::string out =
      run_capture("plot " + dir.path() + "/s.json --out " + dir.path() + "/plots", &rc);
  REQUIRE_MESSAGE(rc == 0, out);
  for (const char* png : {"loss.png", "throughput.png", "step_split.png"}) {
    CAPTURE(png);
    const std::string bytes = read_file(dir.path() + "/plots/" + png);
    REQUIRE(bytes.size() > 8);
    CHECK(bytes.substr(0, 8) == std::string("\x89PNG\r\n\x1a\n", 8));
  }
}

TEST_CASE(
    "a metrics scrape in the middle of a run parses, its step counter grows, ctl shows the rate") {
  temp_dir dir;
  const std::string cfg = dir.write("cfg.yaml", small_yaml(dir.path(), "fast", 100000));
  child_process p({"launch", cfg, "-q", "--metrics", "127.0.0.1:0", "--set", "cluster.workers=2"},
                  dir.path(), "launch");
  const auto url = p.wait_line("coordinator metrics at ", milliseconds(30000));
  REQUIRE_MESSAGE(url.has_value(), p.out() << p.err());
  const std::regex parts("http://([0-9.]+):([0-9]+)(/metrics)");
  std::smatch m;
  REQUIRE(std::regex_match(*url, m, parts));
  httplib::Client client(m[1].str(), std::stoi(m[2].str()));
  client.set_read_timeout(5, 0);
  // The exposition grammar: comments, or `name{labels} value`.
  const std::regex line(
      R"((# (HELP|TYPE) [a-zA-Z_:][a-zA-Z0-9_:]* .*)|([a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? (-?[0-9.e+-]+|NaN|Nan|\+Inf|-Inf)))");
  std::string body;
  auto scrape_steps = [&]() -> double {
    const auto res = client.Get("/metrics");
    if (!res || res->status != 200) return -1;
    body = res->body;
    double steps = -1;
    std::istringstream in(res->body);
    std::string l;
    while (std::getline(in, l)) {
      if (l.empty()) continue;
      CHECK_MESSAGE(std::regex_match(l, line), l);
      if (l.rfind("cohort_steps_total ", 0) == 0) steps = std::stod(l.substr(19));
    }
    return steps;
  };
  double first = -1, later = -1;
  CHECK(eventually(milliseconds(60000), [&] { return (first = scrape_steps()) >= 1; }));
  CHECK(eventually(milliseconds(60000), [&] { return (later = scrape_steps()) > first; }));
  MESSAGE("cohort_steps_total: " << first << " then " << later);
  // Worker figures arrive with the votes and the telemetry.
  CHECK(eventually(milliseconds(30000), [&] {
    scrape_steps();
    return body.find("cohort_pool_bytes{worker=\"worker-") != std::string::npos &&
           body.find("cohort_comm_wait_ratio{worker=\"worker-") != std::string::npos;
  }));
  // `ctl status` carries the job's live figures; `ctl top` shows them twice and ends.
  const job_address a = address_of(p);
  nlohmann::json st;
  CHECK(eventually(milliseconds(30000), [&] {
    st = ctl_status(a);
    return st.is_object() && st.contains("job") && st["job"].contains("steps_per_s");
  }));
  CHECK(st["job"]["steps_per_s"].get<double>() > 0);
  CHECK(st["job"]["split_ms"]["votes"].get<int>() > 0);
  CHECK(st["job"]["split_ms"]["compute"].get<double>() > 0);
  int rc = -1;
  const std::string top = run_capture("ctl " + a.ctl_args() + " top --count 2 --interval 0.2", &rc);
  CHECK(rc == 0);
  CHECK_MESSAGE(top.find("rate: ") != std::string::npos, top);
  CHECK(top.find("a worker's step: compute ") != std::string::npos);
  p.signal(SIGTERM);  // a run of 100000 steps: stopped here (launch stops every child)
  CHECK(p.wait_exit(milliseconds(30000)).has_value());
}

TEST_CASE(
    "a keyed coordinator warns when its metrics go beyond loopback, a bare port stays on it") {
  temp_dir dir;
  const std::string keys = dir.path() + "/keys";
  int rc = -1;
  run_capture("keygen " + keys, &rc);
  REQUIRE(rc == 0);
  const std::string cfg = dir.write("cfg.yaml", small_yaml(dir.path(), "fast", 100000));
  const auto serve = [&](const std::string& metrics, const char* name, std::string* url) {
    child_process c({"coordinator", "--config", cfg, "--keys", keys, "--metrics", metrics},
                    dir.path(), name);
    const auto ep = c.wait_line("coordinator listening on ", milliseconds(15000));
    const auto at = c.wait_line("coordinator metrics at ", milliseconds(15000));
    REQUIRE_MESSAGE((ep.has_value() && at.has_value()), c.out() << c.err());
    *url = *at;
    // The endpoint answers on loopback either way (0.0.0.0 includes it).
    const std::regex parts("http://([0-9.]+):([0-9]+)/metrics");
    std::smatch m;
    REQUIRE(std::regex_match(*at, m, parts));
    httplib::Client client("127.0.0.1", std::stoi(m[2].str()));
    client.set_read_timeout(5, 0);
    const auto res = client.Get("/metrics");
    CHECK((res && res->status == 200));
    const std::string said =
        run_capture("ctl --coordinator " + *ep + " --keys " + keys + " stop", &rc, true);
    CHECK_MESSAGE(rc == 0, said);
    CHECK(c.wait_exit(milliseconds(15000)).has_value());
    return c.err();
  };
  std::string url;
  const std::string wide = serve("0.0.0.0:0", "wide", &url);
  CHECK(url.rfind("http://0.0.0.0:", 0) == 0);
  CHECK_MESSAGE(wide.find("coordinator: warning: metrics: serving on 0.0.0.0") != std::string::npos,
                wide);
  CHECK(wide.find("without authentication") != std::string::npos);
  CHECK(wide.find("keys protect its control plane, not this endpoint") != std::string::npos);
  const std::string local = serve("0", "local", &url);
  CHECK(url.rfind("http://127.0.0.1:", 0) == 0);
  CHECK_MESSAGE(local.find("metrics: serving on") == std::string::npos, local);
}
