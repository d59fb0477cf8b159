// The run's checkpoint directory: file names (step_NNNNNNNN.safetensors, N = the next step
// to run), listing, the newest, and pruning to the newest `keep`. Shared by `cohort train`,
// the DP group that writes checkpoints and the coordinator that resumes from them. Files
// are written atomically (safetensors.hpp), so a listed file is always complete.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace cohort {

/// DIR/step_NNNNNNNN.safetensors for STEP.
std::string checkpoint_file(const std::string& dir, int64_t step);

/// Checkpoints in DIR as (step, path), oldest first; empty when DIR does not exist.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir);

/// The newest checkpoint in DIR, if any.
std::optional<std::pair<int64_t, std::string>> newest_checkpoint(const std::string& dir);

/// Removes all but the newest KEEP checkpoints of DIR (best effort).
void prune_checkpoints(const std::string& dir, int keep);

}  // namespace cohort
