// Fixed-size-block pool over chunks from a chunk_source (device or host memory).
#include "gpu/device_pool.hpp"

#include <cstdlib>
#include <string>

namespace cohort::gpu {

namespace {

status cuda_allocate(void** ptr, std::size_t bytes) { return device_malloc(ptr, bytes); }
void cuda_release(void* ptr) { (void)device_free(ptr); }

status host_allocate(void** ptr, std::size_t bytes) {
  // aligned_alloc wants a size that is a multiple of the alignment.
  *ptr = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (*ptr == nullptr)
    return set_error(status::out_of_memory,
                     "aligned_alloc(" + std::to_string(bytes) + ") for a host pool chunk");
  return status::ok;
}
void host_release(void* ptr) { std::free(ptr); }

}  // namespace

chunk_source cuda_chunks() { return chunk_source{cuda_allocate, cuda_release, "cuda"}; }
chunk_source host_chunks() { return chunk_source{host_allocate, host_release, "host"}; }

device_pool::device_pool(chunk_source source) : device_pool(source, options{}) {}

device_pool::device_pool(chunk_source source, options opts) : source_(source), opts_(opts) {
  // A zero or non-power-of-two min_block would break alignment; fall back to cudaMalloc's 256.
  if (opts_.min_block == 0 || (opts_.min_block & (opts_.min_block - 1)) != 0) opts_.min_block = 256;
  if (opts_.chunk_bytes < opts_.min_block) opts_.chunk_bytes = opts_.min_block;
}

device_pool::~device_pool() {
  for (void* c : chunks_) source_.release(c);
}

std::size_t device_pool::block_size_for(std::size_t bytes, std::size_t min_block) {
  if (bytes <= min_block) return min_block;
  // Granule = a quarter of the largest power of two below `bytes`: 4 size classes per
  // doubling bound the rounding waste by 25% while keeping few distinct free lists.
  std::size_t p = 1;
  while (p <= (bytes - 1) / 2) p <<= 1;  // largest power of two <= bytes - 1
  std::size_t granule = p / 4 < min_block ? min_block : p / 4;
  return (bytes + granule - 1) / granule * granule;
}

status device_pool::carve(void** ptr, std::size_t block_bytes) {
  // Blocks bigger than an eighth of a chunk get a chunk of their own: carving them would
  // strand up to a block's worth of chunk tail.
  if (block_bytes > opts_.chunk_bytes / 8) {
    if (status s = source_.allocate(ptr, block_bytes); s != status::ok) return s;
    chunks_.push_back(*ptr);
    stats_.reserved_bytes += block_bytes;
    ++stats_.chunks;
    ++stats_.chunk_allocations;
    return status::ok;
  }
  if (bump_left_ < block_bytes) {
    void* chunk = nullptr;
    if (status s = source_.allocate(&chunk, opts_.chunk_bytes); s != status::ok) return s;
    chunks_.push_back(chunk);
    stats_.reserved_bytes += opts_.chunk_bytes;
    ++stats_.chunks;
    ++stats_.chunk_allocations;
    bump_ = static_cast<char*>(chunk);
    bump_left_ = opts_.chunk_bytes;
  }
  *ptr = bump_;
  bump_ += block_bytes;
  bump_left_ -= block_bytes;
  return status::ok;
}

status device_pool::allocate(void** ptr, std::size_t bytes) {
  if (ptr == nullptr) return set_error(status::invalid_argument, "device_pool::allocate: null");
  *ptr = nullptr;
  if (bytes == 0) return status::ok;
  const std::size_t block = block_size_for(bytes, opts_.min_block);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = free_.find(block);
  if (it != free_.end() && !it->second.empty()) {
    *ptr = it->second.back();
    it->second.pop_back();
    --stats_.blocks_free;
    stats_.free_block_bytes -= block;
  } else if (status s = carve(ptr, block); s != status::ok) {
    ++stats_.failed_allocations;
    *ptr = nullptr;
    return s;
  }
  live_.emplace(*ptr, live_block{block, bytes});
  stats_.bytes_in_use += bytes;
  stats_.block_bytes_in_use += block;
  if (stats_.bytes_in_use > stats_.peak_bytes) stats_.peak_bytes = stats_.bytes_in_use;
  ++stats_.blocks_in_use;
  ++stats_.allocate_calls;
  return status::ok;
}

status device_pool::release(void* ptr) {
  if (ptr == nullptr) return status::ok;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(ptr);
  if (it == live_.end())
    return set_error(
        status::invalid_argument,
        "device_pool::release: pointer not allocated by this pool or already released");
  const live_block b = it->second;
  live_.erase(it);
  free_[b.block_bytes].push_back(ptr);
  stats_.bytes_in_use -= b.requested_bytes;
  stats_.block_bytes_in_use -= b.block_bytes;
  --stats_.blocks_in_use;
  ++stats_.blocks_free;
  stats_.free_block_bytes += b.block_bytes;
  return status::ok;
}

pool_stats device_pool::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  pool_stats s = stats_;
  s.blocks_total = s.blocks_in_use + s.blocks_free;
  s.internal_waste_bytes = s.block_bytes_in_use - s.bytes_in_use;
  return s;
}

}  // namespace cohort::gpu
