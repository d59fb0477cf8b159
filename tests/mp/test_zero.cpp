// Sharded model state across real processes (train.zero: 1 and 2, docs/sharding.md): every DP
// size, a kill, a scale down and back up, and resumes at other sizes and in `cohort train`,
// each ending on `cohort train`'s parameter hash in bitwise mode: a sharded AdamW update is
// the whole one's, element for element, wherever the cut falls.
#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/mp/dp_util.hpp"
#include "tests/mp/mp_util.hpp"

using namespace cohort::mp;
using std::chrono::milliseconds;
namespace fs = std::filesystem;

namespace {

const milliseconds run_timeout(240000);  // generous: two loaded cores, several processes

// `cohort launch CFG` with train.zero: STAGE on W workers (min = max = W) plus EXTRA arguments;
// its summary.
nlohmann::json zero_launch(const temp_dir& dir, const std::string& cfg, int w,
                           const std::string& tag, std::vector<std::string> extra = {},
                           int stage = 1) {
  const std::string out = dir.path() + "/" + tag + ".json";
  std::vector<std::string> args = {"launch", cfg, "-q", "--summary", out,
                                   "--set", "train.zero=" + std::to_string(stage),
                                   "--set", "cluster.workers=" + std::to_string(w)};
  args.insert(args.end(), extra.begin(), extra.end());
  child_process launch(args, dir.path(), tag);
  return finish_launch(launch, out, run_timeout);
}

// Each worker holds its own shard and its neighbour's: optimizer + replica is 2/W of the
// whole state (within the shards' 64-element alignment), and both parts are reported.
void check_state_bytes(const nlohmann::json& s, int w) {
  for (const auto& worker : s["workers"]) {
    const nlohmann::json& b = worker["model_state_bytes"];
    REQUIRE_MESSAGE(b.is_object(), worker.dump());
    const double whole = 2.0 * b["params"].get<double>();  // AdamW: two slots of 4 bytes
    const double held = b["optimizer"].get<double>() + b["replica"].get<double>();
    if (w == 1) {
      CHECK(b["replica"] == 0);
      CHECK(held == doctest::Approx(whole));
    } else {
      CHECK(b["replica"].get<double>() > 0);
      CHECK(held == doctest::Approx(whole * 2.0 / w).epsilon(0.05));
    }
  }
}

// Four workers under train.zero: STAGE, VICTIM killed at step AT with no respawn and no
// checkpoint: the three survivors re-cut once, at that step, from memory, and end on `cohort
// train`'s bits.
void kill_and_recut(int stage, const std::string& victim, int at) {
  temp_dir dir;
  const int steps = 200;
  std::string yaml = small_yaml(dir.path(), "bitwise", steps);
  yaml.replace(yaml.find("timeout_ms: 2000"), 16, "timeout_ms: 500");
  const std::string cfg = dir.write("cfg.yaml", yaml);
  const std::string hash = train_summary(dir, cfg)["params_sha256"];
  const nlohmann::json s = zero_launch(
      dir, cfg, 4, "zero" + std::to_string(stage) + "-kill",
      {"--set", "elastic.min_workers=3", "--set", "elastic.respawn=false", "--inject",
       "kill worker=" + victim + " at step=" + std::to_string(at)},
      stage);
  check_fault_free(s, hash, steps);
  CHECK(s["dp"] == 3);
  REQUIRE(events_of(s, "kill").size() == 1);
  const auto cuts = events_of(s, "reshard");
  REQUIRE_MESSAGE(cuts.size() == 1, s["events"].dump());
  CHECK(cuts[0]["step"] == at);
  CHECK(cuts[0]["members"] == 3);
  CHECK(cuts[0]["bytes"].get<double>() > 0);
  check_state_bytes(s, 3);
}

}  // namespace

