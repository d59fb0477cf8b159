// A scratch folder for one benchmark command (rendezvous files, per-rank results), removed
// with everything in it when the command ends, however it ends. Owns only that folder.
#pragma once
#include <stdlib.h>

#include <filesystem>
#include <string>
#include <system_error>

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

}  // namespace cohort::cli
