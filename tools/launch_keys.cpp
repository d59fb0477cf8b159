#include "tools/launch_keys.hpp"

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "runtime/core/process.hpp"

namespace cohort::cli {

launch_keys::launch_keys(const std::string& keys_option, bool insecure, const std::string& bind) {
  if (insecure) {
    // Children inherit the environment: none of them may pick up keys from it.
    ::unsetenv("COHORT_KEYS");
    std::printf(
        "launch: warning: --insecure: no keys; anyone who reaches %s can join, steer or read "
        "this run\n",
        bind.c_str());
    return;
  }
  dir_ = keys_option;
  if (dir_.empty()) {
    dir_ = proc::private_run_dir("cohort-keys");
    temporary_ = true;
  }
  if (!net::has_job_keys(dir_)) net::write_job_keys(dir_);
  client_ = std::make_unique<net::client_keys>(net::load_client_keys(dir_, net::key_role::launcher));
  std::printf("launch: keys in %s (ctl: cohort ctl --keys %s ...%s)\n", dir_.c_str(), dir_.c_str(),
              temporary_ ? "; removed when launch exits" : "");
  std::fflush(stdout);
}

launch_keys::~launch_keys() {
  if (!temporary_) return;
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

}  // namespace cohort::cli
