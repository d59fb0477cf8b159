// Helpers shared by the tests/nn gradient checks: seeded random fills and language-model
// batches, central finite differences and a float-noise-robust comparison of two gradient
// vectors.
#pragma once
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "runtime/core/batch.hpp"
#include "runtime/core/rng.hpp"
#include "runtime/nn/model.hpp"

namespace cohort::nn::testing {

/// N sequences of T random token ids and targets below VOCAB, from SEED.
inline batch lm_batch(int n, int t, int vocab, uint64_t seed) {
  rng r(seed);
  batch b;
  b.n = n;
  b.t = t;
  for (int i = 0; i < n * t; ++i) {
    b.ids.push_back(static_cast<int32_t>(r.below(vocab)));
    b.targets.push_back(static_cast<int32_t>(r.below(vocab)));
  }
  return b;
}

inline std::vector<float> randn(std::size_t n, uint64_t seed, float std = 1.0f) {
  rng r(seed);
  std::vector<float> v(n);
  for (float& x : v) x = r.normal() * std;
  return v;
}

/// Sets every parameter of M to N(0, STD^2) draws from SEED, away from the (small) default
/// init, so every path carries gradient.
inline void scramble(model& m, uint64_t seed, float std) {
  rng r(seed);
  tensor& v = m.flat_values();
  for (int64_t i = 0; i < v.numel(); ++i) v[i] = r.normal() * std;
}

/// Central differences of f with respect to every element of x (x is restored).
inline std::vector<double> numeric_grad(std::vector<float>& x, const std::function<double()>& f,
                                        float eps = 1e-2f) {
  std::vector<double> g(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float keep = x[i];
    x[i] = keep + eps;
    const double up = f();
    x[i] = keep - eps;
    const double down = f();
    x[i] = keep;
    g[i] = (up - down) / (2.0 * eps);
  }
  return g;
}

/// Relative error ||a - b|| / max(||a||, ||b||, floor): the whole vector is compared, so
/// float noise in single tiny entries cannot fail the check but a wrong formula does.
template <class A, class B>
double rel_error(const A& a, const B& b, double floor = 1e-6) {
  REQUIRE(a.size() == b.size());
  double d = 0, na = 0, nb = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    d += (double(a[i]) - double(b[i])) * (double(a[i]) - double(b[i]));
    na += double(a[i]) * double(a[i]);
    nb += double(b[i]) * double(b[i]);
  }
  return std::sqrt(d) / std::max({std::sqrt(na), std::sqrt(nb), floor});
}

/// sum(r * y): projects an output onto fixed random weights, giving a scalar loss whose
/// gradient with respect to y is r.
inline double project(const std::vector<float>& y, const std::vector<float>& r) {
  double s = 0;
  for (std::size_t i = 0; i < y.size(); ++i) s += double(y[i]) * r[i];
  return s;
}

/// Every parameter's gradient from M.forward_backward(B, 1) against central differences of
/// LOSS (evaluated with one value moved by +-EPS), compared per parameter by rel_error with
/// FLOOR; each failure names the parameter.
inline void check_param_grads(model& m, const batch& b, const std::function<double()>& loss,
                              float eps, double tol, double floor = 1e-4) {
  m.zero_grad();
  m.forward_backward(b, 1.0f);
  const std::vector<float> all(m.flat_grads().data(), m.flat_grads().data() + m.flat_grads().numel());
  for (parameter& p : m.parameters()) {
    const std::vector<float> analytic(all.begin() + p.offset,
                                      all.begin() + p.offset + p.value.numel());
    std::vector<double> numeric(static_cast<std::size_t>(p.value.numel()));
    for (int64_t i = 0; i < p.value.numel(); ++i) {
      const float keep = p.value[i];
      p.value[i] = keep + eps;
      const double up = loss();
      p.value[i] = keep - eps;
      const double down = loss();
      p.value[i] = keep;
      numeric[static_cast<std::size_t>(i)] = (up - down) / (2.0 * eps);
    }
    INFO("parameter " << p.name);
    CHECK(rel_error(analytic, numeric, floor) < tol);
  }
}

}  // namespace cohort::nn::testing
