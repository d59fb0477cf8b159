#include "runtime/nn/pool.hpp"

#include <cstdlib>
#include <new>

#include "runtime/core/error.hpp"
#include "runtime/nn/device.hpp"

namespace cohort::nn {

void allocation::reset() {
  if (pool_) pool_->release(data_, bytes_, pages_);
  pool_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
  pages_ = 0;
}

pool::pool(std::size_t page_bytes, std::size_t chunk_pages)
    : pool(cpu_device(), page_bytes, chunk_pages) {}

pool::pool(device& dev, std::size_t page_bytes, std::size_t chunk_pages)
    : dev_(&dev), page_bytes_(page_bytes), chunk_pages_(chunk_pages < 1 ? 1 : chunk_pages) {
  COHORT_CHECK(page_bytes_ >= 64 && (page_bytes_ & (page_bytes_ - 1)) == 0);
}

pool::pool(account_t, pool& parent)
    : dev_(parent.dev_),
      page_bytes_(parent.page_bytes_),
      chunk_pages_(parent.chunk_pages_),
      parent_(&parent) {}

pool::~pool() {
  // Live allocations would dangle: that is a bug of the owner, not a runtime condition.
  COHORT_CHECK(allocations_ == 0);
  for (auto& c : chunks_) dev_->free_chunk(c.first);
}

pool& pool::global() {
  // Never destroyed: tensors in static objects may outlive any other static.
  static pool* p = new pool();
  return *p;
}

void pool::insert_free(char* start, std::size_t pages, std::size_t chunk) {
  free_by_addr_.emplace(start, run{pages, chunk});
  free_by_size_.emplace(pages, start);
}

void pool::erase_free(std::map<char*, run>::iterator it) {
  free_by_size_.erase({it->second.pages, it->first});
  free_by_addr_.erase(it);
}

allocation pool::allocate(std::size_t bytes) {
  if (parent_ != nullptr) {
    allocation a = parent_->allocate(bytes);
    a.pool_ = this;  // released through this account, which hands the pages back
    std::lock_guard<std::mutex> lock(mu_);
    bytes_in_use_ += bytes;
    if (bytes_in_use_ > peak_bytes_) peak_bytes_ = bytes_in_use_;
    blocks_in_use_ += a.pages_;
    ++allocations_;
    return a;
  }
  const std::size_t need = bytes == 0 ? 1 : (bytes + page_bytes_ - 1) / page_bytes_;
  std::lock_guard<std::mutex> lock(mu_);
  auto fit = free_by_size_.lower_bound({need, nullptr});
  if (fit == free_by_size_.end()) {
    const std::size_t pages = need > chunk_pages_ ? need : chunk_pages_;
    void* mem = dev_->allocate_chunk(pages * page_bytes_, page_bytes_);
    chunks_.emplace_back(static_cast<char*>(mem), pages);
    blocks_total_ += pages;
    insert_free(static_cast<char*>(mem), pages, chunks_.size() - 1);
    fit = free_by_size_.find({pages, static_cast<char*>(mem)});
  }
  char* start = fit->second;
  auto it = free_by_addr_.find(start);
  const run r = it->second;
  erase_free(it);
  if (r.pages > need) insert_free(start + need * page_bytes_, r.pages - need, r.chunk);

  bytes_in_use_ += bytes;
  if (bytes_in_use_ > peak_bytes_) peak_bytes_ = bytes_in_use_;
  blocks_in_use_ += need;
  ++allocations_;

  allocation a;
  a.pool_ = this;
  a.data_ = start;
  a.bytes_ = bytes;
  a.pages_ = need;
  return a;
}

void pool::release(void* data, std::size_t bytes, std::size_t pages) {
  if (parent_ != nullptr) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      bytes_in_use_ -= bytes;
      blocks_in_use_ -= pages;
      --allocations_;
    }
    parent_->release(data, bytes, pages);
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  char* start = static_cast<char*>(data);
  std::size_t chunk = chunks_.size();
  for (std::size_t i = 0; i < chunks_.size(); ++i)
    if (start >= chunks_[i].first && start < chunks_[i].first + chunks_[i].second * page_bytes_) {
      chunk = i;
      break;
    }
  COHORT_CHECK(chunk < chunks_.size());
  bytes_in_use_ -= bytes;
  blocks_in_use_ -= pages;
  --allocations_;

  // Merge with the free run right after and right before, when in the same chunk.
  auto next = free_by_addr_.find(start + pages * page_bytes_);
  if (next != free_by_addr_.end() && next->second.chunk == chunk) {
    pages += next->second.pages;
    erase_free(next);
  }
  auto after = free_by_addr_.lower_bound(start);
  if (after != free_by_addr_.begin()) {
    auto prev = std::prev(after);
    if (prev->second.chunk == chunk && prev->first + prev->second.pages * page_bytes_ == start) {
      start = prev->first;
      pages += prev->second.pages;
      erase_free(prev);
    }
  }
  insert_free(start, pages, chunk);
}

pool_stats pool::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  pool_stats s;
  s.page_bytes = page_bytes_;
  s.bytes_in_use = bytes_in_use_;
  s.peak_bytes = peak_bytes_;
  s.blocks_in_use = blocks_in_use_;
  s.blocks_total = parent_ != nullptr ? blocks_in_use_ : blocks_total_;
  s.blocks_free = s.blocks_total - blocks_in_use_;
  s.largest_free_run = free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
  s.chunks = chunks_.size();
  s.allocations = allocations_;
  s.fragmentation = s.blocks_free == 0 ? 0.0
                                       : 1.0 - static_cast<double>(s.largest_free_run) /
                                                   static_cast<double>(s.blocks_free);
  s.internal_waste_bytes = blocks_in_use_ * page_bytes_ - bytes_in_use_;
  return s;
}

void pool::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  peak_bytes_ = bytes_in_use_;
}

}  // namespace cohort::nn
