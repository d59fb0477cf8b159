// `cohort bench control [--iters N] [--json]`: control-plane round-trip latency. Measures, in
// one run and with the same frame, (1) a raw ZeroMQ REQ/REP pair over tcp loopback between
// two processes, (2) ping/pong between the coordinator actor (in this process) and a
// `cohort worker` process, through both bridges and both actor mailboxes, and (3) the same
// with CURVE on both bridges (the job's keys, as `cohort launch` runs by default).
#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "actors/coordinator.hpp"
#include "runtime/core/process.hpp"
#include "runtime/core/config.hpp"
#include "runtime/core/error.hpp"
#include "runtime/net/codec.hpp"
#include "runtime/net/curve.hpp"
#include "tools/bench_agents.hpp"
#include "tools/bench_util.hpp"
#include "tools/commands.hpp"

namespace cohort::cli {
namespace {

using std::chrono::milliseconds;

// REP echo server in a forked child. Runs before this process has any thread, so a plain
// fork (no exec) is safe; the child talks to the parent only through the pipe and ZeroMQ.
pid_t start_echo_server(std::string* endpoint) {
  int fds[2];
  if (pipe(fds) != 0) throw error("bench control: pipe failed");
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) throw error("bench control: fork failed");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    close(fds[0]);
    zmq::context_t ctx(1);
    zmq::socket_t rep(ctx, zmq::socket_type::rep);
    rep.bind("tcp://127.0.0.1:0");
    const std::string ep = rep.get(zmq::sockopt::last_endpoint) + "\n";
    if (write(fds[1], ep.data(), ep.size()) != static_cast<ssize_t>(ep.size())) _exit(1);
    close(fds[1]);
    while (true) {
      zmq::message_t m;
      if (!rep.recv(m)) break;
      const bool last = m.size() == 0;
      rep.send(m, zmq::send_flags::none);
      if (last) break;
    }
    rep.close();
    ctx.close();
    _exit(0);
  }
  close(fds[1]);
  std::string line;
  char c;
  while (read(fds[0], &c, 1) == 1 && c != '\n') line.push_back(c);
  close(fds[0]);
  if (line.empty()) throw error("bench control: the REP echo process did not start");
  *endpoint = line;
  return pid;
}

