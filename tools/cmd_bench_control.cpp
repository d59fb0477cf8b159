// `cohort bench control [--iters N] [--json]`: control-plane round-trip latency. Measures, in
// one run and with the same frame, (1) a raw ZeroMQ REQ/REP pair over tcp loopback between
// two processes and (2) ping/pong between the coordinator actor (in this process) and a
// `cohort worker` process, through both bridges and both actor mailboxes.
#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "actors/coordinator.hpp"
#include "actors/process.hpp"
#include "runtime/core/config.hpp"
#include "runtime/core/error.hpp"
#include "runtime/net/codec.hpp"
#include "tools/commands.hpp"

namespace cohort::cli {
namespace {

using std::chrono::milliseconds;

struct summary {
  double p50_us = 0, p99_us = 0, mean_us = 0, min_us = 0;
};

summary summarize(std::vector<uint64_t> ns) {
  summary s;
  if (ns.empty()) return s;
  std::sort(ns.begin(), ns.end());
  auto at = [&](double q) {
    return static_cast<double>(ns[static_cast<size_t>(q * static_cast<double>(ns.size() - 1))]) /
           1e3;
  };
  s.p50_us = at(0.50);
  s.p99_us = at(0.99);
  s.min_us = static_cast<double>(ns.front()) / 1e3;
  double sum = 0;
  for (uint64_t v : ns) sum += static_cast<double>(v);
  s.mean_us = sum / static_cast<double>(ns.size()) / 1e3;
  return s;
}

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

std::vector<uint64_t> run_raw(int warmup, int iters, const std::string& frame) {
  std::string ep;
  const pid_t pid = start_echo_server(&ep);
  std::vector<uint64_t> rtt;
  {
    zmq::context_t ctx(1);
    zmq::socket_t req(ctx, zmq::socket_type::req);
    req.set(zmq::sockopt::linger, 1000);
    req.connect(ep);
    for (int i = 0; i < warmup + iters; ++i) {
      const uint64_t t0 = net::now_ns();
      req.send(zmq::buffer(frame), zmq::send_flags::none);
      zmq::message_t reply;
      if (!req.recv(reply) || reply.size() != frame.size()) {
        throw error("bench control: REQ/REP echo returned a wrong reply");
      }
      if (i >= warmup) rtt.push_back(net::now_ns() - t0);
    }
    req.send(zmq::message_t(), zmq::send_flags::none);  // tells the echo process to exit
    zmq::message_t bye;
    (void)req.recv(bye);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return rtt;
}

std::vector<uint64_t> run_actors(int warmup, int iters) {
  const config c = load_config_text("{}", "<bench control>", {});
  actors::coordinator_node node(actors::coordinator_options_from(c), "tcp://127.0.0.1:0",
                                static_cast<size_t>(c.control.max_message_bytes));
  const std::string name = "bench-worker";
  // The worker's own chatter (its registration line) must not mix into our output.
  const int devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
  const pid_t pid =
      actors::spawn_self({"worker", "--join", node.endpoint(), "--name", name}, devnull);
  if (devnull >= 0) close(devnull);
  auto reap = [pid] {
    for (int i = 0; i < 50; ++i) {
      if (waitpid(pid, nullptr, WNOHANG) == pid) return;
      std::this_thread::sleep_for(milliseconds(100));
    }
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  };

  caf::scoped_actor self{node.system()};
  bool registered = false;
  for (int i = 0; i < 500 && !registered; ++i) {
    self->request(node.actor(), caf::infinite, actors::co_status_atom::value)
        .receive(
            [&](const net::status_reply& s) {
              for (const auto& w : s.workers) registered |= w.member.name == name;
            },
            [&](const caf::error&) {});
    if (!registered) std::this_thread::sleep_for(milliseconds(20));
  }
  if (!registered) {
    node.request_stop("bench failed");
    reap();
    throw error("bench control: the worker process did not register within 10 s");
  }
  std::vector<uint64_t> rtt;
  bool failed = false;
  auto run = [&](int n, bool keep) {
    self->request(node.actor(), caf::infinite, actors::co_bench_atom::value, name,
                  static_cast<uint32_t>(n))
        .receive(
            [&](const actors::bench_result& r) {
              if (keep) rtt = r.rtt_ns;
            },
            [&](const caf::error&) { failed = true; });
  };
  if (warmup > 0) run(warmup, false);
  if (!failed) run(iters, true);
  node.request_stop("bench done");
  node.wait();
  reap();
  if (failed || rtt.size() != static_cast<size_t>(iters)) {
    throw error("bench control: ping/pong with the worker failed");
  }
  return rtt;
}

}  // namespace

void add_bench_control(CLI::App& bench, int* rc) {
  struct options {
    int iters = 2000;
    int warmup = 200;
    bool json = false;
  };
  auto opt = std::make_shared<options>();
  CLI::App* cmd = bench.add_subcommand(
      "control",
      "Control-plane round trips: coordinator actor <-> worker process (ping/pong through both "
      "ZeroMQ bridges and actor mailboxes) against a raw ZeroMQ REQ/REP pair over tcp "
      "loopback, same frame size, same run. Prints p50/p99 of both and their ratio.");
  cmd->add_option("--iters", opt->iters, "Measured round trips per path")
      ->check(CLI::Range(1, 10000000))
      ->capture_default_str();
  cmd->add_option("--warmup", opt->warmup, "Unmeasured round trips first")
      ->check(CLI::Range(0, 10000000))
      ->capture_default_str();
  cmd->add_flag("--json", opt->json, "Print one JSON object instead of the table");
  cmd->callback([opt, rc] {
    const std::string frame = net::encode(net::ping{1, 1});
    // Raw first: it forks without exec, which is only safe while we have no threads.
    const summary raw = summarize(run_raw(opt->warmup, opt->iters, frame));
    actors::log_to_stderr();
    spdlog::set_level(spdlog::level::warn);
    const summary act = summarize(run_actors(opt->warmup, opt->iters));
    const double ratio = raw.p50_us > 0 ? act.p50_us / raw.p50_us : 0;
    if (opt->json) {
      auto js = [](const summary& s) {
        return nlohmann::json{{"p50_us", s.p50_us},
                              {"p99_us", s.p99_us},
                              {"mean_us", s.mean_us},
                              {"min_us", s.min_us}};
      };
      std::cout << nlohmann::json{{"iters", opt->iters},         {"warmup", opt->warmup},
                                  {"frame_bytes", frame.size()}, {"raw_zmq", js(raw)},
                                  {"actors", js(act)},           {"ratio_p50", ratio}}
                       .dump()
                << std::endl;
    } else {
      std::printf(
          "control-plane round trips: %d measured (+%d warm-up) per path, %zu-byte "
          "frames, 2 processes, tcp loopback\n",
          opt->iters, opt->warmup, frame.size());
      std::printf("  %-34s p50 %8.1f us   p99 %8.1f us   mean %8.1f us\n", "raw ZeroMQ REQ/REP",
                  raw.p50_us, raw.p99_us, raw.mean_us);
      std::printf("  %-34s p50 %8.1f us   p99 %8.1f us   mean %8.1f us\n",
                  "actors + bridges (ping/pong)", act.p50_us, act.p99_us, act.mean_us);
      std::printf("  ratio actors / raw at p50: %.2fx (goal: within 2x)\n", ratio);
    }
    *rc = exit_ok;
  });
}

}  // namespace cohort::cli
