// How the config is written as text: values, types, ranges and defaults in words (shared
// with the loader's messages), did-you-mean, and the three texts generated from the schema:
// dump_config, the reference YAML and the markdown key table. The table itself is
// config.cpp; reading YAML is config_loader.cpp.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include "runtime/core/config.hpp"
#include "runtime/core/config_schema.hpp"
#include "runtime/core/sha256.hpp"

namespace cohort::config_schema {
namespace {

// Optimal string alignment distance: Levenshtein plus adjacent swaps, the most common
// typo ("rl" for "lr").
size_t edit_distance(const std::string& a, const std::string& b) {
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<size_t>> d(n + 1, std::vector<size_t>(m + 1));
  for (size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 1; j <= m; ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[n][m];
}

std::string number_text(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) return std::to_string(static_cast<int64_t>(v));
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

}  // namespace

std::string join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? sep : "") + parts[i];
  return out;
}

std::string lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

/// The candidate closest to `word`, or "" when none is close enough to be a typo:
/// one edit for words of up to 3 letters, else a third of the length (at least 2), or a
/// shared prefix of 3+ letters.
std::string closest(const std::string& word, const std::vector<std::string>& candidates) {
  const std::string w = lower(word);
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const std::string& c : candidates) {
    const size_t d = edit_distance(w, lower(c));
    // Two edits turn any two-letter word into any other ("<<" into "dp").
    const size_t limit = w.size() <= 3 ? 1 : std::max<size_t>(2, w.size() / 3);
    const size_t shorter = std::min(w.size(), c.size());
    const bool prefix = shorter >= 3 && lower(c).compare(0, shorter, w, 0, shorter) == 0;
    if ((d <= limit || prefix) && d < best_d) {
      best = c;
      best_d = d;
    }
  }
  return best;
}

std::string format_float(float v) {
  // The shortest %g text that reads back to the same float, so dump -> load is exact.
  char buf[40];
  for (int precision = 1; precision <= 9; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, static_cast<double>(v));
    if (std::strtof(buf, nullptr) == v) break;
  }
  std::string s = buf;
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // reads as a float
  return s;
}

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    const auto u = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (u < 0x20 || u == 0x7f) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\x%02x", u);
      out += esc;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

std::string format_value(const field_ref& f, bool enum_key) {
  struct {
    bool enum_key;
    std::string operator()(int* p) const { return std::to_string(*p); }
    std::string operator()(int64_t* p) const { return std::to_string(*p); }
    std::string operator()(uint64_t* p) const { return std::to_string(*p); }
    std::string operator()(float* p) const { return format_float(*p); }
    std::string operator()(bool* p) const { return *p ? "true" : "false"; }
    // Enum values are plain words; free text (paths, endpoints) is always quoted so a
    // value such as "null" or "1" stays a string when read back.
    std::string operator()(std::string* p) const { return enum_key ? *p : quote(*p); }
    std::string operator()(std::vector<int>* p) const {
      std::vector<std::string> parts;
      for (int v : *p) parts.push_back(std::to_string(v));
      return "[" + join(parts, ", ") + "]";
    }
    std::string operator()(string_list* p) const {
      std::vector<std::string> parts;
      for (const std::string& v : *p) parts.push_back(quote(v));
      return "[" + join(parts, ", ") + "]";
    }
    // A block list, one canonical spec a line; the caller puts it under its key.
    std::string operator()(fault_list* p) const {
      if (p->empty()) return "[]";
      std::string out;
      for (const faults::fault_spec& f : *p) out += "\n  - " + quote(faults::to_string(f));
      return out;
    }
    // ha.etcd: the word local, or the endpoints as a list of strings.
    std::string operator()(ha_config* p) const {
      return p->etcd_local ? "local" : (*this)(&p->etcd_endpoints);
    }
    // A comm choice: its spelling, a plain word like any enum.
    std::string operator()(comm_backend* p) const { return to_string(*p); }
    std::string operator()(comm_transport* p) const { return to_string(*p); }
    std::string operator()(comm_hierarchy* p) const { return to_string(*p); }
    std::string operator()(comm_compression* p) const { return to_string(*p); }
  } visitor{enum_key};
  return std::visit(visitor, f);
}

