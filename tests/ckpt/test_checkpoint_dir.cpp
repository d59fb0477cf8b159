// Checkpoint folders: DIR/step_NNNNNNNN/ with shard_p<P>_t<T>.safetensors and a COMPLETE
// marker written last. Only folders whose marker exists and whose shards all exist with
// the recorded sizes are listed; loading checks each shard's SHA-256 against the marker;
// pruning keeps the newest complete ones and drops interrupted writes older than them.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "runtime/ckpt/checkpoint.hpp"
#include "runtime/ckpt/checkpoint_dir.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/sha256.hpp"
#include "tests/ckpt/env_guard.hpp"
#include "tests/ckpt/sample_shard.hpp"
#include "tests/data/temp_dir.hpp"

using namespace cohort;
using cohort::test::read_all;
using cohort::test::sample_shard;
using cohort::test::temp_dir;
using cohort::test::write_all;
namespace fs = std::filesystem;

namespace {

std::vector<int64_t> listed_steps(const std::string& dir) {
  std::vector<int64_t> out;
  for (const auto& [step, path] : list_checkpoints(dir)) {
    CHECK(path == checkpoint_path(dir, step));
    out.push_back(step);
  }
  return out;
}

std::string shard0(const std::string& step_dir) {
  return (fs::path(step_dir) / "shard_p0_t0.safetensors").string();
}

}  // namespace

TEST_CASE("a checkpoint folder holds one shard per stage/rank and a marker with size and sha256") {
  temp_dir tmp;
  const std::string dir = tmp.file("ck");
  const std::string step_dir = checkpoint_path(dir, 12);
  CHECK(fs::path(step_dir).filename() == "step_00000012");
  CHECK(shard_file_name(0, 0) == "shard_p0_t0.safetensors");
  CHECK(shard_file_name(3, 1) == "shard_p3_t1.safetensors");

  shard_snapshot a = sample_shard(12, 1.0f), b = sample_shard(12, 2.0f);
  b.stage = 1;
  write_training_checkpoint(step_dir, {a, b});

  const nlohmann::json marker = nlohmann::json::parse(read_all(step_dir + "/COMPLETE"));
  CHECK(marker["step"] == 12);
  REQUIRE(marker["shards"].size() == 2);
  for (const auto& s : marker["shards"]) {
    const std::string bytes = read_all(step_dir + "/" + s["file"].get<std::string>());
    CHECK(s["bytes"] == bytes.size());
    CHECK(s["sha256"] == sha256_hex(bytes.data(), bytes.size()));  // of the whole file
  }
  CHECK(marker["shards"][0]["file"] == "shard_p0_t0.safetensors");
  CHECK(marker["shards"][1]["file"] == "shard_p1_t0.safetensors");
  CHECK(listed_steps(dir) == std::vector<int64_t>{12});
  REQUIRE(newest_checkpoint(dir).has_value());
  CHECK(newest_checkpoint(dir)->second == step_dir);

  // Each shard loads back with its own values.
  std::vector<float> w(6, 0.0f), bias(2, 0.0f), m_w(6, 0.0f), m_b(2, 0.0f);
  std::vector<tensor_target> params{{"fc.weight", {2, 3}, w.data()}, {"fc.bias", {2}, bias.data()}};
  std::vector<optimizer_state_target> state{{"exp_avg", {"fc.weight", {2, 3}, m_w.data()}},
                                            {"exp_avg", {"fc.bias", {2}, m_b.data()}}};
  const training_metadata meta = load_checkpoint_shard(step_dir, 1, 0, params, state);
  CHECK(meta.step == 12);
  CHECK(w[5] == 2.0f + 0.5f * 5);
  CHECK(bias[1] == 2.0f + 0.5f * 7);
  CHECK(m_b[0] == -2.0f * 6);
  CHECK(read_checkpoint_metadata(step_dir).optimizer == "adamw");
  CHECK_THROWS_WITH_AS(load_checkpoint_shard(step_dir, 0, 1, params, state),
                       doctest::Contains("has no shard shard_p0_t1.safetensors"), checkpoint_error);
}

