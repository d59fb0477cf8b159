// `cohort coordinator [--config CFG] [--set k=v ...] [--bind EP]`: runs the coordinator
// (actor + ROUTER bridge) until `cohort ctl stop`, SIGINT or SIGTERM. The first stdout line
// is the endpoint it bound; launchers and scripts read it. Logs go to stderr.
#include <csignal>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "actors/coordinator.hpp"
#include "actors/process.hpp"
#include "runtime/core/config.hpp"
#include "tools/commands.hpp"

namespace cohort::cli {

void add_coordinator(CLI::App& app, int* rc) {
  struct options {
    std::string config_path;
    std::vector<std::string> overrides;
    std::string bind;
  };
  auto opt = std::make_shared<options>();
  CLI::App* cmd = app.add_subcommand(
      "coordinator",
      "Run the coordinator: roster, heartbeat monitor, rendezvous store, admin API. Prints "
      "'coordinator listening on ENDPOINT' as its first stdout line, then runs until "
      "`cohort ctl --coordinator ENDPOINT stop`, SIGINT or SIGTERM (all stop every worker).");
  cmd->add_option("--config", opt->config_path,
                  "YAML config (fault_tolerance.*, parallel.*, cluster.workers, control.*); "
                  "defaults when omitted")
      ->type_name("CFG");
  add_set_option(*cmd, &opt->overrides);
  cmd->add_option("--bind", opt->bind,
                  "ZeroMQ endpoint to bind (default: control.bind, tcp://127.0.0.1:0 = any "
                  "free port)")
      ->type_name("EP");
  cmd->callback([opt, rc] {
    const config c = opt->config_path.empty() ? load_config_text("{}", "<defaults>", opt->overrides)
                                              : load_config(opt->config_path, opt->overrides);
    // Before any thread exists, so only the watcher below ever sees SIGINT / SIGTERM.
    actors::block_termination_signals();
    actors::log_to_stderr();
    actors::coordinator_node node(actors::coordinator_options_from(c),
                                  opt->bind.empty() ? c.control.bind : opt->bind,
                                  static_cast<size_t>(c.control.max_message_bytes));
    std::printf("coordinator listening on %s\n", node.endpoint().c_str());
    std::fflush(stdout);
    actors::signal_watcher signals(
        [&node](int sig) { node.request_stop(sig == SIGINT ? "SIGINT" : "SIGTERM"); });
    node.wait();
    *rc = exit_ok;
  });
}

}  // namespace cohort::cli
