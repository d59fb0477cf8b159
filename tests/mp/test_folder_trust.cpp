// Folders and leftovers another user, another run or a killed launch left (issue #33, items 4
// and 5), through the commands: `cohort train` / `cohort launch` refuse a checkpoint folder
// others can write and another run's checkpoint (exit 2), go on from it with --resume-from,
// and a launch removes the shared-memory segments of processes that are gone.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "runtime/comm/shm_names.hpp"
#include "tests/comm/killed_segment.hpp"
#include "tests/mp/dp_util.hpp"

using namespace cohort::mp;
using cohort::test::segment_of_a_killed_child;
namespace fs = std::filesystem;

namespace {

bool segment_exists(const std::string& name) { return fs::exists("/dev/shm" + name); }

}  // namespace

TEST_CASE("a launch removes the shared-memory segment of a killed process, not a live one's") {
  temp_dir dir;
  const std::string cfg = dir.write("cfg.yaml", small_yaml(dir.path(), "fast", 2));
  const std::string dead = segment_of_a_killed_child(1, std::size_t(2) << 20);
  REQUIRE(segment_exists(dead));
  const std::string live = cohort::comm::shm_segment_name(1);  // this test process: alive
  const int fd = ::shm_open(live.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  REQUIRE(fd >= 0);
  ::close(fd);
  int rc = -1;
  const std::string out = run_capture("launch " + cfg + " -q", &rc, true);
  CHECK_MESSAGE(rc == 0, out);
  CHECK(out.find("launch: removed ") != std::string::npos);
  CHECK_FALSE(segment_exists(dead));
  CHECK(segment_exists(live));
  ::shm_unlink(live.c_str());
}

TEST_CASE("another run's checkpoint is refused by --resume and taken by --resume-from") {
  temp_dir dir;
  const std::string cfg = dir.write("cfg.yaml", small_yaml(dir.path(), "fast", 4));
  int rc = -1;
  run_capture("train " + cfg + " -q", &rc);
  REQUIRE(rc == 0);
  const std::string theirs = dir.path() + "/ckpt/step_00000004";
  REQUIRE(fs::exists(theirs + "/COMPLETE"));
  // Another seed is another run: not resumed silently, by train or by launch.
  const std::string other = " --set train.seed=2 --set train.steps=6";
  std::string err = run_capture("train " + cfg + " -q --resume" + other, &rc, true);
  CHECK(rc == 2);
  CHECK(err.find(theirs + ", was written by another run") != std::string::npos);
  CHECK(err.find("--resume-from " + theirs) != std::string::npos);
  err = run_capture("launch " + cfg + " -q --resume" + other, &rc, true);
  CHECK(rc == 2);
  CHECK(err.find("was written by another run") != std::string::npos);
  // Named by the user: taken.
  err = run_capture("launch " + cfg + " -q --resume-from " + theirs + other, &rc, true);
  CHECK_MESSAGE(rc == 0, err);
  CHECK(err.find("resuming from " + theirs + " at step 4") != std::string::npos);
  // Its checkpoints are the seed-2 run's own: that run goes on from them with --resume (a
  // longer run is the same run).
  err = run_capture("train " + cfg + " -q --resume --set train.seed=2 --set train.steps=8", &rc,
                    true);
  CHECK_MESSAGE(rc == 0, err);
  CHECK(err.find("resumed from " + dir.path() + "/ckpt/step_00000006") != std::string::npos);
}

TEST_CASE("a checkpoint folder others can write is refused before training (exit 2)") {
  temp_dir dir;
  const std::string cfg = dir.write("cfg.yaml", small_yaml(dir.path(), "fast", 2));
  const std::string ck = dir.path() + "/ckpt";
  fs::create_directories(ck);
  ::chmod(ck.c_str(), 0777);
  int rc = -1;
  for (const std::string cmd : {"train ", "launch "}) {
    const std::string err = run_capture(cmd + cfg + " -q", &rc, true);
    CAPTURE(cmd);
    CHECK(rc == 2);
    CHECK(err.find("checkpoint folder " + ck) != std::string::npos);
    CHECK(err.find("mode 0777") != std::string::npos);
    CHECK(err.find("chmod go-w " + ck) != std::string::npos);
  }
}
