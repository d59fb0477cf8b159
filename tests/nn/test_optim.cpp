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

namespace {

// 1-bit Adam on elements [0, 2) of a small buffer, with this weight decay and freeze step.
optim_options onebit_options(float weight_decay, int freeze_step) {
  optim_options o;
  o.kind = "onebit_adam";
  o.weight_decay = weight_decay;
  o.freeze_step = freeze_step;
  o.compressed = {{0, 2}};
  return o;
}

}  // namespace

TEST_CASE("1-bit Adam: AdamW until the freeze, then the given momentum over a frozen variance") {
  // Three elements: [0, 2) compressed, 2 kept at full precision; freeze after one update.
  tensor p({3}), g({3}), pa({3}), ga({3});
  for (int i = 0; i < 3; ++i) p[i] = pa[i] = 1.0f + float(i);
  const optim_options o = onebit_options(0.01f, 1);
  auto opt = make_optimizer(p, g, o);
  auto* one = dynamic_cast<onebit_adam*>(opt.get());
  REQUIRE(one != nullptr);
  optim_options oa = o;
  oa.kind = "adamw";
  adamw ref(pa, ga, oa);
  const float lr = 0.1f;

  // Update 1 (warm-up): exactly AdamW, bit for bit.
  CHECK_FALSE(one->frozen());
  for (int i = 0; i < 3; ++i) g[i] = ga[i] = 0.5f - float(i);
  opt->step(lr);
  ref.step(lr);
  for (int i = 0; i < 3; ++i) CHECK(p[i] == pa[i]);
  CHECK(one->frozen());
  const float v0 = opt->state()[1].second[0], m2 = opt->state()[0].second[2];
  const float v2 = opt->state()[1].second[2];

  // Update 2: the buffer holds the group's momentum on [0, 2) and the gradient on 2.
  const double p0 = p[0], p2 = p[2];
  g[0] = 0.25f;  // the new momentum of element 0
  g[1] = -0.5f;  // of element 1
  g[2] = 2.0f;   // the gradient of element 2
  opt->step(lr);
  const double bc1 = 1 - 0.9 * 0.9, bc2_frozen = 1 - 0.999;
  CHECK(opt->state()[0].second[0] == 0.25f);  // m takes the momentum as given
  CHECK(opt->state()[1].second[0] == v0);     // v stays frozen
  CHECK(p[0] == doctest::Approx(p0 * (1 - 0.1 * 0.01) -
                                0.1 / bc1 * 0.25 / (std::sqrt(v0) / std::sqrt(bc2_frozen) + 1e-8))
                    .epsilon(1e-5));
  // Element 2 stays AdamW: m and v move with its gradient.
  const double m = 0.9 * m2 + 0.1 * 2.0, v = 0.999 * v2 + 0.001 * 4.0;
  CHECK(opt->state()[1].second[2] == doctest::Approx(v).epsilon(1e-5));
  CHECK(p[2] ==
        doctest::Approx(p2 * (1 - 0.1 * 0.01) -
                        0.1 / bc1 * m / (std::sqrt(v) / std::sqrt(1 - 0.999 * 0.999) + 1e-8))
            .epsilon(1e-5));
  CHECK(opt->state()[0].first == "exp_avg");
  CHECK(opt->state()[1].first == "exp_avg_sq");
}

TEST_CASE("1-bit Adam: an element that never had a gradient keeps a zero momentum after the freeze") {
  // Element 1's gradient is 0 throughout the warm-up (an input pixel that was always 0), so
  // its variance froze at 0. The signs hand it a momentum of +-scale; divided by eps alone
  // that would move it by lr * scale / 1e-8. It must only decay.
  tensor p({2}), g({2});
  p[0] = 1.0f;
  p[1] = 2.0f;
  const optim_options o = onebit_options(0.1f, 2);
  auto opt = make_optimizer(p, g, o);
  for (int t = 0; t < 2; ++t) {
    g[0] = 0.5f;
    g[1] = 0.0f;
    opt->step(0.01f);
  }
  REQUIRE(opt->state()[1].second[1] == 0.0f);
  const float before = p[1];
  g[0] = 0.3f;
  g[1] = 0.7f;  // what the compressed sum decoded for it: a scale, not a gradient
  opt->step(0.01f);
  CHECK(p[1] == doctest::Approx(before * (1 - 0.01 * 0.1)));
  CHECK(opt->state()[0].second[1] == 0.0f);
  CHECK(opt->state()[0].second[0] == 0.3f);
}
