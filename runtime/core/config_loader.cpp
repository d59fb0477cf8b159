// The config loader: reads the YAML document and the --set overrides into entries (sections,
// keys, duplicates, unknown names with a did-you-mean, syntax errors with a hint), has each
// value read (config_values.cpp), then the rules across keys checked (config_rules.cpp),
// and throws every issue at once with its FILE:LINE:COL. The schema is config.cpp.
#include "runtime/core/config_loader.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "runtime/core/config.hpp"
#include "runtime/core/config_rules.hpp"
#include "runtime/core/config_schema.hpp"
#include "runtime/core/error.hpp"

namespace cohort::config_load {

using config_schema::closest;
using config_schema::find_key;
using config_schema::find_top_level;
using config_schema::is_section;
using config_schema::join;
using config_schema::key_spec;
using config_schema::keys_of;
using config_schema::schema;
using config_schema::top_level_names;

origin mark_of(const YAML::Node& n) {
  const YAML::Mark m = n.Mark();
  if (m.line < 0) return {};
  return {m.line + 1, m.column + 1, {}, 0};
}

void issue_list::report(const origin& at, const std::string& key, const std::string& msg) {
  config_issue i;
  // File issues in reading order, then file-wide ones, then overrides in given order.
  const int group = !at.set_text.empty() ? 2 : at.line == 0 ? 1 : 0;
  order_.push_back(group == 2 ? std::make_tuple(2, at.set_index, 0)
                              : std::make_tuple(group, at.line, at.col));
  if (!at.set_text.empty()) {
    i.file = "--set";
    i.message = "in '" + at.set_text + "': " + msg;
  } else {
    i.file = file_;
    i.line = at.line;
    i.col = at.col;
    i.message = msg;
  }
  i.key = key;
  issues_.push_back(std::move(i));
}

std::vector<config_issue> issue_list::sorted() const {
  std::vector<size_t> idx(issues_.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::stable_sort(idx.begin(), idx.end(),
                   [&](size_t a, size_t b) { return order_[a] < order_[b]; });
  std::vector<config_issue> out;
  for (size_t i : idx) out.push_back(issues_[i]);
  return out;
}

namespace {

std::string syntax_hint(const std::string& msg, const std::string& text, int line) {
  // yaml-cpp's messages name the grammar rule; say what usually causes it.
  std::string bad_line;
  {
    std::istringstream in(text);
    for (int i = 1; std::getline(in, bad_line) && i < line; ++i) {
    }
  }
  if (bad_line.find('\t') != std::string::npos) return "indent with spaces: YAML forbids tabs";
  if (msg.find("sequence flow") != std::string::npos) return "close the list with ']'";
  if (msg.find("map flow") != std::string::npos) return "close the mapping with '}'";
  if (msg.find("end of map") != std::string::npos ||
      msg.find("end of sequence") != std::string::npos) {
    return "check the indentation: keys of one section line up under each other";
  }
  if (msg.find("illegal map value") != std::string::npos) {
    return "a second ':' on the line; put one key per line or quote the value";
  }
  if (msg.find("unknown escape") != std::string::npos) {
    return "in double quotes write \\\\ for a backslash, or use single quotes";
  }
  if (msg.find("alias") != std::string::npos || msg.find("anchor") != std::string::npos) {
    return "define the &anchor before using *alias";
  }
  return "fix the YAML syntax here";
}

class loader final : public config_rules::loaded_keys {
 public:
  explicit loader(std::string name) : name_(name), issues_(std::move(name)) {}

  config run(const std::string& text, const std::vector<std::string>& overrides) {
    const bool file_ok = read_document(text);
    for (size_t i = 0; i < overrides.size(); ++i) read_override(overrides[i], static_cast<int>(i));
    for (const key_spec& k : schema()) {
      auto it = entries_.find(k.path());
      if (it != entries_.end()) convert(k, it->second);
    }
    // Cross-key checks on a half-read file would only add noise to the syntax error.
    if (file_ok) {
      if (fine({"faults"})) COHORT_CHECK(fault_at_.size() == c_.faults.size());
      config_rules::resolve_and_check(c_, *this);
    }
    if (!issues_.empty()) throw config_error(issues_.sorted());
    c_.source = name_;
    return c_;
  }

 private:
  void report(const origin& at, const std::string& key, const std::string& msg) {
    issues_.report(at, key, msg);
  }

  // ---- structure: sections, keys, duplicates ----

  bool read_document(const std::string& text) {
    std::vector<YAML::Node> docs;
    try {
      docs = YAML::LoadAll(text);
    } catch (const YAML::Exception& e) {
      origin at;
      if (e.mark.line >= 0) at = {e.mark.line + 1, e.mark.column + 1, {}, 0};
      report(at, "",
             "YAML syntax error: " + e.msg + " (" + syntax_hint(e.msg, text, at.line) + ")");
      return false;
    }
    if (docs.empty() || docs[0].IsNull()) {
      report({1, 1, {}, 0}, "",
             "the config is empty (write at least one section, e.g. 'model:' with "
             "'kind: mlp'; configs/reference.yaml lists every key)");
      return false;
    }
    if (docs.size() > 1) {
      report(mark_of(docs[1]), "",
             "more than one YAML document ('---') in the file (keep a single document)");
    }
    const YAML::Node& root = docs[0];
    if (!root.IsMap()) {
      report(mark_of(root), "",
             "the top level must be a mapping of sections (" + section_list() + "), got " +
                 got(root) + " (write 'section:' lines with indented 'key: value' under them)");
      return false;
    }
    std::map<std::string, int> seen_sections;
    for (auto it = root.begin(); it != root.end(); ++it) {
      const YAML::Node key = it->first;  // a copy: it-> yields a temporary
      const YAML::Node value = it->second;
      if (!key.IsScalar()) {
        report(mark_of(key), "",
               "a section name must be a plain word, got " + got(key) + " (use one of " +
                   section_list() + ")");
        continue;
      }
      const std::string name = key.Scalar();
      const key_spec* top = find_top_level(name);
      if (!top && !is_section(name)) {
        unknown_section(name, mark_of(key));
        continue;
      }
      auto [first, fresh] = seen_sections.emplace(name, mark_of(key).line);
      if (!fresh) {
        report(mark_of(key), name,
               std::string(top ? "duplicate key" : "duplicate section") + " (first on line " +
                   std::to_string(first->second) +
                   (top ? "; merge the two lists into one)" : "; merge the two into one)"));
        continue;
      }
      if (top) {
        entries_[name] = entry{value, value.IsNull() ? mark_of(key) : mark_of(value)};
        continue;
      }
      if (value.IsNull()) continue;  // "train:" with nothing under it: all defaults
      if (!value.IsMap()) {
        report(mark_of(value), name,
               "a section must be a mapping of keys, got " + got(value) +
                   " (indent 'key: value' lines under '" + name +
                   ":'; keys: " + join(keys_of(name), ", ") + ")");
        continue;
      }
      read_section(name, value);
    }
    return true;
  }

  // PREFIX: the group a nested mapping stands for ("onebit." for train: {onebit: {...}}),
  // whose keys are the schema's dotted names ("onebit.freeze_step").
  void read_section(const std::string& section, const YAML::Node& map,
                    const std::string& prefix = "") {
    for (auto it = map.begin(); it != map.end(); ++it) {
      const YAML::Node key = it->first;  // a copy: it-> yields a temporary
      const YAML::Node value = it->second;
      if (!key.IsScalar()) {
        report(mark_of(key), section,
               "a key must be a plain word, got " + got(key) +
                   " (keys: " + join(keys_of(section), ", ") + ")");
        continue;
      }
      const std::string name = prefix + key.Scalar();
      const std::string path = section + "." + name;
      if (!find_key(section, name)) {
        if (value.IsMap() && is_group(section, name)) {
          read_section(section, value, name + ".");
          continue;
        }
        unknown_key(section, name, mark_of(key));
        continue;
      }
      auto prev = entries_.find(path);
      if (prev != entries_.end()) {
        report(mark_of(key), path,
               "duplicate key (first set on line " + std::to_string(prev->second.at.line) +
                   "; delete one of them)");
        continue;
      }
      // yaml-cpp marks an empty value at the next token, often on the next line; the
      // key's own position is where the user looks.
      entries_[path] = entry{value, value.IsNull() ? mark_of(key) : mark_of(value)};
    }
  }

  // Whether some key of SECTION is named "NAME.<something>".
  static bool is_group(const std::string& section, const std::string& name) {
    for (const std::string& k : keys_of(section))
      if (k.rfind(name + ".", 0) == 0) return true;
    return false;
  }

  std::string section_list() const { return join(top_level_names(), ", "); }

  void unknown_section(const std::string& name, const origin& at) {
    const std::string guess = closest(name, top_level_names());
    if (!guess.empty()) {
      report(at, name, "unknown section (did you mean " + guess + "?)");
      return;
    }
    // A key written at the top level instead of under its section.
    for (const key_spec& k : schema()) {
      if (!k.top_level() && name == k.name) {
        report(at, name,
               "unknown section; " + name + " is a key of section " + k.section +
                   " (did you mean " + k.path() + "? write it indented under '" + k.section +
                   ":')");
        return;
      }
    }
    report(at, name, "unknown section (sections are: " + section_list() + ")");
  }

  void unknown_key(const std::string& section, const std::string& name, const origin& at) {
    const std::string path = section + "." + name;
    if (const key_spec* top = find_top_level(name)) {
      report(at, path,
             "unknown key in section " + section + "; " + top->name +
                 " is a top-level list (write '" + top->name + ":' without indentation)");
      return;
    }
    const std::string guess = closest(name, keys_of(section));
    if (!guess.empty()) {
      report(at, path, "unknown key (did you mean " + section + "." + guess + "?)");
      return;
    }
    // The right key in the wrong section ("lr" under model).
    std::vector<std::string> all;
    for (const key_spec& k : schema()) {
      if (!k.top_level()) all.push_back(k.name);
    }
    const std::string other = closest(name, all);
    if (!other.empty()) {
      for (const key_spec& k : schema()) {
        if (!k.top_level() && other == k.name) {
          report(at, path,
                 "unknown key in section " + section + " (did you mean " + k.path() +
                     "? it belongs in section " + k.section + ")");
          return;
        }
      }
    }
    report(at, path,
           "unknown key in section " + section + " (keys: " + join(keys_of(section), ", ") + ")");
  }

  // ---- --set overrides ----

  void read_override(const std::string& text, int index) {
    const origin at{0, 0, text, index};
    const size_t eq = text.find('=');
    if (eq == std::string::npos) {
      report(at, "", "an override needs the form dotted.key=value (e.g. --set train.lr=0.01)");
      return;
    }
    const std::string path = text.substr(0, eq);
    const std::string value_text = text.substr(eq + 1);
    const size_t dot = path.find('.');
    const std::string section = path.substr(0, dot);
    const std::string name = dot == std::string::npos ? "" : path.substr(dot + 1);
    if (path.empty()) {
      report(at, "", "the key before '=' is empty (write dotted.key=value, e.g. train.lr=0.01)");
      return;
    }
    if (!find_key(section, name) && !find_top_level(path)) {
      std::vector<std::string> all;
      for (const key_spec& k : schema()) all.push_back(k.path());
      const std::string guess = closest(path, all);
      if (is_section(path)) {
        report(at, path,
               "is a section; set one key at a time (keys: " + join(keys_of(path), ", ") + ")");
      } else if (!guess.empty()) {
        report(at, path, "unknown key (did you mean " + guess + "?)");
      } else {
        report(at, path, "unknown key (write section.key; sections are: " + section_list() + ")");
      }
      return;
    }
    YAML::Node value;
    try {
      value = YAML::Load(value_text);
    } catch (const YAML::Exception& e) {
      report(at, path, "YAML syntax error in the value: " + e.msg + " (quote the value)");
      return;
    }
    // A later override of the same key wins, as on most command lines.
    entries_[path] = entry{value, at};
  }

  // ---- one key: type and range (config_values.cpp) ----

  void convert(const key_spec& k, const entry& e) {
    if (!read_key(k, e, c_, issues_, fault_at_)) bad_.insert(k.path());
  }

  // ---- what the rules across keys see (config_rules.hpp) ----

  bool fine(std::initializer_list<const char*> paths) const override {
    for (const char* p : paths) {
      if (bad_.count(p)) return false;
    }
    return true;
  }
  bool present(const std::string& path) const override { return entries_.count(path) != 0; }

  /// Position of the first of `paths` that was written (file or --set); file-wide if none.
  origin where(std::initializer_list<const char*> paths, std::string* key) const {
    for (const char* p : paths) {
      auto it = entries_.find(p);
      if (it != entries_.end()) {
        *key = p;
        return it->second.at;
      }
    }
    *key = *paths.begin();
    return {};
  }

  void complain(std::initializer_list<const char*> paths, const std::string& msg) override {
    std::string key;
    const origin at = where(paths, &key);
    report(at, key, msg);
  }

  void complain_fault(size_t i, const std::string& key, const std::string& msg) override {
    report(fault_at_[i], key, msg);
  }

  std::string name_;
  issue_list issues_;
  std::map<std::string, entry> entries_;
  std::set<std::string> bad_;
  std::vector<origin> fault_at_;  // where each of c_.faults was written
  config c_;
};

}  // namespace
}  // namespace cohort::config_load

namespace cohort {

std::string config_issue::format() const {
  std::string out = file;
  if (line > 0) {
    out += ":" + std::to_string(line);
    if (col > 0) out += ":" + std::to_string(col);
  }
  out += ": ";
  if (!key.empty()) out += key + ": ";
  return out + message;
}

namespace {
// A first line of its own, so a caller that prefixes what() ("cohort: error: ") leaves
// every issue line starting with FILE:LINE:COL for editors and scripts to parse.
std::string join_issues(const std::vector<config_issue>& issues) {
  std::string out = "invalid config (" + std::to_string(issues.size()) +
                    (issues.size() == 1 ? " problem)" : " problems)");
  for (const config_issue& i : issues) out += "\n" + i.format();
  return out;
}
}  // namespace

config_error::config_error(std::vector<config_issue> issues)
    : usage_error(join_issues(issues)), issues_(std::move(issues)) {}

config load_config_text(const std::string& text, const std::string& name,
                        const std::vector<std::string>& overrides) {
  return config_load::loader(name).run(text, overrides);
}

config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    config_issue i;
    i.file = path;
    i.message = std::string("cannot read the config file: ") + std::strerror(errno) +
                " (check the path; configs/reference.yaml lists every key)";
    throw config_error({i});
  }
  std::ostringstream text;
  text << in.rdbuf();
  return load_config_text(text.str(), path, overrides);
}

}  // namespace cohort
