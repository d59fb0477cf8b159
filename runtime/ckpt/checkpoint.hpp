// Training checkpoints: parameters under their exact PyTorch names plus optimizer state
// under "optim.<slot>.<param>", with run metadata, in one safetensors file per shard; and
// whole checkpoint folders (shards, then the COMPLETE marker; checkpoint_dir.hpp).
// Owns the naming and metadata layout (docs/checkpoints.md); knows nothing of models,
// optimizers or data sets beyond the buffers and strings it is handed.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/ckpt/checkpoint_dir.hpp"
#include "runtime/ckpt/safetensors.hpp"

namespace cohort {

/// Value of metadata["format"] in every training checkpoint.
inline constexpr const char* training_checkpoint_format = "cohort.training_checkpoint";
/// Version of the layout below; bumped on any incompatible change.
inline constexpr int training_checkpoint_version = 1;

/// One optimizer state tensor: `slot` is the PyTorch state key ("exp_avg", "exp_avg_sq",
/// "momentum_buffer"), `tensor.name` the parameter it belongs to ("fc1.weight").
struct optimizer_state_view {
  std::string slot;
  tensor_view tensor;
};

/// Where an optimizer state tensor is loaded to (same naming as optimizer_state_view).
struct optimizer_state_target {
  std::string slot;
  tensor_target tensor;
};

/// Run facts stored with the tensors. `extra` carries everything else as strings: the data
/// position ("data.*" from data_position::to_metadata), normalisation or vocabulary
/// (dataset::preprocessing_metadata), model shape, grid, ... Its keys must not collide with
/// the reserved ones (format, format_version, step, config_hash, optimizer, sha256).
struct training_metadata {
  int64_t step = 0;         ///< completed optimizer steps; training resumes at this step
  std::string config_hash;  ///< cohort::config_hash of the run's config
  std::string optimizer;    ///< "adamw", "sgd", ... ("" when no optimizer state is stored)
  metadata_map extra;
};

/// "optim.<slot>.<param>": the file name of an optimizer state tensor. Parameters keep their
/// own names, so PyTorch loads them directly after dropping the "optim." entries.
std::string optimizer_tensor_name(const std::string& slot, const std::string& param);

/// Writes params, optimizer state and metadata to `path` atomically (see
/// write_safetensors); returns the file's size and SHA-256. Throws checkpoint_error on a
/// reserved key, a name clash or an I/O failure; the previous file at `path` is then
/// untouched.
written_file save_training_checkpoint(const std::string& path,
                                      const std::vector<tensor_view>& params,
                                      const std::vector<optimizer_state_view>& optimizer_state,
                                      const training_metadata& meta);

/// Reads `path`, checks format and version, the checksum, and that the file holds exactly
/// the given parameters and optimizer state with the same dtypes and shapes; only then
/// copies them all into the targets. Returns the metadata. Throws checkpoint_error naming
/// the file and every mismatch (up to a few) otherwise; targets are untouched then.
training_metadata load_training_checkpoint(
    const std::string& path, const std::vector<tensor_target>& params,
    const std::vector<optimizer_state_target>& optimizer_state, const read_options& opts = {});

/// Reads only the header of a training checkpoint (no data, no checksum): its metadata, for
/// listing checkpoints or choosing one to resume from. Like load_training_checkpoint, it
/// range-checks the run facts (step, optimizer.steps, data.*, parallel.*: counts not negative,
/// data.step the step, samples_seen = step x global_batch) and throws checkpoint_error naming
/// the key otherwise.
training_metadata read_training_metadata(const std::string& path);

// ---- checkpoint folders ----

/// An owned copy of one shard's training state, independent of the live model: what a
/// background writer holds while training goes on. Every parameter is a slice of `params`
/// (and of each optimizer slot's buffer, laid out the same way).
struct shard_snapshot {
  struct entry {
    std::string name;  ///< PyTorch name ("fc1.weight")
    std::vector<int64_t> shape;
    std::size_t offset = 0;  ///< first float in the flat buffers
  };
  int stage = 0;    ///< pipeline stage P of shard_p<P>_t<T>
  int tp_rank = 0;  ///< tensor-parallel rank T
  /// The file's name in the folder; empty: shard_file_name(stage, tp_rank).
  std::string file;
  std::string file_name() const;
  std::vector<entry> layout;
  std::vector<float> params;
  std::vector<std::pair<std::string, std::vector<float>>> optimizer_state;  ///< slot, buffer
  training_metadata meta;  ///< meta.step is the checkpoint's step
};

/// Writes STEP_DIR/shard_p<P>_t<T>.safetensors from a snapshot; returns its marker record.
shard_record write_checkpoint_shard(const std::string& step_dir, const shard_snapshot& s);

/// Writes a whole checkpoint folder: removes whatever STEP_DIR held (its marker first),
/// writes every shard, then (after the COHORT_TEST_CHECKPOINT_DELAY_MS test pause, if
/// set) the COMPLETE marker. Every shard's meta.step must be the same. A crash at any point
/// leaves a folder that is not listed as complete. Throws checkpoint_error.
void write_training_checkpoint(const std::string& step_dir,
                               const std::vector<shard_snapshot>& shards);

/// One writer's part of a checkpoint several processes write together (one shard per
/// pipeline stage / TP rank, docs/checkpoints.md): writes S's shard into STEP_DIR (created
/// when needed), then, if every shard of ALL_SHARDS ((stage, tp_rank) pairs) is in place
/// (and, when S's metadata has "checkpoint.job", carries the same value: a shard an earlier
/// run left behind does not count), the COMPLETE marker with each file's size and SHA-256. The last
/// writer to finish sees every shard and completes the checkpoint; two that finish together write
/// the same marker. Returns true when this call wrote the marker. Throws checkpoint_error.
bool write_checkpoint_part(const std::string& step_dir, const shard_snapshot& s,
                           const std::vector<std::pair<int, int>>& all_shards);
/// The same with every file of the checkpoint named (shards and feedback parts).
bool write_checkpoint_files(const std::string& step_dir, const shard_snapshot& s,
                            const std::vector<std::string>& all_files);

/// Milliseconds COHORT_TEST_CHECKPOINT_DELAY_MS asks the writer to wait between the shards
/// and the marker (0 when unset): a test aid that opens a window to kill a writer in.
int test_checkpoint_delay_ms();

/// Loads shard (STAGE, TP_RANK) of the complete checkpoint folder STEP_DIR: the marker
/// must list it, its whole-file SHA-256 must match the marker, then as
/// load_training_checkpoint. Throws checkpoint_error naming the folder or file and saying
/// what to do; targets are untouched then.
training_metadata load_checkpoint_shard(const std::string& step_dir, int stage, int tp_rank,
                                        const std::vector<tensor_target>& params,
                                        const std::vector<optimizer_state_target>& optimizer_state);

/// Loads FILE of the complete checkpoint folder STEP_DIR the way load_checkpoint_shard loads
/// a shard (listed in the marker, whole-file SHA-256, then load_training_checkpoint).
training_metadata load_checkpoint_file(const std::string& step_dir, const std::string& file,
                                       const std::vector<tensor_target>& params,
                                       const std::vector<optimizer_state_target>& optimizer_state);

/// How many error-feedback parts (feedback_r<R>) the complete checkpoint folder STEP_DIR
/// holds: W when the marker lists feedback_r0 .. feedback_r<W-1> and each says
/// feedback.replicas = W, 0 when it lists none. Throws checkpoint_error for any other set.
int checkpoint_feedback_parts(const std::string& step_dir);
/// How many sharded-state parts (zero_r<R>, train.zero) the complete checkpoint folder
/// STEP_DIR holds, checked as checkpoint_feedback_parts checks its own (metadata zero.parts).
int checkpoint_zero_parts(const std::string& step_dir);

/// The metadata of shard (STAGE, TP_RANK) of the complete checkpoint folder STEP_DIR
/// (marker checked, shard header read; no data, no checksum).
training_metadata read_checkpoint_metadata(const std::string& step_dir, int stage = 0,
                                           int tp_rank = 0);

/// Checks everything a resume from STEP_DIR relies on without loading it into a model: the
/// marker and shard sizes (read_checkpoint_manifest), every shard's whole-file SHA-256
/// against the marker, every shard's header and data checksum, and its metadata (format,
/// ranges, the marker's step). Reads every shard once. Returns the manifest; throws
/// checkpoint_error naming the folder or file and what is wrong.
checkpoint_manifest verify_checkpoint(const std::string& step_dir);

/// The checkpoint --resume goes on from, and what it passed over.
struct resume_point {
  int64_t step = 0;
  std::string path;
  /// "<what>: <why>" for every newer step folder that is incomplete or fails
  /// verify_checkpoint, and every odd step_* entry of the folder (scan_checkpoints).
  std::vector<std::string> skipped;
};

/// The newest checkpoint of DIR that is complete and passes verify_checkpoint, for
/// --resume; the caller reports `skipped`. Throws usage_error (exit 2) when there is none,
/// naming DIR, everything it skipped and why, and what to do; untrusted_folder_error (exit 2,
/// runtime/core/folder_trust.hpp) when DIR, a step folder or a file in one is not the user's
/// alone (owned by another user, writable by group or others, or under a folder that is).
/// ASKER names the option or argument in the message ("--resume", "CKPT").
resume_point checkpoint_to_resume(const std::string& dir, const char* asker = "--resume");

/// The checkpoint `--resume-from PATH` names: PATH itself when it is a step folder (it holds a
/// COMPLETE marker), else the newest one of the checkpoint folder PATH (checkpoint_to_resume).
/// The same checks: the folder's trust, the marker, every shard's checksums and metadata.
resume_point checkpoint_from(const std::string& path, const char* asker = "--resume");

}  // namespace cohort
