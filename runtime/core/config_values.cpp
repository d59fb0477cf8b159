// Reading one key's value: YAML 1.2 scalars as integers, numbers, booleans, enums, lists and
// fault specs, each checked against its schema row (type, range, choices), every mistake
// reported with where it was written and how to fix it. The document's shape is
// config_loader.cpp; rules across keys are config_rules.cpp.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "runtime/core/config_loader.hpp"

namespace cohort::config_load {

using config_schema::bounds;
using config_schema::closest;
using config_schema::default_text;
using config_schema::describe;
using config_schema::fault_list;
using config_schema::join;
using config_schema::key_spec;
using config_schema::lower;
using config_schema::quote;
using config_schema::string_list;

namespace {

bool all_digits(const std::string& s, size_t from) {
  if (from >= s.size()) return false;
  for (size_t i = from; i < s.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(s[i]))) return false;
  }
  return true;
}

bool looks_integer(const std::string& s) {
  return all_digits(s, (!s.empty() && (s[0] == '-' || s[0] == '+')) ? 1 : 0);
}

bool looks_special_float(const std::string& s) {
  const std::string l = lower(s[0] == '-' || s[0] == '+' ? s.substr(1) : s);
  return l == ".inf" || l == ".nan";
}

/// What is wrong with an etcd client URL, "" when it is http(s)://HOST:PORT (HOST a name,
/// an IPv4 address or an IPv6 one in brackets; PORT 1..65535; nothing after it), the form
/// ha::etcd_client takes. https: the coordinators present the key folder's etcd client
/// certificate (docs/security.md).
std::string etcd_url_problem(const std::string& u) {
  const std::string form =
      " (write https://HOST:PORT or http://HOST:PORT, e.g. "
      "https://10.0.0.5:2379)";
  if (u.find_first_of(" \t\r\n") != std::string::npos)
    return "'" + u + "' has a space in it" + form;
  const bool https = u.rfind("https://", 0) == 0;
  if (!https && u.rfind("http://", 0) != 0) {
    return u.find("://") == std::string::npos
               ? "'" + u + "' has no scheme (write https://" + u + " or http://" + u + ")"
               : "'" + u + "' is not an http(s) URL" + form;
  }
  const std::string rest = u.substr(https ? 8 : 7);
  if (rest.find_first_of("/?#") != std::string::npos)
    return "'" + u + "' has something after the port" + form;
  size_t colon = std::string::npos;
  std::string host;
  if (!rest.empty() && rest[0] == '[') {  // [IPv6]:PORT
    const size_t close = rest.find(']');
    if (close == std::string::npos || close + 1 >= rest.size() || rest[close + 1] != ':')
      return "'" + u + "': an IPv6 address needs its port after the brackets" + form;
    host = rest.substr(1, close - 1);
    colon = close + 1;
  } else {
    colon = rest.rfind(':');
    host = rest.substr(0, colon);
    if (colon != std::string::npos && host.find(':') != std::string::npos)
      return "'" + u + "': write an IPv6 address in brackets (e.g. http://[::1]:2379)";
  }
  if (colon == std::string::npos || colon + 1 == rest.size())
    return "'" + u + "' has no port (write " + (https ? "https://" : "http://") +
           rest.substr(0, colon) + ":2379 for etcd's " + "client port)";
  if (host.empty()) return "'" + u + "' has no host" + form;
  const std::string port = rest.substr(colon + 1);
  const bool digits = all_digits(port, 0);
  if (!digits || port.size() > 5 || std::stoi(port) < 1 || std::stoi(port) > 65535)
    return "'" + u + "': the port must be a number from 1 to 65535, got " + port + form;
  return "";
}

/// The readers of one key, each reporting to the loader's issue list.
class value_reader {
 public:
  value_reader(issue_list& issues, std::vector<origin>& fault_at)
      : issues_(issues), fault_at_(fault_at) {}

  bool read(const key_spec& k, const entry& e, config& c) {
    return std::visit([&](auto* field) { return read_value(k, e, field); }, k.field(c));
  }

