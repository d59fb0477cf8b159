// The process's metric registry: counters, gauges and histograms keyed by (family, labels),
// rendered as Prometheus text exposition 0.0.4. It owns the values and their text; it does
// not serve them (runtime/obs/metrics_server) nor decide what a job measures (the
// coordinator declares its families). Every member is thread-safe: one mutex guards all.
#pragma once
#include <initializer_list>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace cohort::obs {

/// A series' labels as (name, value) pairs, in the caller's order. Two label lists name the
/// same series only when they are equal element by element, order included.
using labels = std::vector<std::pair<std::string, std::string>>;

/// The Prometheus number format used by the exposition: an integral value below 2^53 in
/// magnitude prints as an integer ("3"), others as the shortest round-trip ("0.1", "1e+300");
/// NaN as "NaN", infinities as "+Inf" / "-Inf".
std::string format_number(double v);

/// A thread-safe registry of metric families and their series.
class metrics {
 public:
  using labels = ::cohort::obs::labels;

  /// Declares a counter family (only ever grows: add() with a delta >= 0). Declaring the
  /// same name again with the same kind and help does nothing; anything else is a
  /// usage_error, as is a name outside [a-zA-Z_:][a-zA-Z0-9_:]*.
  void counter(const std::string& name, const std::string& help);
  /// Declares a gauge family (set() or add() with any sign).
  void gauge(const std::string& name, const std::string& help);
  /// Declares a histogram family with finite, strictly increasing bucket upper bounds
  /// (+Inf is implicit). Redeclaring needs the same help and bounds.
  void histogram(const std::string& name, const std::string& help,
                 std::vector<double> upper_bounds);

  /// Sets a gauge series to v (creating the series).
  void set(const std::string& name, const labels& l, double v);
  /// Adds delta to a counter (delta >= 0) or gauge series (creating it at 0).
  void add(const std::string& name, const labels& l, double delta);
  /// Records one observation in a histogram series (creating it empty).
  void observe(const std::string& name, const labels& l, double v);
  /// Drops a series (a worker that left); true when it existed.
  bool remove(const std::string& name, const labels& l);
  /// A counter or gauge series' value; nullopt when that series does not exist.
  std::optional<double> value(const std::string& name, const labels& l) const;

  /// Every family in name order, its series in label order, as Prometheus text 0.0.4.
  std::string exposition() const;

 private:
  enum class kind { counter, gauge, histogram };

  struct series {
    double value = 0;                           // counter, gauge
    std::vector<unsigned long long> in_bucket;  // histogram: count per bound, not cumulative
    double sum = 0;
    unsigned long long count = 0;
  };

  struct family {
    kind type = kind::counter;
    std::string help;
    std::vector<double> bounds;  // histogram only
    std::map<labels, series> by_labels;
  };

  void declare(const std::string& name, kind type, const std::string& help,
               std::vector<double> bounds);
  // The family NAME, which must exist and be one of the kinds in WANT (for messages, VERB
  // names the call); usage_error otherwise. Caller holds mutex_.
  family& find(const std::string& name, std::initializer_list<kind> want, const char* verb);
  const family& find(const std::string& name, std::initializer_list<kind> want,
                     const char* verb) const;
  // The series for L in F, created (after checking its labels) on first use.
  series& series_for(const std::string& name, family& f, const labels& l);

  static const char* kind_name(kind k);
  static void render_family(std::string& out, const std::string& name, const family& f);

  mutable std::mutex mutex_;
  std::map<std::string, family> families_;
};

}  // namespace cohort::obs