std::string type_name(const key_spec& k) {
  struct {
    std::string operator()(int*) const { return "integer"; }
    std::string operator()(int64_t*) const { return "integer"; }
    std::string operator()(uint64_t*) const { return "integer"; }
    std::string operator()(float*) const { return "number"; }
    std::string operator()(bool*) const { return "boolean"; }
    std::string operator()(std::string*) const { return "string"; }
    std::string operator()(std::vector<int>*) const { return "list of integers"; }
    std::string operator()(string_list*) const { return "list of strings"; }
    std::string operator()(fault_list*) const { return "list of fault specs"; }
    std::string operator()(ha_config*) const { return "local or list of URLs"; }
    std::string operator()(comm_backend*) const { return "enum"; }
    std::string operator()(comm_transport*) const { return "enum"; }
    std::string operator()(comm_hierarchy*) const { return "enum"; }
    std::string operator()(comm_compression*) const { return "enum"; }
  } visitor;
  config scratch;
  return k.choices.empty() ? std::visit(visitor, k.field(scratch)) : "enum";
}

std::string describe(const bounds& b) {
  const bool has_lo = b.lo != -HUGE_VAL, has_hi = b.hi != HUGE_VAL;
  if (has_lo && has_hi) {
    return std::string("in ") + (b.lo_open ? "(" : "[") + number_text(b.lo) + ", " +
           number_text(b.hi) + (b.hi_open ? ")" : "]");
  }
  if (has_lo) return (b.lo_open ? "> " : ">= ") + number_text(b.lo);
  if (has_hi) return (b.hi_open ? "< " : "<= ") + number_text(b.hi);
  return "";
}

std::string allowed_text(const key_spec& k) {
  if (!k.choices.empty()) return join(k.choices, " | ");
  if (k.path() == "control.bind") return "tcp://HOST:PORT | ipc://PATH";
  if (k.path() == "comm.interface") return "auto | NAME | ADDRESS";
  if (k.path() == "comm.host_id") return "auto | TEXT";
  if (k.path() == "ha.etcd") return "local | [http(s)://HOST:PORT, ...]";
  config scratch;
  const field_ref f = k.field(scratch);
  if (std::holds_alternative<std::vector<int>*>(f)) return "each " + describe(k.range);
  if (std::holds_alternative<bool*>(f)) return "true | false";
  if (std::holds_alternative<fault_list*>(f)) return "see docs/faults.md";
  if (std::holds_alternative<string_list*>(f)) return "each non-empty";
  if (std::holds_alternative<std::string*>(f)) return "non-empty";
  return describe(k.range);
}

std::string default_text(const key_spec& k) {
  if (k.derived_default) return k.derived_default;
  config defaults;
  return format_value(k.field(defaults), !k.choices.empty());
}

}  // namespace cohort::config_schema

