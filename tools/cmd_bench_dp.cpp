// `cohort bench dp CFG [--workers 1,2] [--batch B] [--steps S] [--bucket-mb MB]
// [--transport T] [--balance equal,measured [--micro-batches K] [--slow F] [--cpu-limit C]]
// [--zero 0,1,2,3] [--bind none,cores,numa] [--json]`:
// weak scaling of data-parallel training. For each worker count N it runs `cohort launch`
// (this binary) with N workers, each computing B samples per step (global batch N*B, one
// micro-batch per worker), and reports the step time, its ratio to the first N's step time
// measured in the same run, and the per-step time split and overlap fraction the workers
// report. With --balance, each count runs once per train.balance mode, each worker's batch in
// K micro-batches and rank 1's compute stretched F times (a `slow` fault) or worker-1 held to C
// cores by a cgroup (launch --cpu-limit), against the ideal
// step (the global batch over the sum of the workers' measured rates, the coordinator's
// figures). With --zero, each count runs once per train.zero stage, and each point shows its
// model-state bytes per worker (the largest worker's) and the bytes each worker sent per
// step, with both ratios to the first stage's point at that count. With --bind, each count runs
// once per cluster.bind mode, each point with its step time against the first mode's and
// where each worker ran (its cpus). Owns the driving and the
// table; the numbers come from the launch summaries.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/comm/allreduce_bench.hpp"
#include "runtime/core/config.hpp"
#include "runtime/core/cpu_limit.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/process.hpp"
#include "tools/bench_util.hpp"
#include "tools/commands.hpp"

