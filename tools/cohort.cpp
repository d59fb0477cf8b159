// The only main of cohort: builds the CLI11 app from the subcommands in tools/cmd_*.cpp,
// runs the chosen one and maps failures to the documented exit codes
// (0 success, 1 runtime failure, 2 usage or config error).
#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <exception>

#include "runtime/core/error.hpp"
#include "tools/commands.hpp"

int main(int argc, char** argv) {
  CLI::App app{
      "cohort: train neural networks across worker processes (data, pipeline and tensor "
      "parallelism) and keep training while workers join, leave or die.\n"
      "Exit codes: 0 success, 1 runtime failure, 2 usage or config error."};
  // A peer that dies mid-write must be an error value (EPIPE), never a killed survivor.
  std::signal(SIGPIPE, SIG_IGN);
  app.require_subcommand(1);
  app.set_version_flag("--version", "cohort 0.1.0");
  int rc = cohort::exit_ok;
  cohort::cli::add_validate(app, &rc);
  cohort::cli::add_train(app, &rc);
  cohort::cli::add_coordinator(app, &rc);
  cohort::cli::add_worker(app, &rc);
  cohort::cli::add_ctl(app, &rc);
  cohort::cli::add_launch(app, &rc);
  cohort::cli::add_agent(app, &rc);
  cohort::cli::add_keygen(app, &rc);
  cohort::cli::add_plot(app, &rc);
  cohort::cli::add_generate(app, &rc);
  cohort::cli::add_serve(app, &rc);
  auto* bench =
      app.add_subcommand("bench", "Benchmarks, each against a reference measured in the same run");
  bench->require_subcommand(1);
  cohort::cli::add_bench_control(*bench, &rc);
  cohort::cli::add_bench_train(*bench, &rc);
  cohort::cli::add_bench_allreduce(*bench, &rc);
  cohort::cli::add_bench_alltoall(*bench, &rc);
  cohort::cli::add_bench_p2p(*bench, &rc);
  cohort::cli::add_bench_dp(*bench, &rc);
  cohort::cli::add_bench_trace(*bench, &rc);
  cohort::cli::add_bench_faults(*bench, &rc);
  cohort::cli::add_bench_serve(*bench, &rc);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);  // prints the message and the usage hint
    return cohort::exit_usage;
  } catch (const cohort::error& e) {
    std::fprintf(stderr, "cohort: error: %s\n", e.what());
    return e.exit_status();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cohort: internal error: %s\n", e.what());
    return cohort::exit_runtime;
  }
  return rc;
}
