// Pipeline stages of the GPT: the partition of its blocks into P contiguous stages and one
// stage as a model of its own (same parameter names and initial values as the full gpt,
// activations saved per micro-batch slot so several micro-batches can be in flight),
// optionally one Megatron tensor-parallel shard of it. Owns the stage arithmetic and its
// buffers; knows nothing of schedules, workers, sockets, or how activations travel between
// stages and sums travel between TP ranks (the caller passes an allreduce function).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/nn/gpt.hpp"

namespace cohort::nn {

/// The part of a GPT one pipeline stage owns: blocks [first_layer, end_layer), plus the
/// embedding (wte, wpe) on the first stage and ln_f + lm_head on the last.
struct stage_range {
  int first_layer = 0;
  int end_layer = 0;  ///< one past the last block
  bool has_embedding = false;
  bool has_head = false;

  int layers() const { return end_layer - first_layer; }
  bool operator==(const stage_range& o) const {
    return first_layer == o.first_layer && end_layer == o.end_layer &&
           has_embedding == o.has_embedding && has_head == o.has_head;
  }
};

/// Parameter elements a stage of `shape` covering `r` holds.
int64_t stage_param_count(const gpt_shape& shape, const stage_range& r);

/// Cuts the n_layer blocks of a GPT into `stages` contiguous, non-empty stages; stage 0
/// also holds the embedding, the last stage ln_f and lm_head. With `explicit_layers`
/// empty the cut minimises the largest stage's parameter count (exact); among the cuts
/// that reach that minimum, earlier stages take as few blocks as possible (under 1F1B
/// stage s keeps P - s micro-batches of activations, so light early stages also even out
/// memory). Otherwise explicit_layers[s] is the number of blocks of stage s. Throws
/// usage_error when stages < 1, stages > n_layer (every stage needs a block), or the
/// explicit counts are not `stages` positive numbers summing to n_layer.
std::vector<stage_range> partition_gpt(const gpt_shape& shape, int stages,
                                       const std::vector<int>& explicit_layers = {});

/// How a gpt_stage sizes its activation memory.
struct gpt_stage_options {
  /// Micro-batches that can be in flight (forwarded, not yet backwarded) at once: under
  /// 1F1B stage s needs P - s, under GPipe M.
  int slots = 1;
  /// Largest micro-batch in sequences; every buffer holds max_batch * context rows.
  int max_batch = 1;
  /// Keep only each slot's stage input and recompute the stage's activations in backward
  /// (one shared set of activations instead of one per slot); gradients are bit-identical.
  bool activation_checkpointing = false;

  /// Tensor parallelism (Megatron-LM): tp_size ranks share this stage. In every block
  /// attn.c_attn and mlp.c_fc are column parallel (rank t holds the output rows of its
  /// heads, or its 1/T of the MLP width) and attn.c_proj and mlp.c_proj row parallel
  /// (the matching input columns; bias whole). Two allreduces per block in forward (after
  /// each row-parallel matmul, before its bias) and two in backward (the gradient w.r.t. the
  /// input of each column-parallel matmul, before the LayerNorm backward). LayerNorms,
  /// embeddings, ln_f and lm_head are replicated; their gradients come out identical on
  /// every rank as long as tp_allreduce hands every rank the same bits.
  int tp_size = 1;  ///< tensor-parallel ranks sharing this stage
  int tp_rank = 0;  ///< this rank in [0, tp_size)
  /// Sums `count` floats in place across the tp_size ranks (an allreduce over the TP group).
  /// Required when tp_size > 1; never called when tp_size == 1. Every rank of the group
  /// must call forward / backward for the same micro-batches in the same order.
  std::function<void(float* data, int64_t count)> tp_allreduce;
};

/// What forward produced for one micro-batch.
struct stage_forward {
  /// [n*t, C] stage output for the next stage; null on the last stage. Without
  /// checkpointing it stays valid until the slot is backwarded or dropped; with it, until
  /// the next forward or backward call of this stage.
  const float* out = nullptr;
  float loss = 0.0f;    ///< last stage: mean loss over the n*t positions
  int64_t correct = 0;  ///< last stage: positions whose argmax equals the target
};

/// One pipeline stage of a GPT. Parameters are the full gpt's of the stage's range, with
/// the same names, declaration order (so flat-buffer order) and blocks, and the same
/// initial values as `gpt(shape..., seed)`. Chaining the stages of a partition over a
/// micro-batch performs the float operations of gpt::forward_backward in the same order,
/// so losses and gradients are bit-identical to the full model's, as long as every stage
/// backwards its micro-batches in the order the full model would have processed them.
///
/// With options.tp_size = T > 1 the stage is TP rank options.tp_rank's shard: the sharded
/// parameters keep their full-model names with the shard's shape and start as the slice
/// of the full gpt's initial value (tp_slices() says which); the stage's input, output,
/// loss and input gradient are the whole tensors, the same on every rank.
///
/// Per micro-batch: forward(slot, ...) saves what backward needs under `slot` (a slot is
/// busy until backward(slot, ...) or drop(slot)); backward accumulates the stage's
/// parameter gradients (reported through the grads-ready hook in descending offsets, as
/// gpt does) and returns dL/d(stage input).
class gpt_stage : public model {
 public:
  /// Throws usage_error for an invalid shape, a range outside [0, n_layer) with no block,
  /// an embedding not at layer 0, a head not after the last layer, options < 1, a tp_rank
  /// outside [0, tp_size), tp_size > 1 without tp_allreduce, or a tp_size that does not
  /// divide n_head and 4 * d_model.
  gpt_stage(const gpt_shape& shape, const stage_range& range, const gpt_stage_options& options,
            uint64_t seed, pool& p = pool::global());

