// The fault spec's words, its canonical printer and the pure scheduling helpers; the parser
// is fault_parser.cpp.
#include "runtime/core/faults.hpp"

#include <cstdio>
#include <cstdlib>

#include "runtime/core/rng.hpp"

namespace cohort::faults {
namespace {

// Stream tags of the counter-based RNG, so the two draws of a random kill (does it fire,
// whom) are independent of each other and of every other use of the same seed.
constexpr uint64_t fires_stream = 0xFA017F1E5ull;
constexpr uint64_t victim_stream = 0xFA017F1C7ull;

}  // namespace

std::string number_text(double v) {
  char buf[40];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

const char* kind_name(fault_kind k) {
  switch (k) {
    case fault_kind::kill:
      return "kill";
    case fault_kind::hang:
      return "hang";
    case fault_kind::slow:
      return "slow";
    case fault_kind::drop_control:
      return "drop control";
    case fault_kind::partition:
      return "partition";
    case fault_kind::scale:
      return "scale";
    case fault_kind::random_kill:
      return "random kill";
  }
  return "?";
}

std::string worker_ref::text() const {
  return by_rank() ? "rank=" + std::to_string(rank) : "worker=" + name;
}

bool operator==(const fault_spec& a, const fault_spec& b) {
  return a.kind == b.kind && a.worker == b.worker && a.coordinator == b.coordinator &&
         a.at_step == b.at_step && a.from_step == b.from_step && a.to_step == b.to_step &&
         a.duration_ms == b.duration_ms && a.factor == b.factor && a.p == b.p && a.seed == b.seed &&
         a.to_workers == b.to_workers && a.mtbf_steps == b.mtbf_steps;
}

std::string to_string(const fault_spec& s) {
  auto duration = [](int64_t ms) {
    return ms % 1000 == 0 ? std::to_string(ms / 1000) + "s" : std::to_string(ms) + "ms";
  };
  const std::string at = " at step=" + std::to_string(s.at_step);
  const std::string victim = s.coordinator ? "coordinator" : s.worker.text();
  switch (s.kind) {
    case fault_kind::kill:
      return "kill " + victim + at;
    case fault_kind::hang:
      return "hang " + s.worker.text() + at + " for=" + duration(s.duration_ms);
    case fault_kind::slow:
      return "slow " + s.worker.text() + " factor=" + number_text(s.factor) +
             " from step=" + std::to_string(s.from_step) + " to step=" + std::to_string(s.to_step);
    case fault_kind::drop_control:
      return "drop control p=" + number_text(s.p) + " seed=" + std::to_string(s.seed);
    case fault_kind::partition:
      return "partition " + victim + at + " for=" + duration(s.duration_ms);
    case fault_kind::scale:
      return "scale to=" + std::to_string(s.to_workers) + at;
    case fault_kind::random_kill:
      return "random kill mtbf=" + number_text(s.mtbf_steps) +
             "steps seed=" + std::to_string(s.seed);
  }
  return "";
}

std::vector<const fault_spec*> due_at(const std::vector<fault_spec>& specs, int64_t step) {
  std::vector<const fault_spec*> out;
  for (const fault_spec& s : specs) {
    switch (s.kind) {
      case fault_kind::kill:
      case fault_kind::hang:
      case fault_kind::partition:
      case fault_kind::scale:
        if (s.at_step == step) out.push_back(&s);
        break;
      case fault_kind::slow:
        if (s.from_step <= step && step <= s.to_step) out.push_back(&s);
        break;
      case fault_kind::drop_control:
      case fault_kind::random_kill:
        break;
    }
  }
  return out;
}

bool random_kill_fires(const fault_spec& s, int64_t step) {
  COHORT_CHECK(s.kind == fault_kind::random_kill && s.mtbf_steps >= 1);
  // 53 random bits as a double in [0, 1): fires with probability exactly 1/mtbf (to 2^-53).
  const uint64_t h = hash_coords(s.seed, fires_stream, static_cast<uint64_t>(step));
  const double u = static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0);
  return u < 1.0 / s.mtbf_steps;
}

int random_kill_victim(const fault_spec& s, int64_t step, int workers) {
  COHORT_CHECK(s.kind == fault_kind::random_kill && workers > 0);
  rng r(hash_coords(s.seed, victim_stream, static_cast<uint64_t>(step)));
  return static_cast<int>(r.below(static_cast<uint64_t>(workers)));
}

}  // namespace cohort::faults
