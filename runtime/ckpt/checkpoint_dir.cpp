#include "runtime/ckpt/checkpoint_dir.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "runtime/core/atomic_file.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/folder_trust.hpp"

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

// A marker is a few hundred bytes per shard; anything far larger was not written by cohort
// and is not read into memory.
constexpr std::uintmax_t max_marker_bytes = 1 << 20;
constexpr std::size_t max_marker_shards = 1 << 16;

// What a step_* name says: the step it names, or why it is not a name cohort writes.
struct step_name {
  int64_t step = -1;
  std::string problem;
};

step_name parse_step_name(const std::string& name) {
  const std::string digits = name.substr(5);  // after "step_"
  const std::size_t end = digits.find_first_not_of("0123456789");
  if (digits.empty() || end == 0) return {-1, "not a step_NNNNNNNN name"};
  if (end != std::string::npos) {
    if (end >= 8 && digits.substr(end) == ".safetensors")
      return {-1, "a single-file checkpoint of an earlier build (not read)"};
    return {-1, "not a step_NNNNNNNN name"};
  }
  int64_t step = 0;
  const auto r = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  if (r.ec == std::errc::result_out_of_range)
    return {-1, "step number out of range (the largest is " +
                    std::to_string(std::numeric_limits<int64_t>::max()) + ")"};
  // step_5 or step_000000005 would name the same step as step_00000005: only the name
  // cohort writes counts, so that one step never has two folders.
  const std::string canonical = fs::path(checkpoint_path("", step)).filename().string();
  if (canonical != name)
    return {-1, "not the name cohort gives step " + std::to_string(step) + " (" + canonical + ")"};
  return {step, ""};
}

// Why an entry of type T cannot be a step folder ("" when it is a real folder).
std::string not_a_folder(fs::file_type t) {
  switch (t) {
    case fs::file_type::directory:
      return "";
    case fs::file_type::symlink:
      return "a symbolic link (never followed: cohort writes real folders only)";
    case fs::file_type::regular:
      return "a file, not a folder";
    default:
      return "not a folder (a special file)";
  }
}

// Makes a folder entry (a new folder, a rename, a removal) durable: fsync of its parent.
void fsync_folder(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    throw checkpoint_error("fsync of folder " + dir + " failed: " + why);
  }
  ::close(fd);
}

// The files a checkpoint write makes inside a step folder: shards, the marker, and their
// temporaries (<name>.tmp.<pid>, left by a write that was killed).
bool written_by_cohort(const std::string& name) {
  static const std::regex pat(
      R"((shard_p[0-9]+_t[0-9]+\.safetensors|feedback_r[0-9]+\.safetensors|zero_r[0-9]+\.safetensors|COMPLETE)(\.tmp\.[0-9]+)?)");
  return std::regex_match(name, pat);
}

}  // namespace

void make_checkpoint_folders(const std::string& path) {
  fs::path target = fs::path(path).lexically_normal();
  if (!target.has_filename() && target.has_parent_path()) target = target.parent_path();
  std::vector<fs::path> missing;
  for (fs::path p = target; !p.empty(); p = p.parent_path()) {
    std::error_code ec;
    const fs::file_status st = fs::status(p, ec);  // follows a link: DIR may be one
    if (st.type() == fs::file_type::not_found) {
      missing.push_back(p);
      if (p == p.parent_path()) break;
      continue;
    }
    if (ec)
      throw checkpoint_error("cannot create the checkpoint folder " + path + ": " + p.string() +
                             ": " + ec.message());
    if (!fs::is_directory(st))
      throw checkpoint_error("cannot create the checkpoint folder " + path + ": " + p.string() +
                             " exists and is not a folder");
    break;
  }
  for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
    if (::mkdir(it->c_str(), checkpoint_folder_mode) != 0) {
      const int err = errno;
      std::error_code ec;
      if (err == EEXIST && fs::is_directory(*it, ec)) continue;  // made meanwhile by a peer
      throw checkpoint_error("cannot create the checkpoint folder " + it->string() + ": " +
                             std::strerror(err) + " (check fault_tolerance.checkpoint_dir)");
    }
    const fs::path parent = it->parent_path();
    fsync_folder(parent.empty() ? "." : parent.string());
  }
  // A folder another user can change (theirs, 0777, or under one they can swap) would let
  // them read the model or plant a checkpoint for the next --resume: never written into.
  require_private_folder(target.string(), "checkpoint folder", 0);
}

