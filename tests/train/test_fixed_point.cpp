// Fixed-point gradient sums: order independence, exact closed-form values, overflow errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "runtime/core/rng.hpp"
#include "runtime/train/fixed_point.hpp"

using namespace cohort::train;

TEST_CASE("fixed point: dyadic values convert exactly") {
  std::vector<float> x{0.5f, -0.25f, 3.0f, 1.0f / 1024};
  std::vector<int64_t> acc(4, 0);
  CHECK(fixed_accumulate(acc.data(), x.data(), 4) == -1);
  CHECK(acc[0] == (int64_t{1} << 39));
  CHECK(acc[1] == -(int64_t{1} << 38));
  std::vector<float> back(4);
  fixed_to_float(back.data(), acc.data(), 4);
  CHECK(back == x);
}

TEST_CASE("fixed point: any summation order gives the same bits") {
  cohort::rng r(7);
  const int parts = 8, n = 1000;
  std::vector<std::vector<float>> g(parts, std::vector<float>(n));
  for (auto& v : g)
    for (auto& e : v) e = (r.uniform() - 0.5f) * 1e-2f;
  std::vector<int64_t> fwd(n, 0), rev(n, 0);
  for (int p = 0; p < parts; ++p) REQUIRE(fixed_accumulate(fwd.data(), g[p].data(), n) == -1);
  // Two "workers": each sums half, then the halves are added (an allreduce).
  std::vector<int64_t> w0(n, 0), w1(n, 0);
  for (int p = parts - 1; p >= 0; --p)
    REQUIRE(fixed_accumulate((p % 2 ? w1 : w0).data(), g[p].data(), n) == -1);
  REQUIRE(fixed_add(rev.data(), w1.data(), n) == -1);
  REQUIRE(fixed_add(rev.data(), w0.data(), n) == -1);
  CHECK(fwd == rev);
  // And it is close to the true sum (one rounding of 2^-41 per addend at most, plus the
  // final float rounding).
  std::vector<float> out(n);
  fixed_to_float(out.data(), fwd.data(), n);
  for (int i = 0; i < n; ++i) {
    double s = 0;
    for (int p = 0; p < parts; ++p) s += g[p][i];
    CHECK(std::fabs(out[i] - s) <= parts * std::ldexp(1.0, -41) + std::fabs(s) * 6e-8);
  }
}

TEST_CASE("fixed point: non-finite and out-of-range values are refused, acc unchanged") {
  std::vector<int64_t> acc{1, 2, 3};
  std::vector<float> bad{0.0f, std::numeric_limits<float>::quiet_NaN(), 1.0f};
  CHECK(fixed_accumulate(acc.data(), bad.data(), 3) == 1);
  CHECK(acc == std::vector<int64_t>{1, 2, 3});
  std::vector<float> big{0.0f, 0.0f, 5e6f};
  CHECK(fixed_accumulate(acc.data(), big.data(), 3) == 2);
  CHECK(acc == std::vector<int64_t>{1, 2, 3});
}

TEST_CASE("fixed point: sums that would overflow int64 are reported, never wrapped") {
  std::vector<int64_t> a{std::numeric_limits<int64_t>::max() - 1, 5};
  std::vector<int64_t> b{2, 5};
  CHECK(fixed_add(a.data(), b.data(), 2) == 0);
  CHECK(a[0] == std::numeric_limits<int64_t>::max() - 1);
  std::vector<float> x{4000000.0f};
  std::vector<int64_t> acc{0};
  CHECK(fixed_accumulate(acc.data(), x.data(), 1) == -1);
  CHECK(fixed_accumulate(acc.data(), x.data(), 1) == -1);  // 8e6 still fits
  CHECK(fixed_accumulate(acc.data(), x.data(), 1) == 0);   // 1.2e7 > 2^23 overflows
}
