// Registration of the cohort subcommands: each tools/cmd_*.cpp adds one subcommand to
// the CLI11 app and runs it. tools/cohort.cpp holds the only main.
#pragma once
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "runtime/core/config.hpp"
#include "runtime/core/faults.hpp"

namespace cohort::cli {

/// Each add_* registers its subcommand; the callback stores the exit code in *rc.
void add_validate(CLI::App& app, int* rc);
void add_train(CLI::App& app, int* rc);
void add_coordinator(CLI::App& app, int* rc);
void add_worker(CLI::App& app, int* rc);
void add_ctl(CLI::App& app, int* rc);
void add_launch(CLI::App& app, int* rc);
/// `cohort agent --join EP --workers N`: one host's agent (docs/agent.md).
void add_agent(CLI::App& app, int* rc);
/// `cohort plot SUMMARY_OR_TRACE --out DIR`: PNG pictures of a run with gnuplot.
void add_plot(CLI::App& app, int* rc);
/// `cohort keygen DIR`: a job's CurveZMQ keys.
void add_keygen(CLI::App& app, int* rc);
void add_generate(CLI::App& app, int* rc);
void add_serve(CLI::App& app, int* rc);
/// `cohort bench ...`: `bench` is the parent subcommand; each adds a child.
void add_bench_control(CLI::App& bench, int* rc);
void add_bench_train(CLI::App& bench, int* rc);
/// `cohort bench allreduce`: cohort's allreduce path vs raw Gloo across N local processes.
void add_bench_allreduce(CLI::App& bench, int* rc);
void add_bench_alltoall(CLI::App& bench, int* rc);
/// `cohort bench p2p`: the pipeline point-to-point channel (ping-pong and streaming) against
/// the Gloo allreduce busbw of the same sizes, two local processes.
void add_bench_p2p(CLI::App& bench, int* rc);
void add_bench_dp(CLI::App& bench, int* rc);
/// `cohort bench trace`: nanoseconds per trace span on each leg (tools/bench_trace.sh).
void add_bench_trace(CLI::App& bench, int* rc);
/// `cohort bench faults`: ETTR of a fault schedule, fault-free and faulty launches alternating.
void add_bench_faults(CLI::App& bench, int* rc);
/// `cohort bench serve`: a served checkpoint's tokens/s one at a time and at once; hostile requests.
void add_bench_serve(CLI::App& bench, int* rc);

/// Adds the shared `--keys DIR` option (default $COHORT_KEYS); WHAT says what it is for.
CLI::Option* add_keys_option(CLI::App& cmd, std::string* dir, const std::string& what);

/// Adds `--trace FILE` and (METRICS non-null) `--metrics [HOST:]PORT` (docs/observability.md).
void add_observe_options(CLI::App& cmd, std::string* trace, std::string* metrics);

/// Adds the shared `--set dotted.key=value` option (repeatable) to a subcommand.
void add_set_option(CLI::App& cmd, std::vector<std::string>* overrides);

/// The faults a job injects: the config's `faults:` list, then every `--inject SPEC` parsed.
/// A bad spec is a usage_error (exit 2) naming its column.
std::vector<faults::fault_spec> job_faults(const config& c, const std::vector<std::string>& inject);

}  // namespace cohort::cli
