// `cohort bench faults CFG --faults SPEC [--pairs N] [--set k=v ...]`: the effective
// training time ratio (ETTR) of a fault schedule: `cohort launch` runs the job without the
// faults and with them, alternating, and each pair's ETTR is the fault-free run's wall time
// over the faulty run's. Every run must end on the fault-free params_sha256 (bitwise: a
// fault costs time, never bits). The runs themselves are launch's; this file only starts
// them, reads their summaries and prints.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "runtime/core/config.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/process.hpp"
#include "tools/bench_util.hpp"
#include "tools/commands.hpp"

namespace cohort::cli {
namespace {

struct faults_bench_options {
  std::string config_path;
  std::vector<std::string> faults;
  std::vector<std::string> overrides;
  int pairs = 5;
  std::string out;  ///< folder for the runs' summaries and logs; empty: a private one
  bool json = false;
};

/// What the bench keeps of one run: launch's summary.
struct run_result {
  double wall_s = 0;
  double train_s = 0;  ///< first step opened -> last commit (the curve's last t_s)
  std::string hash;
  int kills = 0;
  int aborted = 0;
  nlohmann::json kill_costs = nlohmann::json::array();  ///< the kill events' cost breakdowns
  double lost_s = 0;  ///< the kills' lost_ms summed (docs/faults.md), in seconds
};

// 1 - the kills' accounted loss over the faulty run's wall time: what the faults cost by the
// coordinator's own stamps, blind to the machine's drift between two runs (on a shared VM the
// same fault-free run varies by more than the kills cost).
double accounted_ettr(const run_result& faulty) {
  return faulty.wall_s > 0 ? 1.0 - faulty.lost_s / faulty.wall_s : 0.0;
}

// Runs `cohort launch` once and reads its summary; a run that fails or writes no summary is
// a runtime error naming its log.
run_result launch_once(const faults_bench_options& o, bool faulty, const std::string& tag) {
  const std::string summary = o.out + "/" + tag + ".json";
  const std::string log = o.out + "/" + tag + ".log";
  std::vector<std::string> args{"launch", o.config_path, "--quiet", "--summary", summary};
  for (const auto& s : o.overrides) args.insert(args.end(), {"--set", s});
  if (faulty)
    for (const auto& f : o.faults) args.insert(args.end(), {"--inject", f});
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) throw io_error("bench faults: cannot write " + log);
  const pid_t pid = proc::spawn_self(args, fd, fd);
  ::close(fd);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  const int code = proc::exit_code_of(status);
  if (code != 0)
    throw error("bench faults: run " + tag + " (cohort launch) ended with exit code " +
                std::to_string(code) + "; the end of its output:" + log_tail(log));
  std::ifstream in(summary);
  nlohmann::json j;
  try {
    in >> j;
  } catch (const std::exception& e) {
    throw error("bench faults: run " + tag + " left no readable summary at " + summary + " (" +
                e.what() + "); the end of its output:" + log_tail(log));
  }
  run_result r;
  r.wall_s = j.value("wall_s", 0.0);
  const auto& curve = j["curve"];
  r.train_s = curve.empty() ? 0.0 : curve.back().value("t_s", 0.0);
  r.hash = j.value("params_sha256", std::string());
  r.aborted = j.value("aborted_steps", 0);
  for (const auto& e : j["events"]) {
    if (e.value("kind", std::string()) != "kill") continue;
    ++r.kills;
    if (!e.contains("cost")) continue;
    r.kill_costs.push_back(e["cost"]);
    if (e["cost"].contains("lost_ms") && e["cost"]["lost_ms"].is_number())
      r.lost_s += e["cost"]["lost_ms"].get<double>() / 1e3;
  }
  return r;
}

struct spread {
  double median = 0, min = 0, max = 0;
};

spread spread_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return {n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]), v.front(), v.back()};
}

