// The measuring half of `cohort bench p2p`: what one of the two ranks does (endpoint
// exchange through a file store, ping-pong and one-way streaming through p2p_channel, then
// Gloo allreduce of the same sizes through runtime/comm/allreduce_bench for comparison).
// Starting the rank processes and printing is tools/cmd_bench_p2p.cpp.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "runtime/comm/p2p.hpp"

namespace cohort::comm {

struct p2p_bench_options {
  /// Message sizes in bytes (each is rounded down to a multiple of 4 for the allreduce).
  std::vector<std::size_t> sizes;
  /// Timed messages per size (ping-pong round trips; messages per streaming round);
  /// 0: chosen per size (16..300).
  int iters = 0;
  int rounds = 3;  ///< streaming rounds per size; the median round counts
  int warmup = 2;  ///< untimed round trips per size
  int timeout_ms = 60000;
  bool allreduce = true;  ///< also time Gloo allreduce (2 ranks) of every size
  /// Non-empty: a folder of job keys (`cohort keygen`); the channels use its worker key as
  /// `security` says, as a pipeline's do under `cohort launch`.
  std::string keys_dir;
  p2p_security security = p2p_security::authenticate;
};

/// Default sizes: 256 KiB, 1 MiB, 4 MiB, 16 MiB.
std::vector<std::size_t> default_p2p_bench_sizes();

/// One size. Times are seconds; throughput is bytes / time of one way (nccl-tests algbw).
struct p2p_bench_row {
  std::size_t bytes = 0;
  int iters = 0;
  /// Median over round trips of round trip / 2 (rank 0's clock): one message, one way,
  /// nothing else in flight.
  double pingpong_s = 0;
  /// Time per message while rank 0 streams `iters` messages back to back and rank 1
  /// receives them (until rank 1's acknowledgement is back), median over rounds.
  double stream_s = 0;
  /// Gloo allreduce (cohort's communicator path, 2 ranks) of the same bytes, median over
  /// calls of the slowest rank; 0 when not measured.
  double allreduce_s = 0;
};

/// One rank's part (rank 0 or 1). `dir` is a directory both ranks use; it must hold the
/// empty subdirectories kv/ and raw/ (the allreduce bench's stores). Returns the rows (the
/// same on both ranks for the allreduce column; the p2p times are rank 0's). Throws
/// comm_error.
std::vector<p2p_bench_row> run_p2p_bench_rank(const p2p_bench_options& opts, int rank,
                                              const std::string& dir);

}  // namespace cohort::comm
