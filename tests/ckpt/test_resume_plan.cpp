// The resume plan of every command as a table: which checkpoint a run goes on from, what it
// passed over and why, and what refuses it, for `cohort train` (trainer) and `cohort
// coordinator` (job). Folders are built with sample shards; nothing is loaded into a model.
#include <doctest/doctest.h>

#include <algorithm>
#include <exception>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "runtime/ckpt/checkpoint.hpp"
#include "runtime/ckpt/checkpoint_dir.hpp"
#include "runtime/core/config.hpp"
#include "runtime/core/error.hpp"
#include "runtime/train/resume_plan.hpp"
#include "tests/ckpt/sample_shard.hpp"
#include "tests/data/temp_dir.hpp"

using namespace cohort;
using cohort::test::read_all;
using cohort::test::sample_shard;
using cohort::test::temp_dir;
using cohort::test::write_all;
using train::resume_by;
namespace fs = std::filesystem;

namespace {

config run_config(const std::string& dir, int steps, const std::string& optimizer = "adamw") {
  return load_config_text("fault_tolerance:\n  checkpoint_dir: " + dir + "\ntrain:\n  steps: " +
                              std::to_string(steps) + "\n  optimizer: " + optimizer + "\n",
                          "<test>");
}

// A checkpoint of the run run_config describes (train.steps and the optimizer are not part of
// a run's identity: any steps and optimizer give the same one).
void write_checkpoint(const std::string& dir, int64_t step, const std::string& pp = "") {
  shard_snapshot s = sample_shard(step);
  s.meta.extra[train::run_identity_key] = train::run_identity(run_config(dir, 10));
  if (!pp.empty()) s.meta.extra["parallel.pp"] = pp;
  write_training_checkpoint(checkpoint_path(dir, step), {s});
}

void flip_a_bit(const std::string& dir, int64_t step) {
  const std::string file = checkpoint_path(dir, step) + "/" + shard_file_name(0, 0);
  std::string bytes = read_all(file);
  bytes.back() = static_cast<char>(bytes.back() ^ 1);
  write_all(file, bytes);
}

// The refusal's message and whether it is a usage error ("" when there is none).
std::pair<std::string, bool> refusal_of(const train::resume_plan& p) {
  try {
    p.enforce();
  } catch (const usage_error& e) {
    return {e.what(), true};
  } catch (const error& e) {
    return {e.what(), false};
  }
  return {"", false};
}

struct row {
  const char* name;
  std::function<void(const std::string& dir)> setup;
  bool resume = true;
  resume_by by = resume_by::job;
  int steps = 10;
  std::string optimizer = "adamw";
  // Expected: no checkpoint at all (a usage error from plan_resume), or the plan.
  bool none = false;
  int64_t step = 0;
  const char* skipped = "";  ///< a reason the one skipped folder names ("": none skipped)
  int64_t earlier = -1;      ///< step of the earlier checkpoint (-1: none)
  const char* refused = "";  ///< part of the refusal ("": none)
  bool refused_usage = true;
};

}  // namespace

