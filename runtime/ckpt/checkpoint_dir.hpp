// The run's checkpoint directory: one folder per checkpoint, DIR/step_NNNNNNNN/ (N = the
// next step to run), holding one safetensors file per shard (shard_p<P>_t<T>.safetensors)
// and a COMPLETE marker written last. Owns the names, the marker, listing, the newest and
// pruning; not what a shard holds (checkpoint.hpp) nor when checkpoints are taken.
// A checkpoint counts only when COMPLETE exists and names shards that all exist with the
// recorded sizes, so a write killed at any moment is never listed. Whatever else a user or a
// crash leaves in DIR is listed as skipped with a reason, never followed (symbolic links)
// and never deleted: pruning removes only the files it writes, inside step folders it names.
#pragma once
#include <cstdint>
#include <limits>
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
/// feedback_r<R>.safetensors: DP rank R's error-feedback memory (comm.compression with
/// error feedback, onebit_adam; docs/checkpoints.md), one per rank of the group that wrote it.
std::string feedback_file_name(int rank);
/// The rank R of a file named feedback_file_name(R), or -1 for any other name.
int feedback_rank_of(const std::string& file);
/// zero_r<R>.safetensors: DP rank R's shard of the parameters and optimizer state when the
/// optimizer state is sharded (train.zero: 1; docs/sharding.md), one per rank of the group.
std::string zero_file_name(int rank);
/// The rank R of a file named zero_file_name(R), or -1 for any other name.
int zero_rank_of(const std::string& file);

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

/// Mode of every folder a checkpoint write creates (DIR, its missing parents, step folders)
/// and of every file it writes: the owner's only (a checkpoint holds the whole model).
inline constexpr unsigned checkpoint_folder_mode = 0700;
inline constexpr unsigned checkpoint_file_mode = 0600;

/// Creates PATH and its missing parents as folders of checkpoint_folder_mode, fsyncing the
/// folder that holds each new one so the entry survives a crash. An existing folder (or a
/// symbolic link to one: DIR may live on another disk) is kept as it is. Throws
/// checkpoint_error naming PATH, or untrusted_folder_error (exit 2) when PATH is not the
/// user's alone (require_private_folder: another owner, writable by group or others, or
/// under a folder others can swap it from).
void make_checkpoint_folders(const std::string& path);

/// A step folder of DIR: a real folder (not a symbolic link) named exactly as
/// checkpoint_path names its step.
struct checkpoint_entry {
  int64_t step = 0;
  std::string path;
  bool complete = false;
  std::string problem;  ///< why it does not count (empty when complete)
};

/// An entry of DIR whose name starts with "step_" but that is not a step folder.
struct skipped_entry {
  std::string path;
  std::string reason;  ///< e.g. "a symbolic link (never followed)", "step number out of range"
};

/// What scan_checkpoints finds in DIR.
struct checkpoint_scan {
  std::vector<checkpoint_entry> folders;  ///< oldest first, complete or not
  std::vector<skipped_entry> skipped;     ///< in name order
  std::string error;                      ///< set when DIR exists but cannot be listed
};

/// Every step folder in DIR and every other step_* entry with the reason it is skipped;
/// empty when DIR does not exist. Never throws on what DIR holds (odd names, plain files,
/// symbolic links, special files, unreadable or partial markers); reads no shard data.
checkpoint_scan scan_checkpoints(const std::string& dir);

/// Complete checkpoints in DIR as (step, folder), oldest first; empty when DIR does not exist.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir);

/// The newest complete checkpoint in DIR, if any (complete: its marker and shard sizes hold;
/// checkpoint_to_resume, checkpoint.hpp, also checks the contents).
std::optional<std::pair<int64_t, std::string>> newest_checkpoint(const std::string& dir);

/// Keeps the newest KEEP complete checkpoints of DIR at or below step UPTO and removes the
/// older ones, plus incomplete folders older than the newest of those (left by a killed
/// write). Folders above UPTO are never touched: the writer passes the step it just
/// completed, and a later step is either still being written or another run's (a job
/// started afresh in a folder where an earlier job got further must not lose its own
/// checkpoints, nor the one in flight, to that job's). Only step folders scan_checkpoints
/// lists are touched, and in them only what remove_checkpoint removes. Never throws.
void prune_checkpoints(const std::string& dir, int keep,
                       int64_t upto = std::numeric_limits<int64_t>::max());

/// Removes the files a checkpoint write makes in STEP_DIR (COMPLETE first, so that it never
/// looks complete while half removed; shard_p<P>_t<T>.safetensors; their temporaries), then
/// the folder if nothing else is left in it. Never follows a symbolic link: when STEP_DIR is
/// one, nothing is removed. Best effort; returns true when the folder is gone.
bool remove_checkpoint(const std::string& step_dir);

}  // namespace cohort
