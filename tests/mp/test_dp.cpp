// Data-parallel training across real processes: `cohort launch` with 1, 2 and 4 workers
// against `cohort train` in one process. Bitwise mode must give the same parameter hash
// for every DP size; fast mode must agree within float tolerance; a communicator failure
// in the middle of a step must abort that step on every worker (and the run still ends
// with the fault-free hash). Short runs of a small MLP on Fashion-MNIST; the measured
// bytes against the ring's closed form, and the measured overlap of a GPT's buckets.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/mp/dp_util.hpp"

using namespace cohort;
using namespace cohort::mp;
using std::chrono::milliseconds;

namespace {

// `cohort launch` with N workers; its summary (null json if it failed).
nlohmann::json launch_summary(const temp_dir& dir, const std::string& cfg, int workers,
                              std::string* log = nullptr, const std::string& transport = "auto") {
  const std::string tag = "launch" + std::to_string(workers) + transport;
  const std::string out = dir.path() + "/" + tag + ".json";
  child_process launch(
      {"launch", cfg, "-q", "--summary", out, "--set", "cluster.workers=" + std::to_string(workers),
       "--set", "comm.transport=" + transport},
      dir.path(), tag);
  const auto code = launch.wait_exit(milliseconds(120000));
  if (log != nullptr) *log = launch.out() + launch.err();
  REQUIRE_MESSAGE(code.has_value(), "launch did not finish: " << launch.err());
  CHECK_MESSAGE(*code == 0, launch.out() << launch.err());
  return read_json(out);
}

// gpt_yaml's GPT, 8 steps, with four experts, top-2, in the second block; capacity tight
// enough that tokens are dropped.
std::string moe_gpt_yaml(const std::string& dir) {
  std::string yaml = gpt_yaml(dir, 8);
  const std::string ctx = "  context: 32\n";
  yaml.replace(yaml.find(ctx), ctx.size(),
               ctx + "  moe:\n    experts: 4\n    top_k: 2\n    capacity_factor: 1.0\n"
                     "    every: 2\n");
  return yaml;
}

}  // namespace

TEST_CASE(
    "bitwise: params_sha256 is identical for cohort train and launch with dp 1 2 and 4, over "
    "Gloo and over shared memory") {
  temp_dir dir;
  const std::string cfg = dir.write("cfg.yaml", small_yaml(dir.path(), "bitwise"));
  const nlohmann::json ref = train_summary(dir, cfg);
  const std::string hash = ref["params_sha256"];
  REQUIRE(hash.size() == 64);
  for (const std::string transport : {"gloo", "shm"})
    for (int n : {1, 2, 4}) {
      CAPTURE(n);
      CAPTURE(transport);
      const nlohmann::json s = launch_summary(dir, cfg, n, nullptr, transport);
      REQUIRE(s.is_object());
      CHECK(s["params_sha256"] == hash);
      CHECK(s["params_consistent"] == true);
      CHECK(s["dp"] == n);
      CHECK(s["steps_completed"] == 6);
      CHECK(s["workers"].size() == static_cast<size_t>(n));
      // Same parameters, same held-out evaluation.
      CHECK(s["eval"]["accuracy"] == ref["eval"]["accuracy"]);
      CHECK(s["final_loss"].get<double>() == doctest::Approx(ref["final_loss"].get<double>()));
      for (const auto& w : s["workers"]) {
        CHECK(w["steps"] == 6);
        // Counted by the communicator where it hands each transfer to its transport. Gloo: the
        // ring allreduce's closed form, 2(n-1)/n of 6 steps of int64 gradients (25,450
        // parameters), out and in, within Gloo's segment rounding. Shared memory: each rank
        // copies its gradients into the segment once and the sums out once.
        const double expect =
            transport == "gloo" ? 6.0 * 2.0 * (n - 1) / n * 25450 * 8 : 6.0 * 25450 * 8;
        if (n == 1) {
          CHECK(w["bytes_sent"] == 0);
          CHECK(w["bytes_received"] == 0);
          CHECK(w["overlap"] == 0.0);  // no collective ran: nothing was hidden
        } else {
          CHECK(w["bytes_sent"].get<double>() == doctest::Approx(expect).epsilon(0.05));
          CHECK(w["bytes_received"].get<double>() == doctest::Approx(expect).epsilon(0.05));
        }
      }
    }
}

