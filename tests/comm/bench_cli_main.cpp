// A stand-in for tools/cohort.cpp holding only `bench allreduce` and `bench alltoall`, so the bench's CLI (and
// the rank processes it spawns from /proc/self/exe) is tested without the whole tool.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "runtime/core/error.hpp"
#include "tools/commands.hpp"

int main(int argc, char** argv) {
  CLI::App app{"bench allreduce test driver"};
  app.require_subcommand(1);
  int rc = cohort::exit_ok;
  auto* bench = app.add_subcommand("bench", "benchmarks");
  bench->require_subcommand(1);
  cohort::cli::add_bench_allreduce(*bench, &rc);
  cohort::cli::add_bench_alltoall(*bench, &rc);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : cohort::exit_usage;
  } catch (const cohort::error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return e.exit_status();
  }
  return rc;
}
