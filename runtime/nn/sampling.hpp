// Choosing the next token from a language model's logits (`cohort generate`, serving):
// greedy at temperature 0, else a draw from softmax(logits / temperature) cut to the
// smallest set of most likely tokens whose probability reaches top_p (nucleus sampling).
// Pure and deterministic: the same logits, options and generator state give the same token
// on every machine (double arithmetic, a fixed order, the generator's own bits).
#pragma once
#include <cstdint>
#include <random>

namespace cohort::nn {

struct sampling {
  float temperature = 1.0f;  ///< 0: greedy (the most likely token; the lowest id on a tie)
  float top_p = 1.0f;        ///< in (0, 1]: the nucleus's probability mass
};

/// Throws usage_error naming the option when temperature < 0 or is not finite, or top_p is
/// outside (0, 1].
void check_sampling(const sampling& s);

/// A uniform draw in [0, 1) from 53 bits of the generator (the same on every standard
/// library, unlike std::uniform_real_distribution).
double uniform01(std::mt19937_64& rng);

/// The next token from LOGITS[0..vocab): greedy at temperature 0 (the generator is not
/// touched), else one draw of RNG. Non-finite logits count as impossible tokens (-inf); when
/// every logit is, the lowest id.
int sample_next(const float* logits, int vocab, const sampling& s, std::mt19937_64& rng);

}  // namespace cohort::nn
