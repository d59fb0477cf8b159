#include "runtime/ckpt/checkpoint.hpp"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "runtime/core/error.hpp"
#include "runtime/core/sha256.hpp"

namespace cohort {

namespace {

constexpr const char* reserved_keys[] = {"format",      "format_version", "step",
                                         "config_hash", "optimizer",      checksum_key};

training_metadata parse_metadata(const std::string& path, const metadata_map& m) {
  auto get = [&](const char* key) -> const std::string& {
    auto it = m.find(key);
    if (it == m.end())
      throw checkpoint_error("checkpoint " + path + ": metadata key '" + key + "' is missing");
    return it->second;
  };
  auto it = m.find("format");
  if (it == m.end() || it->second != training_checkpoint_format) {
    throw checkpoint_error("checkpoint " + path +
                           ": not a cohort training checkpoint (metadata 'format' is " +
                           (it == m.end() ? "missing" : "'" + it->second + "'") + ")");
  }
  const std::string& version = get("format_version");
  if (version != std::to_string(training_checkpoint_version)) {
    throw checkpoint_error("checkpoint " + path + ": format_version " + version +
                           " is not supported (this build reads version " +
                           std::to_string(training_checkpoint_version) + ")");
  }
  training_metadata meta;
  const std::string& step = get("step");
  errno = 0;
  char* end = nullptr;
  const long long s = std::strtoll(step.c_str(), &end, 10);
  if (step.empty() || errno != 0 || end != step.c_str() + step.size() || s < 0)
    throw checkpoint_error("checkpoint " + path + ": metadata step '" + step + "' is not a step");
  meta.step = s;
  meta.config_hash = get("config_hash");
  meta.optimizer = get("optimizer");
  for (const auto& [k, v] : m) {
    bool reserved = false;
    for (const char* r : reserved_keys) reserved |= k == r;
    if (!reserved) meta.extra[k] = v;
  }
  return meta;
}

}  // namespace

std::string optimizer_tensor_name(const std::string& slot, const std::string& param) {
  return "optim." + slot + "." + param;
}

written_file save_training_checkpoint(const std::string& path,
                                      const std::vector<tensor_view>& params,
                                      const std::vector<optimizer_state_view>& optimizer_state,
                                      const training_metadata& meta) {
  metadata_map m;
  for (const auto& [k, v] : meta.extra) {
    for (const char* r : reserved_keys) {
      if (k == r)
        throw checkpoint_error("checkpoint " + path + ": metadata key '" + k + "' is reserved");
    }
    m[k] = v;
  }
  m["format"] = training_checkpoint_format;
  m["format_version"] = std::to_string(training_checkpoint_version);
  m["step"] = std::to_string(meta.step);
  m["config_hash"] = meta.config_hash;
  m["optimizer"] = meta.optimizer;

  std::vector<tensor_view> all = params;
  for (const auto& p : params) {
    if (p.name.rfind("optim.", 0) == 0) {
      throw checkpoint_error("checkpoint " + path + ": parameter name '" + p.name +
                             "' uses the prefix reserved for optimizer state");
    }
  }
  for (const auto& s : optimizer_state) {
    tensor_view v = s.tensor;
    v.name = optimizer_tensor_name(s.slot, s.tensor.name);
    all.push_back(std::move(v));
  }
  return write_safetensors(path, all, m);
}

training_metadata load_training_checkpoint(
    const std::string& path, const std::vector<tensor_target>& params,
    const std::vector<optimizer_state_target>& optimizer_state, const read_options& opts) {
  const safetensors_file f = safetensors_file::read(path, opts);
  training_metadata meta = parse_metadata(path, f.metadata());
  std::vector<tensor_target> all = params;
  for (const auto& s : optimizer_state) {
    tensor_target t = s.tensor;
    t.name = optimizer_tensor_name(s.slot, s.tensor.name);
    all.push_back(std::move(t));
  }
  f.copy_into(all, /*exact=*/true);
  return meta;
}

training_metadata read_training_metadata(const std::string& path) {
  const safetensors_file f = safetensors_file::read_header(path);
  return parse_metadata(path, f.metadata());
}

// ---- checkpoint folders ----

namespace {

namespace fs = std::filesystem;

// Makes a new folder entry durable: fsync of the folder that holds it.
void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    throw checkpoint_error("fsync of folder " + dir + " failed: " + why);
  }
  ::close(fd);
}

std::string parent_of(const std::string& path) {
  const std::string p = fs::path(path).parent_path().string();
  return p.empty() ? "." : p;
}

}  // namespace

shard_record write_checkpoint_shard(const std::string& step_dir, const shard_snapshot& s) {
  std::vector<tensor_view> params;
  for (const auto& e : s.layout) {
    int64_t n = 1;
    for (int64_t d : e.shape) n *= d;
    COHORT_CHECK(e.offset + static_cast<std::size_t>(n) <= s.params.size());
    params.push_back({e.name, e.shape, s.params.data() + e.offset, dtype::f32});
  }
  std::vector<optimizer_state_view> state;
  for (const auto& [slot, buf] : s.optimizer_state) {
    COHORT_CHECK(buf.size() == s.params.size());
    for (const auto& e : s.layout)
      state.push_back({slot, {e.name, e.shape, buf.data() + e.offset, dtype::f32}});
  }
  const std::string file = shard_file_name(s.stage, s.tp_rank);
  const written_file w =
      save_training_checkpoint((fs::path(step_dir) / file).string(), params, state, s.meta);
  return {file, w.bytes, w.sha256};
}