TEST_CASE("listing ignores folders without a marker, with a missing or truncated shard") {
  temp_dir tmp;
  const std::string dir = tmp.file("ck");
  for (int64_t s : {2, 4, 6, 8, 10})
    write_training_checkpoint(checkpoint_path(dir, s), {sample_shard(s)});
  CHECK(listed_steps(dir) == std::vector<int64_t>{2, 4, 6, 8, 10});

  fs::remove(checkpoint_path(dir, 4) + "/COMPLETE");  // a write killed before its marker
  fs::remove(shard0(checkpoint_path(dir, 6)));        // a shard gone
  const std::string s8 = shard0(checkpoint_path(dir, 8));
  fs::resize_file(s8, fs::file_size(s8) - 1);                                  // a shard cut short
  write_all(checkpoint_path(dir, 10) + "/COMPLETE", "{\"step\": 10, \"shar");  // damaged marker
  fs::create_directories(dir + "/step_00000012");                              // an empty folder
  write_all(dir + "/step_00000014", "not a folder");
  fs::create_directories(dir + "/other");

  CHECK(listed_steps(dir) == std::vector<int64_t>{2});
  CHECK(newest_checkpoint(dir)->first == 2);
  const auto all = scan_checkpoints(dir).folders;
  REQUIRE(all.size() == 6);  // steps 2..12; the plain file and "other" are not checkpoints
  CHECK(all[1].problem.find("no COMPLETE marker") != std::string::npos);
  CHECK(all[2].problem.find("shard_p0_t0.safetensors is missing") != std::string::npos);
  CHECK(all[3].problem.find("truncated") != std::string::npos);
  CHECK(all[4].problem.find("damaged marker") != std::string::npos);
  CHECK(all[5].problem.find("no COMPLETE marker") != std::string::npos);

  // A marker that names another step than its folder does not count either.
  write_training_checkpoint(checkpoint_path(dir, 16), {sample_shard(16)});
  fs::rename(checkpoint_path(dir, 16), checkpoint_path(dir, 18));
  CHECK(listed_steps(dir) == std::vector<int64_t>{2});
}

