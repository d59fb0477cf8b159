// The mixture-of-experts layer (runtime/nn/moe.hpp) and the GPT blocks that use it: routing
// and capacity as tables, a dropped token's output, and every parameter's gradient against
// central differences of the training loss (the load-balancing loss included).
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "runtime/core/error.hpp"
#include "runtime/core/rng.hpp"
#include "runtime/nn/gpt.hpp"
#include "runtime/nn/moe.hpp"
#include "tests/nn/grad_check.hpp"

using namespace cohort;
using namespace cohort::nn;
using namespace cohort::nn::testing;

TEST_CASE("moe capacity: ceil(capacity_factor x tokens x top_k / experts), at least 1") {
  struct row {
    int tokens, experts, top_k;
    float factor;
    int capacity;
  };
  const std::vector<row> rows = {
      {8, 4, 1, 1.0f, 2}, {8, 4, 2, 1.0f, 4}, {8, 4, 1, 1.25f, 3},
      {10, 4, 1, 1.0f, 3}, {1, 8, 1, 1.0f, 1}, {64, 8, 2, 1.25f, 20},
  };
  for (const row& r : rows) {
    CAPTURE(r.tokens);
    CAPTURE(r.experts);
    CHECK(moe_capacity(r.tokens, r.experts, r.top_k, r.factor) == r.capacity);
  }
}

TEST_CASE("moe routing: top-k by probability (ties to the lowest expert), gates, capacity in "
          "choice order") {
  // Four tokens over three experts.
  const std::vector<float> probs = {
      0.6f, 0.3f, 0.1f,   // token 0: 0 then 1
      0.2f, 0.2f, 0.6f,   // token 1: 2, then 0 (a tie with 1: the lower)
      0.5f, 0.1f, 0.4f,   // token 2: 0 then 2
      0.7f, 0.2f, 0.1f};  // token 3: 0 then 1
  SUBCASE("top-1, capacity 2 (factor 1.5): the third token for expert 0 is dropped") {
    const moe_routing r = moe_route(probs.data(), 4, 3, 1, 1.5f);
    CHECK(r.capacity == 2);
    CHECK(r.expert == std::vector<int32_t>{0, 2, 0, 0});
    CHECK(r.slot == std::vector<int32_t>{0, 0, 1, -1});
    CHECK(r.gate == std::vector<float>{0.6f, 0.6f, 0.5f, 0.7f});
    CHECK(r.kept == std::vector<int32_t>{2, 0, 1});
    CHECK(r.wanted == std::vector<int32_t>{3, 0, 1});
    CHECK(r.dropped == 1);
  }
  SUBCASE("top-2, capacity 3 (factor 1.0): first choices first, so token 1's second choice "
          "(expert 0) finds it full") {
    const moe_routing r = moe_route(probs.data(), 4, 3, 2, 1.0f);
    CHECK(r.capacity == 3);
    CHECK(r.expert == std::vector<int32_t>{0, 1, 2, 0, 0, 2, 0, 1});
    // Expert 0: tokens 0, 2, 3 by their first choices; token 1's second comes after: dropped.
    CHECK(r.slot == std::vector<int32_t>{0, 0, 0, -1, 1, 1, 2, 1});
    CHECK(r.kept == std::vector<int32_t>{3, 2, 2});
    CHECK(r.wanted == std::vector<int32_t>{4, 2, 2});
    CHECK(r.dropped == 1);
    // Gates: the two probabilities normalised.
    CHECK(r.gate[0] == doctest::Approx(0.6 / 0.9));
    CHECK(r.gate[1] == doctest::Approx(0.3 / 0.9));
    CHECK(r.gate[2] == doctest::Approx(0.75));
    CHECK(r.gate[3] == doctest::Approx(0.25));
  }
  SUBCASE("bad top_k") {
    CHECK_THROWS_AS(moe_route(probs.data(), 4, 3, 3, 1.0f), usage_error);
    CHECK_THROWS_AS(moe_route(probs.data(), 4, 1, 2, 1.0f), usage_error);
  }
}