 private:
  void report(const origin& at, const std::string& key, const std::string& msg) {
    issues_.report(at, key, msg);
  }

  std::string use_default(const key_spec& k) const {
    return "or delete the key to use the default " + default_text(k);
  }

  bool check_range(const key_spec& k, const std::string& key, double v, const std::string& text,
                   const origin& at) {
    const bounds& b = k.range;
    const bool low = b.lo_open ? !(v > b.lo) : !(v >= b.lo);
    const bool high = b.hi_open ? !(v < b.hi) : !(v <= b.hi);
    if (!low && !high) return true;
    report(at, key,
           "must be " + describe(b) + ", got " + text + " (use a value " + describe(b) + ", " +
               use_default(k) + ")");
    return false;
  }

  template <class T>
  bool read_integer(const key_spec& k, const std::string& key, const YAML::Node& n,
                    const origin& at, T* out) {
    static_assert(std::is_integral_v<T>);
    if (n.IsNull()) {
      report(at, key, "has no value (write an integer, " + use_default(k) + ")");
      return false;
    }
    const std::string s = n.IsScalar() ? n.Scalar() : "";
    if (!n.IsScalar() || is_quoted(n) || !looks_integer(s)) {
      std::string hint = "write a whole number such as " + default_text(k);
      if (n.IsScalar() && is_quoted(n) && looks_integer(s)) hint = "remove the quotes";
      if (n.IsScalar() && !is_quoted(n) && looks_real(s)) {
        const double d = std::strtod(s.c_str(), nullptr);
        hint = d == std::floor(d) && std::fabs(d) < 9e18
                   ? "write it as the whole number " + std::to_string(static_cast<int64_t>(d))
                   : "write a whole number";
      }
      report(at, key, "expected an integer, got " + got(n) + " (" + hint + ")");
      return false;
    }
    errno = 0;
    T v{};
    bool range_ok = true;
    if constexpr (std::is_unsigned_v<T>) {
      // strtoull would wrap "-1" around to 2^64-1.
      if (s[0] == '-' && s.find_first_not_of("-0") != std::string::npos) {
        report(at, key, "must be >= 0, got " + s + " (use a value >= 0, " + use_default(k) + ")");
        return false;
      }
      const unsigned long long u = std::strtoull(s.c_str(), nullptr, 10);
      range_ok = errno != ERANGE && u <= std::numeric_limits<T>::max();
      v = static_cast<T>(u);
    } else {
      const long long ll = std::strtoll(s.c_str(), nullptr, 10);
      range_ok = errno != ERANGE && ll >= std::numeric_limits<T>::min() &&
                 ll <= std::numeric_limits<T>::max();
      v = static_cast<T>(ll);
    }
    if (!range_ok) {
      report(at, key,
             "is too large for a " + std::to_string(sizeof(T) * 8) + "-bit integer, got " + s +
                 " (use a value " + describe(k.range) + " up to " +
                 std::to_string(std::numeric_limits<T>::max()) + ")");
      return false;
    }
    if (!check_range(k, key, static_cast<double>(v), s, at)) return false;
    *out = v;
    return true;
  }

  bool read_value(const key_spec& k, const entry& e, int* out) {
    return read_integer(k, k.path(), e.value, e.at, out);
  }
  bool read_value(const key_spec& k, const entry& e, int64_t* out) {
    return read_integer(k, k.path(), e.value, e.at, out);
  }
  bool read_value(const key_spec& k, const entry& e, uint64_t* out) {
    return read_integer(k, k.path(), e.value, e.at, out);
  }

