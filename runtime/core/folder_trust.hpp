// Whether a folder a run acts on (checkpoints it resumes from, keys it admits) can be trusted:
// owned by the running user and writable by nobody else, itself, its entries and the folders
// above it, after symbolic links are resolved. Owns the check and its message (what, owner,
// mode, the fix); not where such folders are, nor what they hold.
#pragma once
#include <string>

#include "runtime/core/error.hpp"

namespace cohort {

/// A folder or file another user could have planted or replaced: a usage error (exit code 2),
/// whose message names the path, its owner and mode, and the chmod / chown that fixes it.
class untrusted_folder_error : public usage_error {
 public:
  using usage_error::usage_error;
};

/// Checks that DIR (WHAT names it in messages: "checkpoint folder", "key folder") is a folder
/// that only the running user can change:
///   - DIR itself, after resolving symbolic links: a folder owned by the effective user, not
///     writable by group or others;
///   - a symbolic link on the way (DIR itself or a folder above it): owned by the user or root;
///   - every folder above DIR, as written and as resolved: owned by the user or root, and not
///     writable by group or others unless sticky (as /tmp is: nobody can rename or remove
///     another's entry there), so that nobody can swap DIR for another folder;
///   - with DEPTH >= 1, every entry of DIR (not followed when a link), and with DEPTH >= 2 the
///     entries of its sub-folders, down to DEPTH levels: owned by the user, and (links apart)
///     not writable by group or others.
/// A DIR that does not exist passes when the nearest folder above it that exists passes (the
/// run creates DIR itself, privately). Throws untrusted_folder_error naming the first path
/// that fails, its owner and mode, and how to fix it.
void require_private_folder(const std::string& dir, const std::string& what, int depth = 1);

}  // namespace cohort