// Waits up to 5 s for PID to exit on its own (it was told to stop), then kills it.
void reap(pid_t pid) {
  for (int i = 0; i < 50; ++i) {
    if (waitpid(pid, nullptr, WNOHANG) == pid) return;
    std::this_thread::sleep_for(milliseconds(100));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
}

// One coordinator actor in this process and one `cohort worker` process it ping/pongs; with
// KEYS_DIR both speak CURVE with the job's keys there.
class actor_path {
 public:
  actor_path(const std::string& name, const std::string& keys_dir) : name_(name) {
    const config c = load_config_text("{}", "<bench control>", {});
    std::shared_ptr<const net::server_keys> keys;
    if (!keys_dir.empty())
      keys = std::make_shared<const net::server_keys>(net::load_server_keys(keys_dir));
    node_ = std::make_unique<actors::coordinator_node>(
        actors::coordinator_options_from(c), "tcp://127.0.0.1:0",
        static_cast<size_t>(c.control.max_message_bytes), keys);
    std::vector<std::string> args{"worker", "--join", node_->endpoint(), "--name", name};
    if (!keys_dir.empty()) args.insert(args.end(), {"--keys", keys_dir});
    // The worker's own chatter (registration line, logs) must not mix into our output.
    const int devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
    pid_ = proc::spawn_self(args, devnull, devnull);
    if (devnull >= 0) close(devnull);
    self_ = std::make_unique<caf::scoped_actor>(node_->system());
    bool registered = false;
    for (int i = 0; i < 500 && !registered; ++i) {
      (*self_)
          ->request(node_->actor(), caf::infinite, actors::co_status_atom::value)
          .receive(
              [&](const net::status_reply& st) {
                for (const auto& w : st.workers) registered |= w.member.name == name;
              },
              [&](const caf::error&) {});
      if (!registered) std::this_thread::sleep_for(milliseconds(20));
    }
    if (!registered) {
      finish();
      throw error("bench control: the worker process '" + name + "' did not register within 10 s");
    }
  }
  ~actor_path() { finish(); }

  /// N ping/pong round trips; false if the coordinator could not run them.
  bool round_trips(int n, std::vector<uint64_t>* out) {
    if (n <= 0) return true;
    bool ok = true;
    (*self_)
        ->request(node_->actor(), caf::infinite, actors::co_bench_atom::value, name_,
                  static_cast<uint32_t>(n))
        .receive(
            [&](const actors::bench_result& r) {
              if (out != nullptr) out->insert(out->end(), r.rtt_ns.begin(), r.rtt_ns.end());
            },
            [&](const caf::error&) { ok = false; });
    return ok;
  }

 private:
  void finish() {
    if (!node_) return;
    self_.reset();
    node_->request_stop("bench done");
    node_->wait();
    reap(pid_);
    node_.reset();
  }

  std::string name_;
  std::unique_ptr<actors::coordinator_node> node_;
  std::unique_ptr<caf::scoped_actor> self_;
  pid_t pid_ = -1;
};

// The three paths, measured in alternating blocks so that load from elsewhere on the machine
// (other builds, other tests) hits all alike instead of whichever ran last.
struct paths {
  std::vector<uint64_t> raw, actors, curve;
};

paths run_paths(int warmup, int iters, int blocks, const std::string& frame) {
  // The echo process first: it is forked without exec, safe only while we have no threads.
  std::string echo_ep;
  const pid_t echo_pid = start_echo_server(&echo_ep);
  struct echo_guard {
    pid_t pid;
    ~echo_guard() {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  } echo{echo_pid};

  zmq::context_t ctx(1);
  zmq::socket_t req(ctx, zmq::socket_type::req);
  req.set(zmq::sockopt::linger, 0);
  req.connect(echo_ep);
  auto raw_round_trips = [&](int n, std::vector<uint64_t>* out) {
    for (int i = 0; i < n; ++i) {
      const uint64_t t0 = net::now_ns();
      req.send(zmq::buffer(frame), zmq::send_flags::none);
      zmq::message_t reply;
      if (!req.recv(reply) || reply.size() != frame.size()) {
        throw error("bench control: REQ/REP echo returned a wrong reply");
      }
      if (out != nullptr) out->push_back(net::now_ns() - t0);
    }
  };

  proc::log_to_stderr();
  spdlog::set_level(spdlog::level::warn);
  // The job's keys for the CURVE path, in a private folder removed at the end.
  char templ[] = "/tmp/cohort-bench-keys-XXXXXX";
  if (::mkdtemp(templ) == nullptr) throw error("bench control: cannot make a key folder");
  struct dir_guard {
    std::string path;
    ~dir_guard() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  } keys{templ};
  net::write_job_keys(keys.path);
  actor_path plain("bench-worker", "");
  actor_path curve("bench-curve", keys.path);

  paths out;
  bool ok = true;
  raw_round_trips(warmup, nullptr);
  ok &= plain.round_trips(warmup, nullptr);
  ok &= curve.round_trips(warmup, nullptr);
  for (int b = 0; b < blocks && ok; ++b) {
    const int n = iters / blocks + (b < iters % blocks ? 1 : 0);
    raw_round_trips(n, &out.raw);
    ok &= plain.round_trips(n, &out.actors);
    ok &= curve.round_trips(n, &out.curve);
  }
  if (!ok || out.actors.size() != static_cast<size_t>(iters) ||
      out.curve.size() != static_cast<size_t>(iters)) {
    throw error("bench control: ping/pong with a worker failed");
  }
  return out;
}

}  // namespace

void add_bench_control(CLI::App& bench, int* rc) {
  struct options {
    int iters = 2000;
    int warmup = 200;
    int blocks = 20;
    bool json = false;
    agents_options agents{};
    bool insecure = false;
    int kills = 0;
  };
  auto opt = std::make_shared<options>();
  CLI::App* cmd = bench.add_subcommand(
      "control",
      "Control-plane round trips: coordinator actor <-> worker process (ping/pong through both "
      "ZeroMQ bridges and actor mailboxes), plain and with CURVE (the job's keys), against a "
      "raw ZeroMQ REQ/REP pair over tcp loopback, same frame size, same run. Prints p50/p99 "
      "of each and the ratios. With --agents N: N simulated workers against a control-only "
      "coordinator (forming, steady state, a stop of a few), docs/benchmarks.md.");
  cmd->add_option("--iters", opt->iters, "Measured round trips per path")
      ->check(CLI::Range(1, 10000000))
      ->capture_default_str();
  cmd->add_option("--warmup", opt->warmup, "Unmeasured round trips first")
      ->check(CLI::Range(0, 10000000))
      ->capture_default_str();
  cmd->add_option("--blocks", opt->blocks,
                  "The two paths alternate in this many blocks, so machine load hits both alike")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  cmd->add_flag("--json", opt->json, "Print one JSON object instead of the table");
  cmd->add_option("--agents", opt->agents.agents,
                  "Instead: N simulated workers (one ZeroMQ connection each, the real protocol) "
                  "against a `cohort coordinator --control-only` child")
      ->check(CLI::Range(1, 65536));
  cmd->add_option("--per-host", opt->agents.per_host,
                  "With --agents: each agent is a host agent relaying K workers over its one "
                  "connection (host beats; docs/agent.md); 0: each agent is one worker")
      ->check(CLI::Range(0, 4096))
      ->capture_default_str();
  cmd->add_flag("!--spread", opt->agents.aligned,
                "With --per-host: the host agents beat at phases spread evenly over the period "
                "(unsynchronised hosts); by default they beat on the wall clock's grid, as "
                "`cohort agent` does");
  cmd->add_option("--skew-ms", opt->agents.skew_ms,
                  "With --per-host (aligned): the hosts' clocks disagree by up to this much")
      ->check(CLI::Range(0.0, 10000.0))
      ->capture_default_str();
  cmd->add_option("--heartbeat-ms", opt->agents.heartbeat_ms, "With --agents: heartbeat period")
      ->check(CLI::Range(1, 60000))
      ->capture_default_str();
  cmd->add_option("--timeout-ms", opt->agents.timeout_ms, "With --agents: heartbeat timeout")
      ->check(CLI::Range(1, 600000))
      ->capture_default_str();
  cmd->add_option("--join-window-ms", opt->agents.join_window_ms,
                  "With --agents: the coordinator's fault_tolerance.join_window_ms (default: the "
                  "config's)")
      ->check(CLI::Range(0, 60000));
  cmd->add_option("--ack-every", opt->agents.ack_every,
                  "With --agents: agents ask for a heartbeat answer one beat in this many "
                  "(default: as a worker with the default timeouts does; 1: every beat)")
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--steady-s", opt->agents.steady_s,
                  "With --agents: seconds of steady state measured")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  cmd->add_option("--stop-percent", opt->agents.stop_percent,
                  "With --agents: percent of the agents that stop at once (at least one)")
      ->check(CLI::Range(0.0, 50.0))
      ->capture_default_str();
  cmd->add_option("--form-limit-s", opt->agents.form_limit_s,
                  "With --agents: give up forming after this long")
      ->check(CLI::Range(1.0, 3600.0))
      ->capture_default_str();
  cmd->add_option("--coordinator-log", opt->agents.coordinator_log,
                  "With --agents: keep the coordinator's log (info level: each generation and "
                  "who joined together) in this file");
  cmd->add_option("--kills", opt->kills,
                  "Real processes: N SIGKILLs of a worker, under `cohort agent` and joined "
                  "directly, each timed until the roster no longer lists it (--per-host K "
                  "workers, default 8)")
      ->check(CLI::Range(1, 10000));
  cmd->add_flag("--insecure", opt->insecure,
                "With --agents: no keys (plain ZeroMQ); by default the agents and the "
                "coordinator speak CURVE with fresh job keys, as `cohort launch` does");
  cmd->callback([opt, rc] {
    if (opt->kills > 0) {
      if (opt->agents.agents > 0) throw usage_error("--kills and --agents are two benchmarks: one at a time");
      opt->agents.secure = !opt->insecure;
      if (opt->agents.per_host == 0) opt->agents.per_host = 8;
      const nlohmann::json r = run_kills_bench(opt->agents, opt->kills);
      if (opt->json)
        std::cout << r.dump() << std::endl;
      else
        print_kills_table(r);
      *rc = exit_ok;
      for (const auto& x : r["runs"])
        if (x["missed"].get<int>() > 0) *rc = exit_runtime;
      return;
    }
    if (opt->agents.agents > 0 || opt->insecure) {
      if (opt->agents.agents <= 0) throw usage_error("--insecure goes with --agents N or --kills N");
      opt->agents.secure = !opt->insecure;
      const nlohmann::json r = run_agents_bench(opt->agents);
      if (opt->json)
        std::cout << r.dump() << std::endl;
      else
        print_agents_table(r);
      *rc = r["form"]["formed"].get<bool>() ? exit_ok : exit_runtime;
      return;
    }
    const std::string frame = net::encode(net::ping{1, 1});
    const paths m = run_paths(opt->warmup, opt->iters, opt->blocks, frame);
    const summary raw = summarize(m.raw);
    const summary act = summarize(m.actors);
    const summary cur = summarize(m.curve);
    const double ratio = raw.p50_us > 0 ? act.p50_us / raw.p50_us : 0;
    const double curve_ratio = act.p50_us > 0 ? cur.p50_us / act.p50_us : 0;
    if (opt->json) {
      auto js = [](const summary& s) {
        return nlohmann::json{{"p50_us", s.p50_us},
                              {"p99_us", s.p99_us},
                              {"mean_us", s.mean_us},
                              {"min_us", s.min_us}};
      };
      const nlohmann::json out{
          {"iters", opt->iters},         {"warmup", opt->warmup}, {"blocks", opt->blocks},
          {"frame_bytes", frame.size()}, {"raw_zmq", js(raw)},    {"actors", js(act)},
          {"actors_curve", js(cur)},     {"ratio_p50", ratio},    {"curve_ratio_p50", curve_ratio}};
      std::cout << out.dump() << std::endl;
    } else {
      std::printf(
          "control-plane round trips: %d measured (+%d warm-up) per path in %d alternating "
          "blocks, %zu-byte frames, 2 processes, tcp loopback\n",
          opt->iters, opt->warmup, opt->blocks, frame.size());
      std::printf("  %-34s p50 %8.1f us   p99 %8.1f us   mean %8.1f us\n", "raw ZeroMQ REQ/REP",
                  raw.p50_us, raw.p99_us, raw.mean_us);
      std::printf("  %-34s p50 %8.1f us   p99 %8.1f us   mean %8.1f us\n",
                  "actors + bridges (ping/pong)", act.p50_us, act.p99_us, act.mean_us);
      std::printf("  %-34s p50 %8.1f us   p99 %8.1f us   mean %8.1f us\n",
                  "actors + bridges, CURVE", cur.p50_us, cur.p99_us, cur.mean_us);
      std::printf("  ratio actors / raw at p50: %.2fx (goal: within 2x)\n", ratio);
      std::printf("  ratio CURVE / plain actors at p50: %.2fx (goal: at most 1.3x)\n", curve_ratio);
    }
    *rc = exit_ok;
  });
}

}  // namespace cohort::cli
