// `cohort plot SUMMARY_OR_TRACE --out DIR [--step N]`: PNG pictures of a run, drawn with
// gnuplot. Owns only the command line; reading, extraction and drawing live in runtime/obs/plot.
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "runtime/obs/plot.hpp"
#include "tools/commands.hpp"

namespace cohort::cli {

void add_plot(CLI::App& app, int* rc) {
  struct options {
    std::string input;
    std::string out;
    int64_t step = -1;
  };
  auto opt = std::make_shared<options>();
  CLI::App* cmd = app.add_subcommand(
      "plot",
      "Draw PNG pictures of a run with gnuplot. From a summary (`cohort launch CFG --summary "
      "run.json`): loss.png, throughput.png (events as labelled lines) and step_split.png. "
      "From a trace (`--trace trace.json`): pipeline.png, one step's schedule. Each PNG's .dat "
      "and .gp files stay beside it: edit them and re-run `gnuplot NAME.gp` in DIR.");
  cmd->add_option("input", opt->input, "The run's summary or Chrome trace JSON")
      ->type_name("SUMMARY_OR_TRACE")
      ->required();
  cmd->add_option("--out", opt->out, "Folder for the pictures (created if missing)")
      ->type_name("DIR")
      ->required();
  cmd->add_option("--step", opt->step,
                  "Trace only: the step whose schedule pipeline.png draws (default: the last "
                  "step with forward spans from every stage)")
      ->type_name("N")
      ->check(CLI::NonNegativeNumber);
  cmd->callback([opt, rc] {
    const std::optional<int64_t> step =
        opt->step >= 0 ? std::optional<int64_t>(opt->step) : std::nullopt;
    const obs::plot_result r = obs::plot_file(opt->input, opt->out, step);
    for (const std::string& f : r.files) std::printf("plot: wrote %s\n", f.c_str());
    for (const std::string& n : r.notes) std::fprintf(stderr, "plot: note: %s\n", n.c_str());
    *rc = exit_ok;
  });
}

}  // namespace cohort::cli