namespace cohort::cli {

namespace {

struct bench_dp_options {
  std::string config;
  std::vector<int> workers{1, 2};
  int batch = 0;  // per worker; 0: the config's micro_batch
  int64_t steps = 200;
  double bucket_mb = 0;        // 0: the config's comm.bucket_mb
  std::string transport_word;  // empty: the config's comm.transport / comm.hierarchy
  std::optional<comm::bench_transport> transport;  // transport_word, parsed
  std::vector<std::string> overrides;
  std::vector<std::string> balance;  // train.balance modes to compare; empty: the config's
  int micro = 8;                     // --balance: micro-batches per worker
  double slow = 1;                   // --balance: rank 1's compute factor
  double cpu_limit = 0;              // --balance: worker-1's cores (a cgroup); 0: none
  std::vector<int> zero;             // train.zero stages to compare; empty: the config's
  std::vector<std::string> bind;     // cluster.bind modes to compare; empty: the config's
  bool json = false;
};

struct dp_point {
  int workers = 0;
  double step_ms = 0;
  double compute_ms = 0, comm_wait_ms = 0, allreduce_ms = 0, idle_ms = 0;
  double overlap = 0;
  double ratio = 1;     // step time / the first point's step time
  std::string balance;  // --balance: the mode of this run
  double ideal_ms = 0;  // --balance: global batch / the sum of the workers' measured rates
  int zero = -1;        // --zero: the stage of this run
  double state_bytes = 0;     // the largest worker's model state (params, grads, optimizer)
  double sent_per_step = 0;   // bytes each worker handed its transport per step (mean)
  double state_ratio = 1, step_ratio = 1;  // --zero, --bind: against the first at this count
  std::string bind;  // --bind: the mode of this run
  std::string cpus;  // --bind: each worker's cpus ("worker-0 0, worker-1 1")
};

dp_point run_point(const bench_dp_options& o, const config& base, int n,
                   const std::filesystem::path& dir, const std::string& balance, int zero,
                   const std::string& bind) {
  const int b = o.batch > 0 ? o.batch : base.train.micro_batch;
  const std::string tag =
      "dp" + std::to_string(n) + balance + (zero >= 0 ? "z" + std::to_string(zero) : "") + bind;
  const std::string summary = (dir / (tag + ".json")).string();
  std::vector<std::string> args{"launch", o.config, "-q", "--summary", summary};
  for (const auto& s : o.overrides) args.insert(args.end(), {"--set", s});
  const std::vector<std::string> sets{
      "cluster.workers=" + std::to_string(n),
      "train.global_batch=" + std::to_string(n * b),
      "train.micro_batch=" + std::to_string(balance.empty() ? b : b / o.micro),
      "train.steps=" + std::to_string(o.steps),
      "train.warmup_steps=0",
      "train.eval_every=0",
      "fault_tolerance.checkpoint_every=0",
      "fault_tolerance.checkpoint_dir=" + (dir / "ckpt").string(),
  };
  for (const auto& s : sets) args.insert(args.end(), {"--set", s});
  if (o.bucket_mb > 0)
    args.insert(args.end(), {"--set", "comm.bucket_mb=" + std::to_string(o.bucket_mb)});
  if (!balance.empty()) {
    args.insert(args.end(), {"--set", "train.balance=" + balance});
    if (o.slow > 1 && n > 1)
      args.insert(args.end(), {"--inject", "slow rank=1 factor=" + std::to_string(o.slow) +
                                               " from step=0 to step=" + std::to_string(o.steps)});
    if (o.cpu_limit > 0 && n > 1)
      args.insert(args.end(), {"--cpu-limit", "worker-1=" + std::to_string(o.cpu_limit)});
  }
  if (zero >= 0) args.insert(args.end(), {"--set", "train.zero=" + std::to_string(zero)});
  if (!bind.empty()) args.insert(args.end(), {"--set", "cluster.bind=" + bind});
  if (o.transport)
    args.insert(args.end(),
                {"--set", "comm.transport=" + std::string(to_string(o.transport->kind)), "--set",
                 "comm.hierarchy=" + std::string(to_string(o.transport->hierarchy))});
  const std::string log = (dir / (tag + ".log")).string();
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const pid_t pid = proc::spawn_self(args, fd, fd);
  if (fd >= 0) ::close(fd);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  const int code = proc::exit_code_of(status);
  if (code != 0)
    throw error("bench dp: launch with " + std::to_string(n) + " worker(s) exited " +
                std::to_string(code) + "; the end of its output:" + log_tail(log));
  std::ifstream in(summary);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (!j.is_object()) throw error("bench dp: no summary in " + summary + "; the end of launch's output:" + log_tail(log));
  dp_point p;
  p.workers = n;
  const double rate = j["throughput"].begin().value().get<double>();
  // Throughput is in samples/s, or tokens/s for a language model.
  const double per_sample = base.model.kind == "gpt" ? base.model.context : 1;
  const double units_per_step = static_cast<double>(n) * b * per_sample;
  p.step_ms = rate > 0 ? 1000.0 * units_per_step / rate : 0;
  p.balance = balance;
  double rates = 0;
  if (j.contains("balance"))
    for (const auto& [name, r] : j["balance"]["samples_per_s"].items()) rates += r.get<double>();
  if (rates > 0) p.ideal_ms = 1000.0 * n * b / rates;
  p.zero = zero;
  p.bind = bind;
  if (j["memory"].contains("model_state_bytes"))
    p.state_bytes = j["memory"]["model_state_bytes"].get<double>();
  for (const auto& w : j["workers"]) {
    const double steps = std::max<double>(1, w["steps"].get<double>());
    p.sent_per_step += w["bytes_sent"].get<double>() / steps / n;
    p.compute_ms += 1000.0 * w["compute_s"].get<double>() / steps / n;
    p.comm_wait_ms += 1000.0 * w["comm_wait_s"].get<double>() / steps / n;
    p.allreduce_ms += 1000.0 * w["allreduce_s"].get<double>() / steps / n;
    p.idle_ms += 1000.0 * w["idle_s"].get<double>() / steps / n;
    p.overlap += w["overlap"].get<double>() / n;
    if (!p.cpus.empty()) p.cpus += ", ";
    p.cpus += w["name"].get<std::string>() + " " + w.value("cpus", std::string("?"));
  }
  return p;
}

}  // namespace

void add_bench_dp(CLI::App& bench, int* rc) {
  auto o = std::make_shared<bench_dp_options>();
  CLI::App* cmd = bench.add_subcommand(
      "dp",
      "Weak scaling of data-parallel training: `cohort launch` with each worker count at "
      "equal per-worker batch; step time, ratio to the first count, time split, overlap");
  cmd->add_option("config", o->config, "YAML config (model, data, comm)")->required();
  cmd->add_option("--workers", o->workers, "worker counts, first is the reference")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--batch", o->batch,
                  "samples (or sequences) per worker per step; 0: micro_batch");
  cmd->add_option("--steps", o->steps, "steps per run")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40))
      ->capture_default_str();
  cmd->add_option("--bucket-mb", o->bucket_mb, "comm.bucket_mb for every run; 0: the config's");
  cmd->add_option("--transport", o->transport_word,
                  "every run's DP transport: gloo, shm, auto or hierarchical (comm.transport "
                  "and comm.hierarchy; the workers of `launch` share one host, so "
                  "hierarchical is shared memory here: tools/bench_hier.sh measures it across "
                  "emulated hosts); default: the config's")
      ->check(CLI::IsMember(comm::bench_transport::words()));
  add_set_option(*cmd, &o->overrides);
  cmd->add_option("--balance", o->balance,
                  "train.balance modes to compare at each count (equal, measured), against "
                  "the ideal step")
      ->delimiter(',')
      ->check(CLI::IsMember({"equal", "measured"}));
  cmd->add_option("--micro-batches", o->micro, "with --balance: micro-batches per worker")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--slow", o->slow,
                  "with --balance: rank 1's compute stretched this many times (a slow fault)")
      ->check(CLI::Range(1.0, 1000.0))
      ->capture_default_str();
  cmd->add_option("--cpu-limit", o->cpu_limit,
                  "with --balance: worker-1 runs under a CPU budget of this many cores (a cgroup "
                  "of its own, throttled by the kernel; needs root), a slower worker for real")
      ->check(CLI::Range(proc::min_cpus, proc::max_cpus));
  cmd->add_option("--zero", o->zero,
                  "train.zero stages to compare at each count (0, 1, 2, 3): step time, model-state "
                  "bytes per worker and bytes sent per step, against the first stage")
      ->delimiter(',')
      ->check(CLI::Range(0, 3));
  cmd->add_option("--bind", o->bind,
                  "cluster.bind modes to compare at each count (none, cores, numa): step time "
                  "and each worker's cpus, against the first mode")
      ->delimiter(',')
      ->check(CLI::IsMember({"none", "cores", "numa"}));
  cmd->add_flag("--json", o->json, "one JSON object instead of the table");
  cmd->callback([o, rc] {
    const config base = load_config(o->config, o->overrides);
    if (!o->transport_word.empty()) o->transport = comm::bench_transport::parse(o->transport_word);
    // The transport every run uses, as the summary spells it.
    const std::string transport =
        o->transport ? o->transport->word() : std::string(to_string(base.comm.transport));
    if (o->workers.empty()) throw usage_error("bench dp: --workers needs at least one count");
    for (int n : o->workers)
      if (n < 1) throw usage_error("bench dp: worker counts must be >= 1");
    const scratch_dir scratch("bench-dp");
    const std::filesystem::path dir(scratch.path());
    const int b = o->batch > 0 ? o->batch : base.train.micro_batch;
    if (!o->balance.empty() && (b % o->micro != 0))
      throw usage_error("bench dp: --balance splits each worker's batch of " + std::to_string(b) +
                        " into --micro-batches " + std::to_string(o->micro) +
                        " equal micro-batches: use a batch that is a multiple of it");
    const std::vector<std::string> modes =
        o->balance.empty() ? std::vector<std::string>{""} : o->balance;
    const std::vector<int> zeros = o->zero.empty() ? std::vector<int>{-1} : o->zero;
    const std::vector<std::string> binds =
        o->bind.empty() ? std::vector<std::string>{""} : o->bind;
    std::vector<dp_point> pts;
    for (int n : o->workers)
      for (const std::string& mode : modes) {
        const std::size_t first = pts.size();  // this count's first stage
        for (int zero : zeros)
        for (const std::string& bind : binds) {
          if (!o->json)
            std::fprintf(stderr, "bench dp: %d worker(s)%s%s%s...\n", n,
                         mode.empty() ? "" : (", balance " + mode).c_str(),
                         zero < 0 ? "" : (", zero " + std::to_string(zero)).c_str(),
                         bind.empty() ? "" : (", bind " + bind).c_str());
          pts.push_back(run_point(*o, base, n, dir, mode, zero, bind));
          dp_point& p = pts.back();
          p.ratio = pts.front().step_ms > 0 ? p.step_ms / pts.front().step_ms : 0;
          const dp_point& ref = pts[first];
          p.step_ratio = ref.step_ms > 0 ? p.step_ms / ref.step_ms : 0;
          p.state_ratio = ref.state_bytes > 0 ? p.state_bytes / ref.state_bytes : 0;
        }
      }
    if (o->json) {
      nlohmann::json j;
      j["config"] = o->config;
      j["transport"] = transport;
      j["steps"] = o->steps;
      j["batch_per_worker"] = o->batch > 0 ? o->batch : base.train.micro_batch;
      for (const auto& p : pts)
        j["points"].push_back({{"workers", p.workers},
                               {"step_ms", p.step_ms},
                               {"ratio", p.ratio},
                               {"compute_ms", p.compute_ms},
                               {"comm_wait_ms", p.comm_wait_ms},
                               {"allreduce_ms", p.allreduce_ms},
                               {"idle_ms", p.idle_ms},
                               {"overlap", p.overlap},
                               {"balance", p.balance},
                               {"ideal_ms", p.ideal_ms},
                               {"zero", p.zero},
                               {"model_state_bytes", p.state_bytes},
                               {"bytes_sent_per_step", p.sent_per_step},
                               {"step_vs_first_zero", p.step_ratio},
                               {"state_vs_first_zero", p.state_ratio},
                               {"bind", p.bind},
                               {"cpus", p.cpus}});
      std::printf("%s\n", j.dump(2).c_str());
    } else {
      std::printf("bench dp: %s, transport %s\n", o->config.c_str(), transport.c_str());
      if (!o->balance.empty())
        std::printf("balance: %d micro-batches per worker, rank 1 at %.2gx compute%s\n", o->micro,
                    o->slow,
                    o->cpu_limit > 0
                        ? (", worker-1 limited to " + std::to_string(o->cpu_limit).substr(0, 4) +
                           " CPU(s)")
                              .c_str()
                        : "");
      std::printf("%8s %9s %10s %8s %11s %13s %13s %9s %8s %9s %9s\n", "workers", "balance",
                  "step_ms", "ratio", "compute_ms", "comm_wait_ms", "allreduce_ms", "idle_ms",
                  "overlap", "ideal_ms", "vs_ideal");
      for (const auto& p : pts)
        std::printf("%8d %9s %10.2f %8.2f %11.2f %13.2f %13.2f %9.2f %8.2f %9.2f %9.2f\n",
                    p.workers, p.balance.empty() ? "-" : p.balance.c_str(), p.step_ms, p.ratio,
                    p.compute_ms, p.comm_wait_ms, p.allreduce_ms, p.idle_ms, p.overlap, p.ideal_ms,
                    p.ideal_ms > 0 ? p.step_ms / p.ideal_ms : 0.0);
      if (!o->bind.empty()) {
        std::printf("\n%8s %6s %10s %13s %11s  %s\n", "workers", "bind", "step_ms",
                    "step_vs_first", "compute_ms", "cpus");
        for (const auto& p : pts)
          std::printf("%8d %6s %10.2f %13.2f %11.2f  %s\n", p.workers, p.bind.c_str(), p.step_ms,
                      p.step_ratio, p.compute_ms, p.cpus.c_str());
      }
      if (!o->zero.empty()) {
        std::printf("\n%8s %5s %10s %13s %12s %15s %14s\n", "workers", "zero", "step_ms",
                    "step_vs_first", "state_MB", "state_vs_first", "sent_MB_step");
        for (const auto& p : pts)
          std::printf("%8d %5d %10.2f %13.2f %12.3f %15.3f %14.3f\n", p.workers, p.zero, p.step_ms,
                      p.step_ratio, p.state_bytes / 1e6, p.state_ratio, p.sent_per_step / 1e6);
      }
    }
    *rc = exit_ok;
  });
}

}  // namespace cohort::cli
