// A fault's cost as the summary's events table shows it (docs/faults.md, "Where a fault's
// time goes"): run_report stamps fault_cost, this cuts it into parts.
#include <algorithm>
#include <nlohmann/json.hpp>
#include <vector>

#include "runtime/step/run_report.hpp"

namespace cohort::step {

nlohmann::json cost_json(const fault_cost& c, double at_s) {
  nlohmann::json j;
  // Each part is the time from the stamp before it, in time order: with elastic.min_workers
  // at the world the survivors wait for the respawn and the first commit after the fault is
  // its entry (recovered == whole: that step counts as entering, not as a rerun), and a
  // respawn may register before the survivors' rerun commits. Either way the parts sum to
  // whole_ms.
  struct stamp {
    const char* part;
    double t;
    int order;  ///< among equal times; recovered after whole
  };
  std::vector<stamp> v = {{"detect_ms", c.removed_s, 0},     {"rerun_ms", c.recovered_s, 6},
                          {"respawn_ms", c.registered_s, 1}, {"load_ms", c.ready_s, 2},
                          {"admit_ms", c.entered_s, 3},      {"enter_ms", c.whole_s, 4}};
  std::stable_sort(v.begin(), v.end(), [](const stamp& x, const stamp& y) {
    return std::make_pair(x.t, x.order) < std::make_pair(y.t, y.order);
  });
  double last = at_s;
  for (const stamp& x : v) {
    if (x.t < 0) {
      j[x.part] = nullptr;
      continue;
    }
    j[x.part] = 1e3 * std::max(0.0, x.t - last);
    last = std::max(last, x.t);
  }
  j["whole_ms"] = c.whole_s >= 0 ? nlohmann::json(1e3 * (c.whole_s - at_s)) : nlohmann::json();
  // The group's steps at its reduced size: from its first commit without the victim to the
  // first step with the replacement.
  j["reduced_ms"] = c.recovered_s >= 0 && c.entered_s >= 0
                        ? nlohmann::json(1e3 * std::max(0.0, c.entered_s - c.recovered_s))
                        : nlohmann::json();
  j["replacement"] = c.replacement.empty() ? nlohmann::json() : nlohmann::json(c.replacement);
  j["stalled_ms"] = c.stalled_ms;
  j["transfer_ms"] = c.transfer_ms >= 0 ? nlohmann::json(c.transfer_ms) : nlohmann::json();
  j["aborted_steps"] = c.aborted;
  j["steps"] = c.steps;
  // What the fault cost beyond the steps it let through, at the run's median step time.
  if (c.whole_s >= 0 && c.step_ms > 0) {
    j["step_ms"] = c.step_ms;
    j["lost_ms"] = 1e3 * (c.whole_s - at_s) - static_cast<double>(c.steps) * c.step_ms;
  }
  return j;
}

}  // namespace cohort::step