std::string checkpoint_path(const std::string& dir, int64_t step) {
  char name[64];
  std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(step));
  return (fs::path(dir) / name).string();
}

std::string feedback_file_name(int rank) {
  return "feedback_r" + std::to_string(rank) + ".safetensors";
}

std::string zero_file_name(int rank) { return "zero_r" + std::to_string(rank) + ".safetensors"; }

int zero_rank_of(const std::string& file) {
  static const std::regex pat(R"(zero_r([0-9]{1,7})\.safetensors)");
  std::smatch m;
  if (!std::regex_match(file, m, pat)) return -1;
  return std::stoi(m[1].str());
}

int feedback_rank_of(const std::string& file) {
  static const std::regex pat(R"(feedback_r([0-9]{1,7})\.safetensors)");
  std::smatch m;
  if (!std::regex_match(file, m, pat)) return -1;
  return std::stoi(m[1].str());
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
    write_file_atomic((fs::path(step_dir) / checkpoint_marker).string(), j.dump(2) + "\n",
                      checkpoint_file_mode);
  } catch (const error& e) {
    throw checkpoint_error("checkpoint " + step_dir + ": cannot write its " + checkpoint_marker +
                           " marker (" + e.what() + ")");
  }
}

checkpoint_manifest read_checkpoint_manifest(const std::string& step_dir) {
  const std::string where = "checkpoint " + step_dir + ": ";
  const fs::path marker = fs::path(step_dir) / checkpoint_marker;
  std::error_code ec;
  const fs::file_type dir_type = fs::symlink_status(step_dir, ec).type();
  if (dir_type == fs::file_type::not_found) throw checkpoint_error(where + "no such folder");
  if (ec) throw checkpoint_error(where + "cannot be read: " + ec.message());
  if (const std::string why = not_a_folder(dir_type); !why.empty())
    throw checkpoint_error(where + why);
  // The marker must be a plain file: a FIFO would block the reader, a link lead elsewhere.
  const fs::file_type marker_type = fs::symlink_status(marker, ec).type();
  if (marker_type == fs::file_type::not_found) {
    throw checkpoint_error(where + "incomplete: no " + std::string(checkpoint_marker) +
                           " marker (its write was interrupted; it cannot be used)");
  }
  const std::string damaged = std::string(checkpoint_marker) + " ";
  if (ec) throw checkpoint_error(where + damaged + "cannot be read: " + ec.message());
  if (marker_type != fs::file_type::regular)
    throw checkpoint_error(where + damaged + "is not a plain file (damaged marker)");
  const std::uintmax_t marker_bytes = fs::file_size(marker, ec);
  if (ec) throw checkpoint_error(where + damaged + "cannot be read: " + ec.message());
  if (marker_bytes > max_marker_bytes)
    throw checkpoint_error(where + damaged + "is " + std::to_string(marker_bytes) +
                           " bytes, far more than a marker (damaged marker)");
  std::ifstream in(marker, std::ios::binary);
  if (!in) {
    throw checkpoint_error(where + damaged + "cannot be read: " + std::strerror(errno) +
                           " (check the folder's permissions)");
  }
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) throw checkpoint_error(where + damaged + "cannot be read (I/O error)");
  const json j = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer() ||
      j["step"].get<int64_t>() < 0 || !j.contains("shards") || !j["shards"].is_array() ||
      j["shards"].empty() || j["shards"].size() > max_marker_shards)
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
    const fs::file_type shard_type = fs::symlink_status(p, ec).type();
    if (shard_type == fs::file_type::not_found)
      throw checkpoint_error(where + "shard " + r.file + " is missing");
    if (ec) throw checkpoint_error(where + "shard " + r.file + " cannot be read: " + ec.message());
    if (shard_type != fs::file_type::regular)
      throw checkpoint_error(where + "shard " + r.file +
                             " is not a plain file (cohort writes no links or special files)");
    const auto size = fs::file_size(p, ec);
    if (ec) throw checkpoint_error(where + "shard " + r.file + " cannot be read: " + ec.message());
    if (size != r.bytes)
      throw checkpoint_error(where + "shard " + r.file + " is " + std::to_string(size) +
                             " bytes, the marker says " + std::to_string(r.bytes) +
                             " (truncated or replaced)");
    m.shards.push_back(std::move(r));
  }
  return m;
}