  /// Runs the stage on one micro-batch and saves its activations under `slot`.
  /// `b` gives n and t always, ids on the first stage, targets on the last (other fields are
  /// ignored). `x_in` is the previous stage's output [n*t, C] in this stage's device memory
  /// (copied); it must be null on
  /// the first stage, which embeds b.ids instead. Throws usage_error for a busy or unknown
  /// slot, a batch that does not fit, or a wrong x_in.
  stage_forward forward(int slot, const batch& b, const float* x_in = nullptr);

  /// Backward of the micro-batch in `slot`, then frees the slot. The last stage starts from
  /// the loss: d_out must be null and the gradient is that of loss * loss_scale (as in
  /// gpt::forward_backward). Other stages start from d_out = dL/d(stage output) [n*t, C]
  /// (already scaled; loss_scale is ignored). Returns dL/d(stage input) [n*t, C], valid
  /// until the next backward call, or null on the first stage. d_out and the result are
  /// device memory, as are stage_forward::out and what tp_allreduce is handed: the caller
  /// (stage_trainer) moves them between the device and its links. Throws usage_error for a
  /// slot that holds no forwarded micro-batch or a wrong d_out.
  const float* backward(int slot, const float* d_out, float loss_scale = 1.0f);

  /// Forgets the micro-batch in `slot` without a backward (eval, an aborted step).
  void drop(int slot);
  /// Whether `slot` holds a forwarded micro-batch waiting for backward.
  bool busy(int slot) const;

  /// A whole-model stage (embedding and head) only: forward and backward in slot 0, the
  /// same as gpt::forward_backward. Throws usage_error on a partial stage.
  float forward_backward(const batch& b, float loss_scale) override;
  /// A whole-model stage only: loss and accuracy, gradients untouched.
  eval_result eval(const batch& b) override;
  std::string kind() const override { return "gpt_stage"; }

  /// Sets every parameter to its value in `gpt(shape..., seed)` (a TP shard: to its slice
  /// of that value). (model::init_parameters would key the draws by the stage-local index
  /// and give other values.)
  void init_like_gpt(uint64_t seed);
  /// Sets every parameter to its value (a TP shard: its slice) in WHOLE, a model with the
  /// whole GPT's parameters under the same names (a loaded checkpoint). Throws usage_error
  /// for a missing parameter or one of another shape.
  void load_from(const model& whole);
  /// The stage's parts, read by inference (runtime/nn/gpt_decode.hpp): the embedding (first
  /// stage), the blocks (a TP shard's with tp_size > 1), ln_f and lm_head (last stage).
  const embedding& embed() const { return emb_; }
  const std::vector<gpt_block>& layers() const { return layers_; }
  const layernorm& final_norm() const { return ln_f_; }
  const linear& head() const { return lm_head_; }

