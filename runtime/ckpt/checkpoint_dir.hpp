// The run's checkpoint directory: one folder per checkpoint, DIR/step_NNNNNNNN/ (N = the
// next step to run), holding one safetensors file per shard (shard_p<P>_t<T>.safetensors)
// and a COMPLETE marker written last. Owns the names, the marker, listing, the newest and
// pruning; not what a shard holds (checkpoint.hpp) nor when checkpoints are taken.
// A checkpoint counts only when COMPLETE exists and names shards that all exist with the
// recorded sizes, so a write killed at any moment is never listed.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace cohort {

/// File name of the completion marker inside a checkpoint folder.
inline constexpr const char* checkpoint_marker = "COMPLETE";

/// DIR/step_NNNNNNNN: the folder of the checkpoint taken before STEP.
std::string checkpoint_path(const std::string& dir, int64_t step);
/// Same as checkpoint_path (the name predates checkpoint folders; kept for its callers).
inline std::string checkpoint_file(const std::string& dir, int64_t step) {
  return checkpoint_path(dir, step);
}
/// shard_p<P>_t<T>.safetensors: the file of pipeline stage P, tensor-parallel rank T.
std::string shard_file_name(int stage, int tp_rank);

/// One shard as the marker records it.
struct shard_record {
  std::string file;  ///< name inside the checkpoint folder
  uint64_t bytes = 0;
  std::string sha256;  ///< of the whole file, 64 lowercase hex characters
};

/// What COMPLETE holds: {"step": N, "shards": [{"file", "bytes", "sha256"}, ...]}.
struct checkpoint_manifest {
  int64_t step = 0;
  std::vector<shard_record> shards;
  /// The record of `file`, or null.
  const shard_record* find(const std::string& file) const;
};

/// Writes STEP_DIR/COMPLETE atomically (temporary, fsync, rename, fsync of the folder).
/// Call it only after every shard it names is durably in place. Throws checkpoint_error.
void write_checkpoint_marker(const std::string& step_dir, const checkpoint_manifest& m);

/// Reads STEP_DIR/COMPLETE and checks that every shard it names exists with its recorded
/// size (sha256 is checked when a shard is loaded, not here). Throws checkpoint_error naming
/// the folder and what is missing or wrong (no marker: the write was interrupted).
checkpoint_manifest read_checkpoint_manifest(const std::string& step_dir);

/// Every step_NNNNNNNN folder of DIR, complete or not.
struct checkpoint_entry {
  int64_t step = 0;
  std::string path;
  bool complete = false;
  std::string problem;  ///< why it does not count (empty when complete)
};

/// Every checkpoint folder in DIR, oldest first; empty when DIR does not exist.
std::vector<checkpoint_entry> scan_checkpoints(const std::string& dir);

/// Complete checkpoints in DIR as (step, folder), oldest first; empty when DIR does not exist.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir);

/// The newest complete checkpoint in DIR, if any.
std::optional<std::pair<int64_t, std::string>> newest_checkpoint(const std::string& dir);

/// The newest complete checkpoint of DIR, for --resume. Throws usage_error (exit 2) when
/// there is none, naming DIR, every incomplete folder it ignored and why, and what to do.
std::pair<int64_t, std::string> checkpoint_to_resume(const std::string& dir);

/// Keeps the newest KEEP complete checkpoints of DIR and removes the older ones, plus
/// incomplete folders older than the newest complete one (left by a killed write; newer
/// ones may still be being written). Best effort: a folder that cannot be removed stays.
void prune_checkpoints(const std::string& dir, int keep);

/// Removes one checkpoint folder, its marker first so that it never looks complete while
/// half removed. Best effort.
void remove_checkpoint(const std::string& step_dir);

}  // namespace cohort