  bool read_value(const key_spec& k, const entry& e, float* out) {
    const YAML::Node& n = e.value;
    const std::string key = k.path();
    if (n.IsNull()) {
      report(e.at, key, "has no value (write a number, " + use_default(k) + ")");
      return false;
    }
    const std::string s = n.IsScalar() ? n.Scalar() : "";
    if (n.IsScalar() && !is_quoted(n) && looks_special_float(s)) {
      report(e.at, key,
             "must be a finite number, got " + s + " (use a value " + describe(k.range) + ")");
      return false;
    }
    if (!n.IsScalar() || is_quoted(n) || !(looks_integer(s) || looks_real(s))) {
      const bool numeric_text = n.IsScalar() && (looks_integer(s) || looks_real(s));
      report(e.at, key,
             "expected a number, got " + got(n) + " (" +
                 (numeric_text ? std::string("remove the quotes")
                               : "write a number such as " + default_text(k)) +
                 ")");
      return false;
    }
    errno = 0;
    const float v = std::strtof(s.c_str(), nullptr);
    if (std::isinf(v)) {
      report(e.at, key,
             "is too large for a 32-bit float, got " + s + " (use a value " + describe(k.range) +
                 " below 3.4e38)");
      return false;
    }
    if (!check_range(k, key, v, s, e.at)) return false;
    *out = v;
    return true;
  }

  bool read_value(const key_spec& k, const entry& e, std::string* out) {
    const YAML::Node& n = e.value;
    const std::string key = k.path();
    const std::string what = k.choices.empty() ? "a string" : "one of " + join(k.choices, ", ");
    if (n.IsNull()) {
      report(e.at, key, "has no value (write " + what + ", " + use_default(k) + ")");
      return false;
    }
    if (!n.IsScalar()) {
      report(e.at, key, "expected " + what + ", got " + got(n) + " (write a single value)");
      return false;
    }
    const std::string s = n.Scalar();
    if (!k.choices.empty()) {
      if (std::find(k.choices.begin(), k.choices.end(), s) != k.choices.end()) {
        *out = s;
        return true;
      }
      const std::string guess = closest(s, k.choices);
      report(e.at, key,
             "'" + s + "' is not allowed (use one of " + join(k.choices, ", ") +
                 (guess.empty() ? "" : "; did you mean " + guess + "?") + ")");
      return false;
    }
    if (s.empty()) {
      report(e.at, key, "is empty (write a value, " + use_default(k) + ")");
      return false;
    }
    *out = s;
    return true;
  }

  // A comm choice: the word is checked against the schema's choices (its spellings) by the
  // string reader, with its message and suggestion, and becomes the enum here, once.
  template <class E, class = std::enable_if_t<is_choice<E>::value>>
  bool read_value(const key_spec& k, const entry& e, E* out) {
    std::string word;
    if (!read_value(k, e, &word)) return false;
    const std::optional<E> v = parse_choice<E>(word);
    if (!v) {  // the schema row lists a word the enum does not spell: a bug of config.cpp
      report(e.at, k.path(),
             "'" + word + "' is listed but not known to this build (report it; use one of " +
                 join(choice_words<E>(), ", ") + ")");
      return false;
    }
    *out = *v;
    return true;
  }

  bool read_value(const key_spec& k, const entry& e, std::vector<int>* out) {
    const YAML::Node& n = e.value;
    const std::string key = k.path();
    if (n.IsNull()) {
      report(e.at, key, "has no value (write a list such as [256, 128], " + use_default(k) + ")");
      return false;
    }
    if (!n.IsSequence()) {
      const std::string hint = n.IsScalar() && !is_quoted(n) && looks_integer(n.Scalar())
                                   ? "write [" + n.Scalar() + "] for a single layer"
                                   : "write a list such as [256, 128]";
      report(e.at, key, "expected a list of integers, got " + got(n) + " (" + hint + ")");
      return false;
    }
    std::vector<int> values;
    bool ok = true;
    for (size_t i = 0; i < n.size(); ++i) {
      const YAML::Node item = n[i];
      // Elements of a --set value have positions inside the override, not the file.
      const origin at = e.at.set_text.empty() ? mark_of(item) : e.at;
      int v = 0;
      if (read_integer(k, key + "[" + std::to_string(i) + "]", item, at, &v)) {
        values.push_back(v);
      } else {
        ok = false;
      }
    }
    if (ok) *out = std::move(values);
    return ok;
  }

