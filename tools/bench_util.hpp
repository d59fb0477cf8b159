// What the bench commands share: a scratch folder for one command (rendezvous files,
// per-rank results), removed with everything in it when the command ends, however it
// ends; a failed run's log tail; how a message size is printed; and the percentiles of a set
// of durations. Owns nothing else.
#pragma once
#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

#include "runtime/core/error.hpp"

namespace cohort::cli {

class scratch_dir {
 public:
  /// Creates /tmp/cohort-<what>-XXXXXX; throws io_error naming WHAT when it cannot.
  explicit scratch_dir(const std::string& what) {
    std::string tmpl = "/tmp/cohort-" + what + "-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr)
      throw io_error(what + ": cannot create a scratch folder in /tmp (is it writable?)");
    path_ = tmpl;
  }
  ~scratch_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

/// The last LINES lines of the file at PATH (a failed run's log, quoted in the bench's error
/// because the scratch folder that holds it is removed as the command ends).
inline std::string log_tail(const std::string& path, std::size_t lines = 12) {
  std::ifstream f(path);
  std::vector<std::string> all;
  for (std::string l; std::getline(f, l);) all.push_back(l);
  std::string out;
  for (std::size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i)
    out += "\n  " + all[i];
  return out.empty() ? " (no output)" : out;
}

/// "4 MiB", "256 KiB", "100 B": a size in the largest binary unit that divides it.
inline std::string human_bytes(std::size_t bytes) {
  char buf[32];
  if (bytes >= (1u << 20) && bytes % (1u << 20) == 0)
    std::snprintf(buf, sizeof buf, "%zu MiB", bytes >> 20);
  else if (bytes >= 1024 && bytes % 1024 == 0)
    std::snprintf(buf, sizeof buf, "%zu KiB", bytes >> 10);
  else
    std::snprintf(buf, sizeof buf, "%zu B", bytes);
  return buf;
}

/// Percentiles of durations given in nanoseconds, in microseconds.
struct summary {
  double p50_us = 0, p99_us = 0, mean_us = 0, min_us = 0;
};

/// The summary of NS (all zero when empty); a percentile is the sample at q x (n - 1).
inline summary summarize(std::vector<uint64_t> ns) {
  summary s;
  if (ns.empty()) return s;
  std::sort(ns.begin(), ns.end());
  auto at = [&](double q) {
    return static_cast<double>(ns[static_cast<size_t>(q * static_cast<double>(ns.size() - 1))]) /
           1e3;
  };
  s.p50_us = at(0.50);
  s.p99_us = at(0.99);
  s.min_us = static_cast<double>(ns.front()) / 1e3;
  double sum = 0;
  for (uint64_t v : ns) sum += static_cast<double>(v);
  s.mean_us = sum / static_cast<double>(ns.size()) / 1e3;
  return s;
}

}  // namespace cohort::cli
