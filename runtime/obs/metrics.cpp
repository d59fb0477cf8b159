#include "runtime/obs/metrics.hpp"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>
#include <tuple>

#include "runtime/core/error.hpp"

namespace cohort::obs {
namespace {

bool valid_metric_name(const std::string& n) {
  if (n.empty()) return false;
  for (std::size_t i = 0; i < n.size(); ++i) {
    const char c = n[i];
    const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!letter && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

bool valid_label_name(const std::string& n) {
  return valid_metric_name(n) && n.find(':') == std::string::npos;
}

// A number in a message: integers as integers, others as the shortest round trip.
std::string format_number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  constexpr double two_pow_53 = 9007199254740992.0;
  if (std::fabs(v) < two_pow_53 && v == std::trunc(v)) {
    return std::to_string(static_cast<long long>(v));
  }
  char buf[40];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

std::string quoted(const std::string& s) { return "\"" + s + "\""; }

// Text format 0.0.4: HELP text escapes backslash and newline; a label value also escapes
// the double quote that delimits it.
std::string escape(const std::string& s, bool quote) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '"':
        out += quote ? "\\\"" : "\"";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// `{a="x",b="y"}`, empty for none: the series as a user would write it in PromQL.
std::string label_text(const labels& l) {
  if (l.empty()) return {};
  std::string out = "{";
  for (const auto& [k, v] : l) {
    if (out.size() > 1) out += ',';
    out += k + "=\"" + escape(v, true) + "\"";
  }
  return out + "}";
}

// For error messages.
std::string series_text(const std::string& name, const labels& l) { return name + label_text(l); }

void check_metric_name(const std::string& name) {
  if (!valid_metric_name(name)) {
    throw usage_error("metrics: " + quoted(name) +
                      " is not a valid metric name: use letters, digits, '_' and ':', not "
                      "starting with a digit (Prometheus: [a-zA-Z_:][a-zA-Z0-9_:]*)");
  }
}

void check_bounds(const std::string& name, const std::vector<double>& bounds) {
  for (std::size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i])) {
      throw usage_error("metrics: histogram " + quoted(name) + ": bucket bound #" +
                        std::to_string(i) + " is " + format_number(bounds[i]) +
                        "; bounds must be finite (the +Inf bucket is implicit)");
    }
    if (i > 0 && !(bounds[i - 1] < bounds[i])) {
      throw usage_error("metrics: histogram " + quoted(name) +
                        ": bucket bounds must be "
                        "strictly increasing, but bound #" +
                        std::to_string(i) + " (" + format_number(bounds[i]) + ") follows " +
                        format_number(bounds[i - 1]));
    }
  }
}

// Label names of a new series: valid, not reserved, each once.
void check_labels(const std::string& name, const labels& l, bool histogram) {
  std::set<std::string> seen;
  for (const auto& [k, v] : l) {
    const std::string where =
        "metrics: series " + series_text(name, l) + ": label name " + quoted(k);
    if (!valid_label_name(k)) {
      throw usage_error(where +
                        " is not valid: use letters, digits and '_', not starting "
                        "with a digit (Prometheus: [a-zA-Z_][a-zA-Z0-9_]*)");
    }
    if (k.rfind("__", 0) == 0) {
      throw usage_error(where +
                        " is reserved (names starting with \"__\" belong to "
                        "Prometheus): rename it");
    }
    if (histogram && k == "le") {
      throw usage_error(where +
                        " is reserved in a histogram (it holds the bucket bound): "
                        "rename it");
    }
    if (!seen.insert(k).second) {
      throw usage_error(where + " appears twice: give each label once");
    }
  }
}

}  // namespace

metrics::metrics() : registry_(std::make_unique<prometheus::Registry>()) {}

metrics::~metrics() = default;

const char* metrics::kind_name(kind k) {
  switch (k) {
    case kind::counter:
      return "counter";
    case kind::gauge:
      return "gauge";
    case kind::histogram:
      return "histogram";
  }
  return "?";
}

void metrics::counter(const std::string& name, const std::string& help) {
  declare(name, kind::counter, help, {});
}

void metrics::gauge(const std::string& name, const std::string& help) {
  declare(name, kind::gauge, help, {});
}

void metrics::histogram(const std::string& name, const std::string& help,
                        std::vector<double> upper_bounds) {
  check_bounds(name, upper_bounds);
  declare(name, kind::histogram, help, std::move(upper_bounds));
}

void metrics::declare(const std::string& name, kind type, const std::string& help,
                      std::vector<double> bounds) {
  check_metric_name(name);
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = families_.find(name);
  if (it == families_.end()) {
    family f;
    f.type = type;
    f.help = help;
    f.bounds = std::move(bounds);
    // prometheus-cpp 1.0 writes HELP as given; the text format wants '\' and newline escaped.
    const std::string text = escape(help, false);
    switch (type) {
      case kind::counter:
        f.counters = &prometheus::BuildCounter().Name(name).Help(text).Register(*registry_);
        break;
      case kind::gauge:
        f.gauges = &prometheus::BuildGauge().Name(name).Help(text).Register(*registry_);
        break;
      case kind::histogram:
        f.histograms = &prometheus::BuildHistogram().Name(name).Help(text).Register(*registry_);
        break;
    }
    families_.emplace(name, std::move(f));
    return;
  }
  // Redeclaring is allowed so that independent parts may each declare what they use; a
  // different declaration under the same name would make one of them wrong, silently.
  const family& f = it->second;
  if (f.type != type) {
    throw usage_error("metrics: " + quoted(name) + " is already declared as a " +
                      kind_name(f.type) + "; it cannot also be a " + kind_name(type) +
                      ": give the new family another name");
  }
  if (f.help != help) {
    throw usage_error("metrics: " + quoted(name) + " is already declared with help " +
                      quoted(f.help) + ", not " + quoted(help) +
                      ": declare it with the same text everywhere");
  }
  if (f.bounds != bounds) {
    throw usage_error("metrics: histogram " + quoted(name) +
                      " is already declared with other bucket bounds: declare it with the "
                      "same bounds everywhere");
  }
}