TEST_CASE("overlap is measured: small buckets run inside backward, one bucket cannot") {
  // A 4-block GPT (d_model 64, 211,456 parameters, 0.8 MiB of float gradients) whose
  // backward hands its gradients over block by block: with 0.25 MiB buckets the first three
  // allreduces can run while lower blocks are still in backward; with one bucket for
  // everything the allreduce starts only once backward has handed over its last range, so
  // none of it is hidden.
  temp_dir dir;
  const std::string cfg =
      dir.write("gpt.yaml",
                "model:\n  kind: gpt\n  n_layer: 4\n  n_head: 4\n  d_model: 64\n  context: 32\n"
                "data:\n  dataset: kjv\n"
                "train:\n  steps: 8\n  global_batch: 64\n  micro_batch: 32\n  optimizer: adamw\n"
                "  lr: 0.001\n  seed: 1\n  eval_every: 0\n  eval_tokens: 256\n  determinism: fast\n"
                "fault_tolerance:\n  heartbeat_ms: 100\n  timeout_ms: 2000\n  checkpoint_every: 0\n"
                "  checkpoint_dir: " +
                    dir.path() + "/ckpt\n");
  auto run = [&](const std::string& bucket_mb) {
    const std::string out = dir.path() + "/b" + bucket_mb + ".json";
    int rc = -1;
    const std::string log =
        run_capture("launch " + cfg + " -q --summary " + out +
                        " --set cluster.workers=2 --set comm.bucket_mb=" + bucket_mb,
                    &rc, true);
    INFO(log);
    REQUIRE(rc == 0);
    const nlohmann::json j = read_json(out);
    REQUIRE(j.is_object());
    REQUIRE(j["workers"].size() == 2);
    return j;
  };
  const nlohmann::json small = run("0.25");
  const nlohmann::json one = run("64");
  // The hidden part of each worker's collective time lies inside its backward, so inside
  // its compute time (which also holds forward and the optimizer).
  auto overlaps = [](const nlohmann::json& j) {
    std::vector<double> v;
    for (const auto& w : j["workers"]) {
      const double overlap = w["overlap"], allreduce = w["allreduce_s"];
      const double compute = w["compute_s"];
      CAPTURE(overlap);
      CAPTURE(allreduce);
      CAPTURE(compute);
      REQUIRE(allreduce > 0.0);
      CHECK(overlap * allreduce <= compute);
      v.push_back(overlap);
    }
    return v;
  };
  for (double o : overlaps(small)) {
    MESSAGE("overlap with 0.25 MiB buckets: " << o);
    CHECK(o > 0.15);
  }
  for (double o : overlaps(one)) {
    MESSAGE("overlap with one bucket: " << o);
    CHECK(o < 0.05);
  }
}

TEST_CASE("fast: launch with dp 2 agrees with cohort train within 1e-5 relative") {
  temp_dir dir;
  const std::string cfg = dir.write("cfg.yaml", small_yaml(dir.path(), "fast"));
  const nlohmann::json ref = train_summary(dir, cfg);
  const nlohmann::json s = launch_summary(dir, cfg, 2);
  REQUIRE(s.is_object());
  CHECK(s["params_consistent"] == true);  // every replica applied the same reduced gradient
  const double a = ref["final_loss"], b = s["final_loss"];
  CHECK(std::fabs(a - b) <= 1e-5 * std::fabs(a));
  const double ea = ref["eval"]["loss"], eb = s["eval"]["loss"];
  CHECK(std::fabs(ea - eb) <= 1e-5 * std::fabs(ea));
}

