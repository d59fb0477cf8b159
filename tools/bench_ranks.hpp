// The rank processes of `cohort bench allreduce` and `cohort bench alltoall`: this binary
// started again per rank in a hidden child mode (the same subcommand path), waited for, the
// rest killed on the first failure; and the size words of their --sizes.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace cohort::cli {

/// "4096", "4K", "1M", "64MiB" -> bytes (K/M/G are powers of 1024); usage_error otherwise.
std::size_t parse_size(const std::string& text);

/// The subcommand names from the root to CMD ("bench", "allreduce").
std::vector<std::string> command_path(const CLI::App* cmd);

/// Starts one process per ARGVS entry (/proc/self/exe), waits for all; on the first failure
/// kills the rest and throws cohort::error naming the rank.
void run_ranks(const std::vector<std::vector<std::string>>& argvs);

}  // namespace cohort::cli
