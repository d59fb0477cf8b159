// Workers of different speeds across real processes (issue: workers of different speeds):
// train.balance: measured with a slowed worker, a kill, a scale; elastic.straggler_factor
// draining a worker that stays slow. In bitwise mode each micro-batch enters the
// fixed-point sum on its own, so every scenario ends on `cohort train`'s parameter hash.
// Nothing here asserts on speed: the slow workers are slowed by a `slow` fault, or held to a
// tenth of a core by a cgroup of their own (launch --cpu-limit, where cgroups can be made).
#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "runtime/core/cpu_limit.hpp"
#include "tests/mp/dp_util.hpp"
#include "tests/mp/mp_util.hpp"

using namespace cohort::mp;
using std::chrono::milliseconds;

namespace {
const milliseconds run_timeout(240000);  // generous: two loaded cores, several processes
}  // namespace

// train.balance: measured with a worker slowed to a quarter of its speed, then a kill: the
// slow worker is given fewer micro-batches, the respawn gets a plan of its own, and the run
// ends on `cohort train`'s hash (each micro-batch enters the fixed-point sum on its own).
TEST_CASE("balance measured: a slow worker gets fewer micro-batches, a kill too, same hash") {
  temp_dir dir;
  const int steps = 300;
  std::string yaml = small_yaml(dir.path(), "bitwise", steps);
  yaml.replace(yaml.find("timeout_ms: 2000"), 16, "timeout_ms: 500");
  const std::string cfg = dir.write("cfg.yaml", yaml);
  const std::string hash = train_summary(dir, cfg)["params_sha256"];
  const std::string out = dir.path() + "/balance.json";
  child_process launch({"launch", cfg, "-q", "--summary", out, "--set", "cluster.workers=2",
                        "--set", "train.balance=measured", "--inject",
                        "slow worker=worker-1 factor=4 from step=5 to step=200", "--inject",
                        "kill worker=worker-0 at step=240"},
                       dir.path(), "launch-balance");
  const nlohmann::json s = finish_launch(launch, out, run_timeout);
  check_fault_free(s, hash, steps);
  REQUIRE(s["balance"].is_object());
  CHECK(s["balance"]["mode"] == "measured");
  const auto plans = events_of(s, "balance");
  REQUIRE_MESSAGE(!plans.empty(), s["events"].dump());
  bool slow_got_less = false;
  for (const auto& e : plans)
    slow_got_less =
        slow_got_less || e["spec"].get<std::string>().find("worker-1 1 (") != std::string::npos;
  CHECK_MESSAGE(slow_got_less, s["events"].dump());
  CHECK(events_of(s, "kill").size() == 1);
}

// A worker slowed by the kernel, not by a fault: `launch --cpu-limit worker-1=0.1` puts it in
// a cgroup of its own with a tenth of a core's time (against up to a whole core for worker-0),
// so its measured speed is lower for real; the plan gives it fewer micro-batches, the run ends
// on `cohort train`'s hash, and the cgroup is gone after the run. Skipped (77) where this
// process may not make cgroups.
TEST_CASE("balance measured: a worker held to a tenth of a core by its cgroup gets fewer "
          "micro-batches, same hash") {
  std::string why;
  if (!cohort::proc::cpu_cgroup_root(&why)) {
    std::printf("skipped: %s\n", why.c_str());
    std::fflush(stdout);
    std::_Exit(77);
  }
  temp_dir dir;
  const int steps = 60;
  // Compute must dominate a step for a CPU budget to show in the compute times the workers
  // report: with the 32-unit MLP a step is mostly waiting, and the throttled 80 ms of each
  // 100 ms period land in the sum's waits as often as in the compute.
  std::string yaml = small_yaml(dir.path(), "bitwise", steps);
  for (const auto& [from, to] : {std::pair<std::string, std::string>{"hidden: [32]", "hidden: [256]"},
                                 {"global_batch: 64", "global_batch: 2048"},
                                 {"micro_batch: 16", "micro_batch: 256"}})
    yaml.replace(yaml.find(from), from.size(), to);
  const std::string cfg = dir.write("cfg.yaml", yaml);
  const std::string hash = train_summary(dir, cfg)["params_sha256"];
  const std::string out = dir.path() + "/balance-cpu.json";
  child_process launch({"launch", cfg, "-q", "--summary", out, "--set", "cluster.workers=2",
                        "--set", "train.balance=measured", "--cpu-limit", "worker-1=0.1"},
                       dir.path(), "launch-balance-cpu");
  const nlohmann::json s = finish_launch(launch, out, run_timeout);
  check_fault_free(s, hash, steps);
  const std::string log = launch.out();
  const auto at = log.find("worker-1 (pid ");
  REQUIRE_MESSAGE(at != std::string::npos, log << launch.err());
  const auto open = log.find("CPU(s) (", at), close = log.find(")\n", open);
  REQUIRE_MESSAGE(open != std::string::npos, log);
  const std::string cgroup = log.substr(open + 8, close - open - 8);
  CHECK_MESSAGE(!std::filesystem::exists(cgroup), cgroup << " is left after the run");
  // A plan gave the limited worker fewer micro-batches (the last plan may not: on a machine
  // loaded by other tests the unlimited worker can be starved as much, for a while).
  const auto share = [](const std::string& spec, const std::string& name) {
    const auto at = spec.find(name + " ");
    return at == std::string::npos ? -1 : std::stoi(spec.substr(at + name.size() + 1));
  };
  bool fewer = false;
  for (const auto& e : events_of(s, "balance")) {
    const std::string spec = e["spec"];
    fewer = fewer || share(spec, "worker-1") < share(spec, "worker-0");
  }
  CHECK_MESSAGE(fewer, s["events"].dump());
}

