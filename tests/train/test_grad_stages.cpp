// Each stage of the gradient pipeline on its own, on small buffers with closed-form results
// (runtime/train/grad_*.hpp): what it writes, that it stays inside its range, and that it
// leaves what is not its own alone.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "runtime/core/error.hpp"
#include "runtime/nn/optim.hpp"
#include "runtime/train/grad_clip.hpp"
#include "runtime/train/grad_fixed_sum.hpp"
#include "runtime/train/grad_fixed_to_float.hpp"
#include "runtime/train/grad_onebit_denominator.hpp"
#include "runtime/train/grad_onebit_momentum.hpp"

using namespace cohort;
using namespace cohort::train;

namespace {

constexpr double two40 = 1099511627776.0;  // 2^40: one in fixed point

grad_buffers view(std::vector<float>& g, std::vector<int64_t>* fixed = nullptr) {
  grad_buffers b;
  b.grads = g.data();
  b.fixed = fixed != nullptr ? fixed->data() : nullptr;
  b.size = static_cast<int64_t>(g.size());
  return b;
}

// A frozen 1-bit Adam over 3 elements, [0, 2) compressed, with beta1 = 0.5, beta2 = 0.75,
// eps = 1 and freeze step 1: its denominator is sqrt(v) / sqrt(1 - 0.75) + 1 = 2 sqrt(v) + 1.
struct frozen_onebit {
  nn::tensor p{3}, g{3};
  std::unique_ptr<nn::optimizer> opt;
  nn::onebit_adam* one = nullptr;
  frozen_onebit(std::vector<float> m, std::vector<float> v) {
    nn::optim_options o;
    o.kind = "onebit_adam";
    o.beta1 = 0.5f;
    o.beta2 = 0.75f;
    o.eps = 1.0f;
    o.freeze_step = 1;
    o.compressed = {{0, 2}};
    opt = nn::make_optimizer(p, g, o);
    one = dynamic_cast<nn::onebit_adam*>(opt.get());
    REQUIRE(one != nullptr);
    auto state = opt->state();
    for (int i = 0; i < 3; ++i) {
      state[0].second[i] = m[i];
      state[1].second[i] = v[i];
    }
    opt->set_steps(1);
    REQUIRE(one->frozen());
  }
};

}  // namespace

TEST_CASE("fixed_point_sum: each micro-batch from zero, added as integers, its range only") {
  std::vector<float> g = {0.5f, -0.25f, 3.0f, 7.0f};
  std::vector<int64_t> fixed = {1, 0, 0, 5};
  grad_buffers b = view(g, &fixed);
  fixed_sum_stage s;
  CHECK(std::string(s.name()) == "fixed_point_sum");
  s.run(b, 0, 3);
  CHECK(fixed[0] == 1 + static_cast<int64_t>(0.5 * two40));
  CHECK(fixed[1] == -static_cast<int64_t>(0.25 * two40));
  CHECK(fixed[2] == static_cast<int64_t>(3 * two40));
  CHECK(fixed[3] == 5);  // outside the range
  s.begin_micro_batch(b);
  CHECK(g == std::vector<float>{0, 0, 0, 0});
  // Overflow is an error that names the step, not a wrapped sum.
  g[0] = 1e30f;
  b.step = 17;
  CHECK_THROWS_WITH_AS(s.run(b, 0, 1), doctest::Contains("step 17"), cohort::error);
}

TEST_CASE("fixed_to_float: the fixed-point sum as floats, its range only") {
  std::vector<float> g = {9, 9, 9};
  std::vector<int64_t> fixed = {static_cast<int64_t>(3 * two40), -static_cast<int64_t>(two40 / 2),
                                static_cast<int64_t>(two40)};
  grad_buffers b = view(g, &fixed);
  fixed_to_float_stage s;
  CHECK(std::string(s.name()) == "fixed_to_float");
  s.run(b, 0, 2);
  CHECK(g == std::vector<float>{3.0f, -0.5f, 9.0f});
}

TEST_CASE("clip: scales down to max_norm only when the norm is larger") {
  std::vector<float> g = {3, 4};
  grad_buffers b = view(g);
  clip_stage s(1.0f);
  CHECK(std::string(s.name()) == "clip");
  b.norm = 5.0;
  s.run(b, 0, 2);
  const float coef = static_cast<float>(1.0 / (5.0 + 1e-6));
  CHECK(g[0] == 3 * coef);
  CHECK(g[1] == 4 * coef);
  std::vector<float> h = {3, 4};
  grad_buffers c = view(h);
  c.norm = 0.5;  // below max_norm
  s.run(c, 0, 2);
  CHECK(h == std::vector<float>{3, 4});
  clip_stage off(0.0f);  // train.grad_clip: 0 never clips
  c.norm = 1e9;
  off.run(c, 0, 2);
  CHECK(h == std::vector<float>{3, 4});
}

TEST_CASE("momentum_share: beta1 / replicas times m plus (1 - beta1) times g, on compressed ranges only") {
  frozen_onebit o({4, 8, 100}, {1, 1, 1});
  std::vector<float> g = {2, 2, 7};
  grad_buffers b = view(g);
  b.replicas = 2;
  momentum_share_stage s(*o.one);
  CHECK(std::string(s.name()) == "momentum_share");
  s.run(b, 0, 3);
  // 0.5 / 2 * 4 + 0.5 * 2 = 2; 0.25 * 8 + 1 = 3; element 2 is not compressed.
  CHECK(g == std::vector<float>{2, 3, 7});
  // A range that covers element 1 only.
  std::vector<float> h = {2, 2, 7};
  grad_buffers c = view(h);
  c.replicas = 1;
  s.run(c, 1, 2);
  CHECK(h == std::vector<float>{2, 0.5f * 8 + 0.5f * 2, 7});
}

TEST_CASE("divide / multiply_by_denominator: the frozen Adam denominator and its inverse") {
  // v = 4: denominator 2 * 2 + 1 = 5; v = 0: the element never had a gradient and sends 0.
  frozen_onebit o({0, 0, 0}, {4, 0, 9});
  std::vector<float> g = {10, 5, 6};
  grad_buffers b = view(g);
  denominator_stage div(*o.one, denominator_stage::direction::divide);
  denominator_stage mul(*o.one, denominator_stage::direction::multiply);
  CHECK(std::string(div.name()) == "divide_by_denominator");
  CHECK(std::string(mul.name()) == "multiply_by_denominator");
  div.run(b, 0, 3);
  CHECK(g == std::vector<float>{2, 0, 6});  // element 2 is not compressed
  mul.run(b, 0, 3);
  CHECK(g == std::vector<float>{10, 0, 6});
  mul.run(b, 1, 2);  // outside element 0: nothing there changes
  CHECK(g == std::vector<float>{10, 0, 6});
}
