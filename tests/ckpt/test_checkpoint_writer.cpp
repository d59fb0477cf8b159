// The background checkpoint writer over a real trainer: the snapshot is taken at save()
// and is independent of later training; an async checkpoint loads back to exactly the
// state a synchronous one holds; a corrupt shard is refused with the model untouched;
// write errors come back from the next save()/wait(); old checkpoints are pruned.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "runtime/ckpt/checkpoint_dir.hpp"
#include "runtime/core/config.hpp"
#include "runtime/core/error.hpp"
#include "runtime/train/checkpoint_writer.hpp"
#include "runtime/train/trainer.hpp"
#include "tests/ckpt/env_guard.hpp"
#include "tests/data/temp_dir.hpp"

using namespace cohort;
using cohort::test::read_all;
using cohort::test::temp_dir;
using cohort::test::write_all;
namespace fs = std::filesystem;

namespace {

config small_mlp(int64_t steps = 8) {
  return load_config_text(
      "model: {kind: mlp, hidden: [16]}\n"
      "train: {steps: " +
          std::to_string(steps) +
          ", global_batch: 32, micro_batch: 16, lr: 0.003, seed: 11, determinism: bitwise}\n",
      "test.yaml");
}

void run(train::trainer& tr, int64_t from, int64_t to) {
  for (int64_t s = from; s < to; ++s) {
    tr.begin_step();
    tr.compute_gradients(s, 0, tr.micro_batches());
    tr.apply_step(s);
  }
}

// Every float of the training state (parameters, then each optimizer slot), copied.
std::vector<float> state_of(train::trainer& tr) {
  std::vector<float> out;
  for (auto [p, n] : tr.state_buffers()) out.insert(out.end(), p, p + n);
  return out;
}

}  // namespace

TEST_CASE("writer: the snapshot is taken at save(), later training does not leak into it") {
  temp_dir tmp;
  const std::string dir = tmp.file("ck");
  train::trainer tr(small_mlp());
  run(tr, 0, 2);
  const std::string at_save = tr.params_sha256();
  const std::vector<float> state_at_save = state_of(tr);
  const int64_t steps_at_save = tr.optimizer_steps();
  {
    // The write happens after the changes below: it must still hold the old values.
    cohort::test::env_guard delay("COHORT_TEST_CHECKPOINT_DELAY_MS", "200");
    train::checkpoint_writer w(dir, 3);
    w.save(tr, 2);
    CHECK(w.busy());
    run(tr, 2, 4);
    for (auto [p, n] : tr.state_buffers())
      for (std::size_t i = 0; i < n; ++i) p[i] = 42.0f;
    CHECK(w.wait() == checkpoint_path(dir, 2));
    CHECK_FALSE(w.busy());
  }
  REQUIRE(tr.params_sha256() != at_save);
  train::trainer back(small_mlp());
  CHECK(back.load_checkpoint(checkpoint_path(dir, 2)) == 2);
  CHECK(back.params_sha256() == at_save);
  CHECK(state_of(back) == state_at_save);
  CHECK(back.optimizer_steps() == steps_at_save);
}

TEST_CASE("writer: an async checkpoint loads back to the state a synchronous one holds") {
  temp_dir tmp;
  train::trainer tr(small_mlp());
  run(tr, 0, 3);
  tr.save_checkpoint(checkpoint_path(tmp.file("sync"), 3), 3);
  train::checkpoint_writer w(tmp.file("async"), 2);
  w.save(tr, 3);
  const std::string async_dir = w.wait();
  REQUIRE(async_dir == checkpoint_path(tmp.file("async"), 3));
  // Same state, same writer code: the shard files are the same bytes.
  CHECK(read_all(async_dir + "/shard_p0_t0.safetensors") ==
        read_all(checkpoint_path(tmp.file("sync"), 3) + "/shard_p0_t0.safetensors"));

  train::trainer a(small_mlp()), s(small_mlp());
  CHECK(a.load_checkpoint(async_dir) == 3);
  CHECK(s.load_checkpoint(checkpoint_path(tmp.file("sync"), 3)) == 3);
  CHECK(a.params_sha256() == tr.params_sha256());
  CHECK(a.params_sha256() == s.params_sha256());
  CHECK(state_of(a) == state_of(tr));
  CHECK(state_of(a) == state_of(s));
  CHECK(a.optimizer_steps() == tr.optimizer_steps());
  // And training on from it ends where training straight through does.
  run(tr, 3, 6);
  run(a, 3, 6);
  CHECK(a.params_sha256() == tr.params_sha256());
}

TEST_CASE("writer: a corrupt shard is refused by name and the model stays untouched") {
  temp_dir tmp;
  const std::string dir = tmp.file("ck");
  train::trainer tr(small_mlp());
  run(tr, 0, 2);
  tr.save_checkpoint(checkpoint_path(dir, 2), 2);
  const std::string file = checkpoint_path(dir, 2) + "/shard_p0_t0.safetensors";
  std::string bytes = read_all(file);
  bytes[bytes.size() / 2] = static_cast<char>(bytes[bytes.size() / 2] ^ 0x10);
  write_all(file, bytes);

  train::trainer fresh(small_mlp());
  const std::vector<float> before = state_of(fresh);
  CHECK_THROWS_WITH_AS(fresh.load_checkpoint(checkpoint_path(dir, 2)),
                       doctest::Contains(file.c_str()), checkpoint_error);
  CHECK(state_of(fresh) == before);
  CHECK(fresh.optimizer_steps() == 0);
}

TEST_CASE("writer: a failed write is logged, then thrown once from the next save() or wait()") {
  temp_dir tmp;
  write_all(tmp.file("blocker"), "a file where the checkpoint folder should be");
  train::trainer tr(small_mlp());
  {
    train::checkpoint_writer w(tmp.file("blocker") + "/ck", 2);
    w.save(tr, 1);  // returns: the failure happens in the background
    CHECK_THROWS_AS(w.wait(), checkpoint_error);
    CHECK(w.wait().empty());  // reported once
    w.save(tr, 2);
    CHECK_THROWS_AS(w.save(tr, 3), checkpoint_error);  // the previous write's error
    CHECK_FALSE(w.busy());
    w.save(tr, 4);
  }  // the destructor waits and swallows the (already logged) error
}

TEST_CASE("writer: keeps the newest `keep` checkpoints and reports the last one") {
  temp_dir tmp;
  const std::string dir = tmp.file("ck");
  train::trainer tr(small_mlp());
  train::checkpoint_writer w(dir, 2);
  for (int64_t s = 0; s < 4; ++s) {
    run(tr, s, s + 1);
    w.save(tr, s + 1);
  }
  CHECK(w.wait() == checkpoint_path(dir, 4));
  const auto all = list_checkpoints(dir);
  REQUIRE(all.size() == 2);
  CHECK(all[0].first == 3);
  CHECK(all[1].first == 4);
}
