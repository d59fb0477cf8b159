// The resume policy of every command: which checkpoint, and whether it can go on.
#include "runtime/train/resume_plan.hpp"

#include "runtime/core/error.hpp"
#include "runtime/core/paths.hpp"
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

resume_plan plan_resume(const config& c, bool resume, resume_by by) {
  resume_plan p;
  if (!resume) return p;
  const std::string dir = expand_user(c.fault_tolerance.checkpoint_dir);
  // The newest complete checkpoint whose every shard passes its checksums and range checks:
  // a damaged one is skipped here, before anything loads it.
  resume_point newest = checkpoint_to_resume(dir);  // usage_error (exit 2) if none
  p.resume = true;
  p.step = newest.step;
  p.path = std::move(newest.path);
  p.skipped = std::move(newest.skipped);
  p.meta = read_checkpoint_metadata(p.path);
  for (const auto& [step, path] : list_checkpoints(dir))
    if (step < p.step) p.earlier = path;
  p.refusal = refusal_of(p, c, dir, by);
  return p;
}

}  // namespace cohort::train