// train.balance: measured at dp 4 with a slow worker, then a scale down to 3 (a drain at a
// step boundary, so the order needs no timing): a plan for the members left, and the same
// bits as `cohort train`. (A scale-up does not hold training, so a short run may end before
// its joiner enters; the kill case above covers a plan for a newcomer.)
TEST_CASE("balance measured: dp 4 with a slow worker, then a scale to 3, same hash") {
  temp_dir dir;
  const int steps = 300;
  const std::string cfg = dir.write("cfg.yaml", small_yaml(dir.path(), "bitwise", steps));
  const std::string hash = train_summary(dir, cfg)["params_sha256"];
  const std::string out = dir.path() + "/balance-scale.json";
  child_process launch({"launch", cfg, "-q", "--summary", out, "--set", "cluster.workers=4",
                        "--set", "elastic.min_workers=3", "--set", "train.balance=measured",
                        "--inject", "slow worker=worker-0 factor=3 from step=5 to step=150",
                        "--inject", "scale to=3 at step=100"},
                       dir.path(), "launch-balance-scale");
  const nlohmann::json s = finish_launch(launch, out, run_timeout);
  check_fault_free(s, hash, steps);
  CHECK(s["dp"] == 3);
  CHECK(s["balance"]["shares"].size() == 3);
  CHECK_MESSAGE(!events_of(s, "balance").empty(), s["events"].dump());
}

// elastic.straggler_factor: a worker eight times slower than the others for the whole run
// (twice the bound of 4, so that a loaded machine's noise does not name another first) is
// drained once the balancer has seen it below the bound at 3 plans in a row; the run goes on
// with the other three and ends on `cohort train`'s hash.
TEST_CASE("a straggler past elastic.straggler_factor is drained with an event saying why") {
  temp_dir dir;
  const int steps = 300;
  const std::string cfg = dir.write("cfg.yaml", small_yaml(dir.path(), "bitwise", steps));
  const std::string hash = train_summary(dir, cfg)["params_sha256"];
  const std::string out = dir.path() + "/straggler.json";
  // Four workers: each is judged against the median of the other three, two of them fast. With
  // three workers the "median" of the other two is their mean, which the slow one halves, and a
  // fast worker starved of a core under a loaded suite was once named instead (2026-12-05).
  // Factor 4, not 2: four workers and another test on two cores once starved a fast worker to
  // half the others' speed for three plans in a row (the full suite, 2026-12-05).
  child_process launch({"launch", cfg, "-q", "--summary", out, "--set", "cluster.workers=4",
                        "--set", "elastic.min_workers=3", "--set", "elastic.straggler_factor=4",
                        "--inject", "slow worker=worker-2 factor=8 from step=0 to step=300"},
                       dir.path(), "launch-straggler");
  const nlohmann::json s = finish_launch(launch, out, run_timeout);
  check_fault_free(s, hash, steps);
  CHECK(s["dp"] == 3);
  const auto named = events_of(s, "straggler");
  REQUIRE_MESSAGE(named.size() == 1, s["events"].dump());
  CHECK_MESSAGE(named[0]["worker"] == "worker-2", s["events"].dump() << s["balance"].dump());
  CHECK_MESSAGE(
      named[0]["spec"].get<std::string>().find("elastic.straggler_factor") != std::string::npos,
      named[0].dump());
  const auto drained = events_of(s, "drained");
  REQUIRE(drained.size() == 1);
  CHECK(drained[0]["worker"] == "worker-2");
}

// Under measured shares, a launch killed outright resumes from its checkpoint with another
// worker count and ends on `cohort train`'s hash: the checkpoint holds no plan (the resumed
// run measures afresh), and any plan gives the same bits.
TEST_CASE("balance measured: a killed launch resumes with another worker count, same hash") {
  temp_dir dir;
  const int steps = 1000;
  std::string yaml = small_yaml(dir.path(), "bitwise", steps);
  yaml.replace(yaml.find("checkpoint_every: 0"), 19, "checkpoint_every: 100");
  const std::string cfg = dir.write("cfg.yaml", yaml);
  const std::string hash = train_summary(dir, cfg)["params_sha256"];
  std::filesystem::remove_all(dir.path() + "/ckpt");  // only the launch's checkpoints count
  launch_killed_at(
      {"launch", cfg, "-q", "--set", "cluster.workers=3", "--set", "train.balance=measured",
       "--inject", "slow worker=worker-1 factor=3 from step=0 to step=1000"},
      dir, "launch-first", 250, milliseconds(120000));
  const std::string out = dir.path() + "/resumed.json";
  child_process again({"launch", cfg, "-q", "--resume", "--summary", out, "--set",
                       "cluster.workers=2", "--set", "train.balance=measured", "--inject",
                       "slow worker=worker-0 factor=3 from step=0 to step=1000"},
                      dir.path(), "launch-resume");
  const nlohmann::json s = finish_launch(again, out, run_timeout);
  CHECK(again.err().find("resuming from") != std::string::npos);
  CHECK(s["steps_completed"] == steps);
  CHECK(s["dp"] == 2);
  CHECK(s["params_sha256"] == hash);
  CHECK_MESSAGE(!events_of(s, "balance").empty(), s["events"].dump());
}