TEST_CASE("zero 1 at dp 1, 2, 3 and 4 ends on cohort train's hash, each worker holding 2/dp") {
  temp_dir dir;
  const int steps = 40;
  const std::string cfg = dir.write("cfg.yaml", small_yaml(dir.path(), "bitwise", steps));
  const std::string hash = train_summary(dir, cfg)["params_sha256"];
  for (int w = 1; w <= 4; ++w) {
    CAPTURE(w);
    const nlohmann::json s = zero_launch(dir, cfg, w, "zero-dp" + std::to_string(w));
    check_fault_free(s, hash, steps);
    CHECK(s["dp"] == w);
    CHECK(s["memory"]["zero"] == 1);
    check_state_bytes(s, w);
    CHECK(events_of(s, "reshard").empty());  // the first cut moves nothing
  }
}

namespace {

// Sharded gradients (zero 2), and parameters too (zero 3), on the 2-block GPT, whose
// clipping reads the global norm: every DP size ends on `cohort train`'s bits (the norm's
// per-parameter sums are exact, whatever the cut; a gathered block is its owners' bits), and
// with buckets small against the model the gradient buffers' peak stays well under the whole
// model's (12 bytes a parameter in bitwise mode) at dp 4.
void sharded_at_every_dp(int stage) {
  temp_dir dir;
  const int steps = 12;
  const std::string cfg = dir.write("cfg.yaml", gpt_yaml(dir.path(), steps));
  const std::string hash = train_summary(dir, cfg)["params_sha256"];
  for (int w = 1; w <= 4; ++w) {
    CAPTURE(w);
    const nlohmann::json s = zero_launch(dir, cfg, w,
                                         "zero" + std::to_string(stage) + "-dp" + std::to_string(w),
                                         {"--set", "comm.bucket_mb=0.01"}, stage);
    check_fault_free(s, hash, steps);
    CHECK(s["memory"]["zero"] == stage);
    const double whole_params = 4.0 * s["num_params"].get<double>();
    for (const auto& worker : s["workers"]) {
      const nlohmann::json& b = worker["model_state_bytes"];
      const double held = b["optimizer"].get<double>() + b["replica"].get<double>();
      // AdamW: two slots of 4 bytes; each worker holds 2/W of them (all at W = 1).
      CHECK(held == doctest::Approx(2.0 * whole_params * std::min(1.0, 2.0 / w)).epsilon(0.05));
      // The parameters: all of them but under zero 3 in a group (measured: pages in RAM).
      if (stage < 3 || w == 1)
        CHECK(b["params"].get<double>() == whole_params);
      else
        CHECK_MESSAGE(b["params"].get<double>() <= whole_params, b.dump());
      if (w == 4)
        CHECK_MESSAGE(b["grads"].get<double>() < 0.8 * 3.0 * whole_params, b.dump());
    }
  }
}

}  // namespace

TEST_CASE("zero 2 at dp 1, 2, 3 and 4 ends on cohort train's hash, its gradients sharded") {
  sharded_at_every_dp(2);
}

TEST_CASE("zero 3 at dp 1, 2, 3 and 4 ends on cohort train's hash, its parameters sharded") {
  sharded_at_every_dp(3);
}

// A kill loses the victim's shards on it, and each has a second copy on a survivor: the
// three re-cut from memory (no checkpoint exists: checkpoint_every is 0) and the run ends
// on the fault-free bits.
TEST_CASE("zero 1: a killed worker's shards come back from their replicas, same hash") {
  kill_and_recut(1, "worker-2", 60);
}

// Under zero 2 the victim's gradient shard dies with its step (the survivors rerun the step);
// its optimizer state lives on in its replica as under zero 1.
TEST_CASE("zero 2: a killed worker's shards come back from their replicas, same hash") {
  kill_and_recut(2, "worker-1", 70);
}

// Under zero 3 the victim's parameter shards come back with its optimizer state, from the
// same replicas (the parameters are one more slot of the re-cut).
TEST_CASE("zero 3: a killed worker's shards come back from their replicas, same hash") {
  kill_and_recut(3, "worker-3", 50);
}

