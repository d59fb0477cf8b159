// `cohort bench p2p`: two local rank processes (forked from this one) exchange messages of
// each size through p2p_channel over TCP 127.0.0.1 (ping-pong and one-way streaming), then
// run Gloo allreduce of the same sizes in the same run; prints time and throughput (bytes
// / time, one way), the allreduce busbw (nccl-tests) and their ratio, as a table and
// optionally as JSON. The measuring is runtime/comm/p2p_bench.cpp.
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/comm/allreduce_bench.hpp"
#include "runtime/comm/p2p_bench.hpp"
#include "runtime/core/atomic_file.hpp"
#include "runtime/core/error.hpp"
#include "runtime/net/curve.hpp"
#include "tools/bench_util.hpp"
#include "tools/commands.hpp"

namespace cohort::cli {

namespace {

// Rank 0's rows, as a child hands them to the parent.
nlohmann::json rows_to_json(const std::vector<comm::p2p_bench_row>& rows) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& r : rows)
    j.push_back({{"bytes", r.bytes},
                 {"iters", r.iters},
                 {"pingpong_s", r.pingpong_s},
                 {"stream_s", r.stream_s},
                 {"allreduce_s", r.allreduce_s}});
  return j;
}

std::vector<comm::p2p_bench_row> rows_from_json(const nlohmann::json& j) {
  std::vector<comm::p2p_bench_row> rows;
  for (const auto& r : j) {
    comm::p2p_bench_row row;
    row.bytes = r.at("bytes").get<std::size_t>();
    row.iters = r.at("iters").get<int>();
    row.pingpong_s = r.at("pingpong_s").get<double>();
    row.stream_s = r.at("stream_s").get<double>();
    row.allreduce_s = r.at("allreduce_s").get<double>();
    rows.push_back(row);
  }
  return rows;
}

// p2p throughput / allreduce busbw; 0 when the allreduce was not measured.
double ratio(std::size_t bytes, double p2p_s, double allreduce_s) {
  const double bus = comm::busbw_gbps(bytes, allreduce_s, 2);
  return bus > 0 ? comm::algbw_gbps(bytes, p2p_s) / bus : 0.0;
}

// Forks rank 0 and rank 1, each running `body(rank)` and leaving with _exit (a forked child
// must not run the parent's exit handlers). A fork rather than an exec of this binary: the
// ranks need nothing but the options already parsed, and any program that registers the
// subcommand (the tests' too) can run it. On the first failure the other rank is killed.
template <class Body>
void run_two_ranks(Body body) {
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pids[2] = {-1, -1};
  for (int r = 0; r < 2; ++r) {
    pids[r] = fork();
    if (pids[r] < 0) {
      if (r == 1) {
        kill(pids[0], SIGKILL);
        waitpid(pids[0], nullptr, 0);
      }
      throw error("bench p2p: fork failed");
    }
    if (pids[r] == 0) {
      int code = 0;
      try {
        body(r);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "bench p2p: rank %d: %s\n", r, e.what());
        code = 1;
      }
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(code);
    }
  }
  std::string failure;
  bool done[2] = {false, false};
  for (int left = 2; left > 0;) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      break;
    }
    const int r = pid == pids[0] ? 0 : pid == pids[1] ? 1 : -1;
    if (r < 0 || done[r]) continue;  // a child of someone else in this process
    done[r] = true;
    --left;
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok && failure.empty()) {
      failure = "rank " + std::to_string(r) + " " +
                (WIFEXITED(status) ? "exited with code " + std::to_string(WEXITSTATUS(status))
                                   : "was killed by signal " + std::to_string(WTERMSIG(status)));
      if (!done[1 - r]) kill(pids[1 - r], SIGKILL);  // it would only wait for its peer
    }
  }
  if (!failure.empty()) throw error("bench p2p: " + failure + " (see its message above)");
}

// ", PLAIN (HMAC)" or ", CurveZMQ" with keys, else "".
std::string security_label(const comm::p2p_bench_options& o) {
  if (o.keys_dir.empty()) return "";
  return o.security == comm::p2p_security::encrypt ? ", CurveZMQ" : ", PLAIN (HMAC)";
}

void print_table(const comm::p2p_bench_options& o, const std::vector<comm::p2p_bench_row>& rows) {
  std::printf(
      "cohort bench p2p: 2 local processes, p2p_channel (ZeroMQ PUSH/PULL%s) over TCP 127.0.0.1; "
      "ping-pong: median of round trip/2; stream: time per message of %s back-to-back "
      "messages, median of %d rounds; GB/s = bytes/time one way; allreduce: Gloo ring, 2 "
      "ranks, same bytes, busbw = algbw*2(n-1)/n (nccl-tests); ratio = p2p GB/s / allreduce "
      "busbw\n",
      security_label(o).c_str(), o.iters > 0 ? std::to_string(o.iters).c_str() : "iters", o.rounds);
  std::printf("%10s %6s | %9s %7s | %9s %7s | %9s %7s | %9s %9s\n", "size", "iters", "pp us",
              "pp GB/s", "stream us", "GB/s", "allred us", "busbw", "pp/busbw", "strm/busbw");
  for (const auto& r : rows) {
    std::printf("%10s %6d | %9.1f %7.3f | %9.1f %7.3f | %9.1f %7.3f | %9.3f %9.3f\n",
                human_bytes(r.bytes).c_str(), r.iters, r.pingpong_s * 1e6,
                comm::algbw_gbps(r.bytes, r.pingpong_s), r.stream_s * 1e6,
                comm::algbw_gbps(r.bytes, r.stream_s), r.allreduce_s * 1e6,
                comm::busbw_gbps(r.bytes, r.allreduce_s, 2),
                ratio(r.bytes, r.pingpong_s, r.allreduce_s),
                ratio(r.bytes, r.stream_s, r.allreduce_s));
  }
}

