// The memory pool behind every tensor: fixed-size pages carved out of chunks taken from one
// device (the host's memory by default, a GPU's for a model on it) and kept for the whole
// run. Owns allocation, reuse and the statistics a user can read; does not know tensors or
// shapes, and leaves what memory is to its device (runtime/nn/device.hpp).
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

namespace cohort::nn {

class device;

/// What the pool holds, read at one instant.
///
/// Definitions (pages are `page_bytes` each):
/// - bytes_in_use: sum of the byte sizes callers asked for, over live allocations.
/// - peak_bytes: the largest bytes_in_use seen since the pool was made (or reset_peak()).
/// - blocks_in_use: pages held by live allocations (an allocation of b bytes holds
///   max(1, ceil(b / page_bytes)) contiguous pages).
/// - blocks_total: pages taken from the OS; never shrinks during a run.
/// - blocks_free: blocks_total - blocks_in_use.
/// - largest_free_run: the longest run of contiguous free pages inside one chunk, i.e.
///   the largest allocation (in pages) that can be served without asking the OS.
/// - fragmentation: external fragmentation of the free pages,
///   1 - largest_free_run / blocks_free, in [0, 1); 0 when nothing is free. 0 means all
///   free memory is one run; close to 1 means it is scattered in small holes.
/// - internal_waste_bytes: blocks_in_use * page_bytes - bytes_in_use, the tail of the last
///   page of each allocation.
struct pool_stats {
  std::size_t page_bytes = 0;
  std::size_t bytes_in_use = 0;
  std::size_t peak_bytes = 0;
  std::size_t blocks_in_use = 0;
  std::size_t blocks_total = 0;
  std::size_t blocks_free = 0;
  std::size_t largest_free_run = 0;
  std::size_t chunks = 0;
  std::size_t allocations = 0;  ///< live allocations
  double fragmentation = 0.0;
  std::size_t internal_waste_bytes = 0;
};

class pool;

/// A run of pages owned by one tensor storage; returns them to the pool when destroyed.
/// Move-only. The memory is aligned to the page size (at least 64 bytes).
class allocation {
 public:
  allocation() = default;
  allocation(allocation&& o) noexcept { swap(o); }
  allocation& operator=(allocation&& o) noexcept {
    allocation tmp(std::move(o));
    swap(tmp);
    return *this;
  }
  allocation(const allocation&) = delete;
  allocation& operator=(const allocation&) = delete;
  ~allocation() { reset(); }

  /// Start of the memory (null for an empty allocation).
  void* data() const { return data_; }
  /// Bytes the caller asked for.
  std::size_t bytes() const { return bytes_; }
  /// Pages held.
  std::size_t pages() const { return pages_; }
  /// Gives the pages back now.
  void reset();

 private:
  friend class pool;
  void swap(allocation& o) noexcept {
    std::swap(pool_, o.pool_);
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    std::swap(pages_, o.pages_);
  }
  pool* pool_ = nullptr;
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  std::size_t pages_ = 0;
};

/// Page pool. A request takes ceil(bytes/page) contiguous pages: the smallest free run
/// that fits (best fit, lowest address among equals), else a new chunk of
/// max(chunk_pages, needed) pages from the OS. Freed runs merge with free neighbours of
/// the same chunk. Chunks are released only when the pool is destroyed, so every
/// allocation must be gone by then. Thread-safe: one mutex guards all state (the pool is
/// touched at set-up time and a few times per micro-batch, so contention does not matter).
///
/// An account (pool(pool::account, parent)) owns no pages: its allocations come from the
/// parent, whose statistics include them, and its own statistics count only what was taken
/// through it (bytes_in_use, peak_bytes, blocks_in_use, allocations; blocks_total equals
/// blocks_in_use and nothing is free). That measures one kind of memory, e.g. a pipeline
/// stage's activations, inside the process's pool.
class pool {
 public:
  static constexpr std::size_t default_page_bytes = 64 * 1024;
  static constexpr std::size_t default_chunk_pages = 256;  // 16 MiB chunks by default
  /// Tag of the account constructor.
  struct account_t {};
  static constexpr account_t account{};

  /// Host memory; page_bytes must be a power of two >= 64.
  explicit pool(std::size_t page_bytes = default_page_bytes,
                std::size_t chunk_pages = default_chunk_pages);
  /// Memory of DEVICE (which must outlive the pool); chunks are aligned to the page size on
  /// the host, to at least 256 bytes on a GPU.
  explicit pool(device& dev, std::size_t page_bytes = default_page_bytes,
                std::size_t chunk_pages = default_chunk_pages);
  /// An account of `parent`, which must outlive it.
  pool(account_t, pool& parent);
  ~pool();
  pool(const pool&) = delete;
  pool& operator=(const pool&) = delete;

  /// The process-wide pool used when no pool is named.
  static pool& global();

  /// Pages for `bytes` bytes (0 bytes still takes one page, so every allocation has a
  /// distinct address). Throws std::bad_alloc when the OS refuses a chunk.
  allocation allocate(std::size_t bytes);

  /// Statistics at this instant.
  pool_stats stats() const;
  /// Restarts peak tracking from the current bytes_in_use.
  void reset_peak();
  std::size_t page_bytes() const { return page_bytes_; }
  /// The device whose memory this pool hands out.
  device& dev() const { return *dev_; }

 private:
  friend class allocation;
  struct run {
    std::size_t pages;
    std::size_t chunk;
  };
  void release(void* data, std::size_t bytes, std::size_t pages);
  void insert_free(char* start, std::size_t pages, std::size_t chunk);
  void erase_free(std::map<char*, run>::iterator it);

  device* const dev_;
  const std::size_t page_bytes_;
  const std::size_t chunk_pages_;
  pool* const parent_ = nullptr;  // an account's pool (the pages are its)
  mutable std::mutex mu_;
  std::vector<std::pair<char*, std::size_t>> chunks_;     // start, pages
  std::map<char*, run> free_by_addr_;                     // free runs by start address
  std::set<std::pair<std::size_t, char*>> free_by_size_;  // (pages, start): best fit
  std::size_t bytes_in_use_ = 0;
  std::size_t peak_bytes_ = 0;
  std::size_t blocks_in_use_ = 0;
  std::size_t blocks_total_ = 0;
  std::size_t allocations_ = 0;
};

}  // namespace cohort::nn
