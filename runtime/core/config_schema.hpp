// Internal to the config: the schema (one row per key: where it lives in `config`, its range
// or choices, its default, its meaning) and the words every part of the config uses to
// describe keys and values. The table is runtime/core/config.cpp, the lookups over it
// config_schema.cpp; the words are config_text.cpp. Reading YAML is config_loader.cpp; rules
// across keys are config_rules.cpp.
// Callers outside runtime/core/config*.cpp use runtime/core/config.hpp, never this.
#pragma once
#include <cmath>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "runtime/core/config.hpp"

namespace cohort::config_schema {

/// Where a key's value lives inside `config`; the pointer type is the key's YAML type.
/// A key whose section is "" lives at the top level of the file (`faults:`). ha.etcd, the
/// word `local` or a list of URLs, is the one key over two fields: its ha_config* reads and
/// writes etcd_local and etcd_endpoints only. A choice of the comm section is its enum
/// (comm_choices.hpp), read and written as its spellings.
using fault_list = std::vector<faults::fault_spec>;
using string_list = std::vector<std::string>;
using field_ref = std::variant<int*, int64_t*, uint64_t*, float*, bool*, std::string*,
                               std::vector<int>*, string_list*, fault_list*, ha_config*,
                               comm_backend*, comm_transport*, comm_hierarchy*, comm_compression*>;

/// Allowed numeric interval; for lists it applies to every element.
struct bounds {
  double lo = -HUGE_VAL;
  bool lo_open = false;
  double hi = HUGE_VAL;
  bool hi_open = false;
};

struct key_spec {
  const char* section;
  const char* name;
  field_ref (*field)(config&);
  bounds range;
  std::vector<std::string> choices;  ///< non-empty: the value must be one of these
  const char* derived_default;       ///< set when the default depends on other keys
  const char* doc;
  bool top_level() const { return section[0] == '\0'; }
  std::string path() const { return top_level() ? name : std::string(section) + "." + name; }
};

struct section_spec {
  const char* name;
  const char* doc;
};

// ---- the table (config.cpp) ----

/// The fixed order of sections in dumps, the reference file and the docs.
const std::vector<section_spec>& sections();
/// Every key, in the order of dumps, the reference file and the docs.
const std::vector<key_spec>& schema();

// ---- the lookups over it (config_schema.cpp) ----

/// The key `name` of `section`, or nullptr.
const key_spec* find_key(const std::string& section, const std::string& name);
/// The top-level key `name` (not a section), or nullptr.
const key_spec* find_top_level(const std::string& name);
bool is_section(const std::string& name);
/// Every name allowed at the top level: sections, then top-level keys.
std::vector<std::string> top_level_names();
/// The keys of `section`, in schema order.
std::vector<std::string> keys_of(const std::string& section);

// ---- the words (config_text.cpp) ----

std::string join(const std::vector<std::string>& parts, const std::string& sep);
std::string lower(std::string s);
/// closest_name's rule (config.hpp).
std::string closest(const std::string& word, const std::vector<std::string>& candidates);
/// The shortest %g text that reads back to the same float, so dump -> load is exact.
std::string format_float(float v);
/// A double-quoted YAML string, control characters escaped.
std::string quote(const std::string& s);
/// A value as dump_config writes it; `enum_key`: a plain word, not a quoted string.
std::string format_value(const field_ref& f, bool enum_key);
/// "integer", "number", "enum", ... as the reference and the docs table say it.
std::string type_name(const key_spec& k);
/// An interval in words: "in [0, 1)", ">= 1", "> 0"; "" when unbounded.
std::string describe(const bounds& b);
/// What values a key allows, in words ("mlp | gpt", ">= 1", "true | false").
std::string allowed_text(const key_spec& k);
/// The default as written in a config, or the sentence of a derived default.
std::string default_text(const key_spec& k);

}  // namespace cohort::config_schema
