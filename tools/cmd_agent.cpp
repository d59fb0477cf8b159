// `cohort agent --join EP --workers N`: one host's agent (docs/agent.md). Registers the host
// with the coordinator, starts and supervises the host's N workers, and is their one
// connection to the coordinator (tools/host_agent.hpp, runtime/net/host_relay.hpp): their
// heartbeats go on as one host_beat a period, a worker that exits is reported the moment it is
// reaped, one that hangs at the job's timeout. A worker that dies while the coordinator is
// there is started again under its name (--no-respawn: not). SIGINT / SIGTERM: the workers
// are sent SIGTERM (each drains: it leaves at a step boundary), and the agent exits once they
// have. Single-threaded but for the relay's thread: one poll() over a signal pipe.
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/core/config.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/process.hpp"
#include "runtime/net/curve.hpp"
#include "runtime/net/membership.hpp"
#include "tools/commands.hpp"
#include "tools/host_agent.hpp"
#include "tools/launch_respawns.hpp"

namespace cohort::cli {
namespace {

using clock_type = std::chrono::steady_clock;
using std::chrono::milliseconds;

struct agent_options {
  std::string join;
  int workers = 1;
  std::string host;         // empty: the host name
  std::string name_prefix;  // empty: HOST-
  std::string keys;
  bool insecure = false;
  bool respawn = true;
  int stop_timeout_ms = 5000;
  int coordinator_timeout_ms = 10000;
};

class host_agent {
 public:
  explicit host_agent(const agent_options& o) : opt_(o) {}

  int run() {
    signals_ = std::make_unique<proc::signal_pipe>(std::vector<int>{SIGINT, SIGTERM, SIGCHLD});
    // Under Slurm (srun) the node's name is Slurm's, which may differ from the host name.
    const char* slurm_node = std::getenv("SLURMD_NODENAME");
    const std::string name =
        host_agent_name(!opt_.host.empty() || slurm_node == nullptr ? opt_.host : slurm_node);
    prefix_ = opt_.name_prefix.empty() ? name.substr(6) + "-" : opt_.name_prefix;
    relay_ = start_host_relay(opt_.join, name, opt_.keys, config{});
    std::printf("agent: %s registered with %s; workers join %s\n", name.c_str(),
                opt_.join.c_str(), relay_->endpoint().c_str());
    for (int i = 0; i < opt_.workers; ++i) start(prefix_ + std::to_string(i), i);
    std::fflush(stdout);
    while (!children_.empty()) {
      pollfd p{signals_->fd(), POLLIN, 0};
      ::poll(&p, 1, 100);
      for (int sig : signals_->take()) {
        if (sig != SIGCHLD) begin_stop(sig == SIGINT ? "SIGINT" : "SIGTERM");
      }
      reap();
      if (stopping_ && clock_type::now() >= kill_at_) {
        for (const auto& [pid, c] : children_) ::kill(pid, SIGKILL);
        kill_at_ = clock_type::now() + milliseconds(1000);
      }
    }
    const auto c = relay_->counters();
    relay_.reset();  // its last exit notices leave within the socket's linger
    std::printf("agent: every worker has exited (%llu host beats, %llu frames up, %llu down, "
                "%llu exits and %llu hung reported)\n",
                static_cast<unsigned long long>(c.host_beats),
                static_cast<unsigned long long>(c.up), static_cast<unsigned long long>(c.down),
                static_cast<unsigned long long>(c.exits), static_cast<unsigned long long>(c.hung));
    return failed_ ? exit_runtime : exit_ok;
  }

 private:
  struct child {
    std::string name;
    int local_rank = 0;
    clock_type::time_point started{};
  };

  void start(const std::string& name, int local_rank) {
    std::vector<std::string> args = host_worker_args(*relay_, opt_.keys);
    args.insert(args.end(), {"--name", name, "--local-rank", std::to_string(local_rank),
                             "--local-size", std::to_string(opt_.workers),
                             "--coordinator-timeout-ms", std::to_string(opt_.coordinator_timeout_ms)});
    const pid_t pid = proc::spawn_self(args);
    children_[pid] = child{name, local_rank, clock_type::now()};
    std::printf("agent: started %s (pid %d)\n", name.c_str(), static_cast<int>(pid));
    std::fflush(stdout);
  }

