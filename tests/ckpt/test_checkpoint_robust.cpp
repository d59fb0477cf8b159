// Checkpoint folders against what a user or a crash leaves in them: odd step_* names, plain
// files, symbolic links, special files, partial markers, damaged or out-of-range shards.
// Scanning never throws and names what it skipped; resume takes the newest intact checkpoint
// and names the newer ones it passed over; pruning removes only what cohort wrote, never
// through a link; files are 0600 and folders 0700. One case per bug of issue 15.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "runtime/ckpt/checkpoint.hpp"
#include "runtime/ckpt/checkpoint_dir.hpp"
#include "runtime/core/error.hpp"
#include "tests/ckpt/sample_shard.hpp"
#include "tests/data/temp_dir.hpp"

using namespace cohort;
using cohort::test::read_all;
using cohort::test::sample_shard;
using cohort::test::temp_dir;
using cohort::test::write_all;
namespace fs = std::filesystem;

namespace {

std::string shard0(const std::string& step_dir) {
  return (fs::path(step_dir) / "shard_p0_t0.safetensors").string();
}

unsigned mode_of(const std::string& path) {
  struct stat st {};
  REQUIRE(::lstat(path.c_str(), &st) == 0);
  return st.st_mode & 07777;
}

// The reason scan_checkpoints gives for skipping NAME in DIR ("" when not skipped).
std::string skip_reason(const checkpoint_scan& scan, const std::string& dir,
                        const std::string& name) {
  for (const auto& e : scan.skipped)
    if (e.path == (fs::path(dir) / name).string()) return e.reason;
  return "";
}

bool mentions(const std::vector<std::string>& lines, const std::string& a, const std::string& b) {
  return std::any_of(lines.begin(), lines.end(), [&](const std::string& l) {
    return l.find(a) != std::string::npos && l.find(b) != std::string::npos;
  });
}

// Sets the umask for one scope (the modes below are what a write asks for, less the umask).
class umask_guard {
 public:
  explicit umask_guard(mode_t m) : old_(::umask(m)) {}
  ~umask_guard() { ::umask(old_); }

 private:
  mode_t old_;
};

}  // namespace

TEST_CASE("bug 15a: a step folder name that overflows is skipped, not an internal error") {
  temp_dir tmp;
  const std::string dir = tmp.file("ck");
  const std::string huge = "step_99999999999999999999";
  write_training_checkpoint(checkpoint_path(dir, 2), {sample_shard(2)});
  fs::create_directories(dir + "/" + huge);

  // Before the fix every one of these threw std::out_of_range ("stoll").
  checkpoint_scan scan;
  REQUIRE_NOTHROW(scan = scan_checkpoints(dir));
  CHECK(skip_reason(scan, dir, huge).find("out of range") != std::string::npos);
  REQUIRE(scan.folders.size() == 1);
  resume_point r;
  REQUIRE_NOTHROW(r = checkpoint_to_resume(dir));
  CHECK(r.step == 2);
  CHECK(mentions(r.skipped, huge, "out of range"));
  // A fresh run into the folder: its writes and pruning go on (the final checkpoint is written).
  REQUIRE_NOTHROW(write_training_checkpoint(checkpoint_path(dir, 3), {sample_shard(3)}));
  REQUIRE_NOTHROW(prune_checkpoints(dir, 1));
  CHECK(list_checkpoints(dir) ==
        std::vector<std::pair<int64_t, std::string>>{{3, checkpoint_path(dir, 3)}});
  CHECK(fs::is_directory(dir + "/" + huge));  // not ours: left alone
}

