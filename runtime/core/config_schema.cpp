// The lookups over the config schema (the table is config.cpp): a key by section and name,
// the top-level names, a section's keys. The loader, the rules and the texts use these.
#include "runtime/core/config_schema.hpp"

#include <string>
#include <vector>

namespace cohort::config_schema {

const key_spec* find_key(const std::string& section, const std::string& name) {
  for (const key_spec& k : schema()) {
    if (!k.top_level() && section == k.section && name == k.name) return &k;
  }
  return nullptr;
}

bool is_section(const std::string& name) {
  for (const section_spec& s : sections()) {
    if (name == s.name) return true;
  }
  return false;
}

const key_spec* find_top_level(const std::string& name) {
  for (const key_spec& k : schema()) {
    if (k.top_level() && name == k.name) return &k;
  }
  return nullptr;
}

std::vector<std::string> top_level_names() {
  std::vector<std::string> out;
  for (const section_spec& s : sections()) out.push_back(s.name);
  for (const key_spec& k : schema()) {
    if (k.top_level()) out.push_back(k.name);
  }
  return out;
}

std::vector<std::string> keys_of(const std::string& section) {
  std::vector<std::string> out;
  for (const key_spec& k : schema()) {
    if (section == k.section) out.push_back(k.name);
  }
  return out;
}

}  // namespace cohort::config_schema