// A scale down is a drain at a step boundary, a scale up a joiner that holds nothing: both
// re-cut, the joiner's shards coming from the members that hold them, and the bits hold,
// under each stage (zero 2's gradient holders follow the optimizer state's cut; zero 3's
// parameters are one more slot of it).
static void scale_down_and_up(int stage) {
  temp_dir dir;
  // Long enough that the joiner enters before the end: it is in by step ~400 in Release
  // (the scale-up at 100, then ~3 s to start and join); under the sanitizers the join and
  // the steps are both slower, so the step it enters at moves little.
  const int steps = 1500;
  const std::string cfg = dir.write("cfg.yaml", small_yaml(dir.path(), "bitwise", steps));
  const std::string hash = train_summary(dir, cfg)["params_sha256"];
  const nlohmann::json s =
      zero_launch(dir, cfg, 4, "zero-scale",
                  {"--set", "elastic.min_workers=3", "--set", "elastic.max_workers=4", "--inject",
                   "scale to=3 at step=50", "--inject", "scale to=4 at step=100"},
                  stage);
  check_fault_free(s, hash, steps);
  CHECK(s["dp"] == 4);
  const auto cuts = events_of(s, "reshard");
  REQUIRE_MESSAGE(cuts.size() >= 2, s["events"].dump());
  CHECK(cuts.front()["members"] == 3);
  CHECK(cuts.back()["members"] == 4);
  const auto joined = events_of(s, "joined");
  REQUIRE(!joined.empty());
}

TEST_CASE("zero 1: scale 4 -> 3 -> 4 re-cuts twice and ends on cohort train's hash") {
  scale_down_and_up(1);
}

TEST_CASE("zero 2: scale 4 -> 3 -> 4 re-cuts twice and ends on cohort train's hash") {
  scale_down_and_up(2);
}

TEST_CASE("zero 3: scale 4 -> 3 -> 4 re-cuts twice and ends on cohort train's hash") {
  scale_down_and_up(3);
}

// Checkpoints stay one logical model: a dp 4 run's sharded checkpoint resumes at dp 2 with
// zero 2, at dp 3 with replicated state (zero 0), and in `cohort train`, all on the bits of
// the uninterrupted run; a replicated checkpoint resumes sharded the same way.
TEST_CASE("zero 1 checkpoints resume at another dp, replicated, and in cohort train") {
  temp_dir dir;
  const int steps = 60;
  std::string yaml = small_yaml(dir.path(), "bitwise", steps);
  yaml.replace(yaml.find("checkpoint_every: 0"), 19, "checkpoint_every: 30");
  const std::string cfg = dir.write("cfg.yaml", yaml);
  const std::string hash = train_summary(dir, cfg)["params_sha256"];
  const nlohmann::json first = zero_launch(dir, cfg, 4, "zero-ckpt");
  check_fault_free(first, hash, steps);
  const std::string at30 = dir.path() + "/ckpt/step_00000030";
  for (int r = 0; r < 4; ++r)
    CHECK(fs::exists(at30 + "/zero_r" + std::to_string(r) + ".safetensors"));
  CHECK(fs::exists(at30 + "/shard_p0_t0.safetensors"));

  // At dp 2 under zero 2: the state's parts are the same for both stages.
  const nlohmann::json dp2 = zero_launch(dir, cfg, 2, "zero-resume-dp2",
                                         {"--resume-from", at30, "--set",
                                          "fault_tolerance.checkpoint_dir=" + dir.path() + "/c2"},
                                         2);
  CHECK(dp2["params_sha256"] == hash);

  const std::string out3 = dir.path() + "/replicated.json";
  child_process replicated({"launch", cfg, "-q", "--summary", out3, "--set", "cluster.workers=3",
                            "--resume-from", at30, "--set",
                            "fault_tolerance.checkpoint_dir=" + dir.path() + "/c3"},
                           dir.path(), "zero-resume-replicated");
  CHECK(finish_launch(replicated, out3, run_timeout)["params_sha256"] == hash);

  const std::string out1 = dir.path() + "/train-resumed.json";
  int rc = -1;
  run_capture("train " + cfg + " -q --summary " + out1 + " --resume-from " + at30 +
                  " --set fault_tolerance.checkpoint_dir=" + dir.path() + "/c1",
              &rc);
  REQUIRE(rc == 0);
  CHECK(read_json(out1)["params_sha256"] == hash);

  // The other way: `cohort train`'s replicated checkpoint, resumed sharded at dp 3.
  run_capture("train " + cfg + " -q --set fault_tolerance.checkpoint_dir=" + dir.path() + "/t",
              &rc);
  REQUIRE(rc == 0);
  const nlohmann::json sharded =
      zero_launch(dir, cfg, 3, "zero-from-replicated",
                  {"--resume-from", dir.path() + "/t/step_00000030", "--set",
                   "fault_tolerance.checkpoint_dir=" + dir.path() + "/c4"});
  CHECK(sharded["params_sha256"] == hash);
}