TEST_CASE("a communicator failing mid-step aborts the step on every worker") {
  temp_dir dir;
  const std::string cfg = dir.write("cfg.yaml", small_yaml(dir.path(), "bitwise"));
  const std::string hash = train_summary(dir, cfg)["params_sha256"];
  // Rank 1 aborts its own communicator in the middle of step 3's backward.
  ::setenv("COHORT_TEST_ABORT_COMM", "3:1", 1);
  std::string log;
  const nlohmann::json s = launch_summary(dir, cfg, 3, &log);
  ::unsetenv("COHORT_TEST_ABORT_COMM");
  REQUIRE(s.is_object());
  CHECK(s["aborted_steps"].get<int>() >= 1);
  // The joins (one generation or more: close ones share it), then at least one abort.
  CHECK(s["generation"].get<uint64_t>() >= 2);
  // Had any worker applied the aborted attempt, its parameters (and the hash) would differ.
  CHECK(s["params_consistent"] == true);
  CHECK(s["params_sha256"] == hash);
  CHECK(log.find("aborted") != std::string::npos);
  // Each worker computed every step, or one fewer when the abort caught it still in the
  // last collective of the step before (a commit window: its peers had applied that step)
  // and it took that step's state from a peer instead.
  const bool donor = log.find("state sent from rank") != std::string::npos;
  for (const auto& w : s["workers"])
    CHECK_MESSAGE((w["steps"] == 6 || (donor && w["steps"] == 5)), log);
}

TEST_CASE("a worker killed mid-run is restarted and the run ends on the fault-free hash") {
  temp_dir dir;
  const int steps = 400;
  const std::string cfg = dir.write("cfg.yaml", small_yaml(dir.path(), "bitwise", steps));
  const std::string hash = train_summary(dir, cfg)["params_sha256"];
  const std::string out = dir.path() + "/killed.json";
  child_process launch({"launch", cfg, "-q", "--summary", out, "--set", "cluster.workers=3"},
                       dir.path(), "launch-kill");
  const job_address ep = address_of(launch);
  // Once training is under way, SIGKILL worker-1 (no goodbye, mid-step most likely).
  int64_t victim = 0;
  REQUIRE(eventually(milliseconds(60000), [&] {
    const nlohmann::json s = ctl_status(ep);
    if (!s.is_object() || s["step"].get<int64_t>() < 20) return false;
    for (const auto& w : s["workers"])
      if (w["name"] == "worker-1" && w["state"] == "alive") victim = w["pid"];
    return victim > 0;
  }));
  ::kill(static_cast<pid_t>(victim), SIGKILL);
  const auto code = launch.wait_exit(milliseconds(180000));
  REQUIRE_MESSAGE(code.has_value(), "launch did not finish: " << launch.err());
  CHECK_MESSAGE(*code == 0, launch.out() << launch.err());
  const nlohmann::json s = read_json(out);
  REQUIRE(s.is_object());
  CHECK(s["steps_completed"] == steps);
  CHECK(s["params_consistent"] == true);
  // Survivors never applied a step the others discarded, and the restarted worker took the
  // exact state of the step from a live peer: the result is bit for bit the fault-free one.
  CHECK(s["params_sha256"] == hash);
  const std::string log = launch.out() + launch.err();
  CHECK(log.find("restarting worker-1") != std::string::npos);
  CHECK(log.find("state sent from rank") != std::string::npos);
}

