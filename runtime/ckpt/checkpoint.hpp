// Training checkpoints: parameters under their exact PyTorch names plus optimizer state
// under "optim.<slot>.<param>", with run metadata, in one safetensors file.
// Owns the naming and metadata layout (docs/checkpoints.md); knows nothing of models,
// optimizers or data sets beyond the buffers and strings it is handed.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

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
/// write_safetensors). Throws checkpoint_error on a reserved key, a name clash or an I/O
/// failure; the previous file at `path` is then untouched.
void save_training_checkpoint(const std::string& path, const std::vector<tensor_view>& params,
                              const std::vector<optimizer_state_view>& optimizer_state,
                              const training_metadata& meta);

/// Reads `path`, checks format and version, the checksum, and that the file holds exactly
/// the given parameters and optimizer state with the same dtypes and shapes; only then
/// copies them all into the targets. Returns the metadata. Throws checkpoint_error naming
/// the file and every mismatch (up to a few) otherwise; targets are untouched then.
training_metadata load_training_checkpoint(
    const std::string& path, const std::vector<tensor_target>& params,
    const std::vector<optimizer_state_target>& optimizer_state);

/// Reads only the header of a training checkpoint (no data, no checksum): its metadata, for
/// listing checkpoints or choosing one to resume from.
training_metadata read_training_metadata(const std::string& path);

}  // namespace cohort
