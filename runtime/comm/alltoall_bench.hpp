// The measuring half of `cohort bench alltoall` (issue #43, the all-to-all expert parallelism
// needs): what one rank does. cohort's communicator::alltoall over the transport asked
// (shared memory, or Gloo over TCP) and raw Gloo's alltoall (gloo::alltoall on a context of
// its own, nothing of cohort in its loop) on the same buffers' sizes, called alternately,
// each call's time the slowest rank's. Spawning the ranks and printing is
// tools/cmd_bench_alltoall.cpp.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "runtime/comm/allreduce_bench.hpp"

namespace cohort::comm {

struct alltoall_bench_options {
  int ranks = 4;
  /// Bytes each rank sends each other rank (and itself): a rank's buffer is ranks times this.
  std::vector<std::size_t> sizes;
  int iters = 0;  ///< timed calls per path and size; 0: by size
  int warmup = 2;
  int timeout_ms = 60000;
  bench_transport transport;  ///< cohort's row (gloo | shm); raw Gloo is the reference
};

struct alltoall_bench_row {
  std::size_t bytes = 0;  ///< per rank pair
  int iters = 0;
  path_stats cohort, raw;
  /// Median over calls i of raw_i / cohort_i (calls back to back): > 1 when cohort is faster.
  double ratio_cohort_raw = 0;
};

/// Rank RANK's part; the rendezvous files live under DIR (kv/ and raw/, made by the caller).
/// Each path is checked once first (every block arrives where it belongs). The rows are the
/// same on every rank.
std::vector<alltoall_bench_row> run_alltoall_bench_rank(const alltoall_bench_options& opts,
                                                        int rank, const std::string& dir);

}  // namespace cohort::comm
