// GPT inference over the paged KV cache (`cohort serve`; docs/serving.md): the new tokens of
// several sequences at once, each at its own position, go through the model as one set of
// rows, so every linear layer is one matrix product for the whole batch; attention reads
// each sequence's earlier keys and values from its blocks (runtime/nn/kv_cache.hpp) instead
// of recomputing them. A prompt's tokens (prefill) and one token of each running sequence
// (decode) travel in the same call: continuous batching. On the host (a CPU model); the
// model's weights are read, never changed.
#pragma once
#include <cstdint>
#include <vector>

#include "runtime/nn/gpt.hpp"
#include "runtime/nn/kv_cache.hpp"

namespace cohort::nn {

/// N new tokens of one sequence, at its positions length() .. length() + N - 1.
struct decode_item {
  kv_sequence* seq = nullptr;
  const int32_t* ids = nullptr;
  int n = 0;
};

class gpt_decoder {
 public:
  /// M must live on the host and outlive the decoder.
  explicit gpt_decoder(const gpt& m);

  /// Forwards every item's new tokens: their keys and values are written into the item's
  /// sequence (which must have reserve()d them, and ends within the context) and counted
  /// (advance); LOGITS gets, for each item in order, the vocab logits of its last new token.
  /// Throws usage_error for an id outside the vocabulary or a sequence past the context.
  void forward(const std::vector<decode_item>& items, std::vector<float>& logits);

  const gpt_shape& shape() const { return shape_; }

 private:
  const gpt& m_;
  gpt_shape shape_;
  std::vector<float> x_, ln_, qkv_, atty_, res_, fch_, fg_, mean_, rstd_, scores_, last_, lnf_;
  std::vector<const float*> kp_, vp_;  ///< an item's keys and values by position (one layer)
};

}  // namespace cohort::nn
