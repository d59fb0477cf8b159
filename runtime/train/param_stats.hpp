// Whole-model figures that must come out the same bits whether one process holds the
// model or pipeline stages each hold a part: the gradient norm (as per-parameter sums of
// squares added in parameter order) and the parameter hash (over per-parameter digests).
// Owns those definitions; knows nothing of stages, sockets or workers.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "runtime/nn/model.hpp"
#include "runtime/train/square_sum.hpp"

namespace cohort::train {

/// Sum of squares of each parameter's gradient, in parameters() order: the device's double
/// sums, or with EXACT (bitwise mode) square_sum's exact totals, which come out the same
/// bits however a parameter is cut (sharded gradients, train.zero: 2).
std::vector<double> grad_sum_squares_by_param(const nn::model& m, bool exact = false);
/// Per parameter, the exact sum of squares of its gradient elements inside RANGES (flat
/// offsets [begin, end), sorted, disjoint): a sharded member's part of every parameter.
std::vector<square_sum> grad_square_sums_in(const nn::model& m,
                                            const std::vector<std::pair<int64_t, int64_t>>& ranges);

/// `start` + every element of `parts`, added one at a time in order. A pipeline continues
/// the previous stage's running sum with its own parameters, so the total has the same
/// bits as one process adding all of them.
double ordered_sum(const std::vector<double>& parts, double start = 0.0);

/// Scales every gradient of M by the clipping coefficient for `norm` (max_norm <= 0: none).
void clip_grads(nn::model& m, double norm, float max_norm);

/// SHA-256 (hex) of each parameter's float32 bytes, keyed by parameter name.
std::map<std::string, std::string> param_digests(const nn::model& m);

/// The run's params_sha256: SHA-256 over "name:digest\n" lines in name order. Digests from
/// several stages merged into one map give the whole model's value.
std::string combine_param_digests(const std::map<std::string, std::string>& digests);

/// "name:digest\n" lines (what a stage reports) and back; throws protocol-safe
/// usage_error for a malformed line.
std::string format_param_digests(const std::map<std::string, std::string>& digests);
std::map<std::string, std::string> parse_param_digests(const std::string& text);

}  // namespace cohort::train
