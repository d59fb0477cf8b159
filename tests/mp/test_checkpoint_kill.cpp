// A `cohort train` killed (SIGKILL) while a checkpoint is being written: the half-written
// folder is never offered for resume, and `--resume` goes on from the checkpoint before it
// to the same parameters (bitwise) as a run that was never interrupted. The window is
// opened with the COHORT_TEST_CHECKPOINT_DELAY_MS test aid (shards written, marker not yet).
#include <doctest/doctest.h>

#include <csignal>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>

#include "runtime/ckpt/checkpoint_dir.hpp"
#include "tests/mp/dp_util.hpp"
#include "tests/mp/mp_util.hpp"

using namespace cohort;
using namespace cohort::mp;
namespace fs = std::filesystem;

namespace {

// 20 steps of a small MLP, bitwise, a checkpoint every 5 steps into DIR/ckpt.
std::string kill_yaml(const std::string& dir) {
  return "model:\n  kind: mlp\n  hidden: [32]\n"
         "train:\n  steps: 20\n  global_batch: 64\n  micro_batch: 16\n  lr: 0.01\n"
         "  warmup_steps: 0\n  determinism: bitwise\n  eval_every: 0\n"
         "fault_tolerance:\n  checkpoint_every: 5\n  keep: 3\n  checkpoint_dir: " +
         dir + "/ckpt\n";
}

// STEPS steps of kill_yaml's MLP, only the final checkpoint, SIGTERM stopping at a checkpoint.
std::string sigterm_yaml(const std::string& dir, int steps) {
  std::string yaml = kill_yaml(dir);
  yaml.replace(yaml.find("steps: 20"), 9, "steps: " + std::to_string(steps));
  yaml.replace(yaml.find("checkpoint_every: 5"), 19, "checkpoint_every: 0");
  return yaml + "  on_sigterm: checkpoint\n";
}

// A folder of DIR that holds a shard but no COMPLETE marker, newer than every complete one.
std::optional<std::pair<int64_t, std::string>> in_flight(const std::string& dir) {
  const auto newest = newest_checkpoint(dir);
  if (!newest) return std::nullopt;
  for (const auto& e : scan_checkpoints(dir).folders) {
    if (!e.complete && e.step > newest->first && fs::exists(e.path + "/" + shard_file_name(0, 0)) &&
        !fs::exists(e.path + "/" + checkpoint_marker))
      return std::make_pair(e.step, e.path);
  }
  return std::nullopt;
}

// The uninterrupted `cohort train` run of CFG, checkpointing into its own folder; its summary.
nlohmann::json reference(const temp_dir& dir, const std::string& cfg) {
  const std::string out = dir.path() + "/ref.json";
  int rc = -1;
  run_capture("train " + cfg + " -q --summary " + out +
                  " --set fault_tolerance.checkpoint_dir=" + dir.path() + "/ref-ckpt",
              &rc);
  REQUIRE(rc == 0);
  const nlohmann::json ref = nlohmann::json::parse(read_file(out), nullptr, false);
  REQUIRE(ref.is_object());
  return ref;
}

}  // namespace

TEST_CASE("cohort train killed inside a checkpoint write resumes from the one before it") {
  temp_dir dir;
  const std::string cfg = dir.write("cfg.yaml", kill_yaml(dir.path()));
  const std::string ckdir = dir.path() + "/ckpt";

  const nlohmann::json ref = reference(dir, cfg);
  const std::string hash = ref["params_sha256"];
  REQUIRE(hash.size() == 64);
  CHECK(ref["checkpoint"] == checkpoint_path(dir.path() + "/ref-ckpt", 20));

  std::pair<int64_t, std::string> killed_in;
  int64_t before = -1;
  {
    child_process first({"train", cfg, "-q"}, dir.path(), "killed",
                        {"COHORT_TEST_CHECKPOINT_DELAY_MS=" + std::to_string(3000 * time_scale())});
    // A complete checkpoint exists and the next one's shard is on disk without its marker.
    // Read once: the shard seen without its marker is the one the kill must leave so.
    std::optional<std::pair<int64_t, std::string>> seen;
    REQUIRE_MESSAGE(eventually(milliseconds(60000),
                               [&] { return (seen = in_flight(ckdir)).has_value(); }),
                    first.err());
    killed_in = *seen;
    before = newest_checkpoint(ckdir)->first;
    first.signal(SIGKILL);
    const auto code = first.wait_exit(milliseconds(10000));
    REQUIRE(code.has_value());
    CHECK(*code == 128 + SIGKILL);
    CHECK(first.err().find("COHORT_TEST_CHECKPOINT_DELAY_MS") != std::string::npos);
  }
  CHECK(before % 5 == 0);
  CHECK(killed_in.first == before + 5);
  // The half-written folder is still there, and nothing offers it.
  CHECK(fs::exists(killed_in.second));
  CHECK_FALSE(fs::exists(killed_in.second + "/" + checkpoint_marker));
  for (const auto& [step, path] : list_checkpoints(ckdir)) CHECK(step != killed_in.first);
  REQUIRE(newest_checkpoint(ckdir).has_value());
  CHECK(newest_checkpoint(ckdir)->first == before);

  const std::string out = dir.path() + "/resumed.json";
  child_process again({"train", cfg, "-q", "--resume", "--summary", out}, dir.path(), "resumed");
  const auto code = again.wait_exit(milliseconds(120000));
  REQUIRE_MESSAGE(code.has_value(), "resume did not finish: " << again.err());
  CHECK_MESSAGE(*code == 0, again.out() << again.err());
  CHECK(again.err().find("resumed from " + checkpoint_path(ckdir, before) + " at step " +
                         std::to_string(before)) != std::string::npos);
  const nlohmann::json s = nlohmann::json::parse(read_file(out), nullptr, false);
  REQUIRE(s.is_object());
  CHECK(s["steps_completed"] == 20);
  CHECK(s["params_sha256"] == hash);  // as if never interrupted
  CHECK(s["checkpoint"] == checkpoint_path(ckdir, 20));
  // The rewritten folder is complete now; the newest three are kept.
  const auto all = list_checkpoints(ckdir);
  REQUIRE(all.size() == 3);
  CHECK(all.back().first == 20);
  CHECK(all.front().first == 10);
}

