// runtime/train/square_sum: an exact sum of squares, the same bits however its terms are
// cut and merged.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "runtime/train/square_sum.hpp"

using cohort::train::square_sum;

namespace {
double of(const std::vector<float>& x) {
  square_sum s;
  s.add(x.data(), x.size());
  return s.value();
}
}  // namespace

TEST_CASE("square_sum: closed forms") {
  CHECK(of({}) == 0.0);
  CHECK(of({3.0f, 4.0f}) == 25.0);
  CHECK(of({-2.0f}) == 4.0);
  CHECK(of(std::vector<float>(1000, 0.5f)) == 250.0);
  // Terms far apart are kept exactly: 2^60 + 2^-60, rounded once at the end.
  CHECK(of({std::ldexp(1.0f, 30), std::ldexp(1.0f, -30)}) == std::ldexp(1.0, 60));
  // The extremes of a float: the largest and the smallest subnormal.
  const float big = std::numeric_limits<float>::max();
  const float tiny = std::numeric_limits<float>::denorm_min();
  CHECK(of({big}) == static_cast<double>(big) * big);
  CHECK(of({tiny}) == std::ldexp(1.0, -298));
  CHECK(std::isinf(of({1.0f, std::numeric_limits<float>::quiet_NaN()})));
  CHECK(std::isinf(of({std::numeric_limits<float>::infinity()})));
}

TEST_CASE("square_sum: any cut, merged in any order, gives the same total, which a float sum does not") {
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(100000);
  for (auto& v : x) v = d(rng) * std::exp2(static_cast<float>(static_cast<int>(rng() % 40) - 20));
  square_sum whole;
  whole.add(x.data(), x.size());
  bool float_differs = false;
  for (int cuts : {2, 3, 7, 64}) {
    std::vector<square_sum> parts(static_cast<std::size_t>(cuts));
    std::vector<double> float_parts(static_cast<std::size_t>(cuts), 0.0);
    for (int k = 0; k < cuts; ++k) {
      const std::size_t b = x.size() * static_cast<std::size_t>(k) / static_cast<std::size_t>(cuts);
      const std::size_t e =
          x.size() * static_cast<std::size_t>(k + 1) / static_cast<std::size_t>(cuts);
      parts[static_cast<std::size_t>(k)].add(x.data() + b, e - b);
      for (std::size_t i = b; i < e; ++i)
        float_parts[static_cast<std::size_t>(k)] += static_cast<double>(x[i]) * x[i];
    }
    square_sum fwd, back;
    double ffwd = 0, fback = 0;
    for (int k = 0; k < cuts; ++k) {
      fwd.merge(parts[static_cast<std::size_t>(k)]);
      back.merge(parts[static_cast<std::size_t>(cuts - 1 - k)]);
      ffwd += float_parts[static_cast<std::size_t>(k)];
      fback += float_parts[static_cast<std::size_t>(cuts - 1 - k)];
    }
    CHECK(fwd == whole);
    CHECK(back == whole);
    CHECK(fwd.value() == whole.value());
    // Through the wire form too.
    CHECK(square_sum::from_words(fwd.words().data()).value() == whole.value());
    float_differs = float_differs || ffwd != fback;
  }
  CHECK(float_differs);  // the reason this accumulator exists
  // And close to the long-double sum.
  long double ref = 0;
  for (float v : x) ref += static_cast<long double>(v) * v;
  CHECK(std::fabs(whole.value() - static_cast<double>(ref)) <= 1e-12 * static_cast<double>(ref));
}
