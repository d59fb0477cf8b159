// Test helper: sets (or unsets) an environment variable for one scope and restores it after.
#pragma once
#include <cstdlib>
#include <optional>
#include <string>

namespace cohort::test {

class env_guard {
 public:
  env_guard(std::string name, const std::string& value) : name_(std::move(name)) {
    if (const char* old = std::getenv(name_.c_str())) old_ = old;
    ::setenv(name_.c_str(), value.c_str(), 1);
  }
  /// Unsets NAME for the scope.
  env_guard(std::string name, std::nullopt_t) : name_(std::move(name)) {
    if (const char* old = std::getenv(name_.c_str())) old_ = old;
    ::unsetenv(name_.c_str());
  }
  ~env_guard() {
    if (old_)
      ::setenv(name_.c_str(), old_->c_str(), 1);
    else
      ::unsetenv(name_.c_str());
  }
  env_guard(const env_guard&) = delete;
  env_guard& operator=(const env_guard&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

}  // namespace cohort::test
