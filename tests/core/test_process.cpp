// private_run_dir: a fresh 0700 folder NAME-PID-XXXXXX under $TMPDIR, and the folders of
// processes that are gone removed first (never a live process's, never another name's).
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "runtime/core/process.hpp"
#include "tests/data/temp_dir.hpp"

namespace fs = std::filesystem;

namespace {

// A pid no process has now: a child that exited and was reaped.
pid_t gone_pid() {
  const pid_t p = ::fork();
  if (p == 0) ::_exit(0);
  ::waitpid(p, nullptr, 0);
  return p;
}

// The private folders of private_run_dir under BASE: one call with TMPDIR set to it.
std::string run_dir_under(const std::string& base, const std::string& name) {
  const char* old = std::getenv("TMPDIR");
  const std::string saved = old != nullptr ? old : "";
  ::setenv("TMPDIR", base.c_str(), 1);
  const std::string made = cohort::proc::private_run_dir(name);
  if (old != nullptr)
    ::setenv("TMPDIR", saved.c_str(), 1);
  else
    ::unsetenv("TMPDIR");
  return made;
}

}  // namespace

TEST_CASE("private_run_dir removes the folders of processes that are gone, and only those") {
  cohort::test::temp_dir tmp;
  const std::string base = tmp.path().string();
  const std::string gone = base + "/cohort-t-" + std::to_string(gone_pid()) + "-abc123";
  const std::string live = base + "/cohort-t-" + std::to_string(::getppid()) + "-def456";
  const std::string other = base + "/cohort-u-" + std::to_string(gone_pid()) + "-ghi789";
  const std::string odd = base + "/cohort-t-notapid-jkl012";
  for (const auto& d : {gone, live, other, odd}) fs::create_directories(d + "/inside");

  const std::string made = run_dir_under(base, "cohort-t");

  CHECK_FALSE(fs::exists(gone));
  CHECK(fs::exists(live + "/inside"));
  CHECK(fs::exists(other + "/inside"));  // another name: not ours to judge
  CHECK(fs::exists(odd + "/inside"));    // not NAME-PID-...
  CHECK(made.rfind(base + "/cohort-t-" + std::to_string(::getpid()) + "-", 0) == 0);
  struct stat st {};
  REQUIRE(::stat(made.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
  // Its own folder survives the next call: this process is alive.
  const std::string second = run_dir_under(base, "cohort-t");
  CHECK(fs::exists(made));
  CHECK(second != made);
}