TEST_CASE("bug 15b: pruning never follows a symbolic link nor deletes what cohort did not write") {
  temp_dir tmp;
  const std::string dir = tmp.file("ck"), outside = tmp.file("outside");
  // A complete checkpoint outside DIR, linked in under a step name, plus a user's file.
  write_training_checkpoint(outside, {sample_shard(1)});
  write_all(outside + "/precious.txt", "user data");
  fs::create_directories(dir);
  fs::create_directory_symlink(outside, checkpoint_path(dir, 1));
  write_training_checkpoint(checkpoint_path(dir, 2), {sample_shard(2)});
  write_training_checkpoint(checkpoint_path(dir, 3), {sample_shard(3)});
  write_training_checkpoint(checkpoint_path(dir, 4), {sample_shard(4)});
  write_all(checkpoint_path(dir, 2) + "/notes.txt", "a user's file in an old step folder");
  fs::create_symlink(outside + "/precious.txt", checkpoint_path(dir, 3) + "/link.txt");

  CHECK(skip_reason(scan_checkpoints(dir), dir, "step_00000001").find("symbolic link") !=
        std::string::npos);
  prune_checkpoints(dir, 1);

  // Before the fix the link was listed as step 1, and pruning it removed outside/COMPLETE.
  CHECK(fs::exists(outside + "/COMPLETE"));
  CHECK(fs::exists(shard0(outside)));
  CHECK(fs::exists(outside + "/precious.txt"));
  CHECK(fs::is_symlink(checkpoint_path(dir, 1)));
  // Old step folders lose cohort's files; a user's file (and the folder holding it) stays.
  CHECK(fs::exists(checkpoint_path(dir, 2) + "/notes.txt"));
  CHECK_FALSE(fs::exists(shard0(checkpoint_path(dir, 2))));
  CHECK_FALSE(fs::exists(checkpoint_path(dir, 2) + "/COMPLETE"));
  CHECK(fs::is_symlink(checkpoint_path(dir, 3) + "/link.txt"));
  CHECK_FALSE(fs::exists(shard0(checkpoint_path(dir, 3))));
  CHECK(list_checkpoints(dir) ==
        std::vector<std::pair<int64_t, std::string>>{{4, checkpoint_path(dir, 4)}});
  // A step folder that is a link is not written through either.
  CHECK_THROWS_WITH_AS(write_training_checkpoint(checkpoint_path(dir, 1), {sample_shard(1, 5.0f)}),
                       doctest::Contains("symbolic link"), checkpoint_error);
  CHECK(read_all(shard0(outside)) != "");
  CHECK(remove_checkpoint(checkpoint_path(dir, 1)) == false);
  CHECK(fs::exists(outside + "/COMPLETE"));
}

TEST_CASE("bug 15c: metadata out of range is refused though its checksums are consistent") {
  temp_dir tmp;
  const std::string dir = tmp.file("ck");
  // What a cohort writer stores at step 4 with a global batch of 8.
  const metadata_map good = {
      {"optimizer.steps", "4"},    {"data.step", "4"},   {"data.global_batch", "8"},
      {"data.samples_seen", "32"}, {"data.epoch", "0"},  {"data.train_size", "60000"},
      {"data.seed", "1234"},       {"parallel.pp", "1"}, {"parallel.tp", "1"}};
  struct bad_case {
    const char* key;
    const char* value;
  };
  const bad_case bad[] = {
      {"optimizer.steps", "-3"},  // the reported bug: the run went to NaN
      {"optimizer.steps", "5"},   // more optimizer steps than steps
      {"optimizer.steps", "3x"},   {"data.step", "5"},   {"data.global_batch", "0"},
      {"data.samples_seen", "33"}, {"data.epoch", "-1"}, {"data.train_size", "0"},
      {"data.seed", "-1"},         {"parallel.pp", "0"}, {"parallel.tp", "-2"},
  };
  {
    shard_snapshot s = sample_shard(4);
    s.meta.extra = good;
    write_training_checkpoint(checkpoint_path(dir, 4), {s});
    CHECK(read_checkpoint_metadata(checkpoint_path(dir, 4)).extra.at("optimizer.steps") == "4");
    CHECK_NOTHROW(verify_checkpoint(checkpoint_path(dir, 4)));
  }
  write_training_checkpoint(checkpoint_path(dir, 2), {sample_shard(2)});
  for (const auto& b : bad) {
    CAPTURE(b.key);
    CAPTURE(b.value);
    shard_snapshot s = sample_shard(4);
    s.meta.extra = good;
    s.meta.extra[b.key] = b.value;
    write_training_checkpoint(checkpoint_path(dir, 4), {s});
    CHECK_THROWS_WITH_AS(read_checkpoint_metadata(checkpoint_path(dir, 4)),
                         doctest::Contains(b.key), checkpoint_error);
    std::vector<float> w(6), bias(2), m_w(6), m_b(2);
    CHECK_THROWS_AS(
        load_checkpoint_shard(checkpoint_path(dir, 4), 0, 0,
                              {{"fc.weight", {2, 3}, w.data()}, {"fc.bias", {2}, bias.data()}},
                              {{"exp_avg", {"fc.weight", {2, 3}, m_w.data()}},
                               {"exp_avg", {"fc.bias", {2}, m_b.data()}}}),
        checkpoint_error);
    // Resume passes over it to the checkpoint before, and says why.
    const resume_point r = checkpoint_to_resume(dir);
    CHECK(r.step == 2);
    CHECK(mentions(r.skipped, "step_00000004", b.key));
  }
}