checkpoint_scan scan_checkpoints(const std::string& dir) {
  checkpoint_scan out;
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);  // DIR itself may be a link
  if (st.type() == fs::file_type::not_found) return out;
  if (ec || !fs::is_directory(st)) {
    out.error = "cannot list " + dir + ": " + (ec ? ec.message() : "not a folder");
    return out;
  }
  // increment(ec), not ++: an entry that vanishes or a read error must not throw.
  for (fs::directory_iterator it(dir, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind("step_", 0) != 0) continue;  // not a checkpoint name: not ours, not listed
    const std::string path = it->path().string();
    const step_name parsed = parse_step_name(name);
    if (!parsed.problem.empty()) {
      out.skipped.push_back({path, parsed.problem});
      continue;
    }
    std::error_code type_ec;
    const fs::file_type type = it->symlink_status(type_ec).type();
    if (type_ec || type == fs::file_type::not_found) {
      out.skipped.push_back({path, "cannot be read: " + (type_ec ? type_ec.message() : "gone")});
      continue;
    }
    if (const std::string why = not_a_folder(type); !why.empty()) {
      out.skipped.push_back({path, why});
      continue;
    }
    checkpoint_entry c;
    c.step = parsed.step;
    c.path = path;
    try {
      const checkpoint_manifest man = read_checkpoint_manifest(c.path);
      if (man.step != c.step) {
        c.problem = "checkpoint " + c.path + ": its marker says step " + std::to_string(man.step);
      } else {
        c.complete = true;
      }
    } catch (const checkpoint_error& err) {
      c.problem = err.what();
    }
    out.folders.push_back(std::move(c));
  }
  if (ec) out.error = "cannot list " + dir + ": " + ec.message();
  std::sort(out.folders.begin(), out.folders.end(),
            [](const checkpoint_entry& a, const checkpoint_entry& b) { return a.step < b.step; });
  std::sort(out.skipped.begin(), out.skipped.end(),
            [](const skipped_entry& a, const skipped_entry& b) { return a.path < b.path; });
  return out;
}

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  for (auto& c : scan_checkpoints(dir).folders)
    if (c.complete) out.emplace_back(c.step, std::move(c.path));
  return out;
}

std::optional<std::pair<int64_t, std::string>> newest_checkpoint(const std::string& dir) {
  auto all = list_checkpoints(dir);
  if (all.empty()) return std::nullopt;
  return all.back();
}

bool remove_checkpoint(const std::string& step_dir) {
  std::error_code ec;
  const fs::file_type type = fs::symlink_status(step_dir, ec).type();
  if (type == fs::file_type::not_found) return true;
  if (ec || type != fs::file_type::directory) return false;  // a link or a file: not ours
  const fs::path marker = fs::path(step_dir) / checkpoint_marker;
  if (!fs::remove(marker, ec) && ec) return false;  // still marked complete: leave the rest
  std::vector<fs::path> ours;
  for (fs::directory_iterator it(step_dir, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    std::error_code type_ec;
    if (it->symlink_status(type_ec).type() == fs::file_type::regular && !type_ec &&
        written_by_cohort(it->path().filename().string()))
      ours.push_back(it->path());
  }
  for (const auto& p : ours) fs::remove(p, ec);
  // remove() of a folder is rmdir: it fails, and keeps the folder, when a user's file is in it.
  fs::remove(step_dir, ec);
  return fs::symlink_status(step_dir, ec).type() == fs::file_type::not_found;
}

void prune_checkpoints(const std::string& dir, int keep, int64_t upto) {
  auto all = scan_checkpoints(dir).folders;
  all.erase(std::remove_if(all.begin(), all.end(),
                           [upto](const checkpoint_entry& c) { return c.step > upto; }),
            all.end());
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
