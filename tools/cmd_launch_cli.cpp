// `cohort launch`'s command line: its options, the checks made before any process starts,
// then the launcher (tools/cmd_launch.cpp, run_launch).
#include <cstdio>
#include <memory>
#include <vector>

#include "runtime/comm/shm_names.hpp"
#include "runtime/core/config.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/faults.hpp"
#include "runtime/core/process.hpp"
#include "runtime/step/fault_schedule.hpp"
#include "tools/commands.hpp"
#include "tools/launch_cpu_limits.hpp"
#include "tools/launch_options.hpp"

namespace cohort::cli {

void add_launch(CLI::App& app, int* rc) {
  auto opt = std::make_shared<launch_options>();
  CLI::App* cmd = app.add_subcommand(
      "launch",
      "Train on one machine: start a coordinator and cluster.workers local worker processes, "
      "run the config's job on them (data parallel: each worker computes its share of every "
      "global batch; gradients are summed over shared memory within a host and Gloo between "
      "hosts), show progress, evaluate at the end and "
      "exit. Tells the coordinator at once when a worker exits; stops everything on Ctrl-C / "
      "SIGTERM (no child is left behind).");
  cmd->add_option("config", opt->config_path, "YAML config")->type_name("CFG")->required();
  add_set_option(*cmd, &opt->overrides);
  cmd->add_option("--bind", opt->bind, "Coordinator endpoint to bind (default: control.bind)")
      ->type_name("EP");
  cmd->add_option("--summary", opt->summary,
                  "Write the run's JSON summary to PATH (cohort train's keys plus, per worker, "
                  "compute / communication wait / idle time, bytes and overlap)")
      ->type_name("PATH");
  add_observe_options(*cmd, &opt->trace, &opt->metrics);
  cmd->add_flag("--control-only", opt->control_only,
                "Start the cluster without a training job (control plane only) and run until "
                "stopped");
  cmd->add_flag("-q,--quiet", opt->quiet, "no progress lines");
  cmd->add_flag("!--no-respawn", opt->respawn,
                "Do not restart a local worker that dies during training (elastic.respawn: "
                "true, the default, restarts it; it rejoins and takes its state from a live "
                "peer)");
  cmd->add_flag("--resume", opt->resume,
                "Continue from the newest checkpoint in fault_tolerance.checkpoint_dir, with any "
                "worker count; only one this run wrote (same model, data and seed)");
  cmd->add_option("--resume-from", opt->resume_from,
                  "Continue from the checkpoint PATH (a step folder, or the newest of a "
                  "checkpoint folder), even one another run wrote; the folder must be yours")
      ->type_name("PATH")
      ->excludes("--resume");
  cmd->add_option("--inject", opt->inject,
                  "Inject a fault, e.g. 'kill rank=1 at step=30' or 'hang rank=0 at step=10 "
                  "for=2s' (repeatable; docs/faults.md)")
      ->type_name("SPEC");
  cmd->add_option("--stop-timeout-ms", opt->stop_timeout_ms,
                  "After a stop, children still running this long later are killed")
      ->check(CLI::Range(100, 600 * 1000))
      ->capture_default_str();
  CLI::Option* keys =
      add_keys_option(*cmd, &opt->keys,
                      "the job's keys (written there when DIR holds none), so that workers started "
                      "elsewhere can join with the same DIR. Without it, launch writes fresh keys "
                      "into a private folder it removes at exit");
  cmd->add_flag("--insecure", opt->insecure,
                "No keys: the control plane and p2p channels speak plain ZeroMQ; anyone who "
                "reaches the coordinator can join, steer or read the run (docs/security.md)")
      ->excludes(keys);
  add_cpu_limit_option(*cmd, &opt->cpu_limits);
  cmd->add_flag("!--no-agent", opt->agent,
                "The workers connect to the coordinator each on its own, as `cohort worker "
                "--join` from a shell does; by default they reach it through launch's host "
                "agent (docs/agent.md), as under `cohort agent`. Runs with coordinator "
                "standbys (ha) always connect directly");
  cmd->callback([opt, rc] {
    const config c = load_config(opt->config_path, opt->overrides);
    // Bad or unsupported specs stop here, before any process starts (exit 2).
    const std::vector<faults::fault_spec> specs = job_faults(c, opt->inject);
    if (!opt->control_only) step::require_supported(specs, c.ha.standbys);
    opt->respawn = opt->respawn && c.elastic.respawn;
    proc::log_to_stderr();
    // A launch killed outright during a shared-memory rendezvous cannot unlink its segment;
    // the next one on this host removes it (its maker's pid is in the name: shm_names.hpp).
    const auto stale = comm::remove_stale_shm_segments();
    if (!stale.empty())
      std::fprintf(stderr,
                   "launch: removed %zu shared-memory segment(s) of processes that are "
                   "gone (/dev/shm/%s%s)\n",
                   stale.size(), stale.front().c_str(), stale.size() > 1 ? ", ..." : "");
    *rc = run_launch(*opt, c);
  });
}


}  // namespace cohort::cli
