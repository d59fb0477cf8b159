// Internal to the config: what the two halves of the loader share. config_loader.cpp reads
// the document's shape (sections, keys, duplicates, --set overrides) and orders the issues;
// config_values.cpp reads one key's value (type, range, fault specs). Neither knows the
// rules across keys (config_rules.cpp). Callers use runtime/core/config.hpp, never this.
#pragma once
#include <yaml-cpp/yaml.h>

#include <string>
#include <tuple>
#include <vector>

#include "runtime/core/config.hpp"
#include "runtime/core/config_schema.hpp"

namespace cohort::config_load {

/// Where a value came from: a place in the file, or one --set override.
struct origin {
  int line = 0;  // 1-based; 0 unknown
  int col = 0;
  std::string set_text;  // the override text when the value came from --set
  int set_index = 0;     // which --set, for ordering
};

/// The position of `n` in the file; unknown (0, 0) when yaml-cpp has none.
origin mark_of(const YAML::Node& n);

struct entry {
  YAML::Node value;
  origin at;  // the value's position, or its key's when the value is empty
};

/// Every issue found in one config, reported in any order and handed out in reading order:
/// the file's issues by position, then file-wide ones, then overrides in the order given.
class issue_list {
 public:
  explicit issue_list(std::string file) : file_(std::move(file)) {}
  void report(const origin& at, const std::string& key, const std::string& msg);
  bool empty() const { return issues_.empty(); }
  std::vector<config_issue> sorted() const;

 private:
  std::string file_;
  std::vector<config_issue> issues_;
  std::vector<std::tuple<int, int, int>> order_;  // sort key of each issue
};

/// True when the scalar was written in quotes (or with a tag): "2" is a string, 2 is not.
bool is_quoted(const YAML::Node& n);
/// How a value looks, for "got ..." in messages.
std::string got(const YAML::Node& n);

/// Reads the value of `e` into k's field of `c`, checking its type and range; reports every
/// problem to `issues` and returns false if there was one. For the faults list, `fault_at`
/// receives where each spec was written.
bool read_key(const config_schema::key_spec& k, const entry& e, config& c, issue_list& issues,
              std::vector<origin>& fault_at);

}  // namespace cohort::config_load
