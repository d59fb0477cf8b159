// Internal to the config: the rules across keys, and the defaults derived from other keys
// (parallel.dp, data.dataset, elastic bounds). config_rules.cpp is the one place these rules
// live, grouped by the layer that owns each; the schema (config.cpp) checks one key at a
// time and knows none of them. No YAML here: the loader answers through `loaded_keys`.
#pragma once
#include <cstddef>
#include <initializer_list>
#include <string>

#include "runtime/core/config.hpp"

namespace cohort::config_rules {

/// What the rules see of the loader: which keys read cleanly, which were written, and
/// where a problem is reported (so it carries FILE:LINE:COL or the --set it came from).
class loaded_keys {
 public:
  /// True when none of `paths` failed its own type or range check.
  virtual bool fine(std::initializer_list<const char*> paths) const = 0;
  /// True when `path` was written, in the file or by --set.
  virtual bool present(const std::string& path) const = 0;
  /// Reports `msg` at the first of `paths` that was written, under that key; file-wide,
  /// under the first key, when none was.
  virtual void complain(std::initializer_list<const char*> paths, const std::string& msg) = 0;
  /// Reports `msg` at the `i`-th spec of the faults list, under `key`.
  virtual void complain_fault(size_t i, const std::string& key, const std::string& msg) = 0;

 protected:
  ~loaded_keys() = default;
};

/// Resolves the derived defaults of `c` and reports every rule across keys it breaks.
/// Run only on a file that parsed; `c` holds every key that read cleanly.
void resolve_and_check(config& c, loaded_keys& keys);

}  // namespace cohort::config_rules