metrics::family& metrics::find(const std::string& name, std::initializer_list<kind> want,
                               const char* verb) {
  const auto& self = *this;
  return const_cast<family&>(self.find(name, want, verb));
}

const metrics::family& metrics::find(const std::string& name, std::initializer_list<kind> want,
                                     const char* verb) const {
  const auto it = families_.find(name);
  if (it == families_.end()) {
    throw usage_error(std::string("metrics: ") + verb + "(" + quoted(name) + "): no family " +
                      quoted(name) +
                      " is declared: declare it first with counter(), gauge() "
                      "or histogram()");
  }
  if (std::find(want.begin(), want.end(), it->second.type) == want.end()) {
    std::string kinds;
    for (kind k : want) kinds += (kinds.empty() ? "a " : " or a ") + std::string(kind_name(k));
    throw usage_error(std::string("metrics: ") + verb + "(" + quoted(name) + ") needs " + kinds +
                      ", but " + quoted(name) + " is a " + kind_name(it->second.type));
  }
  return it->second;
}

namespace {

// The prometheus-cpp series of L in F, created on first use after checking L: prometheus-cpp
// would throw a bare std::invalid_argument, or silently merge a label given twice.
template <class T, class... Args>
T& series_for(const std::string& name, prometheus::Family<T>& f, const labels& l, bool histogram,
              Args&&... args) {
  const prometheus::Labels key(l.begin(), l.end());
  if (!f.Has(key)) check_labels(name, l, histogram);
  return f.Add(key, std::forward<Args>(args)...);
}

}  // namespace

void metrics::set(const std::string& name, const labels& l, double v) {
  std::lock_guard<std::mutex> lock(mutex_);
  family& f = find(name, {kind::gauge}, "set");
  series_for(name, *f.gauges, l, false).Set(v);
}

void metrics::add(const std::string& name, const labels& l, double delta) {
  std::lock_guard<std::mutex> lock(mutex_);
  family& f = find(name, {kind::counter, kind::gauge}, "add");
  if (f.type == kind::gauge) {
    series_for(name, *f.gauges, l, false).Increment(delta);
    return;
  }
  // prometheus-cpp drops a negative increment without a word; say so instead.
  if (!(delta >= 0)) {
    throw usage_error("metrics: add(" + quoted(series_text(name, l)) + ", " + format_number(delta) +
                      "): a counter only grows (delta >= 0); use a "
                      "gauge for a value that can fall");
  }
  series_for(name, *f.counters, l, false).Increment(delta);
}

void metrics::observe(const std::string& name, const labels& l, double v) {
  std::lock_guard<std::mutex> lock(mutex_);
  family& f = find(name, {kind::histogram}, "observe");
  prometheus::Histogram& h = series_for(name, *f.histograms, l, true, f.bounds);
  if (!std::isnan(v)) {
    h.Observe(v);
    return;
  }
  // A NaN observation (a diverged loss, say) still counts, in +Inf only: it is <= no bound.
  // (Observe would put it in the first bucket: lower_bound compares false against NaN.)
  std::vector<double> in_bucket(f.bounds.size() + 1, 0.0);
  in_bucket.back() = 1;
  h.ObserveMultiple(in_bucket, v);
}

bool metrics::remove(const std::string& name, const labels& l) {
  std::lock_guard<std::mutex> lock(mutex_);
  family& f = find(name, {kind::counter, kind::gauge, kind::histogram}, "remove");
  const prometheus::Labels key(l.begin(), l.end());
  const auto drop = [&key](auto* fam) {
    if (fam == nullptr || !fam->Has(key)) return false;
    fam->Remove(&fam->Add(key));
    return true;
  };
  if (f.type == kind::histogram) {
    if (f.histograms == nullptr || !f.histograms->Has(key)) return false;
    f.histograms->Remove(&f.histograms->Add(key, f.bounds));
    return true;
  }
  return drop(f.counters) || drop(f.gauges);
}

std::optional<double> metrics::value(const std::string& name, const labels& l) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const family& f = find(name, {kind::counter, kind::gauge}, "value");
  const prometheus::Labels key(l.begin(), l.end());
  if (f.counters != nullptr && f.counters->Has(key)) return f.counters->Add(key).Value();
  if (f.gauges != nullptr && f.gauges->Has(key)) return f.gauges->Add(key).Value();
  return std::nullopt;
}

std::string metrics::exposition() const {
  // prometheus-cpp collects families by kind, then in registration order, and a family's
  // series in hash order; sort both so that a scrape reads the same way every time.
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  std::sort(families.begin(), families.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  for (auto& f : families) {
    std::sort(f.metric.begin(), f.metric.end(), [](const auto& a, const auto& b) {
      return std::lexicographical_compare(a.label.begin(), a.label.end(), b.label.begin(),
                                          b.label.end(), [](const auto& x, const auto& y) {
                                            return std::tie(x.name, x.value) <
                                                   std::tie(y.name, y.value);
                                          });
    });
  }
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace cohort::obs
