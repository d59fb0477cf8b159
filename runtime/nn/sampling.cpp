#include "runtime/nn/sampling.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "runtime/core/error.hpp"

namespace cohort::nn {

void check_sampling(const sampling& s) {
  if (!std::isfinite(s.temperature) || s.temperature < 0)
    throw usage_error("--temperature " + std::to_string(s.temperature) +
                      ": must be 0 (greedy) or a positive number");
  if (!(s.top_p > 0 && s.top_p <= 1))
    throw usage_error("--top-p " + std::to_string(s.top_p) +
                      ": must be in (0, 1] (1 keeps every token)");
}

double uniform01(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

int sample_next(const float* logits, int vocab, const sampling& s, std::mt19937_64& rng) {
  int best = 0;
  for (int i = 1; i < vocab; ++i) {
    const bool ok = std::isfinite(logits[i]);
    if (ok && (!std::isfinite(logits[best]) || logits[i] > logits[best])) best = i;
  }
  if (s.temperature == 0 || !std::isfinite(logits[best])) return best;
  // Probabilities relative to the largest logit (no overflow), highest first, ties by id.
  std::vector<double> p(static_cast<std::size_t>(vocab));
  const double top = logits[best];
  for (int i = 0; i < vocab; ++i)
    p[i] = std::isfinite(logits[i]) ? std::exp((logits[i] - top) / s.temperature) : 0.0;
  std::vector<int> order(static_cast<std::size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
  const double total = std::accumulate(p.begin(), p.end(), 0.0);
  // The nucleus: the shortest prefix whose mass reaches top_p (at least one token).
  std::size_t keep = 0;
  double mass = 0;
  while (keep < order.size() && p[order[keep]] > 0) {
    mass += p[order[keep++]];
    if (mass >= s.top_p * total) break;
  }
  double u = uniform01(rng) * mass;
  for (std::size_t k = 0; k < keep; ++k) {
    u -= p[order[k]];
    if (u < 0) return order[k];
  }
  return order[keep - 1];  // rounding left u at or just above the nucleus's mass
}

}  // namespace cohort::nn
