// One micro-batch as the data sets hand it to the models. Owns plain host buffers;
// the model copies what it needs into pool-backed tensors.
#pragma once
#include <cstdint>
#include <vector>

namespace cohort {

struct batch {
  int n = 0;                      ///< rows: samples (classification) or sequences (LM)
  int t = 1;                      ///< time steps per sequence (1 for classification)
  int features = 0;               ///< per-sample float features (784 for Fashion-MNIST)
  std::vector<float> x;           ///< [n, features] inputs (classification)
  std::vector<int32_t> ids;       ///< [n, t] input token ids (LM)
  std::vector<int32_t> targets;   ///< [n] labels or [n, t] next tokens
};

}  // namespace cohort
