#include "runtime/ckpt/checkpoint.hpp"

#include <spdlog/spdlog.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <set>
#include <thread>

#include "runtime/core/error.hpp"
#include "runtime/core/folder_trust.hpp"
#include "runtime/core/sha256.hpp"

namespace cohort {

namespace {

constexpr const char* reserved_keys[] = {"format",      "format_version", "step",
                                         "config_hash", "optimizer",      checksum_key};

// Range checks on the run facts a resume trusts. A value out of range (a negative count of
// optimizer steps, a batch of 0) fails nothing later: it trains on wrong numbers (Adam's bias
// correction of a negative step is NaN). Keys other writers leave out are not required.
void check_ranges(const std::string& path, const training_metadata& meta) {
  constexpr int64_t max_i64 = std::numeric_limits<int64_t>::max();
  auto integer = [&](const char* key, int64_t lo, int64_t hi,
                     const std::string& want) -> std::optional<int64_t> {
    const auto it = meta.extra.find(key);
    if (it == meta.extra.end()) return std::nullopt;
    const std::string& text = it->second;
    int64_t v = 0;
    const auto r = std::from_chars(text.data(), text.data() + text.size(), v);
    if (text.empty() || r.ec != std::errc() || r.ptr != text.data() + text.size() || v < lo ||
        v > hi)
      throw checkpoint_error("checkpoint " + path + ": metadata " + key + " is '" + text +
                             "', not " + want + " (a damaged file, or not written by cohort)");
    return v;
  };
  const int64_t step = meta.step;
  const std::string s = std::to_string(step);
  integer("optimizer.steps", 0, step, "a count of optimizer steps from 0 to the step, " + s);
  integer("data.step", step, step, "the checkpoint's step, " + s);
  const auto batch =
      integer("data.global_batch", 1, std::numeric_limits<int>::max(), "a batch size (1 or more)");
  const auto seen = integer("data.samples_seen", 0, max_i64, "a count (0 or more)");
  if (batch && seen && (step > max_i64 / *batch || step * *batch != *seen))
    throw checkpoint_error("checkpoint " + path + ": metadata data.samples_seen is " +
                           std::to_string(*seen) + ", not step x data.global_batch = " + s + " x " +
                           std::to_string(*batch) + " (a damaged file, or not written by cohort)");
  integer("data.epoch", 0, max_i64, "a count (0 or more)");
  integer("data.train_size", 1, max_i64, "a size (1 or more)");
  integer("parallel.pp", 1, 1 << 16, "a number of pipeline stages (1 or more)");
  integer("parallel.tp", 1, 1 << 16, "a number of tensor-parallel ranks (1 or more)");
  const auto replicas =
      integer("feedback.replicas", 1, 1 << 20, "a number of data-parallel ranks (1 or more)");
  const auto rank = integer("feedback.rank", 0, (1 << 20) - 1, "a data-parallel rank");
  if (replicas && rank && *rank >= *replicas)
    throw checkpoint_error("checkpoint " + path + ": metadata feedback.rank is " +
                           std::to_string(*rank) +
                           ", not a rank of feedback.replicas = " + std::to_string(*replicas) +
                           " (a damaged file, or not written by cohort)");
  if (const auto it = meta.extra.find("data.seed"); it != meta.extra.end()) {
    uint64_t seed = 0;
    const std::string& text = it->second;
    const auto r = std::from_chars(text.data(), text.data() + text.size(), seed);
    if (text.empty() || r.ec != std::errc() || r.ptr != text.data() + text.size())
      throw checkpoint_error("checkpoint " + path + ": metadata data.seed is '" + text +
                             "', not a seed (a damaged file, or not written by cohort)");
  }
}

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
  check_ranges(path, meta);
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

// Readies STEP_DIR for a write: creates it (mode 0700, its parent fsynced) or, when it
// exists, removes what an earlier write of the step left (marker first, so it never looks
// complete with a mix); a user's files in it stay. What is not a real folder (a link, a
// file) was not made by cohort: refused rather than written through or deleted.
void prepare_step_folder(const std::string& step_dir, bool clear) {
  std::error_code ec;
  const fs::file_type type = fs::symlink_status(step_dir, ec).type();
  if (type != fs::file_type::not_found && type != fs::file_type::directory) {
    throw checkpoint_error("checkpoint " + step_dir +
                           ": exists but is not a folder cohort wrote (" +
                           (ec                               ? ec.message()
                            : type == fs::file_type::symlink ? "a symbolic link"
                                                             : "a file") +
                           "); move it out of the checkpoint folder");
  }
  if (type == fs::file_type::directory) {
    if (!clear) return;
    remove_checkpoint(step_dir);
    if (fs::exists(fs::path(step_dir) / checkpoint_marker, ec))
      throw checkpoint_error("checkpoint " + step_dir +
                             ": the marker of an older write of the same step cannot be removed "
                             "(check the folder's permissions)");
  }
  make_checkpoint_folders(step_dir);
}

}  // namespace

std::string shard_snapshot::file_name() const {
  return file.empty() ? shard_file_name(stage, tp_rank) : file;
}

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
  const std::string file = s.file_name();
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
    COHORT_CHECK(names.insert(s.file_name()).second);
  }
  // Whatever the folder held (an interrupted write, an earlier run's checkpoint of the
  // same step) goes first, marker first, so the folder never looks complete with a mix.
  prepare_step_folder(step_dir, /*clear=*/true);

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
  std::vector<std::string> files;
  for (const auto& [stage, tp] : all_shards) files.push_back(shard_file_name(stage, tp));
  return write_checkpoint_files(step_dir, s, files);
}

