// The GPT language model (nanoGPT layout, lm_head NOT tied to wte): token + position
// embedding, n_layer pre-LN transformer blocks (causal self-attention, GELU MLP), final
// LayerNorm and lm_head. Owns its layers, pre-allocated activations and gradient scratch;
// parameter names and shapes match nanoGPT's state_dict (plus a separate lm_head.weight).
#pragma once
#include <string>
#include <vector>

#include <memory>

#include "runtime/nn/layers.hpp"
#include "runtime/nn/model.hpp"
#include "runtime/nn/moe.hpp"

namespace cohort::nn {

/// The sizes that define a GPT.
struct gpt_shape {
  int vocab = 0;
  int context = 0;  ///< longest sequence (T); wpe has this many rows
  int n_layer = 0;
  int n_head = 0;
  int d_model = 0;  ///< C; must be divisible by n_head
  /// Mixture of experts (model.moe; runtime/nn/moe.hpp): 0 experts, a dense model.
  int moe_experts = 0;
  int moe_top_k = 1;
  int moe_every = 1;  ///< every moe_every-th block's MLP is an MoE layer (blocks every-1, 2every-1, ...)
  float moe_capacity_factor = 1.25f;
  float moe_aux_coef = 0.01f;
  int moe_hidden = 0;  ///< an expert's hidden width; 0: 4 * d_model, the dense MLP's
  int expert_hidden() const { return moe_hidden > 0 ? moe_hidden : 4 * d_model; }
  /// Whether block L's MLP is a mixture of experts.
  bool moe_at(int l) const { return moe_experts > 0 && (l + 1) % moe_every == 0; }
};

/// One GPT parameter as the model declares it. gpt_param_specs is the single source of
/// the names, shapes, order and init of GPT parameters, shared by gpt and gpt_stage.
struct gpt_param_spec {
  std::string block;  ///< "embedding", "h.{l}" or "head"
  std::string name;   ///< e.g. "transformer.h.3.attn.c_attn.weight"
  shape_t shape;
  init_spec init;
};

/// Every parameter of a GPT of shape `s` in declaration (= flat memory) order; the index
/// in this list is the parameter's index in a full gpt, which keys its init stream.
/// Throws usage_error for an invalid shape.
std::vector<gpt_param_spec> gpt_param_specs(const gpt_shape& s);

/// Saved activations of one transformer block for up to rows = B*T positions.
struct gpt_block_acts {
  tensor ln1, ln1_mean, ln1_rstd;  ///< LayerNorm 1 output and statistics
  tensor qkv;                      ///< [rows, 3C]
  tensor att;                      ///< [B, NH, T, T] softmax probabilities
  tensor atty;                     ///< [rows, C] attention output before c_proj
  tensor res2;                     ///< [rows, C] residual after the attention branch
  tensor ln2, ln2_mean, ln2_rstd;
  tensor fch, fch_gelu;  ///< [rows, 4C] before / after GELU
  tensor out;            ///< [rows, C] block output (residual after the MLP)
  std::shared_ptr<moe_acts> moe;  ///< an MoE block's routing and experts' activations

  /// Fresh zeroed buffers for `sequences` sequences of s.context tokens.
  void allocate(int64_t sequences, const gpt_shape& s, pool& p);
  /// Bytes held by the buffers.
  std::size_t bytes() const;
};

/// Gradient buffers shared by all blocks (backward visits one block at a time).
struct gpt_grad_scratch {
  tensor dtmp, dln, datty;  ///< [rows, C]
  tensor dqkv;              ///< [rows, 3C]
  tensor dfch, dfch_gelu;   ///< [rows, 4C]
  tensor datt;              ///< [B, NH, T, T]

  /// Fresh zeroed buffers for `sequences` sequences of s.context tokens.
  void allocate(int64_t sequences, const gpt_shape& s, pool& p);
};

/// One transformer block: x + attn(ln_1(x)), then + mlp(ln_2(.)).
struct gpt_block {
  layernorm ln_1, ln_2;
  linear c_attn, attn_proj, c_fc, mlp_proj;  ///< attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj
  int n_head = 0;
  device* dev = &cpu_device();  ///< attention, GELU and the residual adds run here
  /// Set: the MLP is this mixture of experts (c_fc and mlp_proj unused).
  std::shared_ptr<moe_layer> moe;
  /// An MoE block's backward: the scale of its load-balancing loss's gradient (the loss
  /// scale of the step; gpt::forward_backward sets it).
  float aux_scale = 1.0f;

