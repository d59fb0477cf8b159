// A cache of decoded data-set files, so that a worker (a respawn above all) starts without
// decompressing its data set again: Fashion-MNIST's 26 MB of gzip take ~0.45 s of a core to
// inflate, the cached 47 MB a few milliseconds to read. Owns where the cache lives, the
// cached file's layout and its checks; not what the data means (fashion_mnist.cpp).
//
// A cached file is the decoded IDX (dims and payload) with the source's identity (size,
// mtime, inode, device) and a CRC-32 of the payload. It is used only when the source is
// unchanged and every check holds; anything else (a missing, stale, truncated or corrupt
// file, a folder another user could change, a full disk) falls back to decoding the
// source, with a warning where the cache itself is at fault. The cache never makes a load
// fail that would succeed without it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/data/byte_view.hpp"
#include "runtime/data/fashion_mnist.hpp"

namespace cohort {

/// An IDX file's dims and payload, from the cache or decoded.
struct cached_idx {
  std::vector<int64_t> dims;
  byte_view data;
};

/// The cache folder: $COHORT_CACHE_DIR, else $XDG_CACHE_HOME/cohort, else $HOME/.cache/cohort.
/// Empty (no cache) when COHORT_CACHE_DIR is "none" or none of them is set.
std::string data_cache_dir();

/// Where read_idx_cached keeps the decoded form of SOURCE (an absolute path) under CACHE_DIR.
std::string cached_idx_path(const std::string& cache_dir, const std::string& source);

/// read_idx_gz(PATH, EXPECTED_DIMS) through the cache in CACHE_DIR: read from it when it
/// holds PATH's decoded form, else decoded and (when the payload has at least MIN_BYTES)
/// written there for the next load, atomically (a temporary file renamed). A cached payload
/// is mapped read-only, not copied. CACHE_DIR empty: no cache. Errors of the source are read_idx_gz's (data_error); the cache's are warnings.
cached_idx read_idx_cached(const std::string& path, int expected_dims, const std::string& cache_dir,
                           std::size_t min_bytes = std::size_t{1} << 20);

}  // namespace cohort
