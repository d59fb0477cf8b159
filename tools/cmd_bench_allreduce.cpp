// `cohort bench allreduce`: spawns N local rank processes (this executable again, in a
// hidden child mode), which meet through file stores in a temp dir and time cohort's
// allreduce path, the bucket engine and raw Gloo in the same run; prints time, algbw and
// busbw (nccl-tests definitions) and the ratio to raw Gloo. The measuring is
// runtime/comm/allreduce_bench.cpp; this file parses, spawns, waits and prints.
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "runtime/comm/allreduce_bench.hpp"
#include "runtime/core/atomic_file.hpp"
#include "runtime/core/error.hpp"
#include "tools/bench_ranks.hpp"
#include "tools/bench_util.hpp"
#include "tools/commands.hpp"

namespace cohort::cli {

namespace {

nlohmann::json stats_to_json(const comm::path_stats& p) {
  return {{"median_s", p.median}, {"mean_s", p.mean}, {"min_s", p.min}};
}

comm::path_stats stats_from_json(const nlohmann::json& j) {
  comm::path_stats p;
  p.median = j.at("median_s").get<double>();
  p.mean = j.at("mean_s").get<double>();
  p.min = j.at("min_s").get<double>();
  return p;
}

// How rank 0 hands its rows to the parent process.
nlohmann::json rows_to_json(const std::vector<comm::allreduce_bench_row>& rows) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& r : rows)
    j.push_back({{"bytes", r.bytes},
                 {"iters", r.iters},
                 {"cohort", stats_to_json(r.cohort)},
                 {"buckets", stats_to_json(r.buckets)},
                 {"raw", stats_to_json(r.raw)},
                 {"ratio_cohort_raw", r.ratio_cohort_raw},
                 {"ratio_buckets_raw", r.ratio_buckets_raw},
                 {"compressed", stats_to_json(r.compressed)},
                 {"ratio_compressed_raw", r.ratio_compressed_raw},
                 {"compressed_sent", r.compressed_sent},
                 {"fp32_sent", r.fp32_sent}});
  return j;
}

void print_table(const comm::allreduce_bench_options& o,
                 const std::vector<comm::allreduce_bench_row>& rows) {
  std::printf(
      "cohort bench allreduce: %d ranks (local processes) on %d host(s), cohort over %s, raw = "
      "Gloo ring "
      "allreduce over TCP 127.0.0.1, float32 sum, bucket %.3g MiB x %d lane(s); time = median "
      "over calls "
      "(cohort and raw interleaved "
      "call by call) of the slowest rank's time; GB/s: algbw = bytes/time, busbw = "
      "algbw*2(n-1)/n; x/raw = median over calls of raw_i/x_i (the busbw ratio)\n",
      o.ranks, o.hosts, o.transport.word().c_str(), o.bucket_mb, o.lanes);
  std::printf("%10s %6s | %10s %7s %7s | %10s %7s | %10s %7s %7s | %10s %11s\n", "size", "iters",
              "cohort us", "algbw", "busbw", "bucket us", "busbw", "raw us", "algbw", "busbw",
              "cohort/raw", "buckets/raw");
  for (const auto& r : rows) {
    const double c = r.cohort.median, b = r.buckets.median, w = r.raw.median;
    std::printf(
        "%10s %6d | %10.1f %7.3f %7.3f | %10.1f %7.3f | %10.1f %7.3f %7.3f | %10.3f %11.3f\n",
        human_bytes(r.bytes).c_str(), r.iters, c * 1e6, comm::algbw_gbps(r.bytes, c),
        comm::busbw_gbps(r.bytes, c, o.ranks), b * 1e6, comm::busbw_gbps(r.bytes, b, o.ranks),
        w * 1e6, comm::algbw_gbps(r.bytes, w), comm::busbw_gbps(r.bytes, w, o.ranks),
        r.ratio_cohort_raw, r.ratio_buckets_raw);
  }
  if (o.compression == comm::wire_format::f32) return;
  std::printf(
      "\ncompressed_allreduce_sum (%s%s) over the same communicator, interleaved call by call "
      "with raw Gloo; busbw-eq = the fp32 busbw of a sum that took this long; sent = bytes "
      "per rank per call handed to the transport, measured, for the compressed sum and for "
      "cohort's "
      "fp32 allreduce_sum on the same communicator\n",
      comm::name_of(o.compression), o.error_feedback ? ", error feedback" : "");
  std::printf("%10s | %10s %9s | %12s %12s %7s | %10s\n", "size", "comp us", "busbw-eq", "sent B",
              "fp32 sent B", "fewer", "raw/comp");
  for (const auto& r : rows) {
    const double c = r.compressed.median;
    std::printf("%10s | %10.1f %9.3f | %12zu %12zu %7.2f | %10.3f\n", human_bytes(r.bytes).c_str(),
                c * 1e6, comm::busbw_gbps(r.bytes, c, o.ranks), r.compressed_sent, r.fp32_sent,
                r.compressed_sent ? double(r.fp32_sent) / double(r.compressed_sent) : 0.0,
                r.ratio_compressed_raw);
  }
}

