// The device memory pool: blocks of a few fixed size classes carved from large chunks
// (cudaMalloc), recycled through per-size free lists and never handed back to CUDA during a
// run, so a training step allocates without cudaMalloc / cudaFree (each may synchronise the
// device). The device twin of the CPU pool in runtime/nn. Not here: a caching allocator that
// splits or merges blocks; memory for other processes (the pool is per process and device).
#pragma once
#include <cstddef>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "gpu/device.hpp"

namespace cohort::gpu {

/// Where a pool gets its chunks from: plain function pointers so the pool logic is the same
/// for device memory and for host memory (tests, CPU-only runs) and needs no CUDA header.
struct chunk_source {
  status (*allocate)(void** ptr, std::size_t bytes) = nullptr;
  void (*release)(void* ptr) = nullptr;
  const char* name = "";
};

/// Chunks from device_malloc / device_free on the calling thread's current device.
chunk_source cuda_chunks();
/// Chunks from aligned host memory (256-byte aligned, like cudaMalloc).
chunk_source host_chunks();

/// Counters of one pool, read at one instant. Names shared with the CPU pool
/// (runtime/nn/pool.hpp) mean the same thing there: bytes_in_use and peak_bytes count the
/// bytes callers asked for; blocks_* count blocks (pages there). All figures are exact.
struct pool_stats {
  std::size_t bytes_in_use = 0;          ///< sum of the sizes asked for by live blocks
  std::size_t peak_bytes = 0;            ///< highest bytes_in_use seen
  std::size_t block_bytes_in_use = 0;    ///< sum of the block sizes of live blocks
  std::size_t internal_waste_bytes = 0;  ///< block_bytes_in_use - bytes_in_use (rounding)
  std::size_t reserved_bytes = 0;        ///< bytes obtained from the chunk source: the footprint
  std::size_t free_block_bytes = 0;      ///< carved blocks waiting in free lists
  std::size_t blocks_in_use = 0;
  std::size_t blocks_free = 0;
  std::size_t blocks_total = 0;  ///< blocks carved so far: blocks_in_use + blocks_free
  std::size_t chunks = 0;
  std::size_t allocate_calls = 0;      ///< successful allocate() calls, cumulative
  std::size_t chunk_allocations = 0;   ///< calls to the chunk source (should stop growing)
  std::size_t failed_allocations = 0;  ///< allocate() calls that returned an error
  /// Share of reserved memory not holding requested bytes: size-class rounding, free blocks
  /// and chunk tails too small for the next block; 0 when nothing is reserved. (A size-class
  /// pool has no holes to merge, so unlike the CPU page pool's "external fragmentation" this
  /// is the whole overhead.)
  double fragmentation() const {
    return reserved_bytes == 0 ? 0.0 : 1.0 - static_cast<double>(bytes_in_use) / reserved_bytes;
  }
};

/// Fixed-size-block pool. Thread-safe (one mutex): a worker's compute and communication
/// threads may share it.
class device_pool {
 public:
  struct options {
    /// Size of the chunks small blocks are carved from.
    std::size_t chunk_bytes = std::size_t{64} << 20;
    /// Smallest block and the alignment of every block (cudaMalloc aligns to 256).
    std::size_t min_block = 256;
  };

  explicit device_pool(chunk_source source = cuda_chunks());
  device_pool(chunk_source source, options opts);
  /// Returns every chunk to the source (end of run), even if blocks are still in use.
  ~device_pool();
  device_pool(const device_pool&) = delete;
  device_pool& operator=(const device_pool&) = delete;

  /// A block of at least `bytes` (aligned to min_block); *ptr is null on failure and for
  /// bytes == 0.
  status allocate(void** ptr, std::size_t bytes);
  /// Puts a block back on its free list (null is a no-op). A pointer this pool did not hand
  /// out, or one released twice, is invalid_argument and changes nothing.
  status release(void* ptr);

  pool_stats stats() const;

  /// The block size a request of `bytes` gets: min_block, or `bytes` rounded up to a quarter
  /// of its power of two (at most 25% rounding), a multiple of min_block. Pure function.
  static std::size_t block_size_for(std::size_t bytes, std::size_t min_block);

 private:
  struct live_block {
    std::size_t block_bytes;
    std::size_t requested_bytes;
  };
  status carve(void** ptr, std::size_t block_bytes);

  chunk_source source_;
  options opts_;
  mutable std::mutex mutex_;
  std::vector<void*> chunks_;
  char* bump_ = nullptr;                            // next free byte of the current chunk
  std::size_t bump_left_ = 0;                       // bytes left in the current chunk
  std::map<std::size_t, std::vector<void*>> free_;  // block size -> free blocks
  std::unordered_map<void*, live_block> live_;
  pool_stats stats_;
};

}  // namespace cohort::gpu
