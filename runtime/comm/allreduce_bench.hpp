// The measuring half of `cohort bench allreduce`: what one rank does (rendezvous, warm-up,
// timed rounds of cohort's allreduce path, the bucket engine and raw Gloo, interleaved)
// and the nccl-tests bandwidth formulas. Spawning the rank processes and printing is
// tools/cmd_bench_allreduce.cpp.
#pragma once
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/compress.hpp"
#include "runtime/core/comm_choices.hpp"

namespace gloo::rendezvous {
class Context;
}

namespace cohort::comm {

class communicator;
class kv_client;

/// A bench's `--transport` word as the factory's two choices: gloo | shm | auto (transport
/// and hierarchy automatic) | hierarchical (transport automatic, hierarchy hierarchical).
struct bench_transport {
  comm_transport kind = comm_transport::gloo;
  comm_hierarchy hierarchy = comm_hierarchy::automatic;
  /// Every word, for the command line's check.
  static std::vector<std::string> words();
  /// The choices `word` names; usage_error for anything else.
  static bench_transport parse(const std::string& word);
  /// The word that names these choices (for output and the child processes' arguments).
  std::string word() const;
};

struct allreduce_bench_options {
  int ranks = 2;
  /// Message sizes in bytes (float32 elements: each is rounded down to a multiple of 4).
  std::vector<std::size_t> sizes;
  /// Timed allreduces per round and path; 0: chosen per size (more for small messages).
  int iters = 0;
  int rounds = 3;          ///< rounds per size; each round times every path once, order rotated
  int warmup = 2;          ///< untimed allreduces per path and size
  double bucket_mb = 2.0;  ///< bucket size of the bucket-engine path (comm.bucket_mb)
  int timeout_ms = 60000;
  /// The cohort and bucket paths' transport and hierarchy (transport_options). Raw Gloo
  /// stays the reference.
  bench_transport transport;
  /// Emulated hosts (hierarchical / auto only): rank r sits on host r * hosts / ranks,
  /// named by transport_options::host_id.
  int hosts = 1;
  /// Communicators the bucket path spreads its buckets over (comm.lanes); the cohort row
  /// is one call on one communicator whatever this says.
  int lanes = 1;
  /// A fourth path, compressed_allreduce_sum on cohort's communicator in this wire format
  /// (f32: not measured; bf16 | fp16 | fp8 | sign), with error memory when asked.
  wire_format compression = wire_format::f32;
  bool error_feedback = false;
};

/// Default sizes: 1 KiB to 64 MiB in powers of 4.
std::vector<std::size_t> default_bench_sizes();

/// nccl-tests definitions: algbw = bytes / time, busbw = algbw * 2 (n - 1) / n (allreduce).
double algbw_gbps(std::size_t bytes, double seconds);
double busbw_gbps(std::size_t bytes, double seconds, int ranks);

/// Seconds per allreduce of one path at one size. Each call is timed on every rank; per
/// call the slowest rank's time counts; these are summarized over the calls.
struct path_stats {
  double median = 0;  ///< the reported time (robust to a shared machine's spikes)
  double mean = 0;
  double min = 0;
};

/// What the collective benches share (allreduce here, alltoall_bench.hpp).
/// Raw Gloo for rank RANK of N: a context of its own over a file store in DIR, TCP on
/// 127.0.0.1, connected to every peer; nothing of cohort in what it runs.
std::shared_ptr<gloo::rendezvous::Context> raw_gloo_context(int rank, int n,
                                                            const std::string& dir,
                                                            std::chrono::milliseconds timeout);
/// Per call i, the slowest of the N ranks' times MINE[i] (every rank's gathered through
/// CONTROL; every rank must call it with as many times).
std::vector<double> slowest_per_call(communicator& control, const std::vector<double>& mine, int n);
/// The bench's control group (gathering the times, the final barrier) over KV: a Gloo
/// communicator of its own, built first so that neither measured path is the process's
/// first Gloo context (A/A runs showed that one 15-20 % slower at 1-4 MiB, 4 ranks).
std::unique_ptr<communicator> bench_control_group(kv_client& kv, int rank, int n, int timeout_ms);
/// Median, mean and minimum of TIMES.
path_stats summarize(std::vector<double> times);
/// The median over i of A[i] / B[i] (calls i of two paths ran back to back).
double paired_ratio(const std::vector<double>& a, const std::vector<double>& b);

/// One size.
struct allreduce_bench_row {
  std::size_t bytes = 0;
  int iters = 0;
  path_stats cohort;   ///< communicator::allreduce_sum (make_communicator, opts.transport)
  path_stats buckets;  ///< bucket_engine: begin, mark_ready(all), wait_all
  path_stats raw;      ///< gloo::allreduce on a gloo::Context, no cohort code in the loop
  /// Median over i of raw_i / cohort_i (calls i of both paths ran back to back): the
  /// busbw ratio cohort / raw, >= 1 when cohort is at least as fast.
  double ratio_cohort_raw = 0;
  double ratio_buckets_raw = 0;  ///< the same for the bucket path
  /// With a compression: compressed_allreduce_sum of the same floats (busbw-equivalent:
  /// the fp32 figure of a sum that took this long), the paired ratio raw / compressed, and
  /// the bytes this rank handed to its transport for one compressed sum and for one fp32
  /// allreduce_sum on the same communicator, both measured (0 where the backend cannot count).
  path_stats compressed;
  double ratio_compressed_raw = 0;
  std::size_t compressed_sent = 0;
  std::size_t fp32_sent = 0;
};

/// One rank's part. `dir` is a directory shared by the ranks (it holds the file stores).
/// Returns the rows on every rank (all ranks agree on them). Throws comm_error.
std::vector<allreduce_bench_row> run_allreduce_bench_rank(const allreduce_bench_options& opts,
                                                          int rank, const std::string& dir);

}  // namespace cohort::comm