  void reap() {
    int status = 0;
    pid_t pid;
    while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
      auto it = children_.find(pid);
      if (it == children_.end()) continue;
      const child c = it->second;
      children_.erase(it);
      const int code = proc::exit_code_of(status);
      // Faster than any timeout: the coordinator hears it now, in one message.
      relay_->report_exit(c.name, static_cast<int64_t>(pid), code);
      std::printf("agent: %s (pid %d) exited: %s\n", c.name.c_str(), static_cast<int>(pid),
                  proc::describe_exit_code(code).c_str());
      failed_ = code != 0;
      // Restarted only while the coordinator is there: a worker that gave up on a lost
      // coordinator would only give up again.
      const bool heard =
          clock_type::now() - relay_->heard() < milliseconds(opt_.coordinator_timeout_ms);
      if (opt_.respawn && !stopping_ && code != 0 && heard && respawns_.worth(c.name, c.started)) {
        std::printf("agent: restarting %s\n", c.name.c_str());
        start(c.name, c.local_rank);
      }
      std::fflush(stdout);
    }
  }

  void begin_stop(const char* why) {
    if (stopping_) return;
    stopping_ = true;
    std::printf("agent: %s: passed on to each worker (it drains, or under "
                "fault_tolerance.on_sigterm: checkpoint asks for the run's stop with a "
                "checkpoint)\n",
                why);
    std::fflush(stdout);
    for (const auto& [pid, c] : children_) ::kill(pid, SIGTERM);
    kill_at_ = clock_type::now() + milliseconds(opt_.stop_timeout_ms);
  }

  agent_options opt_;
  std::unique_ptr<proc::signal_pipe> signals_;
  std::unique_ptr<net::host_relay> relay_;
  std::map<pid_t, child> children_;
  std::string prefix_;
  respawns respawns_;
  bool stopping_ = false;
  bool failed_ = false;
  clock_type::time_point kill_at_{};
};

}  // namespace

void add_agent(CLI::App& app, int* rc) {
  auto opt = std::make_shared<agent_options>();
  CLI::App* cmd = app.add_subcommand(
      "agent",
      "One host's agent: register the host with the coordinator at --join, start and "
      "supervise --workers N local workers, and be their one connection to the coordinator "
      "(their heartbeats relayed as one per period, their exits reported at once). Exits once "
      "its workers have (0 after a clean end of the job). docs/agent.md");
  cmd->add_option("--join", opt->join, "Coordinator endpoint, e.g. tcp://10.0.0.1:5555")
      ->type_name("EP")
      ->required();
  cmd->add_option("--workers", opt->workers, "Workers to start on this host")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd->add_option("--host", opt->host,
                  "This host's name in the agent's name (agent-HOST) and its workers' (default: "
                  "Slurm's node name, SLURMD_NODENAME, under srun; else the machine's host name)")
      ->type_name("HOST");
  cmd->add_option("--name-prefix", opt->name_prefix,
                  "Workers are named PREFIX0, PREFIX1, ... (default: HOST-)")
      ->type_name("PREFIX");
  CLI::Option* keys = add_keys_option(
      *cmd, &opt->keys,
      "the job's keys: the agent speaks to the coordinator with launcher.key, its workers with "
      "worker.key to the agent");
  cmd->add_flag("--insecure", opt->insecure, "No keys (the coordinator runs without them)")
      ->excludes(keys);
  cmd->add_flag("!--no-respawn", opt->respawn,
                "Do not restart a worker that dies while the coordinator is there");
  cmd->add_option("--stop-timeout-ms", opt->stop_timeout_ms,
                  "After SIGINT / SIGTERM, workers still running this long later are killed")
      ->check(CLI::Range(100, 600 * 1000))
      ->capture_default_str();
  cmd->add_option("--coordinator-timeout-ms", opt->coordinator_timeout_ms,
                  "The workers exit 1 (and are not restarted) when the coordinator is silent "
                  "this long")
      ->check(CLI::Range(100, 3600 * 1000))
      ->capture_default_str();
  cmd->callback([opt, rc] {
    if (opt->keys.empty() && !opt->insecure)
      throw usage_error(
          "agent: --keys DIR (the job's keys, as `cohort launch --keys DIR` or `cohort keygen "
          "DIR` wrote them) or --insecure");
    if (!opt->keys.empty() && !net::has_job_keys(opt->keys))
      throw usage_error("agent: --keys " + opt->keys +
                        " holds no job keys (coordinator.pub); write them with `cohort keygen " +
                        opt->keys + "` and start the coordinator with the same --keys");
    if (!opt->name_prefix.empty()) {
      if (const std::string p = net::membership::name_problem(opt->name_prefix + "0"); !p.empty())
        throw usage_error("--name-prefix: " + p);
    }
    proc::log_to_stderr();
    host_agent a(*opt);
    *rc = a.run();
  });
}

}  // namespace cohort::cli
