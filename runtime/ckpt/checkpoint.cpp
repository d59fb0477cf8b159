#include "runtime/ckpt/checkpoint.hpp"

#include <cerrno>
#include <cstdlib>

#include "runtime/core/error.hpp"

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

void save_training_checkpoint(const std::string& path, const std::vector<tensor_view>& params,
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
  write_safetensors(path, all, m);
}

training_metadata load_training_checkpoint(
    const std::string& path, const std::vector<tensor_target>& params,
    const std::vector<optimizer_state_target>& optimizer_state) {
  const safetensors_file f = safetensors_file::read(path);
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

}  // namespace cohort
