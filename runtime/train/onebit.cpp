#include "runtime/train/onebit.hpp"

#include <fnmatch.h>

#include <algorithm>
#include <cmath>

namespace cohort::train {

onebit_phase onebit_phase_of(const nn::optimizer& opt) {
  const auto* o = dynamic_cast<const nn::onebit_adam*>(&opt);
  if (o == nullptr) return onebit_phase::off;
  return o->frozen() ? onebit_phase::frozen : onebit_phase::warm_up;
}

std::vector<std::pair<int64_t, int64_t>> onebit_ranges(const nn::model& m,
                                                       const std::vector<std::string>& exclude) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const auto& p : m.parameters()) {
    bool kept = false;
    for (const std::string& pattern : exclude)
      kept = kept || fnmatch(pattern.c_str(), p.name.c_str(), 0) == 0;
    if (kept) continue;
    const int64_t n = p.value.numel();
    if (!out.empty() && out.back().first + out.back().second == p.offset)
      out.back().second += n;  // neighbours merge: fewer, larger segments
    else
      out.emplace_back(p.offset, n);
  }
  return out;
}

std::vector<comm::wire_segment> onebit_wire(const nn::onebit_adam& opt) {
  std::vector<comm::wire_segment> out;
  for (const auto& [off, count] : opt.options().compressed)
    out.push_back(
        {static_cast<std::size_t>(off), static_cast<std::size_t>(count), comm::wire_format::sign});
  return out;
}

void add_momentum_share(const nn::onebit_adam& opt, float* g, int replicas, int64_t offset,
                        int64_t count) {
  const float* m = opt.momentum();
  const float beta1 = opt.options().beta1;
  const float a = beta1 / static_cast<float>(replicas), b = 1.0f - beta1;
  nn::device& dev = opt.dev();  // g and m live there
  for (const auto& [off, n] : opt.options().compressed) {
    const int64_t from = std::max(off, offset), to = std::min(off + n, offset + count);
    if (to > from) dev.onebit_momentum_share(g + from, m + from, to - from, a, b);
  }
}

// Sent as m itself, a weight whose gradients were always small would get its chunk's
// magnitude, divided by its small d; divided by d first, the signs carry the update
// direction m / d, whose elements Adam has already brought to one scale, so one magnitude
// per chunk fits them all (docs/compression.md has the figures). v is frozen and the same on
// every replica, so the map is one fixed diagonal scaling: error feedback works in its space
// as in any other. An element with v = 0 never had a gradient: it sends 0 (divided by eps
// alone it would swamp its chunk's magnitude).
void scale_by_denominator(nn::onebit_adam& opt, float* g, int64_t offset, int64_t count,
                          bool divide) {
  const nn::optim_options& o = opt.options();
  const float* v = opt.state()[1].second.data();
  const float sqrt_bc2 = static_cast<float>(
      std::sqrt(1.0 - std::pow(static_cast<double>(o.beta2), static_cast<double>(o.freeze_step))));
  nn::device& dev = opt.dev();  // g and v live there
  for (const auto& [off, n] : o.compressed) {
    const int64_t from = std::max(off, offset), to = std::min(off + n, offset + count);
    if (to > from) dev.onebit_scale_by_denominator(g + from, v + from, to - from, sqrt_bc2, o.eps, divide);
  }
}

}  // namespace cohort::train
