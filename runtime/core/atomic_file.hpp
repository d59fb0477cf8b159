// Atomic small-file writes for summaries, markers and caches: write a temporary file in
// the same directory, fsync it, rename it over the target, fsync the directory. A reader
// sees the old file or the new one, never half of one. Large tensors use runtime/ckpt.
#pragma once
#include <string>

namespace cohort {

/// Replaces `path` with `contents` atomically; the new file has permission bits MODE (less
/// the umask). Throws io_error naming the path and the system error. No temporary file is
/// left behind on failure.
void write_file_atomic(const std::string& path, const std::string& contents, unsigned mode = 0644);

}  // namespace cohort