int run_bench(faults_bench_options o) {
  // Both the config and the schedule are checked before any run starts (exit 2).
  const config c = load_config(o.config_path, o.overrides);
  try {
    (void)job_faults(c, o.faults);
  } catch (const usage_error& e) {
    throw usage_error(std::string("bench faults --faults (each faulty launch's --inject): ") +
                      e.what());
  }
  bool temp = false;
  if (o.out.empty()) {
    o.out = proc::private_run_dir("cohort-bench-faults");
    temp = true;
  }
  std::filesystem::create_directories(o.out);
  std::vector<double> ettr, ettr_train, ettr_acc;
  nlohmann::json rows = nlohmann::json::array();
  std::string reference;  // the first fault-free run's hash
  bool same = true;
  for (int i = 0; i < o.pairs; ++i) {
    // Alternate which run of a pair goes first, so that a drift of the machine's load
    // weighs on both sides alike.
    const bool faulty_first = i % 2 == 1;
    run_result clean, faulty;
    for (int k = 0; k < 2; ++k) {
      const bool is_faulty = (k == 0) == faulty_first;
      const std::string tag = std::string(is_faulty ? "faulty-" : "clean-") + std::to_string(i);
      (is_faulty ? faulty : clean) = launch_once(o, is_faulty, tag);
    }
    if (reference.empty()) reference = clean.hash;
    const bool ok = clean.hash == reference && faulty.hash == reference;
    same = same && ok;
    const double e = faulty.wall_s > 0 ? clean.wall_s / faulty.wall_s : 0.0;
    const double et = faulty.train_s > 0 ? clean.train_s / faulty.train_s : 0.0;
    const double ea = accounted_ettr(faulty);
    ettr.push_back(e);
    ettr_train.push_back(et);
    ettr_acc.push_back(ea);
    rows.push_back({{"pair", i},
                    {"clean_wall_s", clean.wall_s},
                    {"faulty_wall_s", faulty.wall_s},
                    {"clean_train_s", clean.train_s},
                    {"faulty_train_s", faulty.train_s},
                    {"ettr", e},
                    {"ettr_train", et},
                    {"ettr_accounted", ea},
                    {"kills", faulty.kills},
                    {"aborted_steps", faulty.aborted},
                    {"lost_ms_per_kill",
                     faulty.kills > 0 ? 1e3 * (faulty.wall_s - clean.wall_s) / faulty.kills : 0.0},
                    {"kill_costs", faulty.kill_costs},
                    {"same_hash", ok}});
    if (!o.json) {
      std::printf(
          "pair %d: fault-free %.2f s, faulty %.2f s (%d kills, %d aborted steps): ETTR %.3f "
          "(training span %.3f, accounted %.3f)%s\n",
          i, clean.wall_s, faulty.wall_s, faulty.kills, faulty.aborted, e, et, ea,
          ok ? "" : "  HASH DIFFERS");
      std::fflush(stdout);
    }
  }
  const spread s = spread_of(ettr), st = spread_of(ettr_train), sa = spread_of(ettr_acc);
  if (o.json) {
    nlohmann::json j{{"config", o.config_path},
                     {"faults", o.faults},
                     {"pairs", rows},
                     {"ettr", {{"median", s.median}, {"min", s.min}, {"max", s.max}}},
                     {"ettr_train", {{"median", st.median}, {"min", st.min}, {"max", st.max}}},
                     {"ettr_accounted", {{"median", sa.median}, {"min", sa.min}, {"max", sa.max}}},
                     {"params_sha256", reference},
                     {"same_hash", same}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf(
        "ETTR over %d pairs: median %.3f (min %.3f, max %.3f); training span: median %.3f "
        "(min %.3f, max %.3f); accounted (1 - the kills' lost_ms over the faulty wall time): "
        "median %.3f (min %.3f, max %.3f)\n",
        o.pairs, s.median, s.min, s.max, st.median, st.min, st.max, sa.median, sa.min, sa.max);
    std::printf(same ? "every run ended on params_sha256 %s\n"
                     : "NOT every run ended on the fault-free params_sha256 %s (see above)\n",
                reference.c_str());
  }
  if (temp) {
    std::error_code ec;
    std::filesystem::remove_all(o.out, ec);
  } else if (!o.json) {
    std::printf("summaries and logs in %s\n", o.out.c_str());
  }
  return same ? exit_ok : exit_runtime;
}

}  // namespace

void add_bench_faults(CLI::App& bench, int* rc) {
  auto o = std::make_shared<faults_bench_options>();
  CLI::App* cmd = bench.add_subcommand(
      "faults",
      "ETTR of a fault schedule: `cohort launch CFG` without and with the faults, alternating, "
      "each pair's fault-free wall time over its faulty one; every run must end on the "
      "fault-free params_sha256 (exit 1 if not)");
  cmd->add_option("config", o->config_path, "the job's YAML config")->required();
  cmd->add_option("--faults", o->faults,
                  "a fault spec (docs/faults.md) the faulty runs get as --inject; repeatable")
      ->required();
  cmd->add_option("--pairs", o->pairs, "pairs of runs")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--out", o->out,
                  "keep each run's summary and log in this folder (default: a private "
                  "folder, removed at the end)");
  cmd->add_flag("--json", o->json, "print one JSON object instead of lines");
  add_set_option(*cmd, &o->overrides);
  cmd->callback([o, rc] { *rc = run_bench(*o); });
}

}  // namespace cohort::cli