  /// Reads x [b*t, C], fills a (a.out is the block output).
  void forward(gpt_block_acts& a, const float* x, int b, int t) const;
  /// On entry dres holds dL/d(block output); on return dL/dx. Parameter grads accumulate;
  /// each parameter's gradient (linears: chunk by chunk) goes to `report` once final,
  /// in descending addresses.
  void backward(gpt_block_acts& a, gpt_grad_scratch& s, float* dres, const float* x, int b, int t,
                const grads_ready_span& report = {});
};

class gpt : public model {
 public:
  /// Initialised like nanoGPT: weights N(0, 0.02), both c_proj weights
  /// N(0, 0.02/sqrt(2*n_layer)), biases 0, LayerNorm weights 1. Activations are allocated
  /// for max_batch sequences of `context` tokens.
  gpt(int vocab, int context, int n_layer, int n_head, int d_model, int max_batch, uint64_t seed,
      pool& p = pool::global());
  /// A GPT of shape S, with its mixture-of-experts blocks when S has experts (on the host).
  gpt(const gpt_shape& s, int max_batch, uint64_t seed, pool& p = pool::global());

  /// b.ids and b.targets are [n, t] with 1 <= t <= context; the loss is the mean over n*t,
  /// plus the MoE blocks' load-balancing losses.
  float forward_backward(const batch& b, float loss_scale) override;
  /// The MoE blocks of the last forward: tokens each expert computed (summed over the MoE
  /// blocks), assignments dropped over capacity, the load-balancing loss added.
  struct moe_stats {
    std::vector<int64_t> tokens;
    int64_t dropped = 0;
    float aux_loss = 0;
  };
  moe_stats last_moe() const;
  /// Loss and next-token accuracy (argmax) over the n*t positions.
  eval_result eval(const batch& b) override;
  std::string kind() const override { return "gpt"; }
  void params_pass(const std::function<void(std::size_t block)>& backward_done,
                   bool exchanges = false) override;
  void set_moe_exchange(const moe_exchange* ex) override;
  bool has_moe() const override { return shape_.moe_experts > 0; }
  void moe_pass() override;
  /// The logits [vocab] of the token that follows IDS (one sequence, 1 <= size <= context,
  /// every id in [0, vocab)): what position size - 1 of a forward computes, on the host.
  /// Inference only: saved activations are overwritten, no gradient is touched.
  std::vector<float> next_logits(const std::vector<int32_t>& ids);

  const gpt_shape& shape() const { return shape_; }
  /// The transformer blocks (blocks() entries "h.0" ... "h.{L-1}").
  const std::vector<gpt_block>& layers() const { return layers_; }
  /// The embedding, the final LayerNorm and lm_head (inference reads them: gpt_decode.hpp).
  const embedding& embed() const { return emb_; }
  const layernorm& final_norm() const { return ln_f_; }
  const linear& head() const { return lm_head_; }

 private:
  void check(const batch& b) const;
  void reserve(int sequences);
  /// KEEP_HEAD: the head's parameters stay needed (forward_backward's backward goes on).
  float forward(const batch& b, bool keep_head = false);

  gpt_shape shape_;
  int capacity_ = 0;
  embedding emb_;
  std::vector<gpt_block> layers_;
  layernorm ln_f_;
  linear lm_head_;
  tensor encoded_;
  std::vector<gpt_block_acts> acts_;
  tensor lnf_, lnf_mean_, lnf_rstd_, logits_, probs_, losses_;
  gpt_grad_scratch scratch_;
  tensor dres_, dlogits_;
  itensor ids_dev_, targets_dev_;     // the batch on the device (unused on the CPU)
  const int32_t* ids_ = nullptr;      // the forwarded batch's ids and targets, where the
  const int32_t* targets_ = nullptr;  // device reads them
};

}  // namespace cohort::nn