TEST_CASE(
    "injected kill and a hang past the timeout end on the fault-free hash and are accounted") {
  temp_dir dir;
  const int steps = 300;
  std::string yaml = small_yaml(dir.path(), "bitwise", steps);
  // A 500 ms failure timeout, so that a 1.5 s hang is declared dead and rejoins.
  yaml.replace(yaml.find("timeout_ms: 2000"), 16, "timeout_ms: 500");
  const std::string cfg = dir.write("cfg.yaml", yaml);
  const std::string hash = train_summary(dir, cfg)["params_sha256"];
  const std::string out = dir.path() + "/faults.json";
  child_process launch(
      {"launch", cfg, "-q", "--summary", out, "--set", "cluster.workers=3", "--inject",
       "kill rank=1 at step=40", "--inject", "hang worker=worker-2 at step=120 for=1500ms"},
      dir.path(), "launch-faults");
  const auto code = launch.wait_exit(milliseconds(180000));
  REQUIRE_MESSAGE(code.has_value(), "launch did not finish: " << launch.err());
  CHECK_MESSAGE(*code == 0, launch.out() << launch.err());
  const nlohmann::json s = read_json(out);
  REQUIRE(s.is_object());
  CHECK(s["params_sha256"] == hash);
  CHECK(s["params_consistent"] == true);
  CHECK(s["aborted_steps"].get<int>() >= 2);
  bool kill = false, hang = false;
  for (const auto& e : s["events"]) {
    if (e["kind"] == "kill") {
      kill = true;
      CHECK(e["step"] == 40);  // rank=1 names rank 1, whichever worker joined second
      REQUIRE(e["detect_ms"].is_number());
      REQUIRE(e["recover_ms"].is_number());
      CHECK(e["detect_ms"].get<double>() <= e["recover_ms"].get<double>());
    }
    if (e["kind"] == "hang") {
      hang = true;
      CHECK(e["worker"] == "worker-2");
      REQUIRE(e["detect_ms"].is_number());           // silent past the timeout: declared dead
      CHECK(e["detect_ms"].get<double>() >= 400.0);  // not before the timeout (some slack)
      REQUIRE(e["recover_ms"].is_number());
      CHECK(e["recover_ms"].get<double>() >= 1500.0);  // it rejoins after the hang ends
    }
  }
  CHECK(kill);
  CHECK(hang);
}

TEST_CASE("launch rejects a bad fault spec before starting anything") {
  temp_dir dir;
  const std::string cfg = dir.write("cfg.yaml", small_yaml(dir.path(), "fast"));
  int rc = -1;
  run_capture("launch " + cfg + " --inject 'kill rank=1 at stp=3'", &rc);
  CHECK(rc == 2);
}

TEST_CASE("a launch killed outright resumes from its checkpoint with another worker count") {
  temp_dir dir;
  const int steps = 1000;
  std::string yaml = small_yaml(dir.path(), "bitwise", steps);
  yaml.replace(yaml.find("checkpoint_every: 0"), 19, "checkpoint_every: 100");
  const std::string cfg = dir.write("cfg.yaml", yaml);
  const std::string hash = train_summary(dir, cfg)["params_sha256"];
  std::filesystem::remove_all(dir.path() + "/ckpt");  // only the launch's checkpoints count
  launch_killed_at({"launch", cfg, "-q", "--set", "cluster.workers=3"}, dir, "launch-first", 250,
                   milliseconds(60000));
  const std::string out = dir.path() + "/resumed.json";
  child_process again(
      {"launch", cfg, "-q", "--resume", "--summary", out, "--set", "cluster.workers=2"}, dir.path(),
      "launch-resume");
  const auto code = again.wait_exit(milliseconds(120000));
  REQUIRE_MESSAGE(code.has_value(), "resume did not finish: " << again.err());
  CHECK_MESSAGE(*code == 0, again.out() << again.err());
  CHECK(again.err().find("resuming from") != std::string::npos);
  const nlohmann::json s = read_json(out);
  REQUIRE(s.is_object());
  CHECK(s["steps_completed"] == steps);
  CHECK(s["dp"] == 2);
  // Three workers up to the checkpoint, two after it: the same parameters as one process.
  CHECK(s["params_sha256"] == hash);

  // Nothing left to resume from: a clear usage error, exit 2.
  int rc = -1;
  run_capture("launch " + cfg + " --resume", &rc);
  CHECK(rc == 2);
}