// Under zero 3 no member holds all the parameters between steps: a checkpoint gathers them
// first, so rank 0 still writes them whole (shard p0_t0, what PyTorch reads) beside every
// rank's part; written at dp 4, it resumes under zero 3 at dp 2 and at dp 1 on the bits of
// the uninterrupted run.
TEST_CASE("zero 3 checkpoints written at dp 4 resume at dp 2 and dp 1") {
  temp_dir dir;
  const int steps = 12;
  std::string yaml = gpt_yaml(dir.path(), steps);
  yaml.replace(yaml.find("checkpoint_every: 0"), 19, "checkpoint_every: 6");
  const std::string cfg = dir.write("cfg.yaml", yaml);
  const std::string hash = train_summary(dir, cfg)["params_sha256"];
  const nlohmann::json first = zero_launch(dir, cfg, 4, "zero3-ckpt", {}, 3);
  check_fault_free(first, hash, steps);
  const std::string at6 = dir.path() + "/ckpt/step_00000006";
  CHECK(fs::exists(at6 + "/shard_p0_t0.safetensors"));
  for (int w : {2, 1}) {
    CAPTURE(w);
    const nlohmann::json s = zero_launch(
        dir, cfg, w, "zero3-resume-dp" + std::to_string(w),
        {"--resume-from", at6, "--set",
         "fault_tolerance.checkpoint_dir=" + dir.path() + "/c" + std::to_string(w)},
        3);
    CHECK(s["params_sha256"] == hash);
  }
}

// A sharded checkpoint missing a part is refused with the folder and the part named, and
// nothing is trained from it.
TEST_CASE("zero 1: a checkpoint missing a sharded part is refused, naming it") {
  temp_dir dir;
  std::string yaml = small_yaml(dir.path(), "bitwise", 20);
  yaml.replace(yaml.find("checkpoint_every: 0"), 19, "checkpoint_every: 10");
  const std::string cfg = dir.write("cfg.yaml", yaml);
  zero_launch(dir, cfg, 2, "zero-damaged");
  const std::string at10 = dir.path() + "/ckpt/step_00000010";
  fs::remove(at10 + "/zero_r1.safetensors");
  int rc = -1;
  const std::string out =
      run_capture("train " + cfg + " -q --resume-from " + at10 + " --set " +
                      "fault_tolerance.checkpoint_dir=" + dir.path() + "/again",
                  &rc, true);
  CHECK(rc != 0);
  CHECK_MESSAGE(out.find("zero_r1") != std::string::npos, out);
}

