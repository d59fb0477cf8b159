// Counter-based randomness: every random number in cohort is a pure function of
// (seed, a stream of integer coordinates), never of call order, threads or timing.
// That is what makes initialisation and data order reproducible across worker counts.
#pragma once
#include <cmath>
#include <cstdint>

namespace cohort {

/// SplitMix64 finaliser: a strong 64-bit mix.
inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// Hash of a seed and up to three coordinates.
inline uint64_t hash_coords(uint64_t seed, uint64_t a, uint64_t b = 0, uint64_t c = 0) {
  return mix64(mix64(mix64(mix64(seed) ^ a) ^ b) ^ c);
}

/// A sequential generator seeded from coordinates; still a pure function of its seed.
class rng {
 public:
  explicit rng(uint64_t seed) : state_(seed) {}
  uint64_t next_u64() { return mix64(state_++); }
  /// Uniform in [0, 1) with 24 random bits.
  float uniform() { return (next_u64() >> 40) * (1.0f / 16777216.0f); }
  /// Uniform integer in [0, n) (n > 0), Lemire's multiply-shift without rejection bias
  /// that matters at our sizes.
  uint64_t below(uint64_t n) {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(next_u64()) * n) >> 64);
  }
  /// Standard normal via Box-Muller (one value per call, deterministic).
  float normal() {
    double u1 = ((next_u64() >> 11) + 1) * (1.0 / 9007199254740993.0);
    double u2 = (next_u64() >> 11) * (1.0 / 9007199254740992.0);
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }

 private:
  uint64_t state_;
};

}  // namespace cohort
