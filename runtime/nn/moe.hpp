// A mixture-of-experts feed-forward layer (issue #43; docs/moe.md), the MLP of every K-th GPT
// block when model.moe is set: a router (a linear layer without bias, d_model -> experts)
// gives each token a softmax over the experts; the token goes to its top-k (1 or 2; ties to
// the lowest index), each expert is the dense block's MLP (c_fc, GELU, c_proj) of its own,
// and the token's output is the experts' outputs weighted by its gates (top-1: the chosen
// expert's probability, as Switch; top-2: the two probabilities normalised to sum 1, as
// GShard). Each expert takes at most capacity = ceil(capacity_factor * tokens * top_k /
// experts) tokens of a micro-batch, in order (every token's first choice, then every
// token's second); the rest are dropped and counted, and pass through the block's residual
// alone. The load-balancing loss of Switch, aux_coef * experts * sum_e f_e * P_e (f_e: the
// share of the micro-batch's assignments routed to e before capacity, P_e: e's mean router
// probability), is added to the training loss. Backward is hand-written, as the other
// layers'. On the host (a CPU model); routing is a pure function of the router's
// probabilities, so the same micro-batch routes the same way in every process.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/nn/layers.hpp"
#include "runtime/nn/model.hpp"

namespace cohort::nn {

/// Tokens an expert takes at most from TOKENS tokens of a micro-batch.
int moe_capacity(int tokens, int experts, int top_k, float capacity_factor);

/// Where a micro-batch's tokens go: assignment i = token * top_k + choice.
struct moe_routing {
  int tokens = 0, experts = 0, top_k = 1, capacity = 0;
  std::vector<int32_t> expert;  ///< [tokens * top_k] the chosen expert
  std::vector<float> gate;      ///< [tokens * top_k] its weight in the token's output
  std::vector<int32_t> slot;    ///< [tokens * top_k] row in the expert's batch; -1: dropped
  std::vector<int32_t> kept;    ///< [experts] tokens each expert computes
  std::vector<int32_t> wanted;  ///< [experts] assignments before capacity
  int dropped = 0;              ///< assignments over capacity
};

/// Routes TOKENS tokens from their router probabilities PROBS [tokens, experts].
moe_routing moe_route(const float* probs, int tokens, int experts, int top_k,
                      float capacity_factor);

/// Expert parallelism's groups (parallel.ep): a DP group's REPLICAS ranks cut into groups of
/// EP consecutive ranks (the last one smaller when EP does not divide); rank RANK's group,
/// its rank in it and the group's size. Expert e is computed by each group's rank e % size.
struct expert_place {
  int group = 0, rank = 0, size = 1;
};
expert_place expert_group(int ep, int replicas, int rank);

/// The expert whose parameter NAME is ("...mlp.experts.E.<rest>": E), or -1 (a dense one).
int expert_of_param(const std::string& name);

/// Expert parallelism for the passes of a training step (parallel.ep; docs/moe.md): the group
/// of RANKS workers a layer's experts are shared out over, expert e computed by rank e % ranks.
/// Each layer's forward sends every kept token to its expert's rank and gets the output back,
/// and backward does the same with the gradients; each rank computes its experts for every
/// rank's tokens, one source rank at a time (the same products, row for row, as the source
/// would compute alone, so the bits do not depend on ranks).
struct moe_exchange {
  int ranks = 1, rank = 0;
  /// The group's all-to-all of blocks of BYTES each (communicator::alltoall's contract: every
  /// rank calls it in the same order with the same size). Throws what the transport throws.
  std::function<void(const void* send, void* recv, std::size_t bytes)> alltoall;
  /// Bitwise mode: FC and PROJ's gradients hold another rank's contribution alone (computed
  /// from zero): add it to the fixed-point sum and zero them. Empty: contributions add up in
  /// float, as a micro-batch's do.
  std::function<void(linear& fc, linear& proj)> settle;
  bool owns(int expert) const { return expert % ranks == rank; }
};

/// What a forward keeps for backward (sized on use).
struct moe_acts {
  moe_routing route;
  std::vector<float> probs;             ///< [rows, experts]
  std::vector<float> xin, h, hg, y;     ///< per expert, capacity rows each: input, c_fc, GELU, c_proj
  std::vector<float> dy, dhg, dh, dxin; ///< backward scratch, same layout
  std::vector<float> dprobs, dlogits;   ///< [rows, experts]
  std::vector<float> dgate;             ///< [rows * top_k]
  std::vector<float> drouter;           ///< [rows, d_model]: the router's input gradient
  float aux = 0;                        ///< the load-balancing loss (before aux_coef)
  // Expert parallelism (moe_exchange), kept from forward for backward:
  int per_rank = 0;          ///< experts a rank computes at most: ceil(experts / ranks)
  int64_t block_rows = 0;    ///< rows of the pass's largest block (every rank agrees); 0: none
  std::vector<int32_t> send_n, recv_n;  ///< [ranks][per_rank]: rows to / from each rank
  std::vector<int64_t> served_at;       ///< [ranks * per_rank + 1]: row offsets of the served
  std::vector<float> sxin, sh, shg, sy; ///< rows computed here for every rank, by source then
  std::vector<float> sdy, sdhg, sdh, sdxin;  ///< expert (forward, then backward)
  std::vector<float> out, in;           ///< padded blocks [ranks][block_rows, d_model]
};

/// The layer's parameters: the router, then each expert's c_fc and c_proj (memory order).
struct moe_layer {
  linear router;                ///< [experts, d_model], no bias
  std::vector<linear> fc, proj; ///< per expert: [hidden, d_model] and [d_model, hidden], biased
  int top_k = 1;
  float capacity_factor = 1.25f;
  float aux_coef = 0.01f;
  device* dev = &cpu_device();
  /// Expert parallelism for the current training pass, or null (every expert here). Lent by
  /// the trainer for a step's passes only: evaluation and inference run every expert locally.
  const moe_exchange* ep = nullptr;

  int experts() const { return static_cast<int>(fc.size()); }
  /// Y [rows, d_model] = the layer on X [rows, d_model]; saves into A. Returns aux_coef times
  /// the load-balancing loss (the training loss adds it). Under expert parallelism ROWS may be
  /// 0 (a pass without a micro-batch of its own: it computes its experts for the others).
  float forward(moe_acts& a, float* y, const float* x, int rows) const;
  /// On entry DY = dL/dY; DX (assigned) = dL/dX. Parameter gradients accumulate, reported in
  /// descending addresses (experts from the last, c_proj before c_fc, then the router).
  /// AUX_SCALE multiplies the load-balancing loss's gradient (the loss scale the training
  /// loss's gradient carries).
  void backward(moe_acts& a, float* dx, const float* dy, const float* x, int rows, float aux_scale,
                const grads_ready_span& report = {});

 private:
  // Expert parallelism: the experts' forward on A.xin into A.y, and their backward
  // from A.dy into A.dxin (parameter gradients reported as backward's are).
  void forward_experts_ep(moe_acts& a) const;
  void backward_experts_ep(moe_acts& a, const grads_ready_span& report);
};

}  // namespace cohort::nn