TEST_CASE("bug 15d: a truncated and a corrupt newest checkpoint are both skipped by resume") {
  temp_dir tmp;
  const std::string dir = tmp.file("ck");
  write_training_checkpoint(checkpoint_path(dir, 2), {sample_shard(2)});
  const std::string newest = checkpoint_path(dir, 4), file = shard0(newest);

  SUBCASE("corrupt: one bit flipped, same size") {
    write_training_checkpoint(newest, {sample_shard(4)});
    std::string bytes = read_all(file);
    bytes.back() = static_cast<char>(bytes.back() ^ 1);
    write_all(file, bytes);
    CHECK(list_checkpoints(dir).size() == 2);          // complete: its marker and sizes hold
    const resume_point r = checkpoint_to_resume(dir);  // before the fix: step 4, then a hard error
    CHECK(r.step == 2);
    CHECK(r.path == checkpoint_path(dir, 2));
    CHECK(mentions(r.skipped, file, "checksum mismatch"));
  }
  SUBCASE("truncated: one byte short") {
    write_training_checkpoint(newest, {sample_shard(4)});
    fs::resize_file(file, fs::file_size(file) - 1);
    const resume_point r = checkpoint_to_resume(dir);  // before the fix: step 2, said nothing
    CHECK(r.step == 2);
    CHECK(mentions(r.skipped, "step_00000004", "truncated"));
  }
  SUBCASE("neither is left: a usage error naming the folder and both reasons") {
    write_training_checkpoint(newest, {sample_shard(4)});
    fs::resize_file(file, fs::file_size(file) - 1);
    const std::string older = shard0(checkpoint_path(dir, 2));
    std::string bytes = read_all(older);
    bytes[bytes.size() / 2] = static_cast<char>(bytes[bytes.size() / 2] ^ 0x10);
    write_all(older, bytes);
    try {
      checkpoint_to_resume(dir);
      FAIL("a damaged checkpoint was offered");
    } catch (const usage_error& e) {
      const std::string what = e.what();
      CHECK(e.exit_status() == exit_usage);
      CHECK(what.find("in " + dir) != std::string::npos);
      CHECK(what.find("truncated") != std::string::npos);
      CHECK(what.find("checksum mismatch") != std::string::npos);
      CHECK(what.find("run without --resume") != std::string::npos);
    }
  }
}

TEST_CASE("bug 15e: checkpoint files are 0600 and the folders a write creates 0700") {
  umask_guard mask(022);  // the usual umask, under which the old files were 0644
  temp_dir tmp;
  const std::string dir = tmp.file("runs") + "/ck";  // two missing levels
  const std::string step_dir = checkpoint_path(dir, 1);
  write_training_checkpoint(step_dir, {sample_shard(1)});
  CHECK(mode_of(tmp.file("runs")) == 0700);
  CHECK(mode_of(dir) == 0700);
  CHECK(mode_of(step_dir) == 0700);
  CHECK(mode_of(shard0(step_dir)) == 0600);
  CHECK(mode_of(step_dir + "/COMPLETE") == 0600);
  // The pipeline path (several writers) too, and a rewrite of the same step.
  write_checkpoint_part(checkpoint_path(dir, 2), sample_shard(2), {{0, 0}});
  CHECK(mode_of(checkpoint_path(dir, 2)) == 0700);
  CHECK(mode_of(shard0(checkpoint_path(dir, 2))) == 0600);
  CHECK(mode_of(checkpoint_path(dir, 2) + "/COMPLETE") == 0600);
  write_training_checkpoint(step_dir, {sample_shard(1, 2.0f)});
  CHECK(mode_of(shard0(step_dir)) == 0600);
  // An existing DIR keeps its mode: it is the user's.
  fs::create_directories(tmp.file("mine"));
  fs::permissions(tmp.file("mine"), fs::perms(0755));
  write_training_checkpoint(checkpoint_path(tmp.file("mine"), 1), {sample_shard(1)});
  CHECK(mode_of(tmp.file("mine")) == 0755);
  CHECK(mode_of(checkpoint_path(tmp.file("mine"), 1)) == 0700);
}