TEST_CASE("a killed worker's cost: every part present, the parts summing to kill -> whole") {
  temp_dir dir;
  const int steps = 300;
  const std::string cfg = dir.write("cfg.yaml", small_yaml(dir.path(), "bitwise", steps));
  const std::string hash = train_summary(dir, cfg)["params_sha256"];
  const std::string out = dir.path() + "/cost.json";
  // min_workers is the world (3): the two survivors wait for the respawn to load the job,
  // so it enters before the end whatever the machine's speed, and every part is reached.
  child_process launch({"launch", cfg, "-q", "--summary", out, "--set", "cluster.workers=3",
                        "--inject", "kill rank=1 at step=40"},
                       dir.path(), "launch-cost");
  const auto code = launch.wait_exit(milliseconds(180000));
  REQUIRE_MESSAGE(code.has_value(), "launch did not finish: " << launch.err());
  CHECK_MESSAGE(*code == 0, launch.out() << launch.err());
  const nlohmann::json s = read_json(out);
  REQUIRE(s.is_object());
  CHECK(s["params_sha256"] == hash);
  CHECK(s["dp"] == 3);  // the respawn is back
  // The warm worker, started with the run's workers, took the victim's name.
  CHECK_MESSAGE(launch.out().find(", warm)\n") != std::string::npos, launch.out());
  REQUIRE(s["ettr"].is_number());
  CHECK(s["ettr"].get<double>() > 0.0);
  CHECK(s["ettr"].get<double>() <= 1.0);
  int kills = 0;
  for (const auto& e : s["events"]) {
    if (e["kind"] != "kill") continue;
    ++kills;
    CAPTURE(e.dump());
    const nlohmann::json& c = e["cost"];
    double sum = 0;
    for (const char* k :
         {"detect_ms", "rerun_ms", "respawn_ms", "load_ms", "admit_ms", "enter_ms"}) {
      REQUIRE_MESSAGE(c[k].is_number(), k << " missing");
      CHECK(c[k].get<double>() >= 0.0);
      sum += c[k].get<double>();
    }
    // The parts are gaps between the coordinator's stamps: they sum to the total up to the
    // doubles' rounding (1 microsecond allowed).
    REQUIRE(c["whole_ms"].is_number());
    CHECK(std::abs(sum - c["whole_ms"].get<double>()) <= 1e-3);
    // recover_ms (kill -> the next commit) lies within it; here that commit is the
    // respawn's entry, the survivors having waited for it.
    CHECK(std::abs(e["recover_ms"].get<double>() - c["whole_ms"].get<double>()) <= 1e-3);
    CHECK(c["aborted_steps"].get<int>() >= 1);  // the step the kill broke
    CHECK(c["steps"].get<int>() == 1);          // the respawn's first step
    CHECK(c["transfer_ms"].is_number());        // its state came from a live peer
    CHECK(c["stalled_ms"].is_number());
    CHECK(c["reduced_ms"].is_number());
  }
  CHECK(kills == 1);
}

TEST_CASE("with elastic.min_workers below the world the survivors go on without the dead worker") {
  temp_dir dir;
  const std::string cfg = dir.write("cfg.yaml", small_yaml(dir.path(), "bitwise", 200));
  const std::string hash = train_summary(dir, cfg)["params_sha256"];
  const std::string out = dir.path() + "/shrunk.json";
  child_process launch(
      {"launch", cfg, "-q", "--no-respawn", "--summary", out, "--set", "cluster.workers=3", "--set",
       "elastic.min_workers=2", "--inject", "kill rank=2 at step=40"},
      dir.path(), "launch-shrink");
  const auto code = launch.wait_exit(milliseconds(120000));
  REQUIRE_MESSAGE(code.has_value(), "launch did not finish: " << launch.err());
  CHECK_MESSAGE(*code == 0, launch.out() << launch.err());
  const nlohmann::json s = read_json(out);
  REQUIRE(s.is_object());
  CHECK(s["dp"] == 2);  // the last steps ran on the two survivors
  CHECK(s["workers"].size() == 2);
  CHECK(s["params_sha256"] == hash);  // bitwise: the DP size does not change the result
}