  bool read_value(const key_spec& k, const entry& e, string_list* out) {
    const YAML::Node& n = e.value;
    const std::string key = k.path();
    if (n.IsNull()) {
      report(e.at, key, "has no value (write a list such as [\"*.bias\"], " + use_default(k) + ")");
      return false;
    }
    if (!n.IsSequence()) {
      report(e.at, key,
             "expected a list of strings, got " + got(n) +
                 " (write a list such as [\"*.bias\"]; [] for none)");
      return false;
    }
    string_list values;
    bool ok = true;
    for (size_t i = 0; i < n.size(); ++i) {
      const YAML::Node item = n[i];
      const origin at = e.at.set_text.empty() ? mark_of(item) : e.at;
      const std::string item_key = key + "[" + std::to_string(i) + "]";
      if (!item.IsScalar() || item.Scalar().empty()) {
        report(at, item_key, "expected a non-empty string, got " + got(item));
        ok = false;
      } else {
        values.push_back(item.Scalar());
      }
    }
    if (ok) *out = std::move(values);
    return ok;
  }

  bool read_value(const key_spec& k, const entry& e, bool* out) {
    const YAML::Node& n = e.value;
    const std::string key = k.path();
    if (n.IsNull()) {
      report(e.at, key, "has no value (write true or false, " + use_default(k) + ")");
      return false;
    }
    const std::string s = n.IsScalar() ? n.Scalar() : "";
    // YAML 1.2 core schema booleans only: YAML 1.1's yes/no/on/off (and 1/0) read as
    // true in some tools and as strings in others, so they are refused, not guessed.
    if (n.IsScalar() && !is_quoted(n)) {
      if (s == "true" || s == "True" || s == "TRUE") {
        *out = true;
        return true;
      }
      if (s == "false" || s == "False" || s == "FALSE") {
        *out = false;
        return true;
      }
    }
    const std::string l = lower(s);
    std::string hint = "write true or false";
    if (n.IsScalar() && (l == "true" || l == "false")) {
      hint = "remove the quotes";
    } else if (n.IsScalar() && (l == "yes" || l == "on" || l == "y" || s == "1")) {
      hint = "write true; " + s + " is not a boolean in YAML 1.2";
    } else if (n.IsScalar() && (l == "no" || l == "off" || l == "n" || s == "0")) {
      hint = "write false; " + s + " is not a boolean in YAML 1.2";
    }
    report(e.at, key, "expected true or false, got " + got(n) + " (" + hint + ")");
    return false;
  }

  bool read_value(const key_spec& k, const entry& e, fault_list* out) {
    const YAML::Node& n = e.value;
    const std::string key = k.path();
    const std::string example = "e.g. [\"kill rank=2 at step=30\"]";
    if (n.IsNull()) {
      report(e.at, key,
             "has no value (write a list of fault specs, " + example + ", or [] for none)");
      return false;
    }
    if (!n.IsSequence()) {
      const std::string hint = n.IsScalar() ? "write it as a list: [\"" + n.Scalar() + "\"]"
                                            : "write a list of fault specs, " + example;
      report(e.at, key, "expected a list of fault specs, got " + got(n) + " (" + hint + ")");
      return false;
    }
    fault_list values;
    std::vector<origin> where;
    bool ok = true;
    for (size_t i = 0; i < n.size(); ++i) {
      const YAML::Node item = n[i];
      const std::string ikey = key + "[" + std::to_string(i) + "]";
      const bool from_set = !e.at.set_text.empty();
      // Elements of a --set value have positions inside the override, not the file.
      origin at = from_set ? e.at : mark_of(item);
      if (!item.IsScalar()) {
        report(at, ikey,
               "expected a fault spec string, got " + got(item) +
                   " (write the spec on one line with no space after '=', or quote it: - "
                   "\"kill rank=2 at step=30\")");
        ok = false;
        continue;
      }
      // A quoted spec starts one column after its opening quote.
      if (!from_set && is_quoted(item) && at.col > 0) ++at.col;
      try {
        values.push_back(faults::parse_fault(item.Scalar()));
        where.push_back(at);
      } catch (const faults::fault_parse_error& err) {
        if (from_set) {
          report(at, ikey,
                 "column " + std::to_string(err.column()) + " of '" + item.Scalar() +
                     "': " + err.reason());
        } else {
          // The column of the mistake itself: the entry's column plus the spec's own.
          if (at.col > 0) at.col += err.column() - 1;
          report(at, ikey, err.reason());
        }
        ok = false;
      }
    }
    if (ok) {
      *out = std::move(values);
      fault_at_ = std::move(where);
    }
    return ok;
  }

