#include "runtime/ckpt/checkpoint_dir.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "runtime/core/atomic_file.hpp"
#include "runtime/core/error.hpp"

namespace cohort {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// A shard name in the marker must stay inside the folder: a plain file name, nothing else.
bool plain_file_name(const std::string& s) {
  return !s.empty() && s != "." && s != ".." && s.find('/') == std::string::npos &&
         s != checkpoint_marker;
}

bool is_hex64(const std::string& s) {
  return s.size() == 64 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

}  // namespace

std::string checkpoint_path(const std::string& dir, int64_t step) {
  char name[64];
  std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(step));
  return (fs::path(dir) / name).string();
}

std::string shard_file_name(int stage, int tp_rank) {
  return "shard_p" + std::to_string(stage) + "_t" + std::to_string(tp_rank) + ".safetensors";
}

const shard_record* checkpoint_manifest::find(const std::string& file) const {
  for (const auto& s : shards)
    if (s.file == file) return &s;
  return nullptr;
}

void write_checkpoint_marker(const std::string& step_dir, const checkpoint_manifest& m) {
  json j;
  j["step"] = m.step;
  j["shards"] = json::array();
  for (const auto& s : m.shards) {
    COHORT_CHECK(plain_file_name(s.file) && is_hex64(s.sha256));
    j["shards"].push_back({{"file", s.file}, {"bytes", s.bytes}, {"sha256", s.sha256}});
  }
  try {
    write_file_atomic((fs::path(step_dir) / checkpoint_marker).string(), j.dump(2) + "\n");
  } catch (const error& e) {
    throw checkpoint_error("checkpoint " + step_dir + ": cannot write its " + checkpoint_marker +
                           " marker (" + e.what() + ")");
  }
}

checkpoint_manifest read_checkpoint_manifest(const std::string& step_dir) {
  const std::string where = "checkpoint " + step_dir + ": ";
  const fs::path marker = fs::path(step_dir) / checkpoint_marker;
  std::error_code ec;
  if (!fs::is_directory(step_dir, ec)) throw checkpoint_error(where + "no such folder");
  std::ifstream in(marker);
  if (!in) {
    throw checkpoint_error(where + "incomplete: no " + std::string(checkpoint_marker) +
                           " marker (its write was interrupted; it cannot be used)");
  }
  std::stringstream text;
  text << in.rdbuf();
  const json j = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer() ||
      j["step"].get<int64_t>() < 0 || !j.contains("shards") || !j["shards"].is_array() ||
      j["shards"].empty())
    throw checkpoint_error(where + std::string(checkpoint_marker) +
                           " is not {\"step\": N, \"shards\": [...]} (damaged marker)");
  checkpoint_manifest m;
  m.step = j["step"].get<int64_t>();
  for (const json& s : j["shards"]) {
    if (!s.is_object() || !s.contains("file") || !s["file"].is_string() || !s.contains("bytes") ||
        !s["bytes"].is_number_unsigned() || !s.contains("sha256") || !s["sha256"].is_string())
      throw checkpoint_error(where + "a shard entry of " + std::string(checkpoint_marker) +
                             " lacks file, bytes or sha256 (damaged marker)");
    shard_record r{s["file"].get<std::string>(), s["bytes"].get<uint64_t>(),
                   s["sha256"].get<std::string>()};
    if (!plain_file_name(r.file) || !is_hex64(r.sha256) || m.find(r.file) != nullptr)
      throw checkpoint_error(where + std::string(checkpoint_marker) + " names shard '" + r.file +
                             "' with an invalid name or checksum (damaged marker)");
    const fs::path p = fs::path(step_dir) / r.file;
    const auto size = fs::file_size(p, ec);
    if (ec) throw checkpoint_error(where + "shard " + r.file + " is missing");
    if (size != r.bytes)
      throw checkpoint_error(where + "shard " + r.file + " is " + std::to_string(size) +
                             " bytes, the marker says " + std::to_string(r.bytes) +
                             " (truncated or replaced)");
    m.shards.push_back(std::move(r));
  }
  return m;
}

std::vector<checkpoint_entry> scan_checkpoints(const std::string& dir) {
  std::vector<checkpoint_entry> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  static const std::regex pat("step_([0-9]{8,})");
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (!std::regex_match(name, m, pat) || !e.is_directory(ec)) continue;
    checkpoint_entry c;
    c.step = std::stoll(m[1]);
    c.path = e.path().string();
    try {
      const checkpoint_manifest man = read_checkpoint_manifest(c.path);
      if (man.step != c.step) {
        c.problem = "its marker says step " + std::to_string(man.step);
      } else {
        c.complete = true;
      }
    } catch (const checkpoint_error& err) {
      c.problem = err.what();
    }
    out.push_back(std::move(c));
  }
  std::sort(out.begin(), out.end(),
            [](const checkpoint_entry& a, const checkpoint_entry& b) { return a.step < b.step; });
  return out;
}

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  for (auto& c : scan_checkpoints(dir))
    if (c.complete) out.emplace_back(c.step, std::move(c.path));
  return out;
}

std::optional<std::pair<int64_t, std::string>> newest_checkpoint(const std::string& dir) {
  auto all = list_checkpoints(dir);
  if (all.empty()) return std::nullopt;
  return all.back();
}

std::pair<int64_t, std::string> checkpoint_to_resume(const std::string& dir) {
  std::string ignored;
  for (const auto& c : scan_checkpoints(dir)) {
    if (c.complete) continue;
    ignored += "\n  ignored " + c.problem;
  }
  if (auto newest = newest_checkpoint(dir)) return *newest;
  throw usage_error("--resume: no complete checkpoint (a step_NNNNNNNN folder with a " +
                    std::string(checkpoint_marker) + " marker) in " + dir + ignored +
                    "\n(run without --resume, or point fault_tolerance.checkpoint_dir at an "
                    "earlier run)");
}

void remove_checkpoint(const std::string& step_dir) {
  std::error_code ec;
  fs::remove(fs::path(step_dir) / checkpoint_marker, ec);
  fs::remove_all(step_dir, ec);
}

void prune_checkpoints(const std::string& dir, int keep) {
  const auto all = scan_checkpoints(dir);
  int64_t newest_complete = -1;
  std::size_t complete = 0;
  for (const auto& c : all) {
    if (c.complete) {
      newest_complete = c.step;
      ++complete;
    }
  }
  const std::size_t kept = static_cast<std::size_t>(std::max(keep, 0));
  std::size_t complete_seen = 0;
  for (const auto& c : all) {
    if (c.complete) {
      if (complete_seen++ + kept < complete) remove_checkpoint(c.path);
    } else if (c.step < newest_complete) {
      remove_checkpoint(c.path);
    }
  }
}

}  // namespace cohort
