// The resume policy of every command: which checkpoint, and whether it can go on.
#include "runtime/train/resume_plan.hpp"

#include <filesystem>

#include "runtime/core/error.hpp"
#include "runtime/core/folder_trust.hpp"
#include "runtime/core/paths.hpp"
#include "runtime/core/sha256.hpp"
#include "runtime/train/trainer.hpp"

namespace cohort::train {

namespace {

// Why the checkpoint of P cannot go on with C, run BY (null: it can). A job refuses what
// would fail on every worker; the trainer's own load names the optimizer and the grid.
std::exception_ptr refusal_of(const resume_plan& p, const config& c, const std::string& dir,
                              resume_by by) {
  const int64_t steps = c.train.steps;
  try {
    if (by == resume_by::trainer) {
      if (p.step > steps)
        throw usage_error("--resume: the newest checkpoint in " + dir + " is at step " +
                          std::to_string(p.step) + ", past train.steps (" + std::to_string(steps) +
                          "): raise train.steps to train on");
      return nullptr;
    }
    if (p.meta.optimizer != c.train.optimizer)
      throw checkpoint_error(
          p.path + ": holds " + p.meta.optimizer +
          " optimizer state but the config says train.optimizer: " + c.train.optimizer);
    // Shards are per stage and TP rank: another pp x tp cannot load them.
    require_layout(p.path, p.meta, c.parallel.pp, c.parallel.tp);
    if (p.step >= steps)
      throw usage_error("--resume: " + p.path + " is at step " + std::to_string(p.step) +
                        ", the end of train.steps (" + std::to_string(steps) +
                        "): nothing left to train");
  } catch (const error&) {
    return std::current_exception();
  }
  return nullptr;
}

}  // namespace

void resume_plan::enforce() const {
  if (refusal) std::rethrow_exception(refusal);
}

std::string resume_plan::fallback() const {
  return !earlier.empty() ? "remove " + path + " to resume from " + earlier
                          : "no earlier checkpoint is left: run without --resume";
}

std::string run_identity(const config& c) {
  config k = c;
  k.source.clear();
  k.cluster = {};
  k.parallel = {};
  k.train.steps = k.train.log_every = k.train.eval_every = k.train.eval_tokens = 0;
  k.train.threads = k.train.micro_batch = 0;
  // Where the steps run is not what the run is: a GPU run goes on on the CPU, and back.
  k.train.device.clear();
  k.train.precision.clear();
  k.train.optimizer.clear();
  k.data.dir.clear();
  k.data.cache_dir.clear();
  k.comm = {};
  k.fault_tolerance = {};
  k.elastic = {};
  k.control = {};
  k.ha = {};
  k.faults.clear();
  return sha256_hex("cohort run identity 1\n" + dump_config(k));
}

std::map<std::string, std::string> model_metadata(const config& c) {
  std::map<std::string, std::string> m{{"model.kind", c.model.kind}};
  if (c.model.kind == "gpt") m["model.n_head"] = std::to_string(c.model.n_head);
  return m;
}

namespace {

// Refuses a checkpoint of another run found by --resume, saying whose it is.
void require_own_run(const resume_plan& p, const config& c, const std::string& dir) {
  const std::string mine = run_identity(c);
  const auto it = p.meta.extra.find(run_identity_key);
  if (it != p.meta.extra.end() && it->second == mine) return;
  const auto kind = p.meta.extra.find("model.kind");
  const std::string whose =
      it == p.meta.extra.end()
          ? "a run that recorded no run identity (an older cohort, or another tool)"
          : "another run (run identity " + it->second.substr(0, 16) + ", config hash " +
                p.meta.config_hash.substr(0, 16) +
                (kind != p.meta.extra.end() ? ", model " + kind->second : std::string()) + ")";
  throw usage_error(
      "--resume: the newest checkpoint in " + dir + ", " + p.path + ", was written by " + whose +
      ", not by this config's run (run identity " + mine.substr(0, 16) +
      "): it is not resumed silently. To go on from it anyway, pass --resume-from " + p.path +
      " instead of --resume; to start afresh, run without --resume or point "
      "fault_tolerance.checkpoint_dir at a folder of this run");
}

}  // namespace

resume_plan plan_resume(const config& c, bool resume, resume_by by,
                        const std::string& resume_from) {
  resume_plan p;
  const std::string dir = expand_user(c.fault_tolerance.checkpoint_dir);
  // The run writes there: refused now, not at its first checkpoint (the folder and those
  // above it only; nothing in it is read without a resume).
  require_private_folder(dir, "checkpoint folder", 0);
  if (!resume && resume_from.empty()) return p;
  // The newest complete checkpoint whose every shard passes its checksums and range checks:
  // a damaged one is skipped here, before anything loads it.
  resume_point newest = resume_from.empty() ? checkpoint_to_resume(dir)  // usage_error if none
                                            : checkpoint_from(expand_user(resume_from));
  p.resume = true;
  p.step = newest.step;
  p.path = std::move(newest.path);
  p.skipped = std::move(newest.skipped);
  p.meta = read_checkpoint_metadata(p.path);
  // Only --resume-from takes another run's checkpoint: the user named it.
  if (resume_from.empty()) require_own_run(p, c, dir);
  const std::string folder =
      resume_from.empty() ? dir : std::filesystem::path(p.path).parent_path().string();
  for (const auto& [step, path] : list_checkpoints(folder))
    if (step < p.step) p.earlier = path;
  p.refusal = refusal_of(p, c, folder, by);
  return p;
}

}  // namespace cohort::train