bool write_checkpoint_files(const std::string& step_dir, const shard_snapshot& s,
                            const std::vector<std::string>& all_files) {
  // Other writers share the folder: it is created if needed, never cleared.
  prepare_step_folder(step_dir, /*clear=*/false);
  // A marker left by an earlier run of the same step would vouch for a mix of old and new
  // shards: it goes first; the last writer of this run writes the new one.
  std::error_code ec;
  fs::remove(fs::path(step_dir) / checkpoint_marker, ec);
  write_checkpoint_shard(step_dir, s);
  checkpoint_manifest m;
  m.step = s.meta.step;
  for (const std::string& file : all_files) {
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
  return load_checkpoint_file(step_dir, shard_file_name(stage, tp_rank), params, optimizer_state);
}

training_metadata load_checkpoint_file(const std::string& step_dir, const std::string& file,
                                       const std::vector<tensor_target>& params,
                                       const std::vector<optimizer_state_target>& optimizer_state) {
  const checkpoint_manifest m = read_checkpoint_manifest(step_dir);
  const shard_record* r = m.find(file);
  if (r == nullptr) {
    std::string have;
    for (const auto& s : m.shards) have += (have.empty() ? "" : ", ") + s.file;
    const char* what = feedback_rank_of(file) >= 0 ? "error-feedback part "
                       : zero_rank_of(file) >= 0   ? "sharded-state part "
                                                   : "shard ";
    throw checkpoint_error("checkpoint " + step_dir + ": has no " + what + file + " (it holds " +
                           have +
                           "; it was written with another pipeline / tensor layout or "
                           "data-parallel group)");
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

namespace {

// How many parts of one kind (RANK_OF / FILE_NAME) the folder's marker lists: W when they
// are ranks 0 .. W - 1 and each part's metadata KEY says W. WHAT names them in errors.
int count_parts(const std::string& step_dir, int (*rank_of)(const std::string&),
                std::string (*file_name)(int), const char* key, const char* what) {
  const checkpoint_manifest m = read_checkpoint_manifest(step_dir);
  std::set<int> ranks;
  for (const auto& s : m.shards)
    if (const int r = rank_of(s.file); r >= 0) ranks.insert(r);
  const int parts = static_cast<int>(ranks.size());
  if (parts > 0 && *ranks.rbegin() != parts - 1)
    throw checkpoint_error("checkpoint " + step_dir + ": its " + what + " parts are not " +
                           file_name(0) + " to " + file_name(parts - 1) +
                           " (one is missing: a damaged folder; resume an earlier checkpoint)");
  for (int r = 0; r < parts; ++r) {
    const std::string path = (fs::path(step_dir) / file_name(r)).string();
    const training_metadata meta = read_training_metadata(path);
    const auto it = meta.extra.find(key);
    if (it == meta.extra.end() || it->second != std::to_string(parts))
      throw checkpoint_error("checkpoint " + path + ": metadata " + key + " is '" +
                             (it == meta.extra.end() ? std::string("missing") : it->second) +
                             "', but the folder holds " + std::to_string(parts) + " " + what +
                             " parts (a damaged folder; resume an earlier one)");
  }
  return parts;
}

}  // namespace

int checkpoint_feedback_parts(const std::string& step_dir) {
  return count_parts(step_dir, feedback_rank_of, feedback_file_name, "feedback.replicas",
                     "error-feedback");
}

int checkpoint_zero_parts(const std::string& step_dir) {
  return count_parts(step_dir, zero_rank_of, zero_file_name, "zero.parts", "sharded-state");
}

training_metadata read_checkpoint_metadata(const std::string& step_dir, int stage, int tp_rank) {
  const checkpoint_manifest m = read_checkpoint_manifest(step_dir);
  const std::string file = shard_file_name(stage, tp_rank);
  if (m.find(file) == nullptr)
    throw checkpoint_error("checkpoint " + step_dir + ": has no shard " + file +
                           " (it was written with another pipeline / tensor layout)");
  return read_training_metadata((fs::path(step_dir) / file).string());
}

checkpoint_manifest verify_checkpoint(const std::string& step_dir) {
  const checkpoint_manifest m = read_checkpoint_manifest(step_dir);
  for (const auto& r : m.shards) {
    const std::string path = (fs::path(step_dir) / r.file).string();
    read_options o;
    o.file_sha256 = r.sha256;
    // read() checks the whole file's SHA-256, the header's layout and the data section's own
    // checksum; parse_metadata the format and the ranges of the run facts.
    const safetensors_file f = safetensors_file::read(path, o);
    const training_metadata meta = parse_metadata(path, f.metadata());
    if (meta.step != m.step)
      throw checkpoint_error("checkpoint " + path + ": metadata step " + std::to_string(meta.step) +
                             " differs from the marker's step " + std::to_string(m.step));
  }
  return m;
}

resume_point checkpoint_to_resume(const std::string& dir, const char* asker) {
  // Whatever another user could have put in DIR says nothing about who wrote it: the folder,
  // its step folders and their files must be the user's alone before anything is offered.
  require_private_folder(dir, "checkpoint folder", 2);
  const checkpoint_scan scan = scan_checkpoints(dir);
  resume_point out;
  // Odd step_* entries cannot be ordered against the folders (their step is unknown or
  // out of range): all are named, so that a user who expected one to be used sees why not.
  for (const auto& e : scan.skipped) out.skipped.push_back(e.path + ": " + e.reason);
  for (auto it = scan.folders.rbegin(); it != scan.folders.rend(); ++it) {
    if (!it->complete) {
      out.skipped.push_back(it->problem);
      continue;
    }
    try {
      verify_checkpoint(it->path);
      out.step = it->step;
      out.path = it->path;
      return out;
    } catch (const checkpoint_error& e) {
      out.skipped.push_back(e.what());
    }
  }
  std::string why;
  if (!scan.error.empty()) why += "\n  " + scan.error;
  for (const auto& s : out.skipped) why += "\n  skipped " + s;
  const bool resume = std::string(asker) == "--resume";
  throw usage_error(
      std::string(asker) +
      ": no complete checkpoint with intact shards (a step_NNNNNNNN folder "
      "with a " +
      std::string(checkpoint_marker) + " marker whose shards pass their checks) in " + dir + why +
      (resume ? "\n(run without --resume, or point fault_tolerance.checkpoint_dir at an "
                "earlier run)"
              : "\n(name a run's fault_tolerance.checkpoint_dir, or one of its step folders)"));
}

resume_point checkpoint_from(const std::string& path, const char* asker) {
  std::error_code ec;
  if (!fs::exists(fs::path(path) / checkpoint_marker, ec)) return checkpoint_to_resume(path, asker);
  require_private_folder(path, "checkpoint folder", 1);
  resume_point out;
  out.step = verify_checkpoint(path).step;
  out.path = path;
  return out;
}

}  // namespace cohort