TEST_CASE("the marker is written after the shard: a reader never sees one without the other") {
  temp_dir tmp;
  const std::string dir = tmp.file("ck");
  const std::string step_dir = checkpoint_path(dir, 3);
  cohort::test::env_guard delay("COHORT_TEST_CHECKPOINT_DELAY_MS", "300");
  CHECK(test_checkpoint_delay_ms() == 300);
  std::atomic<bool> done{false};
  std::thread writer([&] {
    write_training_checkpoint(step_dir, {sample_shard(3)});
    done = true;
  });
  bool shard_without_marker = false, marker_without_shard = false, listed_early = false;
  while (!done) {
    // Marker first in this check: if it exists, the shard must already have existed.
    const bool marker = fs::exists(step_dir + "/COMPLETE");
    const bool shard = fs::exists(shard0(step_dir));
    marker_without_shard |= marker && !shard;
    if (shard && !marker) {
      shard_without_marker = true;
      // The marker may appear while the listing runs (the window closes): only a listing
      // with the marker still absent after it would be early.
      const bool listed = !list_checkpoints(dir).empty();
      listed_early |= listed && !fs::exists(step_dir + "/COMPLETE");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  writer.join();
  CHECK(shard_without_marker);  // the delay window was seen
  CHECK_FALSE(marker_without_shard);
  CHECK_FALSE(listed_early);  // and nothing was listed inside it
  CHECK(listed_steps(dir) == std::vector<int64_t>{3});
}

TEST_CASE("a sha256 mismatch on load throws checkpoint_error naming the file, targets untouched") {
  temp_dir tmp;
  const std::string dir = tmp.file("ck");
  const std::string step_dir = checkpoint_path(dir, 5);
  write_training_checkpoint(step_dir, {sample_shard(5)});
  // Flip one bit of the last data byte: same size, so the folder is still listed.
  const std::string file = shard0(step_dir);
  std::string bytes = read_all(file);
  bytes.back() = static_cast<char>(bytes.back() ^ 1);
  write_all(file, bytes);
  CHECK(listed_steps(dir) == std::vector<int64_t>{5});

  std::vector<float> w(6, 7.0f), bias(2, 7.0f), m_w(6, 7.0f), m_b(2, 7.0f);
  std::vector<tensor_target> params{{"fc.weight", {2, 3}, w.data()}, {"fc.bias", {2}, bias.data()}};
  std::vector<optimizer_state_target> state{{"exp_avg", {"fc.weight", {2, 3}, m_w.data()}},
                                            {"exp_avg", {"fc.bias", {2}, m_b.data()}}};
  try {
    load_checkpoint_shard(step_dir, 0, 0, params, state);
    FAIL("a corrupt shard loaded");
  } catch (const checkpoint_error& e) {
    const std::string what = e.what();
    CHECK(what.find(file) != std::string::npos);
    CHECK(what.find("file checksum mismatch") != std::string::npos);
  }
  for (float v : w) CHECK(v == 7.0f);
  for (float v : bias) CHECK(v == 7.0f);
  for (float v : m_w) CHECK(v == 7.0f);
  for (float v : m_b) CHECK(v == 7.0f);
}

TEST_CASE("prune keeps the newest complete ones and drops interrupted writes older than them") {
  temp_dir tmp;
  const std::string dir = tmp.file("ck");
  for (int64_t s : {1, 2, 3, 4, 5, 7})
    write_training_checkpoint(checkpoint_path(dir, s), {sample_shard(s)});
  fs::remove(checkpoint_path(dir, 3) + "/COMPLETE");  // interrupted, older than the newest
  fs::remove(checkpoint_path(dir, 7) + "/COMPLETE");  // newer than the newest: maybe in flight
  write_all(dir + "/notes.txt", "kept");
  prune_checkpoints(dir, 2);
  CHECK(listed_steps(dir) == std::vector<int64_t>{4, 5});
  CHECK_FALSE(fs::exists(checkpoint_path(dir, 1)));
  CHECK_FALSE(fs::exists(checkpoint_path(dir, 2)));
  CHECK_FALSE(fs::exists(checkpoint_path(dir, 3)));
  CHECK(fs::exists(shard0(checkpoint_path(dir, 7))));
  CHECK(fs::exists(dir + "/notes.txt"));
  prune_checkpoints(dir, 1);
  CHECK(listed_steps(dir) == std::vector<int64_t>{5});
  prune_checkpoints(tmp.file("absent"), 1);  // no folder: nothing to do, no error
}

TEST_CASE("rewriting a step replaces an interrupted write's leftovers") {
  temp_dir tmp;
  const std::string dir = tmp.file("ck");
  const std::string step_dir = checkpoint_path(dir, 9);
  write_training_checkpoint(step_dir, {sample_shard(9, 1.0f)});
  fs::remove(step_dir + "/COMPLETE");
  write_all(shard0(step_dir) + ".tmp.12345", "half a file");
  write_training_checkpoint(step_dir, {sample_shard(9, 3.0f)});
  CHECK_FALSE(fs::exists(shard0(step_dir) + ".tmp.12345"));
  CHECK(listed_steps(dir) == std::vector<int64_t>{9});
  std::vector<float> w(6), bias(2), m_w(6), m_b(2);
  load_checkpoint_shard(
      step_dir, 0, 0, {{"fc.weight", {2, 3}, w.data()}, {"fc.bias", {2}, bias.data()}},
      {{"exp_avg", {"fc.weight", {2, 3}, m_w.data()}}, {"exp_avg", {"fc.bias", {2}, m_b.data()}}});
  CHECK(w[0] == 3.0f);  // the second write's values
}

TEST_CASE("checkpoint_to_resume: the newest complete one, else a usage error naming the folder") {
  temp_dir tmp;
  const std::string dir = tmp.file("ck");
  CHECK_THROWS_WITH_AS(checkpoint_to_resume(dir), doctest::Contains("no complete checkpoint"),
                       usage_error);
  write_training_checkpoint(checkpoint_path(dir, 4), {sample_shard(4)});
  fs::remove(checkpoint_path(dir, 4) + "/COMPLETE");
  try {
    checkpoint_to_resume(dir);
    FAIL("an incomplete checkpoint was offered");
  } catch (const usage_error& e) {
    const std::string what = e.what();
    CHECK(what.find(dir) != std::string::npos);
    CHECK(what.find("step_00000004: incomplete") != std::string::npos);
    CHECK(what.find("run without --resume") != std::string::npos);
  }
  write_training_checkpoint(checkpoint_path(dir, 2), {sample_shard(2)});
  const resume_point r = checkpoint_to_resume(dir);
  CHECK(r.step == 2);
  CHECK(r.path == checkpoint_path(dir, 2));
  REQUIRE(r.skipped.size() == 1);  // the newer, incomplete step 4, with the reason
  CHECK(r.skipped[0].find("step_00000004: incomplete") != std::string::npos);
}

TEST_CASE("shards written by several workers: the last one in completes the checkpoint") {
  temp_dir tmp;
  const std::string dir = tmp.file("ck");
  const std::string step_dir = checkpoint_path(dir, 8);
  const std::vector<std::pair<int, int>> all = {{0, 0}, {1, 0}};
  shard_snapshot a = sample_shard(8, 1.0f), b = sample_shard(8, 2.0f);
  b.stage = 1;
  a.meta.extra["checkpoint.job"] = b.meta.extra["checkpoint.job"] = "run-2";

  for (const bool b_first : {false, true}) {
    CAPTURE(b_first);
    fs::remove_all(dir);
    CHECK_FALSE(write_checkpoint_part(step_dir, b_first ? b : a, all));
    CHECK(listed_steps(dir).empty());  // one shard in: not a checkpoint yet
    CHECK(write_checkpoint_part(step_dir, b_first ? a : b, all));
    CHECK(listed_steps(dir) == std::vector<int64_t>{8});
    const checkpoint_manifest m = read_checkpoint_manifest(step_dir);
    REQUIRE(m.shards.size() == 2);
    for (const auto& s : m.shards) {
      const std::string bytes = read_all(step_dir + "/" + s.file);
      CHECK(s.bytes == bytes.size());
      CHECK(s.sha256 == sha256_hex(bytes.data(), bytes.size()));
    }
  }
  {
    // A shard an earlier run left behind does not count.
    fs::remove_all(dir);
    shard_snapshot stale = sample_shard(8, 9.0f);
    stale.stage = 1;
    stale.meta.extra["checkpoint.job"] = "run-1";
    fs::create_directories(step_dir);
    write_checkpoint_shard(step_dir, stale);
    write_checkpoint_marker(step_dir, {8, {}});  // and its (stale) marker
    // Stage 0 of this run is in; stage 1 on disk is the old run's: not complete.
    CHECK_FALSE(write_checkpoint_part(step_dir, a, all));
    CHECK(listed_steps(dir).empty());
    // Stage 1 of this run replaces it and completes the checkpoint.
    CHECK(write_checkpoint_part(step_dir, b, all));
    CHECK(listed_steps(dir) == std::vector<int64_t>{8});
  }
}

TEST_CASE("prune leaves steps above the one just written: a later job's own, or one in flight") {
  // An earlier job got to step 20 in this folder; a job started afresh has completed step 4
  // and is writing step 8. Pruning after step 4 must keep both of its steps and the
  // earlier job's (before, the earlier step 20 counted as the newest: 4 and 8 went).
  temp_dir tmp;
  const std::string dir = tmp.file("ck");
  for (int64_t s : {4, 8, 20})
    write_training_checkpoint(checkpoint_path(dir, s), {sample_shard(s)});
  fs::remove(checkpoint_path(dir, 8) + "/COMPLETE");  // being written
  prune_checkpoints(dir, 1, 4);
  CHECK(listed_steps(dir) == std::vector<int64_t>{4, 20});
  CHECK(fs::exists(shard0(checkpoint_path(dir, 8))));
  // Once step 8 completes, step 4 is the older one below it and goes (keep 1).
  write_training_checkpoint(checkpoint_path(dir, 8), {sample_shard(8)});
  prune_checkpoints(dir, 1, 8);
  CHECK(listed_steps(dir) == std::vector<int64_t>{8, 20});
}
