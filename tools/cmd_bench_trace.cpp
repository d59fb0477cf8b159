// `cohort bench trace`: what one trace span costs on each leg of its way, measured in
// isolation (a run's step time varies more between runs than tracing could change it, so
// tools/bench_trace.sh multiplies these by the spans a traced run recorded per step):
// recording it in a worker (trace::complete with its args), carrying it in a telemetry frame
// (encode and decode), and writing it to the job's trace file on the coordinator.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/core/error.hpp"
#include "runtime/core/trace.hpp"
#include "runtime/net/codec.hpp"
#include "runtime/obs/trace_file.hpp"
#include "tools/commands.hpp"

namespace cohort::cli {

namespace {

using clock_type = std::chrono::steady_clock;

double ns_per(clock_type::time_point t0, int64_t n) {
  return std::chrono::duration<double, std::nano>(clock_type::now() - t0).count() /
         static_cast<double>(n);
}

}  // namespace

void add_bench_trace(CLI::App& bench, int* rc) {
  auto spans = std::make_shared<int>(200000);
  auto json = std::make_shared<bool>(false);
  CLI::App* cmd = bench.add_subcommand(
      "trace", "Nanoseconds per trace span: recorded, carried in telemetry, written to the file");
  cmd->add_option("--spans", *spans, "spans per measurement")
      ->check(CLI::Range(1000, 10000000))
      ->capture_default_str();
  cmd->add_flag("--json", *json, "print one JSON object instead of lines");
  cmd->callback([spans, json, rc] {
    const int n = *spans;
    // 1. Recording, as a worker's forward span does (name, category, args), then taking.
    trace::enable(true, static_cast<std::size_t>(n));
    trace::take();
    auto t0 = clock_type::now();
    for (int i = 0; i < n; ++i)
      trace::complete("forward", "compute", i, i + 10, trace::compute,
                      trace::args({{"step", i / 4}, {"mb", i % 4}}));
    std::vector<trace::event> got = trace::take();
    const double record_ns = ns_per(t0, n);
    trace::enable(false);
    if (static_cast<int>(got.size()) != n)
      throw cohort::error("bench trace: recorded " + std::to_string(got.size()) + " of " +
                          std::to_string(n) + " spans");
    // 2. Telemetry frames of 4096 spans, encoded and decoded.
    t0 = clock_type::now();
    std::size_t bytes = 0;
    for (int at = 0; at < n; at += 4096) {
      net::telemetry m;
      for (int i = at; i < std::min(n, at + 4096); ++i) {
        const trace::event& e = got[static_cast<std::size_t>(i)];
        m.spans.push_back(
            {e.name, e.cat, static_cast<uint8_t>(e.ph), e.ts_ns, e.dur_ns, e.tid, e.args});
      }
      const std::string frame = net::encode(m);
      bytes += frame.size();
      if (!net::decode(frame, frame.size()).ok())
        throw cohort::error("bench trace: a telemetry frame did not decode");
    }
    const double carry_ns = ns_per(t0, n);
    // 3. The coordinator's side: queued, formatted and written by the background writer.
    const std::string path = (std::filesystem::temp_directory_path() /
                              ("cohort-bench-trace-" + std::to_string(getpid()) + ".json"))
                                 .string();
    t0 = clock_type::now();
    {
      obs::trace_file f(path, 0, static_cast<std::size_t>(n) + 16);
      for (const trace::event& e : got) f.add(1, e);
      f.close();
    }
    const double write_ns = ns_per(t0, n);
    std::filesystem::remove(path);
    if (*json) {
      std::printf("%s\n", nlohmann::json{{"spans", n},
                                         {"record_ns", record_ns},
                                         {"telemetry_ns", carry_ns},
                                         {"telemetry_bytes_per_span", double(bytes) / n},
                                         {"write_ns", write_ns}}
                              .dump()
                              .c_str());
    } else {
      std::printf(
          "per span, %d spans: record %.0f ns (worker), telemetry %.0f ns (%.1f bytes, "
          "encode + decode), trace file %.0f ns (coordinator)\n",
          n, record_ns, carry_ns, double(bytes) / n, write_ns);
    }
    *rc = exit_ok;
  });
}

}  // namespace cohort::cli