namespace cohort {

using config_schema::default_text;
using config_schema::key_spec;
using config_schema::schema;
using config_schema::section_spec;
using config_schema::sections;

namespace {

std::string wrap_comment(const std::string& text, const std::string& indent, size_t width) {
  std::istringstream words(text);
  std::string word, line, out;
  while (words >> word) {
    if (!line.empty() && indent.size() + 2 + line.size() + 1 + word.size() > width) {
      out += indent + "# " + line + "\n";
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
  }
  if (!line.empty()) out += indent + "# " + line + "\n";
  return out;
}

/// "name: value" with a block value (a list of specs) on the lines below its key.
std::string key_line(const std::string& indent, const key_spec& k, config& c) {
  const std::string v = config_schema::format_value(k.field(c), !k.choices.empty());
  return indent + k.name + ":" + (v[0] == '\n' ? v : " " + v) + "\n";
}

}  // namespace

std::string dump_config(const config& c) {
  config copy = c;  // field() hands out mutable pointers; read through a copy
  std::string out;
  for (const section_spec& s : sections()) {
    out += std::string(s.name) + ":\n";
    for (const key_spec& k : schema()) {
      if (std::strcmp(k.section, s.name) == 0) out += key_line("  ", k, copy);
    }
  }
  // Top-level keys after the sections, in schema order.
  for (const key_spec& k : schema()) {
    if (k.top_level()) out += key_line("", k, copy);
  }
  return out;
}

std::string config_hash(const config& c) { return sha256_hex(dump_config(c)); }

bool keeps_error_feedback(const config& c) {
  return c.train.optimizer == "onebit_adam" ||
         (c.comm.compression != comm_compression::none && c.comm.error_feedback);
}

std::string closest_name(const std::string& word, const std::vector<std::string>& candidates) {
  return config_schema::closest(word, candidates);
}

std::string reference_config_yaml() {
  config defaults;
  std::string out =
      "# cohort reference config: every key at its default, with what it means.\n"
      "# Keys you leave out of a config take these defaults; `cohort validate CFG` prints\n"
      "# a config with every default filled in. Override any key on the command line\n"
      "# with --set section.key=value (the value is YAML).\n"
      "#\n"
      "# Generated from the schema in runtime/core/config.cpp by\n"
      "#   cohort validate --reference > configs/reference.yaml\n"
      "# and checked against it by tests/core/test_config.cpp: edit the schema, not this.\n";
  auto describe_key = [&](const key_spec& k, const std::string& indent) {
    std::string text = wrap_comment(k.doc, indent, 88);
    std::string facts = config_schema::type_name(k);
    const std::string allowed = config_schema::allowed_text(k);
    if (!allowed.empty()) facts += ", " + allowed;
    facts += "; default " + default_text(k);
    text += wrap_comment(facts, indent, 88);
    // A derived default is written as the value that means "derive it" (dp: 0) or as
    // what it resolves to with the other defaults (dataset: fashion_mnist).
    return text + key_line(indent, k, defaults);
  };
  for (const section_spec& s : sections()) {
    out += "\n" + wrap_comment(s.doc, "", 88) + s.name + ":\n";
    for (const key_spec& k : schema()) {
      if (std::strcmp(k.section, s.name) == 0) out += describe_key(k, "  ");
    }
  }
  for (const key_spec& k : schema()) {
    if (!k.top_level()) continue;
    out += "\n" + describe_key(k, "");
    if (k.path() == "faults") {
      // The language at a glance; docs/faults.md has the whole reference.
      out +=
          "# For example:\n"
          "# faults:\n"
          "#   - kill rank=2 at step=30\n"
          "#   - hang rank=1 at step=10 for=3s\n"
          "#   - slow rank=0 factor=3 from step=5 to step=15\n"
          "#   - drop control p=0.05 seed=7\n"
          "#   - partition rank=3 at step=12 for=2s\n"
          "#   - scale to=6 at step=20\n"
          "#   - random kill mtbf=15steps seed=1\n";
    }
  }
  return out;
}

std::string config_keys_markdown() {
  auto cell = [](std::string s) {
    std::string out;
    for (char ch : s) out += ch == '|' ? std::string("\\|") : std::string(1, ch);
    return out;
  };
  std::string out =
      "| key | type | default | allowed | meaning |\n"
      "| --- | --- | --- | --- | --- |\n";
  for (const key_spec& k : schema()) {
    // A derived default is a sentence, not a value to type in: no code quotes for it.
    const std::string def =
        k.derived_default ? std::string(k.derived_default) : "`" + default_text(k) + "`";
    out += "| `" + k.path() + "` | " + config_schema::type_name(k) + " | " + cell(def) + " | " +
           cell(config_schema::allowed_text(k)) + " | " + cell(k.doc) + " |\n";
  }
  return out;
}

}  // namespace cohort
