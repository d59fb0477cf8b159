#include "runtime/step/balance.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "runtime/core/error.hpp"
#include "runtime/train/trainer.hpp"

namespace cohort::step {

std::vector<int> shares_for(const std::vector<double>& speeds, int micro_batches) {
  const int n = static_cast<int>(speeds.size());
  if (n < 1 || micro_batches < n)
    throw error("balance: " + std::to_string(micro_batches) + " micro-batches cannot give " +
                std::to_string(n) + " rank(s) one each");
  double total = 0;
  for (const double s : speeds) {
    if (!(s > 0) || !std::isfinite(s)) throw error("balance: a speed must be finite and > 0");
    total += s;
  }
  // Ranks whose proportional share is below one get one; the others split what is left in
  // proportion to their speeds (repeated, since fixing one raises the others' shares).
  std::vector<bool> fixed(n, false);
  int left = micro_batches;
  double free_total = total;
  for (bool changed = true; changed;) {
    changed = false;
    for (int r = 0; r < n; ++r) {
      if (fixed[r] || left * speeds[r] / free_total >= 1.0) continue;
      fixed[r] = true;
      changed = true;
      --left;
      free_total -= speeds[r];
    }
  }
  std::vector<int> out(n, 1);
  std::vector<double> remainder(n, -1.0);
  int given = micro_batches - left;
  for (int r = 0; r < n; ++r) {
    if (fixed[r]) continue;
    const double ideal = left * speeds[r] / free_total;
    out[r] = static_cast<int>(std::floor(ideal));
    remainder[r] = ideal - out[r];
    given += out[r];
  }
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return remainder[a] > remainder[b]; });
  for (int i = 0; given < micro_batches; ++i, ++given) ++out[order[i % n]];
  return out;
}

double predicted_step_s(const std::vector<int>& shares, const std::vector<double>& speeds) {
  double worst = 0;
  for (std::size_t r = 0; r < shares.size() && r < speeds.size(); ++r)
    worst = std::max(worst, shares[r] / speeds[r]);
  return worst;
}

std::vector<int> micro_batches_of(const std::vector<int32_t>& shares, int micro_batches,
                                  int replicas, int rank) {
  if (shares.empty()) return train::replica_micro_batches(micro_batches, replicas, rank);
  if (static_cast<int>(shares.size()) != replicas || rank < 0 || rank >= replicas)
    throw error("balance: " + std::to_string(shares.size()) + " shares for " +
                std::to_string(replicas) + " replicas (rank " + std::to_string(rank) + ")");
  int64_t sum = 0, first = 0;
  for (int r = 0; r < replicas; ++r) {
    if (shares[r] < 1) throw error("balance: a share below one micro-batch");
    if (r < rank) first += shares[r];
    sum += shares[r];
  }
  if (sum != micro_batches)
    throw error("balance: shares sum to " + std::to_string(sum) + ", not the step's " +
                std::to_string(micro_batches) + " micro-batches");
  std::vector<int> out(shares[rank]);
  std::iota(out.begin(), out.end(), static_cast<int>(first));
  return out;
}

void speed_meter::record(uint64_t id, double seconds, int micro) {
  if (micro <= 0 || !(seconds > 0)) return;
  ++steps_[id];
  const double x = seconds / micro;
  const auto it = per_micro_s_.find(id);
  if (it == per_micro_s_.end())
    per_micro_s_[id] = x;
  else
    it->second = alpha * x + (1 - alpha) * it->second;
}

int speed_meter::steps(uint64_t id) const {
  const auto it = steps_.find(id);
  return it == steps_.end() ? 0 : it->second;
}

std::optional<double> speed_meter::speed(uint64_t id) const {
  const auto it = per_micro_s_.find(id);
  if (it == per_micro_s_.end()) return std::nullopt;
  return 1.0 / it->second;
}

bool worth_replanning(const std::vector<int>& current, const std::vector<int>& proposed,
                      const std::vector<double>& speeds, double threshold) {
  if (current == proposed) return false;
  if (current.size() != speeds.size()) return true;  // not a plan for these ranks
  return predicted_step_s(proposed, speeds) < (1 - threshold) * predicted_step_s(current, speeds);
}

double speed_drift(const std::vector<double>& reference, const std::vector<double>& speeds) {
  if (reference.empty() || reference.size() != speeds.size())
    return std::numeric_limits<double>::infinity();
  const double then = std::accumulate(reference.begin(), reference.end(), 0.0);
  const double now = std::accumulate(speeds.begin(), speeds.end(), 0.0);
  double worst = 0;
  for (std::size_t r = 0; r < speeds.size(); ++r) {
    const double was = reference[r] / then;
    worst = std::max(worst, std::abs(speeds[r] / now - was) / was);
  }
  return worst;
}

int micro_count(const net::step_open& o, int micro_batches) {
  if (o.shares.empty()) {
    if (o.replicas < 1 || o.rank < 0 || o.rank >= o.replicas) return 0;
    return static_cast<int>(train::replica_micro_batches(micro_batches, o.replicas, o.rank).size());
  }
  return o.rank >= 0 && o.rank < static_cast<int>(o.shares.size()) ? o.shares[o.rank] : 0;
}

