// `cohort train CFG`: single-process training, the reference every distributed run must
// match. Progress lines, periodic and final checkpoints, final evaluation, --summary JSON.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>

#include "runtime/ckpt/checkpoint.hpp"
#include "runtime/ckpt/checkpoint_dir.hpp"
#include "runtime/core/atomic_file.hpp"
#include "runtime/core/config.hpp"
#include "runtime/core/paths.hpp"
#include "runtime/core/process.hpp"
#include "runtime/obs/trace_file.hpp"
#include "runtime/step/run_report.hpp"
#include "runtime/train/checkpoint_writer.hpp"
#include "runtime/train/resume_plan.hpp"
#include "runtime/train/trainer.hpp"
#include "tools/commands.hpp"
#include "tools/progress.hpp"

namespace fs = std::filesystem;

namespace cohort::cli {

namespace {

struct train_args {
  std::string config;
  std::vector<std::string> overrides;
  std::string summary;
  std::string trace;
  bool resume = false;
  std::string resume_from;  // --resume-from: a checkpoint of any run, named by the user
  bool quiet = false;
};

// Loads the checkpoint PLAN resumes from into TR; returns the step to go on from. Newer
// folders it passes over are named on stderr with the reason.
int64_t resume(train::trainer& tr, const train::resume_plan& plan) {
  for (const auto& s : plan.skipped) std::fprintf(stderr, "resume: skipped %s\n", s.c_str());
  int64_t start = 0;
  try {
    start = tr.load_checkpoint(plan.path);
  } catch (const checkpoint_error& e) {
    // An intact checkpoint that does not fit this model or config. Name the fix: the
    // checkpoint before it, if pruning left one.
    throw checkpoint_error(std::string(e.what()) + "\n(" + plan.fallback() + ")");
  }
  std::fprintf(stderr, "resumed from %s at step %lld\n", plan.path.c_str(),
               static_cast<long long>(start));
  return start;
}

int run_train(const train_args& a) {
  proc::log_to_stderr();  // stdout carries the final line other programs parse
  config c = load_config(a.config, a.overrides);
  // fault_tolerance.on_sigterm: checkpoint: SIGTERM ends the run after the step in flight,
  // with a checkpoint of it (exit 3); a second SIGTERM or SIGINT ends it at once. Before the
  // trainer's threads exist, so only the watcher sees the signals.
  // (A SIGTERM within 2 s of the first is its echo: srun passes its own on to its task.)
  std::atomic<bool> stop_asked{false};
  std::unique_ptr<proc::signal_watcher> signals;
  std::chrono::steady_clock::time_point asked_at{};
  if (c.fault_tolerance.on_sigterm == "checkpoint")
    signals = std::make_unique<proc::signal_watcher>([&stop_asked, &asked_at](int sig) {
      const auto now = std::chrono::steady_clock::now();
      if (sig == SIGTERM && !stop_asked) {
        asked_at = now;
        stop_asked = true;
        return;
      }
      if (sig == SIGTERM && now - asked_at < std::chrono::seconds(2)) return;
      std::_Exit(128 + sig);
    });
  train::trainer tr(c);
  const auto& t = c.train;
  const bool lm = tr.data().is_language_model();
  const int64_t units_per_step =
      static_cast<int64_t>(t.global_batch) * (lm ? tr.data().context() : 1);
  const std::string ckdir = expand_user(c.fault_tolerance.checkpoint_dir);

  const train::resume_plan plan =
      train::plan_resume(c, a.resume, train::resume_by::trainer, a.resume_from);
  int64_t start = 0;
  if (plan.resume) start = resume(tr, plan);
  plan.enforce();  // after the load, which names a checkpoint that does not fit first

  std::fprintf(
      stderr,
      "train: %s, %lld parameters, %lld steps of %d samples (%d micro-batches), %s, on %s\n",
      c.model.kind.c_str(), static_cast<long long>(tr.model().num_params()),
      static_cast<long long>(t.steps), t.global_batch, tr.micro_batches(), t.determinism.c_str(),
      tr.dev().describe().c_str());
  progress_line progress(t.steps, lm ? "tok/s" : "samples/s", a.quiet, t.log_every);
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  double compute_s = 0.0;
  double last_loss = NAN;
  // Checkpoints are copied here and written in the background: steps never wait for disk.
  train::checkpoint_writer writer(ckdir, c.fault_tolerance.keep);
  // --trace: this one process is the trace's only track; its spans are taken each step.
  std::unique_ptr<obs::trace_file> traced;
  if (!a.trace.empty()) {
    traced = std::make_unique<obs::trace_file>(a.trace, trace::ns(t0));
    traced->name_process(1, "train", 1);
    for (uint32_t k : {trace::compute, trace::control})
      traced->name_thread(1, k, trace::track_name(k));
    trace::enable(true);
  }
  nlohmann::json curve = nlohmann::json::array();
  for (int64_t s = start; s < t.steps; ++s) {
    auto ts = clock::now();
    tr.begin_step();
    double loss_rows = tr.compute_gradients(s, 0, tr.micro_batches());
    tr.apply_step(s);
    const double step_s = std::chrono::duration<double>(clock::now() - ts).count();
    compute_s += step_s;
    last_loss = loss_rows / t.global_batch;
    curve.push_back(step::to_json(
        step::curve_point{s + 1, std::chrono::duration<double>(clock::now() - t0).count(),
                          last_loss, step_s, step_s > 0 ? t.global_batch / step_s : 0.0, 1}));
    if (traced) {
      trace::complete("step", "job", trace::ns(ts), trace::now_ns(), trace::control,
                      trace::args({{"step", s}}));
      for (const trace::event& e : trace::take()) traced->add(1, e);
    }
    if (!std::isfinite(last_loss))
      throw cohort::error("step " + std::to_string(s) + ": loss is not finite (lower train.lr)");
    progress.update(
        s + 1, last_loss,
        static_cast<double>(units_per_step) * (s + 1 - start) / std::max(1e-9, compute_s));
    if (t.eval_every > 0 && (s + 1) % t.eval_every == 0 && s + 1 < t.steps) {
      auto e = tr.evaluate();
      progress.note("eval at step " + std::to_string(s + 1) + ": loss " + std::to_string(e.loss) +
                    (lm ? "" : ", accuracy " + std::to_string(e.accuracy)));
    }
    const bool periodic = c.fault_tolerance.checkpoint_every > 0 &&
                          (s + 1) % c.fault_tolerance.checkpoint_every == 0 && s + 1 < t.steps;
    if (periodic) writer.save(tr, s + 1);
    if (stop_asked && s + 1 < t.steps) {
      progress.finish();
      if (!periodic) writer.save(tr, s + 1);  // written once: a rewrite would unmark it first
      const std::string path = writer.wait();
      std::fprintf(stderr,
                   "train: SIGTERM: stopped early at step %lld of %lld with a checkpoint in %s: "
                   "run again with --resume to go on\n",
                   static_cast<long long>(s + 1), static_cast<long long>(t.steps), path.c_str());
      return exit_stopped;
    }
  }
  progress.finish();
  const double wall = std::chrono::duration<double>(clock::now() - t0).count();
  // A run resumed at its very end already has its final checkpoint: rewriting that folder
  // would only put it at risk (one --resume-from took from elsewhere is written here).
  const bool final_exists =
      start == t.steps && plan.resume && plan.path == checkpoint_path(ckdir, t.steps);
  if (!final_exists) writer.save(tr, t.steps);

  auto ev = tr.evaluate();  // while the final checkpoint is written
  const std::string last_ckpt = final_exists ? checkpoint_path(ckdir, t.steps) : writer.wait();
  const double rate = compute_s > 0 ? units_per_step * (t.steps - start) / compute_s : 0.0;
  std::printf("final: train loss %.4f | eval loss %.4f", last_loss, ev.loss);
  if (!lm) std::printf(" | eval accuracy %.4f", ev.accuracy);
  std::printf(" | %.0f %s | %.1f s | checkpoint %s\n", rate, lm ? "tokens/s" : "samples/s", wall,
              last_ckpt.c_str());

  if (!a.summary.empty()) {
    nlohmann::json j;
    j["steps_completed"] = t.steps;
    j["final_loss"] = last_loss;
    j["eval"] = {{"loss", ev.loss}, {"count", ev.count}};
    if (!lm) j["eval"]["accuracy"] = ev.accuracy;
    j["params_sha256"] = tr.params_sha256();
    j["checkpoint"] = last_ckpt;
    j["throughput"] = {{lm ? "tokens_per_s" : "samples_per_s", rate}};
    j["memory"] = {{"peak_pool_bytes", tr.peak_pool_bytes()}};
    j["wall_s"] = wall;
    j["model"] = c.model.kind;
    j["device"] = tr.dev().name();
    j["precision"] = t.precision;
    j["num_params"] = tr.model().num_params();
    j["config_hash"] = config_hash(c);
    j["curve"] = curve;
    j["events"] = nlohmann::json::array();
    write_file_atomic(a.summary, j.dump(2) + "\n");
  }
  if (traced) {
    for (const trace::event& e : trace::take()) traced->add(1, e);  // the last checkpoint's
    traced->close();
    std::fprintf(stderr, "train: trace written to %s\n", a.trace.c_str());
  }
  return exit_ok;
}

}  // namespace

void add_train(CLI::App& app, int* rc) {
  auto a = std::make_shared<train_args>();
  auto* cmd = app.add_subcommand(
      "train", "Train in one process with no coordinator: the reference for distributed runs");
  cmd->add_option("config", a->config, "YAML config file")->required();
  add_set_option(*cmd, &a->overrides);
  cmd->add_option("--summary", a->summary, "write a JSON summary of the run to PATH");
  add_observe_options(*cmd, &a->trace, nullptr);
  cmd->add_flag("--resume", a->resume,
                "continue from the newest checkpoint in fault_tolerance.checkpoint_dir (one this "
                "run wrote: same model, data and seed; docs/checkpoints.md)");
  cmd->add_option("--resume-from", a->resume_from,
                  "continue from the checkpoint PATH (a step folder, or the newest of a "
                  "checkpoint folder), even one another run wrote; the folder must be yours")
      ->type_name("PATH")
      ->excludes("--resume");
  cmd->add_flag("-q,--quiet", a->quiet, "no progress lines");
  cmd->callback([a, rc] { *rc = run_train(*a); });
}

}  // namespace cohort::cli