nlohmann::json to_report(const comm::p2p_bench_options& o,
                         const std::vector<comm::p2p_bench_row>& rows) {
  nlohmann::json j{
      {"bench", "p2p"},
      {"ranks", 2},
      {"transport", "zmq push/pull tcp 127.0.0.1" + security_label(o)},
      {"security", o.keys_dir.empty() ? "none" : comm::to_string(o.security)},
      {"rounds", o.rounds},
      {"throughput", "bytes / time, one way (algbw)"},
      {"allreduce", o.allreduce ? "gloo ring, 2 ranks, busbw = algbw*2(n-1)/n" : "not measured"},
      {"rows", nlohmann::json::array()}};
  for (const auto& r : rows) {
    nlohmann::json row{
        {"bytes", r.bytes},
        {"iters", r.iters},
        {"pingpong",
         {{"time_us", r.pingpong_s * 1e6}, {"gbps", comm::algbw_gbps(r.bytes, r.pingpong_s)}}},
        {"stream",
         {{"time_us", r.stream_s * 1e6}, {"gbps", comm::algbw_gbps(r.bytes, r.stream_s)}}}};
    if (o.allreduce) {
      row["allreduce"] = {{"time_us", r.allreduce_s * 1e6},
                          {"algbw_gbps", comm::algbw_gbps(r.bytes, r.allreduce_s)},
                          {"busbw_gbps", comm::busbw_gbps(r.bytes, r.allreduce_s, 2)}};
      row["ratio_pingpong_busbw"] = ratio(r.bytes, r.pingpong_s, r.allreduce_s);
      row["ratio_stream_busbw"] = ratio(r.bytes, r.stream_s, r.allreduce_s);
    }
    j["rows"].push_back(row);
  }
  return j;
}

}  // namespace

void add_bench_p2p(CLI::App& bench, int* rc) {
  auto opts = std::make_shared<comm::p2p_bench_options>();
  auto sizes = std::make_shared<std::vector<std::size_t>>();
  auto json_path = std::make_shared<std::string>();
  auto no_allreduce = std::make_shared<bool>(false);
  CLI::App* cmd = bench.add_subcommand(
      "p2p",
      "Point-to-point activation channel (ZeroMQ) between 2 local processes: ping-pong and "
      "streaming throughput, next to Gloo allreduce busbw of the same sizes in the same run");
  cmd->add_option("--sizes", *sizes,
                  "message sizes, comma separated (4096, 64KiB, 1MiB); default "
                  "256KiB,1MiB,4MiB,16MiB")
      ->delimiter(',')
      ->transform(CLI::AsSizeValue(false));
  cmd->add_option("--iters", opts->iters,
                  "timed round trips and streamed messages per round and size; 0: by size "
                  "(16..300)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--rounds", opts->rounds, "streaming rounds per size (the median counts)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--warmup", opts->warmup, "untimed round trips per size")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--timeout-ms", opts->timeout_ms, "send/recv and rendezvous timeout")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--json", *json_path, "also write the results as one JSON object to FILE");
  cmd->add_flag("--no-allreduce", *no_allreduce, "skip the Gloo allreduce comparison");
  auto security = std::make_shared<std::string>("none");
  cmd->add_option("--security", *security,
                  "none: plain ZeroMQ (cohort launch --insecure); authenticate: each "
                  "connection proves the job's worker key once (comm.p2p_security's default); "
                  "encrypt: CurveZMQ on every frame (compare each stream/busbw ratio with none's)")
      ->check(CLI::IsMember({"none", "authenticate", "encrypt"}))
      ->capture_default_str();

  cmd->callback([opts, sizes, json_path, no_allreduce, security, rc] {
    opts->sizes = *sizes;
    if (opts->sizes.empty()) opts->sizes = comm::default_p2p_bench_sizes();
    for (std::size_t s : opts->sizes)
      if (s < 4) throw usage_error("--sizes: each size must be at least 4 bytes");
    opts->allreduce = !*no_allreduce;

    const scratch_dir scratch("bench-p2p");
    const std::string& dir = scratch.path();
    std::filesystem::create_directory(dir + "/kv");
    std::filesystem::create_directory(dir + "/raw");
    if (*security != "none") {
      net::write_job_keys(dir + "/keys");
      opts->keys_dir = dir + "/keys";
      opts->security = comm::parse_p2p_security(*security);
    }

    run_two_ranks([&](int rank) {
      const auto rows = comm::run_p2p_bench_rank(*opts, rank, dir);
      if (rank == 0) write_file_atomic(dir + "/result.json", rows_to_json(rows).dump());
    });

    std::ifstream in(dir + "/result.json");
    if (!in) throw error("bench p2p: rank 0 wrote no result");
    const auto rows = rows_from_json(nlohmann::json::parse(in));
    print_table(*opts, rows);
    if (!json_path->empty()) write_file_atomic(*json_path, to_report(*opts, rows).dump(2) + "\n");
    *rc = exit_ok;
  });
}

}  // namespace cohort::cli
