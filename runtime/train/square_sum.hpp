// An exact sum of squares of floats: the gradient norm's per-parameter sums in bitwise mode
// and under sharded gradients (train.zero: 2). Float sums depend on the order and the
// split of their terms; this one does not: each square is exact in 48 bits, and the terms
// are added as integers in a fixed-point accumulator wide enough for every float's square,
// so any cut of a tensor into pieces (DP shards, pipeline stages) summed anywhere and
// merged in any order gives the same total, rounded once to a double. Pure arithmetic.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>

namespace cohort::train {

class square_sum {
 public:
  /// 32-bit digits kept in int64 (carry-save): a float's square m^2 * 2^(2e) with m < 2^24
  /// and 2e in [-298, 208] lands in bits [0, 554) of the accumulator, scaled by 2^298.
  static constexpr int digits = 19;

  /// Adds x[i]^2 for i in [0, n). Inf and NaN make the total non-finite (value() says so).
  void add(const float* x, std::size_t n);
  /// Adds another accumulator's terms.
  void merge(const square_sum& o);
  /// The exact total rounded to a double (one fixed rounding path: the same bits for the
  /// same total); +inf after an Inf or NaN term or beyond a double's range.
  double value() const;
  /// Carries normalised: every digit in [0, 2^32), except the last, which holds the rest.
  void normalize();
  bool operator==(const square_sum& o) const;

  /// The accumulator as it travels between ranks (digits, then the non-finite flag).
  std::array<int64_t, digits + 1> words() const;
  static square_sum from_words(const int64_t* w);

 private:
  std::array<int64_t, digits> d_{};
  int64_t nonfinite_ = 0;
  int64_t since_normalize_ = 0;
};

}  // namespace cohort::train
