// Checkpoints another user or another run could have put there (issue #33, item 4): a
// checkpoint folder owned by another user, writable by others or reached through a link to
// such a folder is refused for --resume and for writing; a step folder planted in the user's
// own folder is refused; a checkpoint another run wrote is not resumed by --resume, only by
// --resume-from naming it. Another owner needs root (chown 65534 = nobody).
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "runtime/ckpt/checkpoint.hpp"
#include "runtime/ckpt/checkpoint_dir.hpp"
#include "runtime/core/config.hpp"
#include "runtime/core/folder_trust.hpp"
#include "runtime/train/resume_plan.hpp"
#include "tests/ckpt/sample_shard.hpp"
#include "tests/core/untrusted.hpp"
#include "tests/data/temp_dir.hpp"

using namespace cohort;
using cohort::test::sample_shard;
using cohort::test::temp_dir;
using train::resume_by;
namespace fs = std::filesystem;

using cohort::test::untrusted;

namespace {

constexpr uid_t nobody = 65534;

config run_config(const std::string& dir, uint64_t seed = 1) {
  return load_config_text("fault_tolerance:\n  checkpoint_dir: " + dir +
                              "\ntrain:\n  steps: 10\n  seed: " + std::to_string(seed) + "\n",
                          "<test>");
}

// A complete checkpoint at STEP in DIR written by the run of C.
void write_checkpoint(const std::string& dir, int64_t step, const config& c) {
  shard_snapshot s = sample_shard(step);
  s.meta.extra[train::run_identity_key] = train::run_identity(c);
  write_training_checkpoint(checkpoint_path(dir, step), {s});
}

std::string usage_refusal(const config& c, const std::string& from = "") {
  try {
    train::plan_resume(c, from.empty(), resume_by::job, from);
  } catch (const usage_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("--resume refuses a checkpoint folder of mode 0777, and a link to one") {
  temp_dir tmp;
  const std::string dir = tmp.file("ck");
  write_checkpoint(dir, 2, run_config(dir));
  REQUIRE(train::plan_resume(run_config(dir), true, resume_by::job).step == 2);
  ::chmod(dir.c_str(), 0777);
  std::string m = untrusted([&] { checkpoint_to_resume(dir); });
  CHECK(m.find("checkpoint folder " + dir) != std::string::npos);
  CHECK(m.find("mode 0777") != std::string::npos);
  CHECK(m.find("chmod go-w " + dir) != std::string::npos);
  // The commands' plan, and a write, refuse it the same way.
  CHECK(usage_refusal(run_config(dir)).find("mode 0777") != std::string::npos);
  CHECK(untrusted([&] {
          write_training_checkpoint(checkpoint_path(dir, 4), {sample_shard(4)});
        }).find("mode 0777") != std::string::npos);
  const std::string link = tmp.file("link");
  fs::create_directory_symlink(dir, link);
  m = untrusted([&] { checkpoint_to_resume(link); });
  CHECK(m.find(dir + " (where " + link + " leads)") != std::string::npos);
  CHECK(m.find("mode 0777") != std::string::npos);
  // --resume-from names a folder: the same checks.
  CHECK(usage_refusal(run_config(dir), checkpoint_path(link, 2)).find("mode 0777") !=
        std::string::npos);
}

TEST_CASE("--resume refuses a checkpoint folder, step folder or shard another user owns") {
  if (::geteuid() != 0) {
    MESSAGE("skipped: making files of another user needs root");
    return;
  }
  temp_dir tmp;
  const std::string dir = tmp.file("ck");
  write_checkpoint(dir, 2, run_config(dir));
  REQUIRE(::chown(dir.c_str(), nobody, nobody) == 0);
  std::string m = untrusted([&] { checkpoint_to_resume(dir); });
  CHECK(m.find("checkpoint folder " + dir + ": " + dir + " is owned by uid 65534") !=
        std::string::npos);
  CHECK(m.find("mode 0700") != std::string::npos);
  CHECK(m.find("chown 0 " + dir) != std::string::npos);
  // Through a link of the user's own.
  const std::string link = tmp.file("link");
  fs::create_directory_symlink(dir, link);
  CHECK(untrusted([&] { checkpoint_to_resume(link); }).find("owned by uid 65534") !=
        std::string::npos);
  // The user's folder with a self-consistent step folder another user planted: refused,
  // never resumed (before: "resumed from .../step_00000020").
  REQUIRE(::chown(dir.c_str(), 0, 0) == 0);
  write_checkpoint(dir, 20, run_config(dir));
  const std::string planted = checkpoint_path(dir, 20);
  for (const auto& e : fs::directory_iterator(planted))
    REQUIRE(::lchown(e.path().c_str(), nobody, nobody) == 0);
  REQUIRE(::chown(planted.c_str(), nobody, nobody) == 0);
  m = usage_refusal(run_config(dir));
  CHECK(m.find(planted + " is owned by uid 65534") != std::string::npos);
  // Only a shard of it planted: refused too.
  REQUIRE(::chown(planted.c_str(), 0, 0) == 0);
  REQUIRE(::chown((planted + "/" + checkpoint_marker).c_str(), 0, 0) == 0);
  CHECK(usage_refusal(run_config(dir))
            .find(planted + "/" + shard_file_name(0, 0) + " is owned by uid 65534") !=
        std::string::npos);
}

TEST_CASE("--resume does not go on from another run's checkpoint, --resume-from does") {
  temp_dir tmp;
  const std::string dir = tmp.file("ck");
  const config mine = run_config(dir, 1);
  write_checkpoint(dir, 2, mine);
  // A self-consistent step folder of another run (another seed), newer than this run's.
  write_checkpoint(dir, 20, run_config(dir, 7));
  const std::string other = checkpoint_path(dir, 20);
  const std::string m = usage_refusal(mine);
  CHECK(m.find(other + ", was written by another run (run identity " +
               train::run_identity(run_config(dir, 7)).substr(0, 16)) != std::string::npos);
  CHECK(m.find("not resumed silently") != std::string::npos);
  CHECK(m.find("--resume-from " + other) != std::string::npos);
  // Named by the user, it is taken.
  const train::resume_plan p = train::plan_resume(mine, false, resume_by::job, other);
  CHECK(p.resume);
  CHECK(p.step == 20);
  CHECK(p.path == other);
  CHECK(p.earlier == checkpoint_path(dir, 2));
  // So is a whole folder, its newest checkpoint.
  CHECK(train::plan_resume(mine, false, resume_by::trainer, dir).path == other);
  // A checkpoint that records no run identity (an older cohort, another tool) is not taken
  // by --resume either.
  fs::remove_all(other);
  write_training_checkpoint(checkpoint_path(dir, 4), {sample_shard(4)});
  CHECK(usage_refusal(mine).find("recorded no run identity") != std::string::npos);
  fs::remove_all(checkpoint_path(dir, 4));
  // This run's own checkpoint: resumed, with a longer run, another worker count or grid.
  const config longer = load_config_text(
      "fault_tolerance:\n  checkpoint_dir: " + dir +
          "\n  keep: 7\ntrain:\n  steps: 50\n  seed: 1\n  log_every: 3\n  micro_batch: 32\n"
          "cluster:\n  workers: 4\n",
      "<test>");
  CHECK(train::plan_resume(longer, true, resume_by::job).step == 2);
}

TEST_CASE("run identity: what a resume may change leaves it, the model and data do not") {
  const config base = run_config("ck");
  const std::string id = train::run_identity(base);
  auto with = [](const std::string& yaml) {
    return train::run_identity(load_config_text(yaml, "<t>"));
  };
  CHECK(with("fault_tolerance:\n  checkpoint_dir: ck\ntrain:\n  steps: 10\n  seed: 1\n") == id);
  CHECK(with("fault_tolerance:\n  checkpoint_dir: elsewhere\ntrain:\n  steps: 99\n  seed: 1\n"
             "  optimizer: sgd\ncomm:\n  compression: bf16\n") == id);
  // The device and precision are where and how the steps run: a GPU run resumes on the CPU.
  CHECK(with("train:\n  steps: 10\n  seed: 1\n  device: auto\n  precision: bf16\n") == id);
  CHECK(with("train:\n  seed: 2\n") != id);
  CHECK(with("train:\n  lr: 0.5\n") != id);
  CHECK(with("model:\n  hidden: [64]\n") != id);
}
