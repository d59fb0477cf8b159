// 1-bit Adam's part of the gradient path, gathered: which ranges it compresses, its phase
// (warm-up, frozen), the momentum shares replicas send after the freeze and the frozen Adam
// denominator they travel divided by. The optimizer's own update and state (m, v) are
// nn::onebit_adam's (runtime/nn/optim.hpp); the error memory is the trainer's, shared with
// comm.compression (trainer_feedback.cpp); the stages that call this are grad_onebit_*.hpp.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/comm/buckets.hpp"
#include "runtime/nn/model.hpp"
#include "runtime/nn/optim.hpp"

namespace cohort::train {

/// Where 1-bit Adam stands: off (another optimizer), warm-up (plain AdamW, float sums), frozen
/// (v frozen; the compressed ranges carry momentum shares as signs). Changes only when the
/// optimizer's step count does (a step, a restore).
enum class onebit_phase { off, warm_up, frozen };

/// OPT's phase (off unless OPT is an nn::onebit_adam).
onebit_phase onebit_phase_of(const nn::optimizer& opt);

/// onebit_adam's compressed ranges of M: every parameter whose name matches none of the
/// EXCLUDE glob patterns (fnmatch), neighbours merged, in offset order.
std::vector<std::pair<int64_t, int64_t>> onebit_ranges(const nn::model& m,
                                                       const std::vector<std::string>& exclude);

/// The frozen phase's wire: OPT's compressed ranges as sign segments.
std::vector<comm::wire_segment> onebit_wire(const nn::onebit_adam& opt);

/// After the freeze, on OPT's compressed ranges inside [offset, offset + count):
/// g[i] = beta1 / replicas * m[i] + (1 - beta1) * g[i] (this replica's share of the new
/// momentum; the shares sum to it).
void add_momentum_share(const nn::onebit_adam& opt, float* g, int replicas, int64_t offset,
                        int64_t count);

/// After the freeze, on OPT's compressed ranges inside [offset, offset + count): g[i] divided
/// (DIVIDE) or multiplied by the frozen Adam denominator sqrt(v[i]) / sqrt(1 - beta2^T) + eps
/// (T: the freeze step); an element with v[i] = 0 becomes 0.
void scale_by_denominator(nn::onebit_adam& opt, float* g, int64_t offset, int64_t count,
                          bool divide);

}  // namespace cohort::train