TEST_CASE("scanning names every odd step entry it skips and why, and never hangs or throws") {
  temp_dir tmp;
  const std::string dir = tmp.file("ck"), outside = tmp.file("outside");
  write_training_checkpoint(checkpoint_path(dir, 2), {sample_shard(2)});
  write_training_checkpoint(outside, {sample_shard(9)});
  fs::create_directories(dir + "/step_5");                  // short name
  fs::create_directories(dir + "/step_000000007");          // another name for step 7
  fs::create_directories(dir + "/step_00000006x");          // not digits
  write_all(dir + "/step_00000008", "a file");              // a plain file
  write_all(dir + "/step_00000011.safetensors", "legacy");  // the single-file layout
  fs::create_directory_symlink(outside, checkpoint_path(dir, 9));
  fs::create_symlink(tmp.file("nowhere"), checkpoint_path(dir, 13));  // dangling
  REQUIRE(::mkfifo(checkpoint_path(dir, 15).c_str(), 0600) == 0);     // a special file
  write_all(dir + "/notes.txt", "not a step name: neither listed nor touched");

  // Step folders whose insides are odd: listed, with the reason they do not count.
  write_training_checkpoint(checkpoint_path(dir, 20), {sample_shard(20)});
  fs::remove(checkpoint_path(dir, 20) + "/COMPLETE");
  REQUIRE(::mkfifo((checkpoint_path(dir, 20) + "/COMPLETE").c_str(), 0600) == 0);  // would block
  write_training_checkpoint(checkpoint_path(dir, 21), {sample_shard(21)});
  fs::remove(checkpoint_path(dir, 21) + "/COMPLETE");
  fs::create_directories(checkpoint_path(dir, 21) + "/COMPLETE");  // a folder
  write_training_checkpoint(checkpoint_path(dir, 22), {sample_shard(22)});
  write_all(checkpoint_path(dir, 22) + "/COMPLETE", "{\"step\": 22, \"sha");  // partial
  write_training_checkpoint(checkpoint_path(dir, 23), {sample_shard(23)});
  fs::remove(shard0(checkpoint_path(dir, 23)));
  fs::create_symlink(shard0(outside), shard0(checkpoint_path(dir, 23)));  // a linked shard
  fs::create_directories(checkpoint_path(dir, 24));                       // empty: no marker

  checkpoint_scan scan;
  REQUIRE_NOTHROW(scan = scan_checkpoints(dir));
  CHECK(scan.error.empty());
  CHECK(skip_reason(scan, dir, "step_5").find("not the name cohort gives step 5 (step_00000005)") !=
        std::string::npos);
  CHECK(skip_reason(scan, dir, "step_000000007").find("step_00000007") != std::string::npos);
  CHECK(skip_reason(scan, dir, "step_00000006x") == "not a step_NNNNNNNN name");
  CHECK(skip_reason(scan, dir, "step_00000008") == "a file, not a folder");
  CHECK(skip_reason(scan, dir, "step_00000011.safetensors").find("earlier build") !=
        std::string::npos);
  CHECK(skip_reason(scan, dir, "step_00000009").find("symbolic link") != std::string::npos);
  CHECK(skip_reason(scan, dir, "step_00000013").find("symbolic link") != std::string::npos);
  CHECK(skip_reason(scan, dir, "step_00000015").find("special file") != std::string::npos);
  CHECK(skip_reason(scan, dir, "notes.txt").empty());
  CHECK(scan.skipped.size() == 8);

  REQUIRE(scan.folders.size() == 6);
  CHECK(scan.folders[0].complete);
  const auto problem = [&](int64_t step) {
    for (const auto& f : scan.folders)
      if (f.step == step) return f.problem;
    return std::string("(not listed)");
  };
  CHECK(problem(20).find("not a plain file (damaged marker)") != std::string::npos);
  CHECK(problem(21).find("not a plain file (damaged marker)") != std::string::npos);
  CHECK(problem(22).find("damaged marker") != std::string::npos);
  CHECK(problem(23).find("shard_p0_t0.safetensors is not a plain file") != std::string::npos);
  CHECK(problem(24).find("no COMPLETE marker") != std::string::npos);

  // Resume: step 2, naming every newer folder it passed over and every odd entry.
  const resume_point r = checkpoint_to_resume(dir);
  CHECK(r.step == 2);
  CHECK(r.skipped.size() == 8 + 5);
  CHECK(mentions(r.skipped, "step_00000024", "no COMPLETE marker"));
  CHECK(mentions(r.skipped, "step_00000009", "symbolic link"));

  // Pruning touches step folders only, and through no link.
  prune_checkpoints(dir, 1);
  CHECK(fs::exists(dir + "/notes.txt"));
  CHECK(fs::exists(dir + "/step_5"));
  CHECK(fs::exists(dir + "/step_00000008"));
  CHECK(fs::exists(outside + "/COMPLETE"));
  CHECK(fs::exists(shard0(outside)));
  CHECK(fs::is_symlink(shard0(checkpoint_path(dir, 23))));
}

TEST_CASE("a checkpoint folder that cannot be listed is a usage error naming it") {
  temp_dir tmp;
  write_all(tmp.file("file"), "not a folder");
  const checkpoint_scan scan = scan_checkpoints(tmp.file("file"));
  CHECK(scan.error.find("not a folder") != std::string::npos);
  const std::string file = tmp.file("file");
  CHECK_THROWS_WITH_AS(checkpoint_to_resume(file), doctest::Contains(file.c_str()), usage_error);
  CHECK_NOTHROW(prune_checkpoints(tmp.file("file"), 1));
  CHECK(scan_checkpoints(tmp.file("absent")).folders.empty());
  CHECK(scan_checkpoints(tmp.file("absent")).error.empty());
}
