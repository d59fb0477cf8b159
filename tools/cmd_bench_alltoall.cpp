// `cohort bench alltoall`: N local rank processes time cohort's alltoall (shared memory or
// Gloo over TCP) against raw Gloo's alltoall in the same run (issue #43: the exchange expert
// parallelism makes every step). The measuring is runtime/comm/alltoall_bench.cpp; this file
// parses, spawns, waits and prints.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/comm/alltoall_bench.hpp"
#include "runtime/core/atomic_file.hpp"
#include "runtime/core/error.hpp"
#include "tools/bench_ranks.hpp"
#include "tools/bench_util.hpp"
#include "tools/commands.hpp"

namespace cohort::cli {

namespace {

nlohmann::json row_json(const comm::alltoall_bench_row& r) {
  auto stats = [](const comm::path_stats& p) {
    return nlohmann::json{{"median_s", p.median}, {"mean_s", p.mean}, {"min_s", p.min}};
  };
  return {{"bytes", r.bytes}, {"iters", r.iters}, {"cohort", stats(r.cohort)},
          {"raw", stats(r.raw)}, {"ratio_cohort_raw", r.ratio_cohort_raw}};
}

}  // namespace

void add_bench_alltoall(CLI::App& bench, int* rc) {
  auto opts = std::make_shared<comm::alltoall_bench_options>();
  auto sizes = std::make_shared<std::vector<std::string>>();
  auto json = std::make_shared<bool>(false);
  auto child_rank = std::make_shared<int>(-1);
  auto child_dir = std::make_shared<std::string>();
  auto transport_word = std::make_shared<std::string>("shm");
  CLI::App* cmd = bench.add_subcommand(
      "alltoall",
      "All-to-all across N local processes: cohort's communicator (shared memory or Gloo) "
      "against raw Gloo's alltoall, timed in the same run");
  cmd->add_option("--ranks", opts->ranks, "local rank processes")
      ->check(CLI::Range(2, 64))
      ->capture_default_str();
  cmd->add_option("--sizes", *sizes,
                  "bytes each rank sends each rank, comma separated (4096, 64K, 1M); default "
                  "4K,64K,1M,4M")
      ->delimiter(',');
  cmd->add_option("--iters", opts->iters, "timed calls per path and size; 0: by size")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--warmup", opts->warmup, "untimed calls per path and size")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--timeout-ms", opts->timeout_ms, "collective and rendezvous timeout")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--transport", *transport_word,
                  "cohort's row: shm (shared memory) or gloo (TCP); the raw row is always Gloo")
      ->check(CLI::IsMember({"shm", "gloo"}))
      ->capture_default_str();
  cmd->add_flag("--json", *json, "print one JSON object instead of a table");
  cmd->add_option("--child-rank", *child_rank)->group("");
  cmd->add_option("--child-dir", *child_dir)->group("");
  cmd->callback([cmd, opts, sizes, json, child_rank, child_dir, transport_word, rc] {
    opts->transport = comm::bench_transport::parse(*transport_word);
    opts->sizes.clear();
    for (const auto& s : *sizes) opts->sizes.push_back(parse_size(s));
    if (opts->sizes.empty()) opts->sizes = {4u << 10, 64u << 10, 1u << 20, 4u << 20};
    for (std::size_t s : opts->sizes)
      if (s < 1) throw usage_error("--sizes: each size must be at least 1 byte");
    if (*child_rank >= 0) {
      const auto rows = comm::run_alltoall_bench_rank(*opts, *child_rank, *child_dir);
      if (*child_rank == 0) {
        nlohmann::json j = nlohmann::json::array();
        for (const auto& r : rows) j.push_back(row_json(r));
        write_file_atomic(*child_dir + "/result.json", j.dump());
      }
      *rc = exit_ok;
      return;
    }
    const scratch_dir scratch("bench-alltoall");
    const std::string& dir = scratch.path();
    std::filesystem::create_directory(dir + "/kv");
    std::filesystem::create_directory(dir + "/raw");
    std::string joined;
    for (std::size_t i = 0; i < opts->sizes.size(); ++i)
      joined += (i ? "," : "") + std::to_string(opts->sizes[i]);
    std::vector<std::vector<std::string>> argvs;
    for (int r = 0; r < opts->ranks; ++r) {
      std::vector<std::string> a = {"cohort"};
      for (const auto& name : command_path(cmd)) a.push_back(name);
      for (const std::string& s :
           {std::string("--ranks"), std::to_string(opts->ranks), std::string("--sizes"), joined,
            std::string("--iters"), std::to_string(opts->iters), std::string("--warmup"),
            std::to_string(opts->warmup), std::string("--timeout-ms"),
            std::to_string(opts->timeout_ms), std::string("--transport"), *transport_word,
            std::string("--child-rank"), std::to_string(r), std::string("--child-dir"), dir})
        a.push_back(s);
      argvs.push_back(a);
    }
    run_ranks(argvs);
    std::ifstream in(dir + "/result.json");
    if (!in) throw error("bench alltoall: rank 0 wrote no result");
    const nlohmann::json rows = nlohmann::json::parse(in);
    if (*json) {
      std::printf("%s\n", nlohmann::json{{"bench", "alltoall"},
                                         {"ranks", opts->ranks},
                                         {"transport", *transport_word},
                                         {"rows", rows}}
                              .dump()
                              .c_str());
      *rc = exit_ok;
      return;
    }
    std::printf(
        "cohort bench alltoall: %d ranks (local processes), cohort over %s, raw = Gloo's "
        "alltoall over TCP 127.0.0.1; size = bytes each rank sends each rank; time = median over "
        "calls (cohort and raw interleaved) of the slowest rank's time; raw/cohort = median of "
        "raw_i/cohort_i\n",
        opts->ranks, transport_word->c_str());
    std::printf("%10s %7s %14s %14s %10s\n", "size", "iters", "cohort_us", "raw_gloo_us",
                "raw/cohort");
    for (const auto& r : rows)
      std::printf("%10s %7d %14.1f %14.1f %9.2fx\n",
                  human_bytes(r.at("bytes").get<std::size_t>()).c_str(), r.at("iters").get<int>(),
                  r.at("cohort").at("median_s").get<double>() * 1e6,
                  r.at("raw").at("median_s").get<double>() * 1e6,
                  r.at("ratio_cohort_raw").get<double>());
    *rc = exit_ok;
  });
}

}  // namespace cohort::cli
