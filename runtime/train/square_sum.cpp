#include "runtime/train/square_sum.hpp"

#include <cmath>
#include <cstring>
#include <limits>

namespace cohort::train {

namespace {
// Bit 0 of the accumulator weighs 2^-298: the smallest square, (2^-149)^2.
constexpr int lsb_exponent = -298;
// Digits take 32-bit pieces; after this many additions each could carry into bit 63.
constexpr int64_t normalize_every = int64_t{1} << 29;
}  // namespace

void square_sum::add(const float* x, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &x[i], sizeof bits);
    const uint32_t exp = (bits >> 23) & 0xffu;
    uint64_t m = bits & 0x7fffffu;
    if (exp == 0xffu) {
      nonfinite_ = 1;
      continue;
    }
    if (m == 0 && exp == 0) continue;
    int e = -149;  // a subnormal: m * 2^-149
    if (exp != 0) {
      m |= 0x800000u;
      e = static_cast<int>(exp) - 150;
    }
    const int pos = 2 * e - lsb_exponent;  // in [0, 506]
    const unsigned __int128 sq = static_cast<unsigned __int128>(m * m) << (pos & 31);
    const int at = pos >> 5;
    d_[at] += static_cast<int64_t>(static_cast<uint64_t>(sq) & 0xffffffffu);
    d_[at + 1] += static_cast<int64_t>(static_cast<uint64_t>(sq >> 32) & 0xffffffffu);
    d_[at + 2] += static_cast<int64_t>(static_cast<uint64_t>(sq >> 64));
    if (++since_normalize_ == normalize_every) normalize();
  }
}

void square_sum::normalize() {
  for (int i = 0; i + 1 < digits; ++i) {
    d_[i + 1] += d_[i] >> 32;
    d_[i] &= 0xffffffff;
  }
  since_normalize_ = 0;
}

void square_sum::merge(const square_sum& o) {
  square_sum b = o;
  b.normalize();
  normalize();
  for (int i = 0; i < digits; ++i) d_[i] += b.d_[i];
  nonfinite_ |= b.nonfinite_;
  normalize();
}

double square_sum::value() const {
  if (nonfinite_) return std::numeric_limits<double>::infinity();
  square_sum c = *this;
  c.normalize();
  // From the top digit down: the same exact total always takes the same roundings.
  double v = 0.0;
  for (int i = digits - 1; i >= 0; --i)
    v += std::ldexp(static_cast<double>(c.d_[i]), 32 * i + lsb_exponent);
  return v;
}

bool square_sum::operator==(const square_sum& o) const {
  square_sum a = *this, b = o;
  a.normalize();
  b.normalize();
  return a.d_ == b.d_ && a.nonfinite_ == b.nonfinite_;
}

std::array<int64_t, square_sum::digits + 1> square_sum::words() const {
  square_sum c = *this;
  c.normalize();
  std::array<int64_t, digits + 1> w{};
  for (int i = 0; i < digits; ++i) w[i] = c.d_[i];
  w[digits] = c.nonfinite_;
  return w;
}

square_sum square_sum::from_words(const int64_t* w) {
  square_sum s;
  for (int i = 0; i < digits; ++i) s.d_[i] = w[i];
  s.nonfinite_ = w[digits] != 0 ? 1 : 0;
  return s;
}

}  // namespace cohort::train
