#include "runtime/ckpt/checkpoint_dir.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <regex>

namespace cohort {

namespace fs = std::filesystem;

std::string checkpoint_file(const std::string& dir, int64_t step) {
  char name[64];
  std::snprintf(name, sizeof name, "step_%08lld.safetensors", static_cast<long long>(step));
  return (fs::path(dir) / name).string();
}

std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  static const std::regex pat("step_([0-9]{8})\\.safetensors");
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (std::regex_match(name, m, pat)) out.emplace_back(std::stoll(m[1]), e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<std::pair<int64_t, std::string>> newest_checkpoint(const std::string& dir) {
  auto all = list_checkpoints(dir);
  if (all.empty()) return std::nullopt;
  return all.back();
}

void prune_checkpoints(const std::string& dir, int keep) {
  const auto all = list_checkpoints(dir);
  for (std::size_t i = 0; i + static_cast<std::size_t>(std::max(keep, 0)) < all.size(); ++i) {
    std::error_code ec;
    fs::remove(all[i].second, ec);
  }
}

}  // namespace cohort
