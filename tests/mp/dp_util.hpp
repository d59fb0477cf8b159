// Helpers shared by the data-parallel multi-process tests (test_dp, test_elastic): the small
// MLP config, `cohort train`'s summary as the fault-free reference, `cohort ctl status
// --json`. Only for tests/mp;
// process handling (children, temp dirs, polling) lives in mp_util.hpp.
#pragma once
#include <doctest/doctest.h>

#include <chrono>
#include <csignal>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/mp/mp_util.hpp"

namespace cohort::mp {

/// A config of STEPS steps of a small MLP on Fashion-MNIST: 64 samples in 4 micro-batches
/// of 16 (so up to 4 replicas all have work), DETERMINISM "bitwise" or "fast".
inline std::string small_yaml(const std::string& dir, const std::string& determinism,
                              int steps = 6) {
  return "model:\n  kind: mlp\n  hidden: [32]\n"
         "train:\n  steps: " +
         std::to_string(steps) +
         "\n  global_batch: 64\n  micro_batch: 16\n  lr: 0.01\n"
         "  warmup_steps: 0\n  determinism: " +
         determinism +
         "\n  eval_every: 0\n"
         "fault_tolerance:\n  heartbeat_ms: 100\n  timeout_ms: 2000\n  checkpoint_every: 0\n"
         "  checkpoint_dir: " +
         dir + "/ckpt\n";
}

// STEPS steps of a 2-block GPT on the KJV text: 8 sequences of 32 characters a step in 4
// micro-batches of 2, so a replica of a dp = 2 run still has 2 micro-batches in flight.
inline std::string gpt_yaml(const std::string& dir, int steps = 6, int layers = 2) {
  return "model:\n  kind: gpt\n  n_layer: " + std::to_string(layers) +
         "\n  n_head: 4\n  d_model: 32\n  context: 32\n"
         "data:\n  dataset: kjv\n"
         "train:\n  steps: " +
         std::to_string(steps) +
         "\n  global_batch: 8\n  micro_batch: 2\n  optimizer: adamw\n  lr: 0.001\n"
         "  grad_clip: 1.0\n  warmup_steps: 2\n  seed: 1\n  eval_every: 0\n  eval_tokens: 2048\n"
         "  determinism: bitwise\n"
         "fault_tolerance:\n  heartbeat_ms: 100\n  timeout_ms: 2000\n  checkpoint_every: 0\n"
         "  checkpoint_dir: " +
         dir + "/ckpt\n";
}

/// Parses the file at PATH as JSON; a discarded (null-like) value when it is not JSON.
inline nlohmann::json read_json(const std::string& path) {
  return nlohmann::json::parse(read_file(path), nullptr, false);
}

/// The last N lines of TEXT.
inline std::string last_lines(const std::string& text, int n) {
  size_t at = text.size();
  if (at > 0 && text[at - 1] == '\n') --at;  // the last line's own end
  for (int i = 0; i < n; ++i) {
    const size_t nl = at == 0 ? std::string::npos : text.rfind('\n', at - 1);
    if (nl == std::string::npos) return text;
    at = nl;
  }
  return text.substr(at + 1);
}

/// Waits up to TIMEOUT for `cohort launch` to end (exit 0 expected); its summary at OUT.
inline nlohmann::json finish_launch(child_process& launch, const std::string& out,
                                    std::chrono::milliseconds timeout) {
  const auto code = launch.wait_exit(timeout);
  // The ends first: a report that keeps only a failure's head still shows where it stood.
  REQUIRE_MESSAGE(code.has_value(), "launch did not finish; its last lines:\n"
                                        << last_lines(launch.out(), 40) << "--- stderr:\n"
                                        << last_lines(launch.err(), 40) << "--- all of it:\n"
                                        << launch.out() << launch.err());
  CHECK_MESSAGE(*code == 0, launch.out() << launch.err());
  const nlohmann::json s = read_json(out);
  REQUIRE_MESSAGE(s.is_object(), "no summary: " << launch.out() << launch.err());
  return s;
}

/// Where `cohort launch` can be reached: its coordinator's endpoint and the folder of the
/// keys launch wrote for the job (ctl and extra workers need both).
struct job_address {
  std::string ep;
  std::string keys;
  /// ctl's arguments that reach the job.
  std::string ctl_args() const { return "--coordinator " + ep + " --keys " + keys; }
};

/// The address launch prints ("launch: keys in DIR (...)", then "coordinator listening on").
inline job_address address_of(const child_process& launch) {
  const auto keys = launch.wait_line("launch: keys in ", std::chrono::milliseconds(15000));
  const auto ep = launch.wait_line("coordinator listening on ", std::chrono::milliseconds(15000));
  REQUIRE_MESSAGE((keys.has_value() && ep.has_value()), launch.out() << launch.err());
  return job_address{*ep, keys->substr(0, keys->find(" ("))};
}

/// `cohort ctl ... status --json` against the job at A, parsed; null json when ctl failed.
inline nlohmann::json ctl_status(const job_address& a) {
  int rc = -1;
  const std::string out = run_capture("ctl " + a.ctl_args() + " status --json", &rc);
  if (rc != 0) return nlohmann::json();
  return nlohmann::json::parse(out, nullptr, false);
}

/// Runs `cohort ARGS` (a launch) in DIR until its job has committed STEP steps (within
/// TIMEOUT), then SIGKILLs the launcher (its children follow via PDEATHSIG) and waits for it:
/// a run that dies at once, for the cases that resume from its checkpoints.
inline void launch_killed_at(const std::vector<std::string>& args, const temp_dir& dir,
                             const std::string& tag, int64_t step,
                             std::chrono::milliseconds timeout) {
  child_process launch(args, dir.path(), tag);
  const job_address ep = address_of(launch);
  REQUIRE(eventually(timeout, [&] {
    const nlohmann::json s = ctl_status(ep);
    return s.is_object() && s["step"].get<int64_t>() >= step;
  }));
  launch.signal(SIGKILL);
  launch.wait_exit(std::chrono::milliseconds(10000));
}

/// The summary's events as "KIND WORKER", in order.
inline std::vector<std::string> event_order(const nlohmann::json& summary) {
  std::vector<std::string> order;
  for (const auto& e : summary["events"])
    order.push_back(e["kind"].get<std::string>() + " " + e["worker"].get<std::string>());
  return order;
}

/// How many workers a `ctl status --json` answer lists as alive.
inline int alive_workers(const nlohmann::json& status) {
  int alive = 0;
  for (const auto& w : status["workers"]) alive += w["state"] == "alive";
  return alive;
}

/// The summary's events of KIND, in order.
inline std::vector<nlohmann::json> events_of(const nlohmann::json& summary,
                                             const std::string& kind) {
  std::vector<nlohmann::json> out;
  for (const auto& e : summary["events"])
    if (e["kind"] == kind) out.push_back(e);
  return out;
}

/// The checks every fault scenario shares: all steps ran and ended on the fault-free
/// parameters.
inline void check_fault_free(const nlohmann::json& s, const std::string& hash, int steps) {
  CHECK(s["steps_completed"] == steps);
  CHECK(s["params_consistent"] == true);
  CHECK_MESSAGE(s["params_sha256"] == hash, s.dump());
}

/// `cohort train CFG` in one process; its summary (the fault-free reference).
inline nlohmann::json train_summary(const temp_dir& dir, const std::string& cfg) {
  const std::string out = dir.path() + "/train.json";
  int rc = -1;
  run_capture("train " + cfg + " -q --summary " + out, &rc);
  REQUIRE(rc == 0);
  return read_json(out);
}

/// A 20-step checkpoint of gpt_yaml's small GPT, trained by `cohort train` in DIR (what the
/// serving tests serve): its checkpoint folder.
inline std::string small_checkpoint(const temp_dir& dir) {
  std::string yaml = gpt_yaml(dir.path(), 20);
  const std::string every = "checkpoint_every: 0";
  yaml.replace(yaml.find(every), every.size(), "checkpoint_every: 20");
  train_summary(dir, dir.write("gpt.yaml", yaml));
  return dir.path() + "/ckpt";
}

}  // namespace cohort::mp
