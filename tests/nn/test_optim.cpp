// Optimizers and clipping against values worked out by hand from the PyTorch formulas.
#include <doctest/doctest.h>

#include <cmath>

#include "runtime/cpu/kernels.hpp"
#include "runtime/nn/optim.hpp"

using namespace cohort::nn;

TEST_CASE("AdamW: two steps from known values equal the hand-computed update") {
  tensor p({2}), g({2});
  p[0] = 1.0f;
  p[1] = -2.0f;
  optim_options o;
  o.beta1 = 0.9f;
  o.beta2 = 0.999f;
  o.eps = 1e-8f;
  o.weight_decay = 0.01f;
  adamw opt(p, g, o);
  const float lr = 0.1f;

  // Step 1, g = (0.5, -1): m = 0.1 g, v = 0.001 g^2, mhat = g, vhat = g^2, so the
  // update is lr * g / (|g| + eps) = lr * sign(g) (up to eps) after the decay p *= 1 - lr*wd.
  g[0] = 0.5f;
  g[1] = -1.0f;
  opt.step(lr);
  CHECK(opt.steps() == 1);
  CHECK(p[0] == doctest::Approx(1.0 * (1 - 0.001) - 0.1 * 0.5 / (0.5 + 1e-8)).epsilon(1e-6));
  CHECK(p[1] == doctest::Approx(-2.0 * (1 - 0.001) + 0.1 * 1.0 / (1.0 + 1e-8)).epsilon(1e-6));
  auto st = opt.state();
  REQUIRE(st.size() == 2);
  CHECK(st[0].first == "exp_avg");
  CHECK(st[0].second[0] == doctest::Approx(0.05));
  CHECK(st[1].second[1] == doctest::Approx(0.001));

  // Step 2, g = (-1, 2): moments and bias corrections written out in double.
  const double p0 = p[0], p1 = p[1];
  g[0] = -1.0f;
  g[1] = 2.0f;
  opt.step(lr);
  auto expect = [&](double p_old, double g1, double g2) {
    const double m = 0.9 * (0.1 * g1) + 0.1 * g2;
    const double v = 0.999 * (0.001 * g1 * g1) + 0.001 * g2 * g2;
    const double bc1 = 1 - 0.9 * 0.9, bc2 = 1 - 0.999 * 0.999;
    return p_old * (1 - 0.1 * 0.01) - 0.1 / bc1 * m / (std::sqrt(v) / std::sqrt(bc2) + 1e-8);
  };
  CHECK(p[0] == doctest::Approx(expect(p0, 0.5, -1.0)).epsilon(1e-5));
  CHECK(p[1] == doctest::Approx(expect(p1, -1.0, 2.0)).epsilon(1e-5));
}

TEST_CASE("SGD with momentum follows PyTorch's buffer convention") {
  tensor p({1}), g({1});
  p[0] = 1.0f;
  optim_options o;
  o.kind = "sgd";
  o.momentum = 0.9f;
  o.weight_decay = 0.1f;
  auto opt = make_optimizer(p, g, o);
  g[0] = 2.0f;
  opt->step(0.5f);
  // g' = 2 + 0.1*1 = 2.1; buf = 2.1; p = 1 - 0.5*2.1 = -0.05.
  CHECK(p[0] == doctest::Approx(-0.05));
  g[0] = 1.0f;
  opt->step(0.5f);
  // g' = 1 + 0.1*(-0.05) = 0.995; buf = 0.9*2.1 + 0.995 = 2.885; p = -0.05 - 1.4425.
  CHECK(p[0] == doctest::Approx(-0.05 - 0.5 * 2.885));
  CHECK(opt->state()[0].second[0] == doctest::Approx(2.885));
}

TEST_CASE("make_optimizer rejects unknown kinds") {
  tensor p({1}), g({1});
  optim_options o;
  o.kind = "lamb";
  CHECK_THROWS_AS(make_optimizer(p, g, o), cohort::usage_error);
}

TEST_CASE("global gradient-norm clipping") {
  tensor g({3});
  g[0] = 3.0f;
  g[1] = 0.0f;
  g[2] = 4.0f;
  SUBCASE("norm above the limit scales to the limit") {
    CHECK(clip_grad_norm(g, 1.0f) == doctest::Approx(5.0));
    CHECK(g[0] == doctest::Approx(3.0 / (5.0 + 1e-6)));
    CHECK(g[2] == doctest::Approx(4.0 / (5.0 + 1e-6)));
    CHECK(std::sqrt(grad_sum_squares(g)) == doctest::Approx(1.0).epsilon(1e-6));
  }
  SUBCASE("norm below the limit leaves gradients alone") {
    CHECK(clip_grad_norm(g, 10.0f) == doctest::Approx(5.0));
    CHECK(g[0] == 3.0f);
    CHECK(g[2] == 4.0f);
  }
  SUBCASE("max_norm 0 disables clipping") {
    CHECK(clip_coefficient(100.0, 0.0f) == 1.0f);
    clip_grad_norm(g, 0.0f);
    CHECK(g[2] == 4.0f);
  }
}
