// The process's metric registry: counters, gauges and histograms looked up by family name
// and labels, with the checks that turn misuse into a usage_error a person can act on. The
// values, their series and the text exposition 0.0.4 are prometheus-cpp's (core only); this
// file does not serve them (runtime/obs/metrics_server) nor decide what a job measures (the
// coordinator declares its families). Every member is thread-safe.
#pragma once
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace prometheus {
class Registry;
class Counter;
class Gauge;
class Histogram;
template <typename T>
class Family;
}  // namespace prometheus

namespace cohort::obs {

/// A series' labels as (name, value) pairs. A series is its label set, as in Prometheus: the
/// order of the pairs does not matter (the text lists them by name).
using labels = std::vector<std::pair<std::string, std::string>>;

/// A thread-safe registry of metric families and their series.
class metrics {
 public:
  using labels = ::cohort::obs::labels;

  metrics();
  ~metrics();
  metrics(const metrics&) = delete;
  metrics& operator=(const metrics&) = delete;

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

  /// Every family that has a series, in name order, its series in label order, as
  /// Prometheus text 0.0.4 (prometheus-cpp's TextSerializer: NaN prints as "Nan", a
  /// histogram as _count, _sum, then its buckets).
  std::string exposition() const;

 private:
  enum class kind { counter, gauge, histogram };

  // A declared family: what was declared (for redeclaration checks and messages) and the
  // prometheus-cpp family that holds its series (owned by registry_; one of the three).
  struct family {
    kind type = kind::counter;
    std::string help;
    std::vector<double> bounds;  // histogram only
    prometheus::Family<prometheus::Counter>* counters = nullptr;
    prometheus::Family<prometheus::Gauge>* gauges = nullptr;
    prometheus::Family<prometheus::Histogram>* histograms = nullptr;
  };

  void declare(const std::string& name, kind type, const std::string& help,
               std::vector<double> bounds);
  // The family NAME, which must exist and be one of the kinds in WANT (for messages, VERB
  // names the call); usage_error otherwise. Caller holds mutex_.
  family& find(const std::string& name, std::initializer_list<kind> want, const char* verb);
  const family& find(const std::string& name, std::initializer_list<kind> want,
                     const char* verb) const;

  static const char* kind_name(kind k);

  // mutex_ guards families_ (the name -> family map); the series themselves are
  // prometheus-cpp's, which locks its own.
  mutable std::mutex mutex_;
  std::unique_ptr<prometheus::Registry> registry_;
  std::map<std::string, family> families_;
};

}  // namespace cohort::obs
