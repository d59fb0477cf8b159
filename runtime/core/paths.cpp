#include "runtime/core/paths.hpp"

#include <pwd.h>
#include <unistd.h>

#include <cstdlib>
#include <vector>

#include "runtime/core/error.hpp"

namespace cohort {
namespace {

// getpwnam/getpwuid return static storage shared by every thread; the _r variants
// make the lookup safe to call from worker threads.
bool passwd_home(const char* user, std::string* home) {
  long hint = sysconf(_SC_GETPW_R_SIZE_MAX);
  std::vector<char> buf(hint > 0 ? static_cast<size_t>(hint) : 16384);
  passwd entry{};
  passwd* found = nullptr;
  int rc = user ? getpwnam_r(user, &entry, buf.data(), buf.size(), &found)
                : getpwuid_r(getuid(), &entry, buf.data(), buf.size(), &found);
  if (rc != 0 || found == nullptr || found->pw_dir == nullptr) return false;
  *home = found->pw_dir;
  return true;
}

}  // namespace

std::string expand_user(const std::string& path) {
  if (path.empty() || path[0] != '~') return path;
  const size_t slash = path.find('/');
  const std::string user =
      path.substr(1, slash == std::string::npos ? std::string::npos : slash - 1);
  const std::string rest = slash == std::string::npos ? std::string() : path.substr(slash);
  std::string home;
  if (user.empty()) {
    const char* env = std::getenv("HOME");
    if (env != nullptr && *env != '\0') {
      home = env;
    } else if (!passwd_home(nullptr, &home)) {
      throw usage_error("cannot expand '" + path +
                        "': HOME is not set and the current user has no passwd entry (set "
                        "HOME or write an absolute path)");
    }
  } else if (!passwd_home(user.c_str(), &home)) {
    throw usage_error("cannot expand '" + path + "': no user named '" + user +
                      "' (write an absolute path)");
  }
  // "/" as home plus "/rest" would give "//rest"; harmless, but keep paths tidy.
  if (home.size() > 1 && home.back() == '/') home.pop_back();
  if (home == "/" && !rest.empty()) return rest;
  return home + rest;
}

}  // namespace cohort
