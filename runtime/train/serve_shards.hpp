// A GPT served across processes (`cohort serve CKPT --tp T --pp P`; docs/serving.md): the
// model cut into P pipeline stages of T tensor-parallel shards each (Megatron's column /
// row cut and the balanced stage cut training uses: nn::gpt_stage), each shard a process
// of its own with the keys and values of its layers and heads, and one head, the serving
// process, whose engine schedules the requests (continuous batching, the block tables) and
// samples. Rank 0 is the head, rank 1 + s*T + t stage s's TP rank t; they share one group
// on this host (shared memory, rendezvous through files in a private folder), and each
// stage's T ranks a group of their own for the sums of their row-parallel products.
//
// A step: the head broadcasts its header and the items (new ids, positions, block tables);
// stage 0 embeds and runs its blocks, and every stage's output rows are broadcast from its
// first rank for the next; the last stage's first rank broadcasts the logits, which the
// head samples from. Stages run one after another (a decode step is one batch: there is
// nothing to overlap).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/communicator.hpp"
#include "runtime/nn/gpt_decode.hpp"
#include "runtime/train/generate.hpp"

namespace cohort::train {

struct shard_layout {
  int tp = 1;
  int pp = 1;
  int world() const { return 1 + tp * pp; }
  int stage_of(int rank) const { return (rank - 1) / tp; }
  int tp_rank_of(int rank) const { return (rank - 1) % tp; }
  int first_of_stage(int s) const { return 1 + s * tp; }
};

/// Throws usage_error, saying why, when SHAPE cannot be cut as L asks: tp must divide
/// n_head and 4 * d_model, pp must be at most n_layer, both >= 1.
void check_shard_layout(const nn::gpt_shape& shape, const shard_layout& l);

/// RANK's communicator in the group of L over the files of DIR (made by the head, 0700).
/// TIMEOUT_MS bounds each collective (the head's death ends the shards sooner: their
/// parent's death signal).
std::unique_ptr<comm::communicator> shard_group(const std::string& dir, const shard_layout& l,
                                                int rank, int timeout_ms);

/// The head's side: an nn::decoder whose model runs in the shards.
class shard_head : public nn::decoder {
 public:
  shard_head(std::unique_ptr<comm::communicator> world, const nn::gpt_shape& shape,
             const shard_layout& l);
  /// Tells the shards to end (they return from run_shard).
  ~shard_head() override;
  shard_head(const shard_head&) = delete;
  shard_head& operator=(const shard_head&) = delete;

  void forward(const std::vector<nn::decode_item>& items, std::vector<float>& logits) override;
  const nn::gpt_shape& shape() const override { return shape_; }
  int cache_layers() const override { return 0; }

 private:
  std::unique_ptr<comm::communicator> world_;
  nn::gpt_shape shape_;
  shard_layout layout_;
  std::vector<int32_t> payload_;
  std::vector<float> x_;
};

/// What a shard needs besides the model: the group's folder and layout, its rank, the KV
/// cache the head numbers (the same blocks and positions per block), the collectives' bound.
struct shard_options {
  std::string dir;
  shard_layout layout;
  int rank = 1;
  int kv_blocks = 256;
  int block_tokens = 16;
  int timeout_ms = 600000;
};

/// A shard's life: its part of G (a TP slice of its stage's blocks), its TP group, then the
/// steps the head sends until it says stop. LOADED, when set, is called once the shard holds
/// its slice: from then on G's model is not read (a shard process frees it there). Throws
/// comm_error when the group breaks.
void run_shard(const loaded_gpt& g, const shard_options& o,
               const std::function<void()>& loaded = {});

}  // namespace cohort::train
