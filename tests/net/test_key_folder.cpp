// Key folders another user could change (issue #33, item 4): a folder of mode 0777 whose
// `authorized` another user replaced is refused, so the replaced admin key is never admitted;
// so are a folder, or a key file in it, owned by another user (root: chown 65534 = nobody).
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "runtime/core/folder_trust.hpp"
#include "runtime/net/curve.hpp"
#include "tests/core/untrusted.hpp"
#include "tests/data/temp_dir.hpp"

using namespace cohort;
using cohort::test::temp_dir;
using cohort::test::untrusted;
using cohort::test::write_all;

namespace {

constexpr uid_t nobody = 65534;

}  // namespace

TEST_CASE("a key folder of mode 0777 whose authorized file was replaced is refused") {
  temp_dir tmp;
  const std::string dir = tmp.file("keys");
  net::write_job_keys(dir);
  REQUIRE(net::load_server_keys(dir).authorized.size() == 3);
  // Another user, through the open folder, swaps in their own admin key (a file 0600 as
  // the old check wanted) and so takes the real admin's place.
  ::chmod(dir.c_str(), 0777);
  const net::keypair theirs = net::make_keypair();
  const std::string path = dir + "/authorized";
  ::unlink(path.c_str());
  write_all(path, "admin " + theirs.public_key + "\n");
  ::chmod(path.c_str(), 0600);
  const std::string m = untrusted([&] { net::load_server_keys(dir); });
  CHECK(m.find("key folder " + dir) != std::string::npos);
  CHECK(m.find("mode 0777") != std::string::npos);
  CHECK(m.find("chmod go-w " + dir) != std::string::npos);
  // Clients refuse it the same way: a replaced coordinator.pub would send them elsewhere.
  CHECK(untrusted([&] { net::load_client_keys(dir, net::key_role::admin); }).find("mode 0777") !=
        std::string::npos);
  // keygen will not write keys under it either: the open folder could swap them.
  CHECK(untrusted([&] { net::write_job_keys(dir + "/sub"); }).find("the folder above it " + dir) !=
        std::string::npos);
}

TEST_CASE("a key folder or key file another user owns is refused") {
  if (::geteuid() != 0) {
    MESSAGE("skipped: making files of another user needs root");
    return;
  }
  temp_dir tmp;
  const std::string dir = tmp.file("keys");
  net::write_job_keys(dir);
  REQUIRE(::lchown((dir + "/authorized").c_str(), nobody, nobody) == 0);
  std::string m = untrusted([&] { net::load_server_keys(dir); });
  CHECK(m.find(dir + "/authorized is owned by uid 65534") != std::string::npos);
  REQUIRE(::lchown((dir + "/authorized").c_str(), 0, 0) == 0);
  REQUIRE(::chown(dir.c_str(), nobody, nobody) == 0);
  m = untrusted([&] { net::load_server_keys(dir); });
  CHECK(m.find("key folder " + dir + ": " + dir + " is owned by uid 65534") != std::string::npos);
  CHECK(m.find("chown 0 " + dir) != std::string::npos);
}