int test_checkpoint_delay_ms() {
  const char* v = std::getenv("COHORT_TEST_CHECKPOINT_DELAY_MS");
  if (v == nullptr || *v == '\0') return 0;
  char* end = nullptr;
  const long ms = std::strtol(v, &end, 10);
  if (*end != '\0' || ms < 0 || ms > 3600 * 1000) {
    spdlog::warn("COHORT_TEST_CHECKPOINT_DELAY_MS='{}' is not a number of milliseconds; ignored",
                 v);
    return 0;
  }
  return static_cast<int>(ms);
}

void write_training_checkpoint(const std::string& step_dir,
                               const std::vector<shard_snapshot>& shards) {
  COHORT_CHECK(!shards.empty());
  std::set<std::string> names;
  for (const auto& s : shards) {
    COHORT_CHECK(s.meta.step == shards.front().meta.step);
    COHORT_CHECK(names.insert(shard_file_name(s.stage, s.tp_rank)).second);
  }
  // Whatever the folder held (an interrupted write, an earlier run's checkpoint of the
  // same step) goes first, marker first, so the folder never looks complete with a mix.
  std::error_code ec;
  if (fs::exists(step_dir, ec)) {
    remove_checkpoint(step_dir);
    if (fs::exists(step_dir, ec))
      throw checkpoint_error("checkpoint " + step_dir +
                             ": an older folder of the same step cannot be removed (check "
                             "its permissions)");
  }
  fs::create_directories(step_dir, ec);
  if (ec)
    throw checkpoint_error("checkpoint " + step_dir +
                           ": cannot create the folder: " + ec.message());
  fsync_dir(parent_of(step_dir));

  checkpoint_manifest m;
  m.step = shards.front().meta.step;
  for (const auto& s : shards) m.shards.push_back(write_checkpoint_shard(step_dir, s));
  if (const int delay = test_checkpoint_delay_ms(); delay > 0) {
    spdlog::warn(
        "COHORT_TEST_CHECKPOINT_DELAY_MS={} (a test aid): waiting before the {} marker "
        "of {}",
        delay, checkpoint_marker, step_dir);
    std::this_thread::sleep_for(std::chrono::milliseconds(delay));
  }
  write_checkpoint_marker(step_dir, m);
}

bool write_checkpoint_part(const std::string& step_dir, const shard_snapshot& s,
                           const std::vector<std::pair<int, int>>& all_shards) {
  std::error_code ec;
  fs::create_directories(step_dir, ec);
  if (ec)
    throw checkpoint_error("checkpoint " + step_dir +
                           ": cannot create the folder: " + ec.message());
  // A marker left by an earlier run of the same step would vouch for a mix of old and new
  // shards: it goes first; the last writer of this run writes the new one.
  fs::remove(fs::path(step_dir) / checkpoint_marker, ec);
  write_checkpoint_shard(step_dir, s);
  checkpoint_manifest m;
  m.step = s.meta.step;
  for (const auto& [stage, tp] : all_shards) {
    const std::string file = shard_file_name(stage, tp);
    const fs::path path = fs::path(step_dir) / file;
    if (!fs::exists(path, ec)) return false;  // another writer is still at it
    // A shard of another run (an interrupted write of the same step) is not this
    // checkpoint's: its own writer replaces it and completes the checkpoint then.
    const auto own = s.meta.extra.find("checkpoint.job");
    if (own != s.meta.extra.end()) {
      try {
        const training_metadata other = read_training_metadata(path.string());
        const auto it = other.extra.find("checkpoint.job");
        if (it == other.extra.end() || it->second != own->second) return false;
      } catch (const std::exception&) {
        return false;  // half-written or foreign: not ours yet
      }
    }
    std::ifstream in(path, std::ios::binary);
    if (!in) return false;
    sha256 h;
    std::vector<char> buf(1 << 20);
    uint64_t bytes = 0;
    while (in) {
      in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
      const auto got = static_cast<std::size_t>(in.gcount());
      h.update(buf.data(), got);
      bytes += got;
    }
    m.shards.push_back({file, bytes, h.hex_digest()});
  }
  if (const int delay = test_checkpoint_delay_ms(); delay > 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(delay));
  write_checkpoint_marker(step_dir, m);
  return true;
}

training_metadata load_checkpoint_shard(
    const std::string& step_dir, int stage, int tp_rank, const std::vector<tensor_target>& params,
    const std::vector<optimizer_state_target>& optimizer_state) {
  const checkpoint_manifest m = read_checkpoint_manifest(step_dir);
  const std::string file = shard_file_name(stage, tp_rank);
  const shard_record* r = m.find(file);
  if (r == nullptr) {
    std::string have;
    for (const auto& s : m.shards) have += (have.empty() ? "" : ", ") + s.file;
    throw checkpoint_error("checkpoint " + step_dir + ": has no shard " + file + " (it holds " +
                           have + "; it was written with another pipeline / tensor layout)");
  }
  read_options o;
  o.file_sha256 = r->sha256;
  const std::string path = (fs::path(step_dir) / file).string();
  training_metadata meta = load_training_checkpoint(path, params, optimizer_state, o);
  if (meta.step != m.step)
    throw checkpoint_error("checkpoint " + path + ": metadata step " + std::to_string(meta.step) +
                           " differs from the marker's step " + std::to_string(m.step));
  return meta;
}

training_metadata read_checkpoint_metadata(const std::string& step_dir, int stage, int tp_rank) {
  const checkpoint_manifest m = read_checkpoint_manifest(step_dir);
  const std::string file = shard_file_name(stage, tp_rank);
  if (m.find(file) == nullptr)
    throw checkpoint_error("checkpoint " + step_dir + ": has no shard " + file +
                           " (it was written with another pipeline / tensor layout)");
  return read_training_metadata((fs::path(step_dir) / file).string());
}

}  // namespace cohort
