// Test helper: a tiny shard snapshot (a 2x3 weight, a bias of 2, one AdamW-like slot) for
// the checkpoint folder tests; its values depend on `seed`.
#pragma once
#include <cstdint>
#include <vector>

#include "runtime/ckpt/checkpoint.hpp"

namespace cohort::test {

inline shard_snapshot sample_shard(int64_t step, float seed = 1.0f) {
  shard_snapshot s;
  s.layout = {{"fc.weight", {2, 3}, 0}, {"fc.bias", {2}, 6}};
  for (int i = 0; i < 8; ++i) s.params.push_back(seed + 0.5f * static_cast<float>(i));
  std::vector<float> m;
  for (int i = 0; i < 8; ++i) m.push_back(-seed * static_cast<float>(i));
  s.optimizer_state.emplace_back("exp_avg", m);
  s.meta.step = step;
  s.meta.config_hash = "cfg";
  s.meta.optimizer = "adamw";
  return s;
}

}  // namespace cohort::test
