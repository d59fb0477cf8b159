// `cohort worker --join EP [--name NAME]`: one worker process. Registers with the
// coordinator at EP, heartbeats from its own thread, rejoins as a new member when declared
// dead, exits 0 on `stop` or SIGINT/SIGTERM (after telling the coordinator it leaves).
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "actors/worker.hpp"
#include "runtime/core/config.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/cpu_limit.hpp"
#include "runtime/core/process.hpp"
#include "runtime/net/membership.hpp"
#include "tools/commands.hpp"

namespace cohort::cli {

void add_worker(CLI::App& app, int* rc) {
  struct options {
    std::vector<std::string> join;
    std::string name;
    int coordinator_timeout_ms = 10000;
    int64_t max_message_bytes = control_config{}.max_message_bytes;
    std::string keys;
    int reattach_ms = 30000;
    int local_rank = -1;
    int local_size = 0;
    bool name_from_stdin = false;
    double cpu_limit = 0;  // cores; 0: none
    std::string agent_key;  // Z85: the host agent's local socket key
    std::string route_to;   // the data plane's route (default: --join)
  };
  auto opt = std::make_shared<options>();
  CLI::App* cmd = app.add_subcommand(
      "worker",
      "Run one worker: join the coordinator at --join, heartbeat, rejoin after being declared "
      "dead, exit 0 on `cohort ctl stop` or SIGINT/SIGTERM, 1 when the coordinator is gone.");
  cmd->add_option("--join", opt->join,
                  "Coordinator endpoint, e.g. tcp://127.0.0.1:5555; with coordinator standbys "
                  "(ha) every candidate's, comma-separated: the worker finds the leader and "
                  "re-attaches to the next one when it is lost")
      ->type_name("EP")
      ->delimiter(',')
      ->required();
  cmd->add_option("--name", opt->name,
                  "Worker name, unique among live workers (default: the coordinator picks "
                  "worker-<id>)")
      ->type_name("NAME");
  cmd->add_option("--coordinator-timeout-ms", opt->coordinator_timeout_ms,
                  "Exit 1 when the coordinator answers neither registration nor heartbeats "
                  "for this long")
      ->check(CLI::Range(100, 3600 * 1000))
      ->capture_default_str();
  cmd->add_option("--reattach-ms", opt->reattach_ms,
                  "With several --join endpoints: how long a worker that lost the leader looks "
                  "for the next one before it exits 1 (ha.reattach_ms)")
      ->check(CLI::Range(100, 3600 * 1000))
      ->capture_default_str();
  cmd->add_option("--max-message-bytes", opt->max_message_bytes,
                  "Larger inbound frames are dropped and counted (control.max_message_bytes)")
      ->check(CLI::Range(int64_t{64}, int64_t{1} << 40))
      ->capture_default_str();
  cmd->add_option("--local-rank", opt->local_rank,
                  "This worker's rank among the workers of its host: train.device cuda and "
                  "auto take GPU N modulo the GPUs it sees (default: COHORT_LOCAL_RANK, "
                  "SLURM_LOCALID or LOCAL_RANK from the environment, else 0)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--local-size", opt->local_size,
                  "Workers on this host (cluster.bind splits the host's cores among them by "
                  "local rank; default: COHORT_LOCAL_SIZE, SLURM_NTASKS_PER_NODE or "
                  "LOCAL_WORLD_SIZE from the environment, else 1)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_flag("--name-from-stdin", opt->name_from_stdin,
                "Start, then wait for the first line of standard input, 'NAME [LOCAL_RANK]', "
                "before registering under that name (launch keeps one such worker ready for "
                "the next respawn); exit 0 at the end of input")
      ->excludes("--name");
  add_keys_option(*cmd, &opt->keys,
                  "the worker speaks CURVE with worker.key to a coordinator known by "
                  "coordinator.pub (needed when the coordinator was started with keys)");
  cmd->add_option("--agent-key", opt->agent_key,
                  "--join names a host agent (`cohort agent`, or launch's own): its local "
                  "socket's public key (Z85, printed by the agent and passed by it to the "
                  "workers it starts) stands in for coordinator.pub; worker.key is still this "
                  "worker's key")
      ->type_name("KEY");
  cmd->add_option("--route-to", opt->route_to,
                  "With comm.interface: auto, the data plane uses the local address of the "
                  "route to EP (default: the --join endpoint; a host agent passes the "
                  "coordinator's, since its workers join it on loopback)")
      ->type_name("EP");
  cmd->add_option("--cpu-limit", opt->cpu_limit,
                  "Run this worker under a CPU budget of CPUS cores (a cgroup of its own, as "
                  "docker --cpus; needs root): a slower worker, balanced by train.balance")
      ->type_name("CPUS")
      ->check(CLI::Range(proc::min_cpus, proc::max_cpus));
  cmd->callback([opt, rc] {
    if (!opt->name.empty())
      if (const std::string problem = net::membership::name_problem(opt->name); !problem.empty())
        throw usage_error("--name: " + problem);
    for (const auto& ep : opt->join)
      if (ep.empty()) throw usage_error("--join: an empty endpoint (EP[,EP...])");
    std::shared_ptr<const net::client_keys> keys;
    if (!opt->keys.empty()) {
      net::client_keys k = net::load_client_keys(opt->keys, net::key_role::worker);
      if (!opt->agent_key.empty()) {
        if (!net::valid_z85_key(opt->agent_key))
          throw usage_error("--agent-key: '" + opt->agent_key +
                            "' is not a 40-character Z85 key (the agent prints it)");
        k.server_public = opt->agent_key;
      }
      keys = std::make_shared<const net::client_keys>(std::move(k));
    } else if (!opt->agent_key.empty()) {
      throw usage_error("--agent-key goes with --keys DIR (the worker's own key)");
    }
    if (!opt->agent_key.empty() && opt->join.size() > 1)
      throw usage_error("--agent-key: a host agent is one endpoint, not a list of candidates");
    if (opt->name_from_stdin) {
      // Everything above is done ahead (a warm worker); the name is what remains.
      std::string line;
      if (!std::getline(std::cin, line)) {
        *rc = 0;  // never needed: launch ended
        return;
      }
      std::istringstream in(line);
      std::vector<std::string> words;
      for (std::string w; in >> w;) words.push_back(w);
      std::size_t used = 0;
      try {
        if (words.size() == 2) opt->local_rank = std::stoi(words[1], &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (words.empty() || words.size() > 2 ||
          (words.size() == 2 && (used != words[1].size() || opt->local_rank < 0)))
        throw usage_error("--name-from-stdin: '" + line +
                          "' is not 'NAME [LOCAL_RANK]' (LOCAL_RANK a number >= 0)");
      opt->name = words[0];
      if (const std::string problem = net::membership::name_problem(opt->name); !problem.empty())
        throw usage_error("--name-from-stdin: " + problem);
    }
    proc::block_termination_signals();
    proc::log_to_stderr();
    // Read where the trainer picks its device (runtime/nn/device.hpp, local_rank_from_env).
    if (opt->local_rank >= 0)
      ::setenv("COHORT_LOCAL_RANK", std::to_string(opt->local_rank).c_str(), 1);
    if (opt->local_size > 0)
      ::setenv("COHORT_LOCAL_SIZE", std::to_string(opt->local_size).c_str(), 1);
    const std::string limited =
        opt->cpu_limit > 0 ? proc::limit_cpu(::getpid(), opt->cpu_limit) : std::string();
    actors::worker_options wo;
    wo.name = opt->name;
    wo.pid = static_cast<int64_t>(::getpid());
    wo.coordinator_timeout_ms = opt->coordinator_timeout_ms;
    wo.candidates = opt->join;
    wo.reattach_ms = opt->reattach_ms;
    wo.keys = keys;
    wo.route_to = opt->route_to;
    actors::worker_node node(wo.candidates.front(), wo,
                             static_cast<size_t>(opt->max_message_bytes));
    proc::signal_watcher signals([&node](int) { node.request_leave(); });
    *rc = node.wait();
    if (!limited.empty()) proc::release_own_cpu_limit(limited);
  });
}

}  // namespace cohort::cli
