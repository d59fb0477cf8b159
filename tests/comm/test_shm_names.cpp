// Shared-memory segments a process left when it died before unlinking them (issue #33, item
// 5): remove_stale_shm_segments removes those of a dead maker (a child SIGKILLed while it held
// one, as at the rendezvous) and keeps those of live processes and names not its own.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "runtime/comm/shm_names.hpp"
#include "tests/comm/killed_segment.hpp"

using namespace cohort::comm;
using cohort::test::segment_of_a_killed_child;

namespace {

bool exists(const std::string& name) { return std::filesystem::exists("/dev/shm" + name); }

void make_segment(const std::string& name) {
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  REQUIRE(fd >= 0);
  REQUIRE(::ftruncate(fd, 4096) == 0);
  ::close(fd);
}

}  // namespace

TEST_CASE("a dead maker's segment is removed, a live one's and foreign names are kept") {
  const std::string dead = segment_of_a_killed_child(3, 4096);
  REQUIRE(dead.rfind("/cohort-", 0) == 0);
  REQUIRE(exists(dead));                         // SIGKILL left it, as the issue saw
  const std::string live = shm_segment_name(3);  // this process: alive
  make_segment(live);
  // Same layout but another pid namespace, and a name that is not a segment's of cohort.
  const std::string pid_part = dead.substr(8, dead.find('-', 8) - 8);
  const std::string other_ns = "/cohort-" + pid_part + "-n1-ab-g3";
  const std::string foreign = "/cohort-" + pid_part + "-notours";
  make_segment(other_ns);
  make_segment(foreign);

  const std::vector<std::string> removed = remove_stale_shm_segments();
  CHECK(std::find(removed.begin(), removed.end(), dead.substr(1)) != removed.end());
  CHECK_FALSE(exists(dead));
  CHECK(exists(live));
  CHECK(exists(other_ns));
  CHECK(exists(foreign));
  for (const std::string& n : {live, other_ns, foreign}) ::shm_unlink(n.c_str());
}
