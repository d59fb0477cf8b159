// GPT inference over the paged KV cache (`cohort serve`; docs/serving.md): the new tokens of
// several sequences at once, each at its own position, go through the model as one set of
// rows, so every linear layer is one matrix product for the whole batch; attention reads
// each sequence's earlier keys and values from its blocks (runtime/nn/kv_cache.hpp) instead
// of recomputing them. A prompt's tokens (prefill) and one token of each running sequence
// (decode) travel in the same call: continuous batching. On the host (a CPU model); the
// model's weights are read, never changed.
//
// One arithmetic for one process and for a model cut across processes: a gpt_part is the
// whole GPT, or a pipeline stage's blocks (a tensor-parallel shard's, whose row-parallel
// products are summed over its group through tp_allreduce), with the embedding on the
// first part and ln_f and lm_head on the last (runtime/train/serve_shards.hpp runs the parts
// of a sharded model in their processes).
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "runtime/nn/gpt.hpp"
#include "runtime/nn/kv_cache.hpp"

namespace cohort::nn {

class gpt_stage;

/// N new tokens of one sequence, at its positions length() .. length() + N - 1.
struct decode_item {
  kv_sequence* seq = nullptr;
  const int32_t* ids = nullptr;
  int n = 0;
};

/// What a decoder gives the serving engine: the logits of each item's last new token, its
/// sequence advanced by its new tokens. The model may run here (gpt_decoder) or in other
/// processes (train::shard_head).
class decoder {
 public:
  virtual ~decoder() = default;
  /// Forwards every item's new tokens: their keys and values are written into the item's
  /// sequence (which must have reserve()d them, and ends within the context) and counted
  /// (advance); LOGITS gets, for each item in order, the vocab logits of its last new token.
  /// Throws usage_error for an id outside the vocabulary or a sequence past the context.
  virtual void forward(const std::vector<decode_item>& items, std::vector<float>& logits) = 0;
  virtual const gpt_shape& shape() const = 0;
  /// Layers whose keys and values the caller's kv_blocks must hold: the model's when it runs
  /// here, 0 when its parts keep their own caches (the caller's blocks only number them).
  virtual int cache_layers() const = 0;
};

/// Throws usage_error unless every item of ITEMS fits SHAPE: a token, ids in the vocabulary,
/// positions within the context, reserved blocks.
void check_decode_items(const gpt_shape& shape, const std::vector<decode_item>& items);

/// One item's cache as a part reads it: its block table in BLOCKS and how many positions
/// are filled before this step.
struct kv_view {
  kv_blocks* blocks = nullptr;
  const int* table = nullptr;
  int length = 0;
  float* at(int layer, bool v, int pos) const {
    const int bt = blocks->block_tokens();
    return blocks->at(table[pos / bt], layer, v, pos % bt);
  }
};

/// The layers one decoder runs (pointers into a gpt or a gpt_stage, which must outlive it).
struct gpt_part {
  gpt_shape shape;                              ///< the whole model's
  const embedding* embed = nullptr;             ///< the first part's
  const std::vector<gpt_block>* blocks = nullptr;
  const layernorm* final_norm = nullptr;        ///< the last part's
  const linear* head = nullptr;                 ///< the last part's
  int tp_size = 1;
  /// Sums COUNT floats in place over the part's TP group (tp_size > 1), the same bits on
  /// every rank.
  std::function<void(float* data, int64_t count)> tp_allreduce;

  static gpt_part whole(const gpt& m);
  static gpt_part of_stage(const gpt_stage& s, std::function<void(float*, int64_t)> tp_allreduce);
};

class gpt_decoder : public decoder {
 public:
  /// The whole model M (on the host; it must outlive the decoder).
  explicit gpt_decoder(const gpt& m);
  /// A part (on the host).
  explicit gpt_decoder(gpt_part p);

  void forward(const std::vector<decode_item>& items, std::vector<float>& logits) override;
  const gpt_shape& shape() const override { return part_.shape; }
  int cache_layers() const override { return part_.shape.n_layer; }

  /// The part on one step of ROWS rows: item k has N[k] new tokens after KV[k].length filled
  /// positions, its keys and values going to KV[k] (the part's own blocks, its layers counted
  /// from 0). X is [ROWS, d_model]: the part's input (ignored by the first part, which embeds
  /// IDS, every item's new ids in order) and, on return, its output. The last part also
  /// fills LOGITS with each item's last row's logits. Nothing is advanced.
  void run(const std::vector<kv_view>& kv, const std::vector<int>& n, const int32_t* ids,
           int rows, float* x, std::vector<float>* logits);

 private:
  gpt_part part_;
  std::vector<float> ln_, qkv_, atty_, res_, fch_, fg_, mean_, rstd_, scores_, last_, lnf_, x_;
  std::vector<const float*> kp_, vp_;  ///< an item's keys and values by position (one layer)
  std::vector<kv_view> views_;
  std::vector<int> n_;
  std::vector<int32_t> ids_;
};

}  // namespace cohort::nn
