#include "runtime/nn/kv_cache.hpp"

#include <string>

#include "runtime/core/error.hpp"

namespace cohort::nn {

kv_blocks::kv_blocks(int capacity, int block_tokens, int n_layer, int d_model, pool& p)
    : capacity_(capacity), block_tokens_(block_tokens), n_layer_(n_layer), d_model_(d_model) {
  if (capacity < 1 || block_tokens < 1 || n_layer < 0 || d_model < 1)
    throw usage_error(
        "kv cache: capacity, block_tokens and d_model must be >= 1, n_layer >= 0");
  // No layers: the blocks are only numbered here (their keys and values live elsewhere).
  if (n_layer > 0)
    arena_ = tensor(shape_t{static_cast<int64_t>(capacity) * n_layer * 2 * block_tokens * d_model}, p);
  for (int id = 0; id < capacity; ++id) free_.insert(free_.end(), id);
}

int kv_blocks::take() {
  if (free_.empty()) return -1;
  const int id = *free_.begin();
  free_.erase(free_.begin());
  return id;
}

void kv_blocks::give(int id) {
  if (id < 0 || id >= capacity_ || !free_.insert(id).second)
    throw usage_error("kv cache: block " + std::to_string(id) + " is not taken");
}

int kv_sequence::blocks_needed(int n) const {
  return blocks_->blocks_for(length_ + n) - static_cast<int>(table_.size());
}

bool kv_sequence::reserve(int n) {
  const int need = blocks_needed(n);
  if (need <= 0) return true;
  if (need > blocks_->free_blocks()) return false;
  for (int i = 0; i < need; ++i) table_.push_back(blocks_->take());
  return true;
}

void kv_sequence::release() {
  for (const int id : table_) blocks_->give(id);
  table_.clear();
  length_ = 0;
}

}  // namespace cohort::nn