TEST_CASE("moe expert parallelism: ep 2 and 4 at dp 4 end on cohort train's hash (bitwise), "
          "with tokens per expert and the all-to-all in the summary, and after a worker holding "
          "experts is killed mid-run") {
  temp_dir dir;
  std::string yaml = moe_gpt_yaml(dir.path());
  // Six micro-batches: at dp 4 two ranks have one fewer, and take part in a pass without one.
  const std::string batch = "global_batch: 8";
  yaml.replace(yaml.find(batch), batch.size(), "global_batch: 12");
  const nlohmann::json ref = train_summary(dir, dir.write("moe.yaml", yaml));
  const std::string hash = ref["params_sha256"];
  REQUIRE(hash.size() == 64);
  for (int ep : {2, 4}) {
    CAPTURE(ep);
    const std::string cfg =
        dir.write("moe_ep" + std::to_string(ep) + ".yaml",
                  yaml + "parallel:\n  ep: " + std::to_string(ep) + "\n");
    const nlohmann::json s = launch_summary(dir, cfg, 4);
    REQUIRE(s.is_object());
    CHECK(s["params_sha256"] == hash);
    CHECK(s["steps_completed"] == 8);
    const nlohmann::json& m = s["moe"];
    CHECK(m["ep"] == ep);
    REQUIRE(m["tokens_per_expert"].size() == 4);
    int64_t sum = 0;
    for (const auto& n : m["tokens_per_expert"]) sum += n.get<int64_t>();
    // Every token of every step reached its experts or was dropped: 8 steps x 12 sequences x
    // 32 tokens x top-2 assignments in the one MoE block.
    CHECK(sum + m["dropped"].get<int64_t>() == 8 * 12 * 32 * 2);
    CHECK(m["tokens"].get<int64_t>() == sum);
    CHECK(m["alltoall"]["calls"].get<int64_t>() > 0);
    CHECK(m["alltoall"]["bytes_sent"].get<int64_t>() > 0);
    for (const auto& w : s["workers"]) CHECK(w["moe"]["alltoall_calls"].get<int64_t>() > 0);
  }
  // ep 4, rank 1 (expert 1 of 4) SIGKILLed at step 4, not started again: the other three
  // compute every expert between them from then on (expert e on rank e mod 3; the state of
  // each is in every worker).
  const std::string cfg = dir.path() + "/moe_ep4.yaml";
  const std::string out = dir.path() + "/killed.json";
  child_process launch({"launch", cfg, "-q", "--summary", out, "--set", "cluster.workers=4",
                        "--set", "elastic.respawn=false", "--set", "elastic.min_workers=2",
                        "--inject", "kill rank=1 at step=4"},
                       dir.path(), "launch-ep-kill");
  const nlohmann::json k = finish_launch(launch, out, milliseconds(120000));
  CHECK(k["params_sha256"] == hash);
  CHECK(events_of(k, "kill").size() == 1);
  CHECK(k["workers"].size() == 3);
}

namespace {

// Expert parallelism with sharded state (train.zero): the experts' optimizer state, gradients
// and (zero 3) parameters live on two workers each, as every other element's; a block's gather
// brings a member its own experts only; a kill, a drain and a join re-cut them from memory.
// moe_gpt_yaml's GPT with six micro-batches (two ranks run a pass without one) and experts
// 16 x d_model wide, so that one expert's parameters (133 KB) span many pages; STEPS steps.
std::string moe_sharded_yaml(const std::string& dir, int steps) {
  std::string yaml = moe_gpt_yaml(dir);
  const std::string batch = "global_batch: 8";
  yaml.replace(yaml.find(batch), batch.size(), "global_batch: 12");
  const std::string every = "    every: 2\n";
  yaml.replace(yaml.find(every), every.size(), every + "    hidden: 512\n");
  yaml.replace(yaml.find("steps: 8"), 8, "steps: " + std::to_string(steps));
  return yaml;
}

// The "__metadata__" of the safetensors file at PATH (its header: 8 bytes of length, then JSON).
nlohmann::json safetensors_metadata(const std::string& path) {
  const std::string bytes = read_file(path);
  REQUIRE(bytes.size() >= 8);
  uint64_t len = 0;
  for (int i = 7; i >= 0; --i) len = (len << 8) | static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)]);
  REQUIRE(bytes.size() >= 8 + len);
  const nlohmann::json header = nlohmann::json::parse(bytes.substr(8, len), nullptr, false);
  REQUIRE(header.is_object());
  return header.value("__metadata__", nlohmann::json::object());
}