  // ha.etcd: the word local, or a non-empty list of etcd client URLs.
  bool read_value(const key_spec& k, const entry& e, ha_config* out) {
    const YAML::Node& n = e.value;
    const std::string key = k.path();
    const std::string what =
        "local, or a list of etcd client URLs such as [\"http://10.0.0.5:2379\"]";
    if (n.IsNull()) {
      report(e.at, key, "has no value (write " + what + ", " + use_default(k) + ")");
      return false;
    }
    if (n.IsScalar() && n.Scalar() == "local") {
      out->etcd_local = true;
      out->etcd_endpoints.clear();
      return true;
    }
    if (!n.IsSequence()) {
      std::string hint = "write " + what;
      if (n.IsScalar() && etcd_url_problem(n.Scalar()).empty()) {
        hint = "write it as a list: [\"" + n.Scalar() + "\"]";
      } else if (n.IsScalar() && !closest(n.Scalar(), {"local"}).empty()) {
        hint = "did you mean local?";
      }
      report(e.at, key,
             "expected local or a list of etcd client URLs, got " + got(n) + " (" + hint + ")");
      return false;
    }
    if (n.size() == 0) {
      report(e.at, key,
             "an empty list names no etcd (write local for an etcd that cohort launch starts, "
             "or the client URLs of yours)");
      return false;
    }
    string_list urls;
    bool ok = true;
    for (size_t i = 0; i < n.size(); ++i) {
      const YAML::Node item = n[i];
      // Elements of a --set value have positions inside the override, not the file.
      const origin at = e.at.set_text.empty() ? mark_of(item) : e.at;
      const std::string item_key = key + "[" + std::to_string(i) + "]";
      const std::string problem = !item.IsScalar() || item.Scalar().empty()
                                      ? "expected an etcd client URL, got " + got(item) +
                                            " (write http://HOST:PORT, e.g. http://10.0.0.5:2379)"
                                      : etcd_url_problem(item.Scalar());
      const auto twice = std::find(urls.begin(), urls.end(), item.IsScalar() ? item.Scalar() : "");
      if (!problem.empty()) {
        report(at, item_key, problem);
        ok = false;
      } else if (twice != urls.end()) {
        report(at, item_key,
               "'" + item.Scalar() + "' is listed twice (first as " + key + "[" +
                   std::to_string(twice - urls.begin()) + "]; keep one)");
        ok = false;
      }
      urls.push_back(item.IsScalar() ? item.Scalar() : "");
    }
    if (!ok) return false;
    out->etcd_local = false;
    out->etcd_endpoints = std::move(urls);
    return true;
  }

  issue_list& issues_;
  std::vector<origin>& fault_at_;  // where each fault spec was written
};

}  // namespace

bool is_quoted(const YAML::Node& n) { return n.Tag() != "?"; }

/// How a value looks, for "got ..." in messages.
std::string got(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return "nothing";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Scalar:
      break;
  }
  std::string s = n.Scalar();
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return is_quoted(n) ? "the quoted string " + quote(s) : s;
}

bool read_key(const key_spec& k, const entry& e, config& c, issue_list& issues,
              std::vector<origin>& fault_at) {
  return value_reader(issues, fault_at).read(k, e, c);
}

}  // namespace cohort::config_load

namespace cohort {

bool looks_real(const std::string& s) {
  size_t i = (!s.empty() && (s[0] == '-' || s[0] == '+')) ? 1 : 0;
  size_t digits = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i, ++digits;
  if (i < s.size() && s[i] == '.') {
    ++i;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i, ++digits;
  }
  if (digits == 0) return false;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '-' || s[i] == '+')) ++i;
    if (!config_load::all_digits(s.substr(i), 0)) return false;
    i = s.size();
  }
  return i == s.size();
}

}  // namespace cohort