TEST_CASE("resume plan: the checkpoint each command goes on from, and what refuses it") {
  auto nothing = [](const std::string&) {};
  auto two_and_four = [](const std::string& d) {
    write_checkpoint(d, 2);
    write_checkpoint(d, 4);
  };
  auto corrupt_newest = [](const std::string& d) {
    write_checkpoint(d, 2);
    write_checkpoint(d, 4);
    flip_a_bit(d, 4);
  };
  const std::vector<row> rows = {
      {"no --resume: a fresh start, the folder never read", nothing, false},
      {"no --resume, trainer", nothing, false, resume_by::trainer},
      {"no checkpoint folder", nothing, true, resume_by::job, 10, "adamw", true},
      {"no checkpoint folder, trainer", nothing, true, resume_by::trainer, 10, "adamw", true},
      {"an empty folder", [](const std::string& d) { fs::create_directories(d); }, true,
       resume_by::job, 10, "adamw", true},
      {"newest verified", two_and_four, true, resume_by::job, 10, "adamw", false, 4, "", 2},
      {"newest verified, trainer", two_and_four, true, resume_by::trainer, 10, "adamw", false, 4,
       "", 2},
      {"corrupt newest skipped with its reason", corrupt_newest, true, resume_by::job, 10, "adamw",
       false, 2, "checksum mismatch"},
      {"corrupt newest skipped, trainer", corrupt_newest, true, resume_by::trainer, 10, "adamw",
       false, 2, "checksum mismatch"},
      {"another optimizer: the job refuses before any worker starts", two_and_four, true,
       resume_by::job, 10, "sgd", false, 4, "", 2, "holds adamw optimizer state", false},
      {"another optimizer: the trainer's load says so", two_and_four, true, resume_by::trainer, 10,
       "sgd", false, 4, "", 2},
      {"another grid: the job refuses", [](const std::string& d) { write_checkpoint(d, 4, "2"); },
       true, resume_by::job, 10, "adamw", false, 4, "", -1, "grid of pp = 2 x tp = 1"},
      {"another grid: the trainer's load says so",
       [](const std::string& d) { write_checkpoint(d, 4, "2"); }, true, resume_by::trainer, 10,
       "adamw", false, 4},
      {"at the end of train.steps: nothing left for a job", two_and_four, true, resume_by::job, 4,
       "adamw", false, 4, "", 2, "nothing left to train"},
      {"at the end of train.steps: the trainer finishes the run", two_and_four, true,
       resume_by::trainer, 4, "adamw", false, 4, "", 2},
      {"past train.steps, job", two_and_four, true, resume_by::job, 3, "adamw", false, 4, "", 2,
       "the end of train.steps (3)"},
      {"past train.steps, trainer", two_and_four, true, resume_by::trainer, 3, "adamw", false, 4,
       "", 2, "past train.steps (3): raise train.steps"},
  };
  for (const row& x : rows) {
    CAPTURE(x.name);
    temp_dir tmp;
    const std::string dir = tmp.file("ck");
    x.setup(dir);
    const config c = run_config(dir, x.steps, x.optimizer);
    if (x.none) {
      CHECK_THROWS_WITH_AS(train::plan_resume(c, x.resume, x.by),
                           doctest::Contains("no complete checkpoint"), usage_error);
      continue;
    }
    const train::resume_plan p = train::plan_resume(c, x.resume, x.by);
    CHECK(p.resume == x.resume);
    CHECK(p.step == x.step);
    CHECK(p.path == (x.resume ? checkpoint_path(dir, x.step) : ""));
    if (x.resume) CHECK(p.meta.step == x.step);
    if (std::string(x.skipped).empty()) {
      CHECK(p.skipped.empty());
    } else {
      REQUIRE(p.skipped.size() == 1);
      CHECK(p.skipped[0].find(x.skipped) != std::string::npos);
    }
    CHECK(p.earlier == (x.earlier >= 0 ? checkpoint_path(dir, x.earlier) : ""));
    const auto [what, usage] = refusal_of(p);
    if (std::string(x.refused).empty()) {
      CHECK(what.empty());
    } else {
      CHECK(what.find(x.refused) != std::string::npos);
      CHECK(usage == x.refused_usage);
    }
  }
}

TEST_CASE("resume plan: the fallback names the checkpoint before, or running without --resume") {
  temp_dir tmp;
  const std::string dir = tmp.file("ck");
  write_checkpoint(dir, 2);
  const config c = run_config(dir, 10);
  CHECK(train::plan_resume(c, true, resume_by::trainer).fallback() ==
        "no earlier checkpoint is left: run without --resume");
  write_checkpoint(dir, 4);
  CHECK(train::plan_resume(c, true, resume_by::trainer).fallback() ==
        "remove " + checkpoint_path(dir, 4) + " to resume from " + checkpoint_path(dir, 2));
}