void print_json(const comm::allreduce_bench_options& o,
                const std::vector<comm::allreduce_bench_row>& rows) {
  auto path = [&](std::size_t bytes, const comm::path_stats& p) {
    return nlohmann::json{{"time_us", p.median * 1e6},
                          {"mean_us", p.mean * 1e6},
                          {"min_us", p.min * 1e6},
                          {"algbw_gbps", comm::algbw_gbps(bytes, p.median)},
                          {"busbw_gbps", comm::busbw_gbps(bytes, p.median, o.ranks)}};
  };
  nlohmann::json j{{"bench", "allreduce"},     {"ranks", o.ranks},
                   {"backend", "gloo"},        {"transport", o.transport.word()},
                   {"hosts", o.hosts},         {"lanes", o.lanes},
                   {"dtype", "float32"},       {"time", "median over calls of the slowest rank"},
                   {"bucket_mb", o.bucket_mb}, {"rows", nlohmann::json::array()}};
  for (const auto& r : rows)
    j["rows"].push_back({{"bytes", r.bytes},
                         {"iters", r.iters},
                         {"cohort", path(r.bytes, r.cohort)},
                         {"buckets", path(r.bytes, r.buckets)},
                         {"raw_gloo", path(r.bytes, r.raw)},
                         {"ratio_cohort_raw", r.ratio_cohort_raw},
                         {"ratio_buckets_raw", r.ratio_buckets_raw}});
  if (o.compression != comm::wire_format::f32) {
    j["compression"] = comm::name_of(o.compression);
    j["error_feedback"] = o.error_feedback;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const auto& r = rows[i];
      j["rows"][i]["compressed"] = path(r.bytes, r.compressed);
      j["rows"][i]["compressed"]["busbw_equivalent_gbps"] =
          j["rows"][i]["compressed"]["busbw_gbps"];
      j["rows"][i]["compressed"].erase("busbw_gbps");
      j["rows"][i]["compressed"].erase("algbw_gbps");
      j["rows"][i]["ratio_compressed_raw"] = r.ratio_compressed_raw;
      j["rows"][i]["compressed_sent_bytes"] = r.compressed_sent;
      j["rows"][i]["fp32_sent_bytes"] = r.fp32_sent;
    }
  }
  std::printf("%s\n", j.dump().c_str());
}

}  // namespace

