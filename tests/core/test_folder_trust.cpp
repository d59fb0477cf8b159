// require_private_folder: folders another user owns or can write (itself, a file in it, a
// folder above it, or where a symbolic link leads) are refused with the path, owner, mode and
// fix; the user's own private folders pass. Another owner needs root (chown 65534 = nobody).
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "runtime/core/folder_trust.hpp"
#include "tests/data/temp_dir.hpp"

using namespace cohort;
using cohort::test::temp_dir;
using cohort::test::write_all;
namespace fs = std::filesystem;

namespace {

constexpr uid_t nobody = 65534;

// The refusal's message, or "" when DIR passes.
std::string refusal(const std::string& dir, int depth = 1) {
  try {
    require_private_folder(dir, "checkpoint folder", depth);
  } catch (const untrusted_folder_error& e) {
    CHECK(e.exit_status() == exit_usage);
    return e.what();
  }
  return "";
}

std::string private_folder(const temp_dir& tmp, const std::string& name) {
  const std::string d = tmp.file(name);
  fs::create_directories(d);
  ::chmod(d.c_str(), 0700);
  write_all(d + "/file", "mine");
  ::chmod((d + "/file").c_str(), 0600);
  return d;
}

}  // namespace

TEST_CASE("the user's own private folder passes, as does one still to be made in it") {
  temp_dir tmp;
  const std::string d = private_folder(tmp, "ck");
  CHECK(refusal(d) == "");
  CHECK(refusal(d + "/") == "");
  CHECK(refusal(d + "/not/yet") == "");
  // 0755 is the user's too: others may read, not write.
  ::chmod(d.c_str(), 0755);
  CHECK(refusal(d) == "");
}

TEST_CASE("a folder group or others can write is refused with its mode and chmod go-w") {
  temp_dir tmp;
  const std::string d = private_folder(tmp, "ck");
  ::chmod(d.c_str(), 0777);
  const std::string m = refusal(d);
  CHECK(m.find("checkpoint folder " + d) != std::string::npos);
  CHECK(m.find("mode 0777") != std::string::npos);
  CHECK(m.find("chmod go-w " + d) != std::string::npos);
  ::chmod(d.c_str(), 0770);
  CHECK(refusal(d).find("mode 0770") != std::string::npos);
  // A file in it that others can write, at depth 1 only.
  ::chmod(d.c_str(), 0700);
  ::chmod((d + "/file").c_str(), 0666);
  CHECK(refusal(d, 0) == "");
  CHECK(refusal(d, 1).find("chmod go-w " + d + "/file") != std::string::npos);
}

TEST_CASE("a symbolic link to a folder others can write is refused, naming where it leads") {
  temp_dir tmp;
  const std::string open = private_folder(tmp, "open");
  ::chmod(open.c_str(), 0777);
  const std::string link = tmp.file("link");
  fs::create_directory_symlink(open, link);
  const std::string m = refusal(link);
  CHECK(m.find("checkpoint folder " + link) != std::string::npos);
  CHECK(m.find(open + " (where " + link + " leads)") != std::string::npos);
  CHECK(m.find("mode 0777") != std::string::npos);
  // A link to a private folder is fine (the folder may live on another disk).
  ::chmod(open.c_str(), 0700);
  CHECK(refusal(link) == "");
}

TEST_CASE("a folder above that others can write is refused unless sticky like /tmp") {
  temp_dir tmp;
  const std::string above = tmp.file("shared");
  fs::create_directories(above);
  const std::string d = private_folder(tmp, "shared/ck");
  ::chmod(above.c_str(), 0777);
  const std::string m = refusal(d);
  CHECK(m.find("the folder above it " + above) != std::string::npos);
  CHECK(m.find("others can rename it") != std::string::npos);
  // Not made yet: the folder it would be made in is refused the same way.
  CHECK(refusal(above + "/later").find("the folder above it " + above) != std::string::npos);
  ::chmod(above.c_str(), 01777);
  CHECK(refusal(d) == "");
}

TEST_CASE("a folder, a file or a link owned by another user is refused with the owner and chown") {
  if (::geteuid() != 0) {
    MESSAGE("skipped: making a folder of another user needs root");
    return;
  }
  temp_dir tmp;
  const std::string d = private_folder(tmp, "ck");
  REQUIRE(::chown(d.c_str(), nobody, nobody) == 0);
  std::string m = refusal(d);
  CHECK(m.find("checkpoint folder " + d) != std::string::npos);
  CHECK(m.find("owned by uid 65534") != std::string::npos);
  CHECK(m.find("mode 0700") != std::string::npos);
  CHECK(m.find("chown 0 " + d) != std::string::npos);
  CHECK(m.find("chmod go-w") == std::string::npos);
  // Another's and open to all: both fixes are named.
  ::chmod(d.c_str(), 0777);
  CHECK(refusal(d).find("`chown 0 " + d + "` and `chmod go-w " + d + "`") != std::string::npos);
  ::chmod(d.c_str(), 0700);
  // Through a symbolic link of the user's own.
  fs::create_directory_symlink(d, tmp.file("link"));
  CHECK(refusal(tmp.file("link")).find("owned by uid 65534") != std::string::npos);
  // The user's folder with another's file in it (a planted one).
  REQUIRE(::chown(d.c_str(), 0, 0) == 0);
  REQUIRE(::lchown((d + "/file").c_str(), nobody, nobody) == 0);
  m = refusal(d);
  CHECK(m.find(d + "/file is owned by uid 65534") != std::string::npos);
  // A folder above owned by another user: its owner could swap the folder.
  const std::string theirs = tmp.file("theirs");
  fs::create_directories(theirs + "/ck");
  REQUIRE(::chown(theirs.c_str(), nobody, nobody) == 0);
  CHECK(refusal(theirs + "/ck").find("the folder above it " + theirs) != std::string::npos);
  // Another user's symbolic link, even to the user's own folder.
  const std::string mine = private_folder(tmp, "mine");
  fs::create_directory_symlink(mine, tmp.file("their_link"));
  REQUIRE(::lchown(tmp.file("their_link").c_str(), nobody, nobody) == 0);
  CHECK(refusal(tmp.file("their_link")).find("the symbolic link") != std::string::npos);
}