TEST_CASE("cohort train --resume with only an interrupted checkpoint is a usage error (exit 2)") {
  temp_dir dir;
  const std::string cfg = dir.write("cfg.yaml", kill_yaml(dir.path()));
  const std::string ckdir = dir.path() + "/ckpt";
  fs::create_directories(checkpoint_path(ckdir, 5));
  dir.write("ckpt/step_00000005/shard_p0_t0.safetensors", "half a shard");
  child_process again({"train", cfg, "-q", "--resume"}, dir.path(), "resume-none");
  const auto code = again.wait_exit(milliseconds(60000));
  REQUIRE(code.has_value());
  CHECK(*code == 2);
  CHECK(again.err().find("no complete checkpoint") != std::string::npos);
  CHECK(again.err().find("step_00000005: incomplete") != std::string::npos);
}

TEST_CASE("a launch killed inside a checkpoint write resumes on another worker count") {
  temp_dir dir;
  std::string yaml = kill_yaml(dir.path());
  yaml.replace(yaml.find("steps: 20"), 9, "steps: 40");
  const std::string cfg = dir.write("cfg.yaml", yaml);
  const std::string ckdir = dir.path() + "/ckpt";
  const std::string hash = reference(dir, cfg)["params_sha256"];
  REQUIRE(hash.size() == 64);

  std::pair<int64_t, std::string> killed_in;
  int64_t before = -1;
  {
    // Rank 0 of three workers writes; the whole launch dies while a marker is missing.
    child_process first({"launch", cfg, "-q", "--set", "cluster.workers=3"}, dir.path(),
                        "launch-killed", {"COHORT_TEST_CHECKPOINT_DELAY_MS=" + std::to_string(3000 * time_scale())});
    // Read once: the shard seen without its marker is the one the kill must leave so.
    std::optional<std::pair<int64_t, std::string>> seen;
    REQUIRE_MESSAGE(eventually(milliseconds(60000),
                               [&] { return (seen = in_flight(ckdir)).has_value(); }),
                    first.err());
    killed_in = *seen;
    before = newest_checkpoint(ckdir)->first;
    first.signal(SIGKILL);  // the children follow (PDEATHSIG)
    first.wait_exit(milliseconds(10000));
  }
  CHECK_FALSE(fs::exists(killed_in.second + "/" + checkpoint_marker));
  REQUIRE(newest_checkpoint(ckdir).has_value());
  CHECK(newest_checkpoint(ckdir)->first == before);

  const std::string out = dir.path() + "/resumed.json";
  child_process again(
      {"launch", cfg, "-q", "--resume", "--summary", out, "--set", "cluster.workers=2"}, dir.path(),
      "launch-resumed");
  const auto code = again.wait_exit(milliseconds(120000));
  REQUIRE_MESSAGE(code.has_value(), "resume did not finish: " << again.err());
  CHECK_MESSAGE(*code == 0, again.out() << again.err());
  CHECK(again.err().find("resuming from " + checkpoint_path(ckdir, before)) != std::string::npos);
  const nlohmann::json s = nlohmann::json::parse(read_file(out), nullptr, false);
  REQUIRE(s.is_object());
  CHECK(s["steps_completed"] == 40);
  CHECK(s["dp"] == 2);
  CHECK(s["params_sha256"] == hash);  // three workers, a kill mid-write, two workers: same bits
  CHECK(s["checkpoint"] == checkpoint_path(ckdir, 40));
}