// `cohort launch` of CFG with 4 workers and EXTRA; its summary.
nlohmann::json launch4(const temp_dir& dir, const std::string& cfg, const std::string& tag,
                       const std::vector<std::string>& extra) {
  const std::string out = dir.path() + "/" + tag + ".json";
  std::vector<std::string> args = {"launch", cfg, "-q", "--summary", out, "--set",
                                   "cluster.workers=4"};
  args.insert(args.end(), extra.begin(), extra.end());
  child_process launch(args, dir.path(), tag);
  return finish_launch(launch, out, milliseconds(120000));
}

}  // namespace

TEST_CASE("moe expert parallelism with sharded state: zero 2 and 3 at ep 4 end on cohort "
          "train's hash (dp 4 and 5), a member gathers only its experts, and the worker of an "
          "expert killed is re-cut from memory") {
  temp_dir dir;
  const std::string cfg = dir.write("moe.yaml", moe_sharded_yaml(dir.path(), 8));
  const std::string hash = train_summary(dir, cfg)["params_sha256"];
  REQUIRE(hash.size() == 64);
  std::map<int, double> params_peak;  // ep -> the largest member's, zero 3
  for (int zero : {2, 3})
    for (int ep : {1, 4}) {
      if (zero == 2 && ep == 1) continue;
      CAPTURE(zero);
      CAPTURE(ep);
      std::vector<std::string> extra = {"--set", "train.zero=" + std::to_string(zero), "--set",
                                        "parallel.ep=" + std::to_string(ep)};
      if (zero == 3 && ep == 4) extra.insert(extra.end(), {"--set", "fault_tolerance.checkpoint_every=4"});
      const nlohmann::json s =
          launch4(dir, cfg, "z" + std::to_string(zero) + "ep" + std::to_string(ep), extra);
      CHECK(s["params_sha256"] == hash);
      CHECK(s["steps_completed"] == 8);
      for (const auto& w : s["workers"]) {
        const nlohmann::json& b = w["model_state_bytes"];
        // Optimizer state: 2 of 4 shards (its own and its neighbour's) of two AdamW slots.
        const double whole = 2.0 * 4.0 * s["num_params"].get<double>();
        CHECK(b["optimizer"].get<double>() + b["replica"].get<double>() ==
              doctest::Approx(whole / 2).epsilon(0.05));
        if (zero == 3)
          params_peak[ep] = std::max(params_peak[ep], b["params"].get<double>());
      }
    }
  // With ep 4 a member gathers 1 of the 4 experts of the MoE block, with ep 1 all 4: its peak
  // is lower by about 3 experts (400 KB), less what its own shards hold of them; 1 expert's
  // worth is the floor asserted.
  const double expert_bytes = 4.0 * (2 * 512 * 32 + 512 + 32);
  CHECK(params_peak[4] < params_peak[1] - expert_bytes);
  // The experts' cut is written down with the checkpoint (4 shards, each holding one whole
  // expert of 33,312 elements: ranges of that size at least), and read back by it: the
  // checkpoint of step 4 resumes in cohort train and at dp 2, ep 2, zero 2 on the same hash.
  const std::string at4 = dir.path() + "/ckpt/step_00000004";
  const nlohmann::json head = safetensors_metadata(at4 + "/shard_p0_t0.safetensors");
  REQUIRE_MESSAGE(head.contains("zero.cut"), head.dump());
  const std::string cut = head["zero.cut"];
  CHECK(std::count(cut.begin(), cut.end(), ';') == 3);
  {
    const std::string out = dir.path() + "/resumed.json";
    child_process train({"train", cfg, "-q", "--summary", out, "--resume-from", at4}, dir.path(),
                        "train-resumed");
    const nlohmann::json r = finish_launch(train, out, milliseconds(120000));
    CHECK(r["params_sha256"] == hash);
    const nlohmann::json dp2 = launch4(dir, cfg, "resumed-dp2",
                                       {"--set", "cluster.workers=2", "--set", "train.zero=2",
                                        "--set", "parallel.ep=2", "--resume-from", at4});
    CHECK(dp2["dp"] == 2);
    CHECK(dp2["params_sha256"] == hash);
  }
  // dp 5, ep 4: EP groups of 4 and of 1 (the one alone has no exchange, computes every expert
  // itself and still gathers as the others do).
  const nlohmann::json five = launch4(dir, cfg, "z3dp5",
                                      {"--set", "cluster.workers=5", "--set", "train.zero=3",
                                       "--set", "parallel.ep=4"});
  CHECK(five["dp"] == 5);
  CHECK(five["params_sha256"] == hash);
  // zero 3, ep 4: the worker of expert 1 killed at step 4, not restarted; the three left
  // re-cut its shards from their copies and end on the same hash.
  const nlohmann::json k =
      launch4(dir, cfg, "z3kill",
              {"--set", "train.zero=3", "--set", "parallel.ep=4", "--set",
               "elastic.respawn=false", "--set", "elastic.min_workers=2", "--inject",
               "kill rank=1 at step=4"});
  CHECK(k["params_sha256"] == hash);
  CHECK(events_of(k, "kill").size() == 1);
  CHECK(events_of(k, "reshard").size() == 1);
  CHECK(k["workers"].size() == 3);
}