// Two neighbours killed at once take both copies of the shard between them: the survivors'
// re-cut says so, the coordinator rolls every member back to the last checkpoint, the
// steps since are replayed, and the run still ends on the fault-free bits.
TEST_CASE("zero 1: two neighbours killed at once roll back to the checkpoint, same hash") {
  temp_dir dir;
  const int steps = 120;
  std::string yaml = small_yaml(dir.path(), "bitwise", steps);
  yaml.replace(yaml.find("timeout_ms: 2000"), 16, "timeout_ms: 500");
  yaml.replace(yaml.find("checkpoint_every: 0"), 19, "checkpoint_every: 20");
  const std::string cfg = dir.write("cfg.yaml", yaml);
  const std::string hash = train_summary(dir, cfg)["params_sha256"];
  const nlohmann::json s = zero_launch(
      dir, cfg, 4, "zero-two-kills",
      {"--set", "elastic.min_workers=2", "--set", "elastic.respawn=false", "--inject",
       "kill rank=1 at step=50", "--inject", "kill rank=2 at step=50"});
  check_fault_free(s, hash, steps);
  CHECK(s["dp"] == 2);
  CHECK(events_of(s, "kill").size() == 2);
  CHECK_MESSAGE(s["aborted_steps"].get<int>() >= 1, s.dump());
}

// Without a checkpoint to roll back to, the same double loss ends the run with the lost
// range named and what to set.
TEST_CASE("zero 1: a lost shard with no checkpoint ends the run saying what to set") {
  temp_dir dir;
  std::string yaml = small_yaml(dir.path(), "bitwise", 120);
  yaml.replace(yaml.find("timeout_ms: 2000"), 16, "timeout_ms: 500");
  const std::string cfg = dir.write("cfg.yaml", yaml);
  const std::string out = dir.path() + "/lost.json";
  child_process launch({"launch", cfg, "-q", "--summary", out, "--set", "train.zero=1", "--set",
                        "cluster.workers=4", "--set", "elastic.min_workers=2", "--set",
                        "elastic.respawn=false", "--inject", "kill rank=1 at step=50",
                        "--inject", "kill rank=2 at step=50"},
                       dir.path(), "zero-lost");
  const auto code = launch.wait_exit(run_timeout);
  REQUIRE(code.has_value());
  CHECK(*code != 0);
  const std::string all = launch.out() + launch.err();
  CHECK_MESSAGE(all.find("held only by members that are gone") != std::string::npos, all);
  CHECK_MESSAGE(all.find("checkpoint_every") != std::string::npos, all);
}

// `cohort train --resume-from` at train.steps runs no step and writes its final checkpoint at
// once: the optimizer state it was resumed with must be in it (sharded state is released at
// a resume and loaded when first needed), so a run resumed from that checkpoint ends where
// one resumed from the original does.
TEST_CASE("zero 1: cohort train resumed at its last step writes the optimizer state it loaded") {
  temp_dir dir;
  std::string yaml = small_yaml(dir.path(), "bitwise", 20);
  yaml.replace(yaml.find("checkpoint_every: 0"), 19, "checkpoint_every: 10");
  const std::string cfg = dir.write("cfg.yaml", yaml);
  auto train = [&](const std::string& args) {
    int rc = -1;
    const std::string out = run_capture("train " + cfg + " -q --set train.zero=1 " + args, &rc);
    REQUIRE_MESSAGE(rc == 0, out);
  };
  train("");
  const std::string first = dir.path() + "/ckpt/step_00000020";
  REQUIRE(fs::exists(first));
  train("--resume-from " + first + " --set fault_tolerance.checkpoint_dir=" + dir.path() +
        "/again");
  const std::string again = dir.path() + "/again/step_00000020";
  REQUIRE(fs::exists(again));
  train("--resume-from " + first + " --set train.steps=30 --set fault_tolerance.checkpoint_dir=" +
        dir.path() + "/a --summary " + dir.path() + "/a.json");
  train("--resume-from " + again + " --set train.steps=30 --set fault_tolerance.checkpoint_dir=" +
        dir.path() + "/b --summary " + dir.path() + "/b.json");
  CHECK(read_json(dir.path() + "/a.json")["params_sha256"] ==
        read_json(dir.path() + "/b.json")["params_sha256"]);
}
