// Where a run starts: fresh, or from the newest checkpoint of fault_tolerance.checkpoint_dir
// that is complete, intact and fits the config. One policy for every command that resumes
// (`cohort train`, `cohort coordinator` and so `cohort launch`); printing what it found and
// loading the checkpoint stay with the commands. Not where checkpoints are written or
// verified (runtime/ckpt/).
#pragma once
#include <cstdint>
#include <exception>
#include <map>
#include <string>
#include <vector>

#include "runtime/ckpt/checkpoint.hpp"
#include "runtime/core/config.hpp"

namespace cohort::train {

/// The model facts a checkpoint records beside its tensors: model.kind, and for a GPT
/// model.n_head (the tensors' shapes give its other sizes, not how the width splits into
/// heads), which `cohort generate` reads.
std::map<std::string, std::string> model_metadata(const config& c);

/// Who loads the checkpoint: one process that loads it itself and reports what does not fit
/// as it loads (`cohort train`), or the workers of a job, so that the coordinator must refuse
/// a checkpoint that does not fit before any worker starts (`cohort coordinator`).
enum class resume_by { trainer, job };

/// The plan: a fresh start, or the checkpoint to go on from and what was passed over.
struct resume_plan {
  bool resume = false;               ///< false: a fresh start at step 0
  int64_t step = 0;                  ///< the step training goes on from
  std::string path;                  ///< the checkpoint folder to load (empty: fresh start)
  training_metadata meta;            ///< its metadata (shard p0_t0)
  std::vector<std::string> skipped;  ///< newer step folders passed over: "<what>: <why>"
  std::string earlier;               ///< the newest complete checkpoint before `path`, if any
  /// Why `path` cannot go on with this config (null: it can): a usage_error (exit 2) or a
  /// checkpoint_error. A command names `skipped` first, then calls enforce().
  std::exception_ptr refusal;

  /// Throws the refusal, if any.
  void enforce() const;
  /// What to do when `path` turns out not to fit as it is loaded: remove it to resume from
  /// `earlier`, or run without --resume when pruning left no earlier checkpoint.
  std::string fallback() const;
};

/// Metadata key of the run a checkpoint belongs to (run_identity of its config).
inline constexpr const char* run_identity_key = "run.identity";

/// The identity of C's run: SHA-256 of its config without what a resume may change (the
/// length of the run, the worker count and grid, the optimizer, which is checked on its own,
/// evaluation, logging, threads, micro-batch size, data paths, comm.*, fault_tolerance.*,
/// elastic.*, control.*, ha.*, faults). Two configs share it when one goes on with the
/// other's training: the same model, data set, seed and optimizer settings.
std::string run_identity(const config& c);

/// The plan of a run of C: a fresh start unless RESUME (--resume) or RESUME_FROM
/// (--resume-from PATH, a step folder or a checkpoint folder). With RESUME, the newest
/// checkpoint of C's fault_tolerance.checkpoint_dir whose every shard passes its checks
/// (checkpoint_to_resume); it must carry C's run_identity, else plan_resume throws a
/// usage_error (exit 2) naming the run that wrote it and asking for --resume-from, which takes
/// a checkpoint of any run (checkpoint_from: the same folder and content checks). Always, and
/// first, C's checkpoint_dir (which the run writes) must be the user's alone, and so must the
/// folder of the checkpoint resumed (untrusted_folder_error, exit 2); the plan is refused when
/// it cannot go on:
///   job:     its optimizer is not train.optimizer (checkpoint_error), its pp x tp grid is not
///            the config's (usage_error, train::require_layout), or it is at or past
///            train.steps (usage_error: nothing left to train);
///   trainer: it is past train.steps (usage_error); the load checks optimizer and grid.
/// Throws usage_error (exit 2) when the folder holds no such checkpoint, naming what it
/// skipped and why.
resume_plan plan_resume(const config& c, bool resume, resume_by by,
                        const std::string& resume_from = "");

}  // namespace cohort::train
