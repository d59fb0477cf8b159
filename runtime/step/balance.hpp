// train.balance: measured (docs/data_parallel.md, "Workers of different speeds"). The
// coordinator gives each DP rank a number of whole micro-batches in proportion to its
// measured speed; the global batch stays what the config says. Pure arithmetic here: the
// shares from speeds, which micro-batches a rank computes under them, the filter over the
// measured times and when a new plan is worth it. training_job owns one planner.
//
// Exact in bitwise mode: each micro-batch's gradient enters the fixed-point sum on its own,
// so any assignment of micro-batches to ranks gives the same bits, and which micro-batches
// rank r computes is a pure function of (the plan, r): a replayed step reads the same ones.
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/net/protocol.hpp"

namespace cohort::step {

/// The micro-batches rank RANK of REPLICAS computes: under SHARES (one count per rank,
/// summing to MICRO_BATCHES) a contiguous range in rank order; with no SHARES (equal) the
/// round robin of train::replica_micro_batches. Throws cohort::error for SHARES that do not
/// fit (wrong length, a count below one, a sum other than MICRO_BATCHES).
std::vector<int> micro_batches_of(const std::vector<int32_t>& shares, int micro_batches,
                                  int replicas, int rank);

/// What one step of K micro-batches costs a rank: fixed + per_micro * K seconds.
struct step_cost {
  double fixed = 0;      ///< seconds a step costs whatever its micro-batches (>= 0)
  double per_micro = 0;  ///< seconds each micro-batch adds (> 0)
  double at(int k) const { return fixed + per_micro * k; }
};

/// A member's measured speed as an affine cost: exponentially weighted means (weight
/// `alpha` on the newest step) of K, T, K^2 and K T over its steps (K micro-batches in T
/// seconds), fitted by least squares once its K has varied (a re-plan changed it: variance
/// of K at least `min_variance`); until then, and after K has stayed put long enough for the
/// variance to fade, the last fit's fixed part is kept and the rest is per micro-batch. A
/// rank given fewer micro-batches then does not look slower for carrying its fixed work over
/// fewer of them (what made plans swing between neighbouring splits).
class speed_meter {
 public:
  static constexpr double alpha = 0.3;
  static constexpr double min_variance = 0.2;
  /// One step of member ID: SECONDS of compute for MICRO micro-batches (ignored when 0).
  void record(uint64_t id, double seconds, int micro);
  /// The observed rate, micro-batches per second (mean K over mean T); nullopt before the
  /// first record.
  std::optional<double> speed(uint64_t id) const;
  /// The fitted cost; nullopt before the first record.
  std::optional<step_cost> cost(uint64_t id) const;
  void forget(uint64_t id) { seen_.erase(id); }

 private:
  struct moments {
    double k = 0, t = 0, kk = 0, kt = 0;
    double fixed = 0;  ///< the last fit's fixed part
  };
  std::map<uint64_t, moments> seen_;
};

/// Whole micro-batches per rank minimising the slowest rank's predicted time under COSTS:
/// every rank at least one, then each further micro-batch to the rank whose time it raises
/// least (a tie to the lower rank). Needs MICRO_BATCHES >= COSTS.size() >= 1 and each
/// per_micro > 0.
std::vector<int> shares_for(const std::vector<step_cost>& costs, int micro_batches);
/// The step time a plan predicts under COSTS: the slowest rank's cost of its share.
double predicted_step_s(const std::vector<int>& shares, const std::vector<step_cost>& costs);

/// Whether PROPOSED is worth moving to from CURRENT under COSTS: its predicted step time is
/// shorter by more than THRESHOLD (a fraction of the current's).
bool worth_replanning(const std::vector<int>& current, const std::vector<int>& proposed,
                      const std::vector<step_cost>& costs, double threshold);

/// How many micro-batches the receiver of O computes (its shares, or the round robin's).
int micro_count(const net::step_open& o, int micro_batches);

/// The coordinator's planner (one per job). Off (train.balance: equal) it plans nothing and
/// every step_open carries no shares. On, the first plan comes once every stepping member
/// has a measured cost (a member without one counts at the median of the others' rates), a
/// new one whenever the members or their ranks change, and otherwise only when it is
/// predicted (speed_meter's affine costs) to shorten the step by more than `threshold`, at
/// `confirm_plans` plans in a row with the same proposal (a plan replacing a plan; the first
/// one, and one for new members, is taken at once): noise in the measured times otherwise
/// makes it swing between neighbouring splits.
class balancer {
 public:
  static constexpr double threshold = 0.05;
  static constexpr int confirm_plans = 3;
  /// MICRO_BATCHES per step, ROWS samples each (the summary's samples/s); STRAGGLER_FACTOR:
  /// elastic.straggler_factor (0: no straggler is named).
  balancer(bool measured, int micro_batches, int rows, double straggler_factor = 0);

  /// The shares for a step over BY_RANK (each DP rank's member id and name, in rank order):
  /// empty for equal shares. *NOTE says why when the plan changed, else stays empty.
  std::vector<int32_t> plan(const std::vector<std::pair<uint64_t, std::string>>& by_rank,
                            std::string* note);
  /// A member's vote: COMPUTE_S of compute for MICRO micro-batches.
  void measured(uint64_t id, double compute_s, int micro) { meter_.record(id, compute_s, micro); }
  /// Micro-batches a step has (the job's, whatever the plan).
  int micro_batches() const { return micro_batches_; }
  /// {"mode", "replans", "shares": {name: micro-batches}, "samples_per_s": {name: rate}}.
  nlohmann::json json() const;
  /// With a straggler factor F > 1: a member whose measured speed stayed below the median of
  /// the others' over F at `straggler_plans` plans in a row (counted by plan(), equal shares
  /// too), with a line saying why; taken once. nullopt when none, or F is 0.
  std::optional<std::pair<uint64_t, std::string>> take_straggler();
  static constexpr int straggler_plans = 3;

 private:
  bool on_;
  int micro_batches_, rows_;
  speed_meter meter_;
  std::vector<std::pair<uint64_t, std::string>> ranks_;  ///< whom plan_ was made for
  std::vector<int> plan_;                                ///< empty: equal
  std::vector<int> proposed_;  ///< the proposal seen at the last plans, not yet confirmed
  int proposed_count_ = 0;     ///< plans in a row that proposed it
  int replans_ = 0;
  std::vector<double> speeds_;          ///< of ranks_ at the last plan (empty: unknown)
  std::map<uint64_t, int> slow_plans_;  ///< per member: plans in a row below the bound
  void count_stragglers();              ///< slow_plans_ after a plan's speeds_
  double straggler_factor_ = 0;
};

}  // namespace cohort::step