TEST_CASE("fault_tolerance.on_sigterm: checkpoint: SIGTERM to a launch and `ctl stop --checkpoint` "
          "each stop the run at a checkpoint (exit 3), and --resume on other worker counts ends "
          "on the fault-free hash") {
  temp_dir dir;
  const std::string cfg = dir.write("cfg.yaml", sigterm_yaml(dir.path(), 3000));
  const std::string ckdir = dir.path() + "/ckpt";
  const std::string hash = reference(dir, cfg)["params_sha256"];
  REQUIRE(hash.size() == 64);
  // Runs a launch of WORKERS until its job is past step AT (RESUME: from the newest
  // checkpoint), then STOP(launch, its address); its summary once it has exited 3.
  auto stop_at = [&](int workers, int64_t at, bool resume,
                     const std::function<void(child_process&, const job_address&)>& stop) {
    const std::string out = dir.path() + "/run-" + std::to_string(workers) + ".json";
    std::vector<std::string> args{"launch", cfg, "-q", "--summary", out, "--set",
                                  "cluster.workers=" + std::to_string(workers)};
    if (resume) args.push_back("--resume");
    child_process launch(args, dir.path(), "stop-" + std::to_string(workers));
    const job_address ep = address_of(launch);
    REQUIRE(eventually(milliseconds(60000), [&] {
      const nlohmann::json s = ctl_status(ep);
      return s.is_object() && s["step"].get<int64_t>() > at;
    }));
    stop(launch, ep);
    const auto code = launch.wait_exit(milliseconds(60000));
    REQUIRE_MESSAGE(code.has_value(), launch.err());
    CHECK_MESSAGE(*code == 3, launch.out() << launch.err());
    const nlohmann::json s = nlohmann::json::parse(read_file(out), nullptr, false);
    REQUIRE_MESSAGE(s.is_object(), launch.err());
    REQUIRE(s.contains("stopped_early"));
    const int64_t end = s["stopped_early"]["end_step"];
    CHECK(s["steps_completed"] == end);
    CHECK(s["checkpoint"] == checkpoint_path(ckdir, end));
    CHECK(newest_checkpoint(ckdir)->first == end);  // complete: the marker is written
    return s;
  };
  const nlohmann::json first = stop_at(3, 100, false, [](child_process& l, const job_address&) {
    l.signal(SIGTERM);
  });
  CHECK(first["stopped_early"]["asked_by"] == "SIGTERM");
  const int64_t end1 = first["stopped_early"]["end_step"];
  const nlohmann::json second =
      stop_at(2, end1 + 100, true, [](child_process&, const job_address& ep) {
        int rc = -1;
        const std::string said = run_capture("ctl " + ep.ctl_args() + " stop --checkpoint", &rc);
        CHECK_MESSAGE(rc == 0, said);
      });
  CHECK(second["stopped_early"]["asked_by"] == "ctl");
  CHECK(second["stopped_early"]["end_step"].get<int64_t>() > end1);
  const std::string out = dir.path() + "/last.json";
  child_process last({"launch", cfg, "-q", "--resume", "--summary", out, "--set",
                      "cluster.workers=4"},
                     dir.path(), "last");
  const auto code = last.wait_exit(milliseconds(120000));
  REQUIRE_MESSAGE(code.has_value(), last.err());
  CHECK_MESSAGE(*code == 0, last.out() << last.err());
  const nlohmann::json s = nlohmann::json::parse(read_file(out), nullptr, false);
  REQUIRE(s.is_object());
  CHECK(s["steps_completed"] == 3000);
  CHECK_FALSE(s.contains("stopped_early"));
  CHECK(s["params_sha256"] == hash);  // 3 workers, a stop, 2 workers, a stop, 4 workers
}

TEST_CASE("fault_tolerance.on_sigterm: checkpoint: SIGTERM to cohort train writes the step it "
          "reached and exits 3, and --resume ends on the uninterrupted run's bits") {
  temp_dir dir;
  const std::string cfg = dir.write("cfg.yaml", sigterm_yaml(dir.path(), 5000));
  const std::string ckdir = dir.path() + "/ckpt";
  const std::string hash = reference(dir, cfg)["params_sha256"];
  child_process first({"train", cfg, "--set", "train.log_every=10"}, dir.path(), "train-term");
  // A progress line: the run is past its first steps (and the watcher is up).
  REQUIRE(eventually(milliseconds(30000), [&] { return first.err().find("step 10/") != std::string::npos; }));
  first.signal(SIGTERM);
  const auto code = first.wait_exit(milliseconds(30000));
  REQUIRE(code.has_value());
  CHECK_MESSAGE(*code == 3, first.err());
  const auto newest = newest_checkpoint(ckdir);
  REQUIRE(newest.has_value());
  CHECK(newest->first > 0);
  CHECK(newest->first < 5000);
  CHECK(first.err().find("stopped early at step " + std::to_string(newest->first)) !=
        std::string::npos);
  const std::string out = dir.path() + "/resumed.json";
  int rc = -1;
  run_capture("train " + cfg + " -q --resume --summary " + out, &rc);
  CHECK(rc == 0);
  const nlohmann::json s = nlohmann::json::parse(read_file(out), nullptr, false);
  REQUIRE(s.is_object());
  CHECK(s["params_sha256"] == hash);
}
