// expand_user: "~" forms against $HOME and the passwd database; other paths untouched.
#include <doctest/doctest.h>
#include <pwd.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "runtime/core/error.hpp"
#include "runtime/core/paths.hpp"

namespace {

/// Sets HOME for one test and puts the old value back.
class home_guard {
 public:
  explicit home_guard(const char* value) {
    const char* old = std::getenv("HOME");
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value) {
      setenv("HOME", value, 1);
    } else {
      unsetenv("HOME");
    }
  }
  ~home_guard() {
    if (had_) {
      setenv("HOME", old_.c_str(), 1);
    } else {
      unsetenv("HOME");
    }
  }

 private:
  bool had_ = false;
  std::string old_;
};

}  // namespace

TEST_CASE("expand_user replaces a leading ~ with HOME") {
  home_guard home("/home/tester");
  CHECK(cohort::expand_user("~") == "/home/tester");
  CHECK(cohort::expand_user("~/") == "/home/tester/");
  CHECK(cohort::expand_user("~/.cache/cohort") == "/home/tester/.cache/cohort");
}

TEST_CASE("expand_user leaves other paths alone") {
  home_guard home("/home/tester");
  CHECK(cohort::expand_user("") == "");
  CHECK(cohort::expand_user("/abs/~/x") == "/abs/~/x");
  CHECK(cohort::expand_user("checkpoints") == "checkpoints");
  CHECK(cohort::expand_user("a/~b") == "a/~b");
}

TEST_CASE("expand_user with a trailing slash or / as HOME") {
  {
    home_guard home("/home/tester/");
    CHECK(cohort::expand_user("~/x") == "/home/tester/x");
  }
  {
    home_guard home("/");
    CHECK(cohort::expand_user("~/x") == "/x");
    CHECK(cohort::expand_user("~") == "/");
  }
}

TEST_CASE("expand_user without HOME uses the passwd entry") {
  const passwd* me = getpwuid(getuid());
  if (me == nullptr) return;  // a uid without a passwd entry (some containers): nothing to compare
  const std::string expected = std::string(me->pw_dir) + "/x";
  home_guard home(nullptr);
  CHECK(cohort::expand_user("~/x") == expected);
}

TEST_CASE("expand_user ~user uses that user's home") {
  const passwd* root = getpwnam("root");
  REQUIRE(root != nullptr);
  const std::string root_home = root->pw_dir;
  CHECK(cohort::expand_user("~root") == root_home);
  CHECK(cohort::expand_user("~root/data") ==
        (root_home == "/" ? std::string("/data") : root_home + "/data"));
  CHECK_THROWS_AS(cohort::expand_user("~no_such_user_cohort/x"), cohort::usage_error);
}