TEST_CASE("moe expert parallelism with sharded state: a drain to 3 and a join back to 4 re-cut "
          "the experts twice and end on cohort train's hash") {
  temp_dir dir;
  // Long enough for the joiner to start (~3 s) before the end.
  const std::string cfg = dir.write("moe300.yaml", moe_sharded_yaml(dir.path(), 300));
  const std::string hash = train_summary(dir, cfg)["params_sha256"];
  const nlohmann::json s =
      launch4(dir, cfg, "z3scale",
              {"--set", "train.zero=3", "--set", "parallel.ep=4", "--set",
               "elastic.min_workers=3", "--set", "elastic.max_workers=4", "--inject",
               "scale to=3 at step=20", "--inject", "scale to=4 at step=40"});
  CHECK(s["params_sha256"] == hash);
  const auto cuts = events_of(s, "reshard");
  REQUIRE_MESSAGE(cuts.size() >= 2, s["events"].dump());
  CHECK(cuts.front()["members"] == 3);
  CHECK(cuts.back()["members"] == 4);
  CHECK(!events_of(s, "joined").empty());
}

TEST_CASE("moe: a mixture-of-experts GPT ends on cohort train's hash at dp 2 and 4 "
          "(bitwise), and after a worker is killed mid-run") {
  temp_dir dir;
  const std::string cfg = dir.write("moe.yaml", moe_gpt_yaml(dir.path()));
  const nlohmann::json ref = train_summary(dir, cfg);
  const std::string hash = ref["params_sha256"];
  REQUIRE(hash.size() == 64);
  for (int n : {2, 4}) {  // dp 1 is cohort train's own arithmetic (the case above)
    CAPTURE(n);
    const nlohmann::json s = launch_summary(dir, cfg, n);
    REQUIRE(s.is_object());
    CHECK(s["params_sha256"] == hash);
    CHECK(s["steps_completed"] == 8);
  }
  // dp 4, rank 1 SIGKILLed at step 4: the survivors go on, the launcher starts it again.
  const std::string out = dir.path() + "/killed.json";
  child_process launch({"launch", cfg, "-q", "--summary", out, "--set", "cluster.workers=4",
                        "--set", "elastic.respawn=true", "--inject", "kill rank=1 at step=4"},
                       dir.path(), "launch-moe-kill");
  const nlohmann::json k = finish_launch(launch, out, milliseconds(120000));
  CHECK(k["params_sha256"] == hash);
  CHECK(events_of(k, "kill").size() == 1);
}