balancer::balancer(bool measured, int micro_batches, int rows, double straggler_factor)
    : on_(measured),
      micro_batches_(micro_batches),
      rows_(rows),
      straggler_factor_(straggler_factor) {}

std::vector<int32_t> balancer::plan(const std::vector<std::pair<uint64_t, std::string>>& by_rank,
                                    std::string* note) {
  const int n = static_cast<int>(by_rank.size());
  const bool moved = ranks_ != by_rank;  // new members or ranks: the old plan is void
  ranks_ = by_rank;
  if (moved) {
    plan_.clear();
    judged_at_.clear();
  }
  speeds_.clear();
  std::vector<double> known;
  for (const auto& [id, name] : by_rank)
    if (const auto s = meter_.speed(id)) known.push_back(*s);
  if (known.empty()) return {};
  std::nth_element(known.begin(), known.begin() + static_cast<std::ptrdiff_t>(known.size() / 2),
                   known.end());
  const double median = known[known.size() / 2];
  std::vector<double> speeds;
  for (const auto& [id, name] : by_rank) speeds.push_back(meter_.speed(id).value_or(median));
  speeds_ = speeds;
  count_stragglers();
  if (!on_ || n < 2 || micro_batches_ < n) return {};
  const std::vector<int> proposed = shares_for(speeds, micro_batches_);
  // Without a plan, the round robin's counts are what the ranks run.
  std::vector<int> current = plan_;
  if (current.empty())
    for (int r = 0; r < n; ++r)
      current.push_back(
          static_cast<int>(train::replica_micro_batches(micro_batches_, n, r).size()));
  // The first judgement for these ranks sets the drift's base, whatever it decides.
  const bool first = judged_at_.empty();
  if (first) judged_at_ = speeds;
  const bool replan =
      moved ? proposed != current
            : (first || speed_drift(judged_at_, speeds) > drift) &&
                  worth_replanning(current, proposed, speeds, threshold);
  if (replan) {
    plan_ = proposed;
    judged_at_ = speeds;
    ++replans_;
    if (note != nullptr) {
      std::string line = "balance: micro-batches per rank ";
      for (int r = 0; r < n; ++r)
        line += (r ? ", " : "") + by_rank[r].second + " " + std::to_string(plan_[r]) + " (" +
                std::to_string(static_cast<long>(speeds[r] * rows_)) + " samples/s)";
      *note = line;
    }
  }
  return std::vector<int32_t>(plan_.begin(), plan_.end());
}

void balancer::count_stragglers() {
  std::map<uint64_t, int> counts;
  const int n = static_cast<int>(ranks_.size());
  // Sorted once: the others' median is the whole's element (n - 1) / 2, or the next one when
  // rank r's own speed sits at or below it.
  std::vector<double> sorted = speeds_;
  std::sort(sorted.begin(), sorted.end());
  const std::size_t mid = static_cast<std::size_t>(n - 1) / 2;
  for (int r = 0; n >= 2 && straggler_factor_ > 1 && r < n; ++r) {
    const auto own = static_cast<std::size_t>(
        std::lower_bound(sorted.begin(), sorted.end(), speeds_[r]) - sorted.begin());
    const double median = own <= mid ? sorted[mid + 1] : sorted[mid];
    const uint64_t id = ranks_[r].first;
    if (meter_.steps(id) < straggler_warmup) continue;
    if (speeds_[r] * straggler_factor_ < median) {
      const auto it = slow_plans_.find(id);
      counts[id] = (it == slow_plans_.end() ? 0 : it->second) + 1;
    }
  }
  slow_plans_ = std::move(counts);  // members gone or back above the bound start again
}

std::optional<std::pair<uint64_t, std::string>> balancer::take_straggler() {
  for (std::size_t r = 0; r < ranks_.size() && r < speeds_.size(); ++r) {
    const auto it = slow_plans_.find(ranks_[r].first);
    if (it == slow_plans_.end() || it->second < straggler_plans) continue;
    slow_plans_.erase(it);
    double fastest = 0;
    for (const double s : speeds_) fastest = std::max(fastest, s);
    return std::make_pair(
        ranks_[r].first, ranks_[r].second + " computed " +
                             std::to_string(static_cast<long>(speeds_[r] * rows_)) +
                             " samples/s, below the others' median over elastic.straggler_factor " +
                             std::to_string(straggler_factor_).substr(0, 4) + " at " +
                             std::to_string(straggler_plans) + " plans in a row (the fastest: " +
                             std::to_string(static_cast<long>(fastest * rows_)) + " samples/s)");
  }
  return std::nullopt;
}

nlohmann::json balancer::json() const {
  nlohmann::json j;
  j["mode"] = on_ ? "measured" : "equal";
  j["replans"] = replans_;
  j["shares"] = nlohmann::json::object();
  j["samples_per_s"] = nlohmann::json::object();
  const int n = static_cast<int>(ranks_.size());
  for (int r = 0; r < n; ++r) {
    const auto& [id, name] = ranks_[r];
    j["shares"][name] =
        plan_.empty() ? static_cast<int>(train::replica_micro_batches(micro_batches_, n, r).size())
                      : plan_[r];
    if (const auto s = meter_.speed(id)) j["samples_per_s"][name] = *s * rows_;
  }
  return j;
}

}  // namespace cohort::step
