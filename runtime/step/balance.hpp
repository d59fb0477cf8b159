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

/// Micro-batches per rank in proportion to SPEEDS (micro-batches per second, each > 0):
/// every rank at least one, the MICRO_BATCHES all given out (largest remainders; a tie goes
/// to the lower rank). Needs MICRO_BATCHES >= SPEEDS.size() >= 1.
std::vector<int> shares_for(const std::vector<double>& speeds, int micro_batches);

/// The step time a plan predicts: the slowest rank's SHARES[r] / SPEEDS[r].
double predicted_step_s(const std::vector<int>& shares, const std::vector<double>& speeds);

/// The micro-batches rank RANK of REPLICAS computes: under SHARES (one count per rank,
/// summing to MICRO_BATCHES) a contiguous range in rank order; with no SHARES (equal) the
/// round robin of train::replica_micro_batches. Throws cohort::error for SHARES that do not
/// fit (wrong length, a count below one, a sum other than MICRO_BATCHES).
std::vector<int> micro_batches_of(const std::vector<int32_t>& shares, int micro_batches,
                                  int replicas, int rank);

/// A member's measured speed: an exponentially weighted mean of its seconds per
/// micro-batch (weight `alpha` on the newest step), reported as micro-batches per second.
class speed_meter {
 public:
  static constexpr double alpha = 0.3;
  /// One step of member ID: SECONDS of compute for MICRO micro-batches (ignored when 0).
  void record(uint64_t id, double seconds, int micro);
  /// Micro-batches per second; nullopt before the first record.
  std::optional<double> speed(uint64_t id) const;
  /// How many steps of member ID were recorded.
  int steps(uint64_t id) const;
  void forget(uint64_t id) {
    per_micro_s_.erase(id);
    steps_.erase(id);
  }

 private:
  std::map<uint64_t, double> per_micro_s_;
  std::map<uint64_t, int> steps_;
};

/// Whether PROPOSED is worth moving to from CURRENT at SPEEDS: its predicted step time is
/// shorter by more than THRESHOLD (a fraction of the current's).
bool worth_replanning(const std::vector<int>& current, const std::vector<int>& proposed,
                      const std::vector<double>& speeds, double threshold);

/// How far SPEEDS have drifted from REFERENCE (the speeds a plan was judged at, same ranks):
/// the largest change of a rank's fraction of the total speed, relative to its fraction then.
/// Only fractions count: all ranks slowing alike moves no micro-batch. 0 for equal vectors;
/// +inf when the lengths differ or REFERENCE is empty.
double speed_drift(const std::vector<double>& reference, const std::vector<double>& speeds);

/// How many micro-batches the receiver of O computes (its shares, or the round robin's).
int micro_count(const net::step_open& o, int micro_batches);

/// The coordinator's planner (one per job). Off (train.balance: equal) it plans nothing and
/// every step_open carries no shares. On, the first plan comes once every stepping member
/// has a measured speed (a member without one counts at the median of the others), a new
/// one whenever the members or their ranks change, and otherwise only when the speeds have
/// drifted by more than `drift` (speed_drift) from those the current plan was judged at AND
/// the new plan is predicted to shorten the step by more than `threshold`. The drift bound
/// damps flapping: a rank given fewer micro-batches carries its fixed per-step work over
/// fewer of them and looks slower, and two loaded cores add noise of 10-20% to a 3 ms
/// compute; with the 5% rule alone a factor-2 slow worker's plan moved 11 and 13 times
/// between 11:5, 12:4 and 13:3 in 100 steps, with a 10% bound 8 and 10 times, with 20% a
/// median of 4 (docs/benchmarks.md, "Workers of different speeds").
class balancer {
 public:
  static constexpr double threshold = 0.05;
  static constexpr double drift = 0.20;
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
  /// too), with a line saying why; taken once. nullopt when none, or F is 0. A member's first
  /// `straggler_warmup` measured steps are not judged: they carry one-time costs (first
  /// touches of its buffers, its links), and a loaded machine once drained a fast worker at
  /// step 3 of a run for them.
  std::optional<std::pair<uint64_t, std::string>> take_straggler();
  static constexpr int straggler_plans = 3;
  static constexpr int straggler_warmup = 10;

 private:
  bool on_;
  int micro_batches_, rows_;
  speed_meter meter_;
  std::vector<std::pair<uint64_t, std::string>> ranks_;  ///< whom plan_ was made for
  std::vector<int> plan_;                                ///< empty: equal
  int replans_ = 0;
  std::vector<double> speeds_;          ///< of ranks_ at the last plan (empty: unknown)
  std::vector<double> judged_at_;       ///< speeds the current plan was judged at (drift's base)
  std::map<uint64_t, int> slow_plans_;  ///< per member: plans in a row below the bound
  void count_stragglers();              ///< slow_plans_ after a plan's speeds_
  double straggler_factor_ = 0;
};

}  // namespace cohort::step
