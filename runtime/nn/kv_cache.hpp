// The paged KV cache of GPT inference (`cohort serve`; docs/serving.md): the keys and values
// of every sequence being decoded live in fixed-size blocks of block_tokens positions, taken
// from one arena in the memory pool as a sequence grows and given back when it ends, so
// that sequences of any length share the memory without fragmenting it (vLLM's
// PagedAttention layout). Owns the blocks and each sequence's block table; knows nothing of
// the model's arithmetic (runtime/nn/gpt_decode.hpp) or of requests.
#pragma once
#include <cstdint>
#include <set>
#include <vector>

#include "runtime/nn/tensor.hpp"

namespace cohort::nn {

/// The blocks: capacity of them, each holding block_tokens positions of keys and values
/// for every layer ([layer][k|v][position][d_model] floats). With n_layer 0 they hold
/// nothing: ids only, for a model whose parts keep the keys and values in their own
/// processes (runtime/train/serve_shards.hpp).
class kv_blocks {
 public:
  kv_blocks(int capacity, int block_tokens, int n_layer, int d_model, pool& p = pool::global());

  /// A free block's id (the lowest free one), or -1 when none is free.
  int take();
  /// Gives block ID back; throws usage_error for an id that is not taken.
  void give(int id);

  int capacity() const { return capacity_; }
  int free_blocks() const { return static_cast<int>(free_.size()); }
  int used_blocks() const { return capacity_ - free_blocks(); }
  int block_tokens() const { return block_tokens_; }
  /// Blocks a sequence of TOKENS positions holds: ceil(tokens / block_tokens).
  int blocks_for(int tokens) const { return (tokens + block_tokens_ - 1) / block_tokens_; }
  std::size_t bytes() const { return arena_.bytes(); }

  /// Keys (V = false) or values (V = true) of layer L at position POS of block ID: d_model
  /// floats.
  float* at(int id, int layer, bool v, int pos) {
    return arena_.data() + ((static_cast<int64_t>(id) * n_layer_ + layer) * 2 + (v ? 1 : 0)) *
                               block_tokens_ * d_model_ +
           static_cast<int64_t>(pos) * d_model_;
  }

 private:
  int capacity_, block_tokens_, n_layer_, d_model_;
  tensor arena_;
  std::set<int> free_;  ///< free ids; take() gives the lowest, so the cache fills from the bottom
};

/// One sequence's positions in the cache: its block table and how many positions hold
/// keys and values.
class kv_sequence {
 public:
  explicit kv_sequence(kv_blocks& blocks) : blocks_(&blocks) {}
  ~kv_sequence() { release(); }
  kv_sequence(const kv_sequence&) = delete;
  kv_sequence& operator=(const kv_sequence&) = delete;

  /// Room for N more positions: takes the blocks they need. False (nothing taken) when the
  /// cache has too few free blocks.
  bool reserve(int n);
  /// Blocks that N more positions would take.
  int blocks_needed(int n) const;
  /// Gives every block back; the sequence is empty.
  void release();

  int length() const { return length_; }
  /// Counts N more positions as filled (after reserve(N) and writing them).
  void advance(int n) { length_ += n; }
  /// Where position POS of layer L lives (keys, or values when V).
  float* at(int layer, bool v, int pos) {
    const int bt = blocks_->block_tokens();
    return blocks_->at(table_[static_cast<std::size_t>(pos / bt)], layer, v, pos % bt);
  }
  const std::vector<int>& table() const { return table_; }
  kv_blocks* blocks() const { return blocks_; }

 private:
  kv_blocks* blocks_;
  std::vector<int> table_;
  int length_ = 0;
};

}  // namespace cohort::nn
