// Small path helpers shared by every part that opens user-given paths (data.cache_dir,
// fault_tolerance.checkpoint_dir). Owns "~" expansion only; it never touches the disk.
// Configs keep paths as written (so a config's hash does not depend on $HOME); expand
// them where the path is opened.
#pragma once
#include <string>

namespace cohort {

/// Expands a leading "~" ("~" alone or "~/rest") to $HOME, or to the passwd home
/// directory when HOME is unset or empty, and "~user" / "~user/rest" to that user's
/// home. Any other path is returned unchanged. Throws usage_error when the home
/// directory cannot be found (unknown user, no HOME and no passwd entry).
std::string expand_user(const std::string& path);

}  // namespace cohort
