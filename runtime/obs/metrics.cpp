#include "runtime/obs/metrics.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>

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

// `{a="x",b="y"}` with an optional trailing le="..." (histogram buckets); empty for none.
std::string label_text(const labels& l, const std::string* le = nullptr) {
  if (l.empty() && le == nullptr) return {};
  std::string out = "{";
  for (const auto& [k, v] : l) {
    if (out.size() > 1) out += ',';
    out += k + "=\"" + escape(v, true) + "\"";
  }
  if (le != nullptr) {
    if (out.size() > 1) out += ',';
    out += "le=\"" + *le + "\"";
  }
  return out + "}";
}

// The series as a user would write it in PromQL, for error messages.
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

metrics::series& metrics::series_for(const std::string& name, family& f, const labels& l) {
  const auto it = f.by_labels.find(l);
  if (it != f.by_labels.end()) return it->second;
  check_labels(name, l, f.type == kind::histogram);
  series s;
  s.in_bucket.assign(f.bounds.size(), 0);
  return f.by_labels.emplace(l, std::move(s)).first->second;
}

void metrics::set(const std::string& name, const labels& l, double v) {
  std::lock_guard<std::mutex> lock(mutex_);
  family& f = find(name, {kind::gauge}, "set");
  series_for(name, f, l).value = v;
}

void metrics::add(const std::string& name, const labels& l, double delta) {
  std::lock_guard<std::mutex> lock(mutex_);
  family& f = find(name, {kind::counter, kind::gauge}, "add");
  if (f.type == kind::counter && !(delta >= 0)) {
    throw usage_error("metrics: add(" + quoted(series_text(name, l)) + ", " + format_number(delta) +
                      "): a counter only grows (delta >= 0); use a "
                      "gauge for a value that can fall");
  }
  series_for(name, f, l).value += delta;
}

void metrics::observe(const std::string& name, const labels& l, double v) {
  std::lock_guard<std::mutex> lock(mutex_);
  family& f = find(name, {kind::histogram}, "observe");
  series& s = series_for(name, f, l);
  // A NaN observation (a diverged loss, say) still counts, in +Inf only: it is <= no bound.
  if (!std::isnan(v)) {
    const auto b = std::lower_bound(f.bounds.begin(), f.bounds.end(), v);
    if (b != f.bounds.end()) ++s.in_bucket[b - f.bounds.begin()];
  }
  s.sum += v;
  ++s.count;
}

bool metrics::remove(const std::string& name, const labels& l) {
  std::lock_guard<std::mutex> lock(mutex_);
  family& f = find(name, {kind::counter, kind::gauge, kind::histogram}, "remove");
  return f.by_labels.erase(l) > 0;
}

std::optional<double> metrics::value(const std::string& name, const labels& l) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const family& f = find(name, {kind::counter, kind::gauge}, "value");
  const auto it = f.by_labels.find(l);
  if (it == f.by_labels.end()) return std::nullopt;
  return it->second.value;
}

void metrics::render_family(std::string& out, const std::string& name, const family& f) {
  out += "# HELP " + name + " " + escape(f.help, false) + "\n";
  out += "# TYPE " + name + " " + kind_name(f.type) + "\n";
  for (const auto& [l, s] : f.by_labels) {
    if (f.type != kind::histogram) {
      out += name + label_text(l) + " " + format_number(s.value) + "\n";
      continue;
    }
    unsigned long long cumulative = 0;
    for (std::size_t i = 0; i < f.bounds.size(); ++i) {
      cumulative += s.in_bucket[i];
      const std::string le = format_number(f.bounds[i]);
      out += name + "_bucket" + label_text(l, &le) + " " + std::to_string(cumulative) + "\n";
    }
    const std::string inf = "+Inf";
    out += name + "_bucket" + label_text(l, &inf) + " " + std::to_string(s.count) + "\n";
    out += name + "_sum" + label_text(l) + " " + format_number(s.sum) + "\n";
    out += name + "_count" + label_text(l) + " " + std::to_string(s.count) + "\n";
  }
}

std::string metrics::exposition() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string out;
  for (const auto& [name, f] : families_) render_family(out, name, f);
  return out;
}

}  // namespace cohort::obs