void add_bench_allreduce(CLI::App& bench, int* rc) {
  auto opts = std::make_shared<comm::allreduce_bench_options>();
  auto sizes = std::make_shared<std::vector<std::string>>();
  auto json = std::make_shared<bool>(false);
  auto child_rank = std::make_shared<int>(-1);
  auto child_dir = std::make_shared<std::string>();
  auto transport_word = std::make_shared<std::string>("gloo");
  auto compression_word = std::make_shared<std::string>("none");
  CLI::App* cmd = bench.add_subcommand(
      "allreduce",
      "Allreduce across N local processes: cohort's communicator, its bucket engine and raw "
      "Gloo (the same ring algorithm called directly), timed in the same run");
  cmd->add_option("--ranks", opts->ranks, "local rank processes")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_option("--sizes", *sizes,
                  "message sizes, comma separated (4096, 64K, 1M, 16MiB); default 1K..64M in "
                  "powers of 4")
      ->delimiter(',');
  cmd->add_option("--iters", opts->iters,
                  "timed allreduces per path and size; 0: by size (16..300)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--warmup", opts->warmup, "untimed allreduces per path and size")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--bucket-mb", opts->bucket_mb, "bucket size of the bucket-engine path (MiB)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--timeout-ms", opts->timeout_ms, "collective and rendezvous timeout")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--transport", *transport_word,
                  "what the cohort and bucket rows use: gloo (TCP), shm (shared memory), "
                  "hierarchical (shared memory inside each host, Gloo among the hosts' "
                  "leaders), auto (as comm.transport and comm.hierarchy auto decide); the raw "
                  "row is always flat Gloo")
      ->check(CLI::IsMember(comm::bench_transport::words()))
      ->capture_default_str();
  cmd->add_option("--lanes", opts->lanes,
                  "communicators the bucket row spreads its buckets over (comm.lanes; one "
                  "over shared memory alone)")
      ->check(CLI::Range(1, 8))
      ->capture_default_str();
  cmd->add_option("--hosts", opts->hosts,
                  "emulated hosts: ranks r*H/N.. share host r (a host id each, as "
                  "comm.host_id sets); with hierarchical or auto")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_option("--compression", *compression_word,
                  "also time compressed_allreduce_sum in this wire format (comm.compression; "
                  "sign = 1-bit Adam's), paired with raw Gloo: time, busbw-equivalent, bytes "
                  "sent per rank")
      ->check(CLI::IsMember({"none", "bf16", "fp16", "fp8", "sign"}))
      ->capture_default_str();
  cmd->add_flag("--error-feedback", opts->error_feedback,
                "with --compression: keep worker and server error memory (comm.error_feedback)");
  cmd->add_flag("--json", *json, "print one JSON object instead of a table");
  // The rank processes this command starts: hidden (empty group).
  cmd->add_option("--child-rank", *child_rank)->group("");
  cmd->add_option("--child-dir", *child_dir)->group("");

  cmd->callback([cmd, opts, sizes, json, child_rank, child_dir, transport_word, compression_word,
                 rc] {
    // The words become the options' types here, once.
    opts->transport = comm::bench_transport::parse(*transport_word);
    opts->compression = comm::parse_wire_format(*compression_word);
    opts->sizes.clear();
    for (const auto& s : *sizes) opts->sizes.push_back(parse_size(s));
    if (opts->sizes.empty()) opts->sizes = comm::default_bench_sizes();
    for (std::size_t s : opts->sizes)
      if (s < sizeof(float)) throw usage_error("--sizes: each size must be at least 4 bytes");

    if (opts->hosts > opts->ranks)
      throw usage_error("--hosts " + std::to_string(opts->hosts) + " is more than --ranks " +
                        std::to_string(opts->ranks) + " (each host needs a rank)");
    if (opts->hosts > 1 && opts->transport.kind != comm_transport::automatic)
      throw usage_error(
          "--hosts needs --transport hierarchical or auto (gloo and shm do not "
          "look at hosts)");
    if (*child_rank >= 0) {  // one rank of a run started below
      const auto rows = comm::run_allreduce_bench_rank(*opts, *child_rank, *child_dir);
      if (*child_rank == 0)
        write_file_atomic(*child_dir + "/result.json", rows_to_json(rows).dump());
      *rc = exit_ok;
      return;
    }

    const scratch_dir scratch("bench-allreduce");
    const std::string& dir = scratch.path();
    std::filesystem::create_directory(dir + "/kv");
    std::filesystem::create_directory(dir + "/raw");

    std::ostringstream joined;
    for (std::size_t i = 0; i < opts->sizes.size(); ++i) joined << (i ? "," : "") << opts->sizes[i];
    std::vector<std::vector<std::string>> argvs;
    for (int r = 0; r < opts->ranks; ++r) {
      std::vector<std::string> a = {"cohort"};
      for (const auto& name : command_path(cmd)) a.push_back(name);
      for (const std::string& s : {std::string("--ranks"),       std::to_string(opts->ranks),
                                   std::string("--sizes"),       joined.str(),
                                   std::string("--iters"),       std::to_string(opts->iters),
                                   std::string("--warmup"),      std::to_string(opts->warmup),
                                   std::string("--bucket-mb"),   std::to_string(opts->bucket_mb),
                                   std::string("--timeout-ms"),  std::to_string(opts->timeout_ms),
                                   std::string("--transport"),   *transport_word,
                                   std::string("--hosts"),       std::to_string(opts->hosts),
                                   std::string("--lanes"),       std::to_string(opts->lanes),
                                   std::string("--compression"), *compression_word,
                                   std::string("--child-rank"),  std::to_string(r),
                                   std::string("--child-dir"),   dir})
        a.push_back(s);
      if (opts->error_feedback) a.push_back("--error-feedback");
      argvs.push_back(a);
    }
    run_ranks(argvs);

    std::ifstream in(dir + "/result.json");
    if (!in) throw error("bench allreduce: rank 0 wrote no result");
    const nlohmann::json j = nlohmann::json::parse(in);
    std::vector<comm::allreduce_bench_row> rows;
    for (const auto& r : j) {
      comm::allreduce_bench_row row;
      row.bytes = r.at("bytes").get<std::size_t>();
      row.iters = r.at("iters").get<int>();
      row.cohort = stats_from_json(r.at("cohort"));
      row.buckets = stats_from_json(r.at("buckets"));
      row.raw = stats_from_json(r.at("raw"));
      row.ratio_cohort_raw = r.at("ratio_cohort_raw").get<double>();
      row.ratio_buckets_raw = r.at("ratio_buckets_raw").get<double>();
      row.compressed = stats_from_json(r.at("compressed"));
      row.ratio_compressed_raw = r.at("ratio_compressed_raw").get<double>();
      row.compressed_sent = r.at("compressed_sent").get<std::size_t>();
      row.fp32_sent = r.at("fp32_sent").get<std::size_t>();
      rows.push_back(row);
    }
    if (*json)
      print_json(*opts, rows);
    else
      print_table(*opts, rows);
    *rc = exit_ok;
  });
}

}  // namespace cohort::cli