namespace {

gpt_shape moe_shape(int top_k, float capacity, int every) {
  gpt_shape s{7, 4, 2, 2, 8};
  s.moe_experts = 4;
  s.moe_top_k = top_k;
  s.moe_capacity_factor = capacity;
  s.moe_every = every;
  s.moe_aux_coef = 0.05f;
  return s;
}

// Every parameter's gradient from forward_backward against central differences of the loss
// forward_backward returns (the cross-entropy plus the load-balancing losses). The floor:
// experts that few tokens reach have gradients near float noise at this eps.
void check_grads(gpt& m, const batch& b, float eps, double tol) {
  check_param_grads(m, b, [&] { return static_cast<double>(m.forward_backward(b, 1.0f)); }, eps,
                    tol, 1e-3);
}

}  // namespace

TEST_CASE("moe GPT: names and shapes, the router and each expert in every every-th block") {
  gpt m(moe_shape(2, 2.0f, 2), 2, 1);
  CHECK(m.param("transformer.h.0.mlp.c_fc.weight").value.shape() == shape_t{32, 8});
  CHECK_THROWS_AS(m.param("transformer.h.0.mlp.router.weight"), usage_error);
  CHECK(m.param("transformer.h.1.mlp.router.weight").value.shape() == shape_t{4, 8});
  CHECK(m.param("transformer.h.1.mlp.experts.3.c_fc.weight").value.shape() == shape_t{32, 8});
  CHECK(m.param("transformer.h.1.mlp.experts.3.c_proj.bias").value.shape() == shape_t{8});
  CHECK_THROWS_AS(m.param("transformer.h.1.mlp.c_fc.weight"), usage_error);
}

TEST_CASE("moe GPT gradients match finite differences, top-1 and top-2, with the "
          "load-balancing loss") {
  for (int top_k : {1, 2}) {
    CAPTURE(top_k);
    // Capacity for every token (no drop can appear or vanish between the two sides of a
    // difference); routing choices are far apart at this scale.
    gpt m(moe_shape(top_k, 4.0f, 1), 2, 3);
    scramble(m, 40 + top_k, 0.5f);
    check_grads(m, lm_batch(2, 3, 7, 50 + top_k), 3e-3f, 3e-2);
  }
}

TEST_CASE("moe: a token over every expert's capacity gets no MoE output (the residual "
          "carries it), and is counted") {
  gpt m(moe_shape(1, 0.25f, 1), 2, 5);  // capacity ceil(0.25 * 6 / 4) = 1 of 6 tokens
  scramble(m, 6, 0.5f);
  m.forward_backward(lm_batch(2, 3, 7, 7), 1.0f);
  const gpt::moe_stats st = m.last_moe();
  int64_t kept = 0;
  for (int64_t t : st.tokens) kept += t;
  // Two MoE blocks, 6 tokens each: every expert takes at most one a block.
  CHECK(kept <= 8);
  CHECK(st.dropped == 12 - kept);
  CHECK(st.dropped >= 4);
  CHECK(st.aux_loss > 0);

  // The layer alone: rows it dropped come out zero.
  const moe_layer& layer = *m.layers()[0].moe;
  moe_acts a;
  const std::vector<float> x = randn(6 * 8, 9);
  std::vector<float> y(6 * 8, 1.0f);
  layer.forward(a, y.data(), x.data(), 6);
  int zero_rows = 0;
  for (int t = 0; t < 6; ++t) {
    if (a.route.slot[static_cast<std::size_t>(t)] >= 0) continue;
    bool all_zero = true;
    for (int k = 0; k < 8; ++k) all_zero = all_zero && y[static_cast<std::size_t>(t * 8 + k)] == 0.0f;
    zero_rows += all_zero;
    CHECK(all_zero);
  }
  CHECK(zero_rows == a.route.dropped);
}