  /// Where a parameter of a TP rank lies in the whole-model tensor of the same name.
  /// dim -1: replicated, the shard is the whole tensor. dim 0: rows; the full tensor's dim 0
  /// is cut into `parts` equal consecutive parts and the shard is rows [begin, end) of each
  /// part, the parts' pieces stacked in order (parts = 3 for attn.c_attn's weight and
  /// bias, whose rows are q | k | v; 1 otherwise). dim 1: columns [begin, end) of every
  /// row of a 2-D tensor. The shard has full_shape with that dimension's extent replaced by
  /// parts * (end - begin).
  struct tp_slice {
    int dim = -1;  ///< -1 replicated, 0 rows, 1 columns
    int64_t begin = 0, end = 0;
    int parts = 1;
    shape_t full_shape;
  };
  /// Per parameter (in parameters() order): true when every TP rank holds the same whole
  /// tensor (LayerNorms, embeddings, head, row-parallel biases), false for a TP shard.
  /// All true when tp_size == 1.
  const std::vector<bool>& tp_replicated() const { return tp_replicated_; }
  /// Per parameter (in parameters() order): the whole-model tensor it slices, so
  /// checkpoints and tests can reassemble the full tensor from the T shards.
  const std::vector<tp_slice>& tp_slices() const { return tp_slices_; }

  const gpt_shape& shape() const { return shape_; }
  const stage_range& range() const { return range_; }
  const gpt_stage_options& options() const { return options_; }
  /// The stage's activation memory as its own pool account measures it: the buffers that
  /// keep micro-batches between forward and backward, taken when a slot is forwarded and
  /// given back when it is backwarded or dropped (its input copy plus a set of saved
  /// activations; with checkpointing the input only, and one shared set held for the
  /// stage's life). peak_bytes is the most held at once. Scratch used within one call
  /// (gradients, logits) lives in the model's pool and is not counted.
  pool_stats activation_stats() const { return acts_.stats(); }
  /// Bytes one forwarded micro-batch holds (every buffer is sized for max_batch):
  /// checkpointing, the input copy; otherwise the input copy and a set of activations.
  std::size_t activation_bytes_per_slot() const { return per_slot_bytes_; }

 private:
  /// Saved activations of the whole stage for one micro-batch.
  struct act_set {
    std::vector<gpt_block_acts> blocks;
    tensor lnf, lnf_mean, lnf_rstd, probs;  // last stage only
  };
  struct slot_state {
    bool busy = false;
    int n = 0, t = 0;
    tensor input;  // [rows, C]: the embedding output (first stage) or the received x
    std::vector<int32_t> ids, targets;  // the host's: the batch checks, the argmax
    // Where the device reads them: ids / targets themselves on the CPU, else their staging.
    const int32_t* ids_dev = nullptr;
    const int32_t* targets_dev = nullptr;
    itensor ids_staging, targets_staging;
  };

  /// Takes slot's buffers from the activation account; release gives them back.
  void hold(int slot);
  void release(int slot);
  void allocate_set(act_set& a);
  void check_slot(int slot) const;
  void check_batch(const batch& b) const;
  act_set& acts_of(int slot) { return sets_[options_.activation_checkpointing ? 0 : slot]; }
  /// Blocks (and head) forward from slot.input into `a`; returns the loss on the last stage.
  float run_forward(const slot_state& s, act_set& a, int64_t* correct);
  /// Block l forward / backward: gpt_block's own with tp_size 1, the Megatron shard with
  /// its collectives otherwise.
  void block_forward(std::size_t l, gpt_block_acts& a, const float* x, int n, int t);
  void block_backward(std::size_t l, gpt_block_acts& a, float* dres, const float* x, int n, int t);

  gpt_shape shape_;
  stage_range range_;
  gpt_stage_options options_;
  pool acts_;  // before the buffers it lends: they go back to it when destroyed
  std::size_t per_slot_bytes_ = 0;
  embedding emb_;
  std::vector<gpt_block> layers_;
  layernorm ln_f_;
  linear lm_head_;
  std::vector<slot_state> slots_;
  std::vector<act_set> sets_;
  tensor logits_, losses_;  // last stage: per-call scratch
  gpt_grad_scratch scratch_;
  tensor dres_, dlogits_;
  std::vector<bool> tp_replicated_;
  std::vector<tp_slice> tp_slices_;
};

}  // namespace cohort::nn
