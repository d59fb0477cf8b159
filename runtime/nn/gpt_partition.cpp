// partition_gpt: the balanced cut of a GPT's blocks into pipeline stages (declared in
// gpt_stage.hpp), by the parameter count each stage would hold.
#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "runtime/core/error.hpp"
#include "runtime/core/rules.hpp"
#include "runtime/nn/gpt_stage.hpp"

namespace cohort::nn {

namespace {

/// Parameter elements of the embedding, of each block and of the head, summed from
/// gpt_param_specs so the partition counts exactly what the models allocate.
struct block_sizes {
  int64_t embedding = 0, head = 0;
  std::vector<int64_t> layers;
};

block_sizes sizes_of(const gpt_shape& shape) {
  block_sizes s;
  s.layers.assign(shape.n_layer, 0);
  for (const gpt_param_spec& p : gpt_param_specs(shape)) {
    const int64_t n = shape_numel(p.shape);
    if (p.block == "embedding")
      s.embedding += n;
    else if (p.block == "head")
      s.head += n;
    else
      s.layers.at(std::stoi(p.block.substr(2))) += n;
  }
  return s;
}

}  // namespace

std::vector<stage_range> partition_gpt(const gpt_shape& shape, int stages,
                                       const std::vector<int>& explicit_layers) {
  const block_sizes sz = sizes_of(shape);  // also validates the shape
  const int L = shape.n_layer, P = stages;
  if (P < 1)
    throw usage_error("pipeline: parallel.pp must be >= 1 (got " + std::to_string(P) + ")");
  if (!rules::stages_fit_blocks(P, L))
    throw usage_error(
        "pipeline: " + std::to_string(P) + " stages for " + std::to_string(L) +
        " transformer blocks; every stage needs at least one block, so pp <= n_layer");
  std::vector<int> counts;
  if (!explicit_layers.empty()) {
    if (static_cast<int>(explicit_layers.size()) != P)
      throw usage_error("pipeline: " + std::to_string(explicit_layers.size()) +
                        " explicit stage layer counts for " + std::to_string(P) + " stages");
    int sum = 0;
    for (int c : explicit_layers) {
      if (c < 1)
        throw usage_error("pipeline: every stage needs at least one block (explicit count " +
                          std::to_string(c) + ")");
      sum += c;
    }
    if (sum != L)
      throw usage_error("pipeline: explicit stage layer counts sum to " + std::to_string(sum) +
                        ", the model has n_layer = " + std::to_string(L));
    counts = explicit_layers;
  } else {
    // prefix[i] = parameters of blocks [0, i); cost of stage s over blocks [i, j).
    std::vector<int64_t> prefix(L + 1, 0);
    for (int l = 0; l < L; ++l) prefix[l + 1] = prefix[l] + sz.layers[l];
    auto cost = [&](int s, int i, int j) {
      return prefix[j] - prefix[i] + (s == 0 ? sz.embedding : 0) + (s == P - 1 ? sz.head : 0);
    };
    // best[s][i]: the smallest possible largest stage when stages s..P-1 cover blocks
    // [i, L), each with at least one block (exact, O(P L^2): L is at most a few hundred).
    constexpr int64_t inf = std::numeric_limits<int64_t>::max();
    std::vector<std::vector<int64_t>> best(P + 1, std::vector<int64_t>(L + 1, inf));
    for (int i = 0; i < L; ++i) best[P - 1][i] = cost(P - 1, i, L);
    for (int s = P - 2; s >= 0; --s)
      for (int i = s; i <= L - (P - s); ++i)
        for (int j = i + 1; j <= L - (P - s - 1); ++j)
          if (best[s + 1][j] != inf)
            best[s][i] = std::min(best[s][i], std::max(cost(s, i, j), best[s + 1][j]));
    const int64_t opt = best[0][0];
    // Walk forward taking, at each stage, the fewest blocks that still allow a cut of the
    // rest within opt: the lexicographically smallest optimal cut.
    int i = 0;
    for (int s = 0; s < P - 1; ++s) {
      int j = i + 1;
      while (cost(s, i, j) > opt || best[s + 1][j] > opt) ++j;
      COHORT_CHECK(j <= L - (P - s - 1));
      counts.push_back(j - i);
      i = j;
    }
    counts.push_back(L - i);
  }
  std::vector<stage_range> out;
  int first = 0;
  for (int s = 0; s < P; ++s) {
    out.push_back({first, first + counts[s], s == 0, s == P - 1});
    first += counts[s];
  }
  return out;
}

}  // namespace cohort::nn
