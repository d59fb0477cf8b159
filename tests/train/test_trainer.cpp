// The single-process trainer: learning, determinism, the bitwise sum's independence from
// how micro-batches are shared out, and exact resume from a checkpoint.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>

#include "runtime/ckpt/checkpoint.hpp"
#include "runtime/core/config.hpp"
#include "runtime/train/fixed_point.hpp"
#include "runtime/train/trainer.hpp"

using namespace cohort;

namespace {

config small_mlp(const std::string& determinism, int64_t steps = 6) {
  std::string y =
      "model: {kind: mlp, hidden: [32, 16]}\n"
      "train: {steps: " +
      std::to_string(steps) +
      ", global_batch: 64, micro_batch: 16, lr: 0.003, seed: 5, determinism: " + determinism +
      ", log_every: 1000}\n";
  return load_config_text(y, "test.yaml");
}

std::string run(train::trainer& tr, int64_t from, int64_t to) {
  for (int64_t s = from; s < to; ++s) {
    tr.begin_step();
    tr.compute_gradients(s, 0, tr.micro_batches());
    tr.apply_step(s);
  }
  return tr.params_sha256();
}

}  // namespace

TEST_CASE("learning rate schedule: warm-up then cosine to min_lr") {
  train_config t;
  t.lr = 1.0f;
  t.steps = 12;
  t.warmup_steps = 1;
  t.lr_schedule = "cosine";
  t.min_lr = 0.0f;
  CHECK(train::learning_rate(t, 0) == doctest::Approx(1.0));                // (0+1)/1 of warm-up
  CHECK(train::learning_rate(t, 1) == doctest::Approx(1.0));                // cosine start
  CHECK(train::learning_rate(t, 6) == doctest::Approx(0.5).epsilon(1e-6));  // half-way
  CHECK(train::learning_rate(t, 11) == doctest::Approx(0.0));               // last step
  t.lr_schedule = "constant";
  t.warmup_steps = 4;
  CHECK(train::learning_rate(t, 1) == doctest::Approx(0.5));
  CHECK(train::learning_rate(t, 9) == doctest::Approx(1.0));
}

TEST_CASE("trainer: same seed gives the same parameters and the loss goes down") {
  train::trainer a(small_mlp("fast", 30)), b(small_mlp("fast", 30));
  CHECK(a.params_sha256() == b.params_sha256());
  a.begin_step();
  double first = a.compute_gradients(0, 0, a.micro_batches()) / 64;
  a.apply_step(0);
  run(a, 1, 30);
  a.begin_step();
  double last = a.compute_gradients(30, 0, a.micro_batches()) / 64;
  CHECK(first == doctest::Approx(std::log(10.0)).epsilon(0.15));  // chance level at init
  CHECK(last < first * 0.8);
  CHECK(run(b, 0, 30) == a.params_sha256());
}

TEST_CASE("bitwise: sharing micro-batches out in any way gives the same bits") {
  // One process runs all 4 micro-batches; "two replicas" run [0,2) and [2,4) separately
  // and add their fixed-point sums, in the other order. The results must be identical.
  train::trainer one(small_mlp("bitwise")), r0(small_mlp("bitwise")), r1(small_mlp("bitwise"));
  for (int64_t s = 0; s < 4; ++s) {
    one.begin_step();
    one.compute_gradients(s, 0, 4);
    one.apply_step(s);
    r0.begin_step();
    r1.begin_step();
    r1.compute_gradients(s, 2, 4);
    r0.compute_gradients(s, 0, 2);
    std::vector<int64_t> sum = r1.fixed_grads();
    REQUIRE(train::fixed_add(sum.data(), r0.fixed_grads().data(),
                             static_cast<int64_t>(sum.size())) == -1);
    r0.fixed_grads() = sum;
    r1.fixed_grads() = sum;
    r0.apply_step(s);
    r1.apply_step(s);
  }
  CHECK(one.params_sha256() == r0.params_sha256());
  CHECK(one.params_sha256() == r1.params_sha256());
}

TEST_CASE("fast and bitwise agree closely") {
  train::trainer f(small_mlp("fast")), b(small_mlp("bitwise"));
  run(f, 0, 3);
  run(b, 0, 3);
  const auto& pf = f.model().flat_values();
  const auto& pb = b.model().flat_values();
  double num = 0, den = 0;
  for (int64_t i = 0; i < pf.numel(); ++i) {
    num += (pf[i] - pb[i]) * (pf[i] - pb[i]);
    den += pf[i] * pf[i];
  }
  CHECK(std::sqrt(num / den) < 1e-5);
}

TEST_CASE("checkpoint: save, load into a fresh trainer, continue: same bits as no stop") {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("cohort_trainer_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "step_00000004").string();  // a checkpoint folder
  train::trainer straight(small_mlp("bitwise", 8));
  const std::string want = run(straight, 0, 8);

  train::trainer first(small_mlp("bitwise", 8));
  run(first, 0, 4);
  first.save_checkpoint(path, 4);
  train::trainer second(small_mlp("bitwise", 8));
  CHECK(second.load_checkpoint(path) == 4);
  CHECK(second.params_sha256() == first.params_sha256());
  CHECK(run(second, 4, 8) == want);
  fs::remove_all(dir);
}

TEST_CASE("onebit_adam: its compressed ranges skip biases, and warm-up is AdamW bit for bit") {
  config c = small_mlp("fast", 12);
  c.train.optimizer = "onebit_adam";
  c.train.onebit_freeze_step = 4;
  train::trainer one(c);
  // MLP 784-32-16-10: weights compressed, biases kept (the default exclude list).
  const auto ranges = train::onebit_ranges(one.model(), c.train.onebit_exclude);
  REQUIRE(ranges.size() == 3);
  CHECK(ranges[0] == std::make_pair<int64_t, int64_t>(0, 32 * 784));
  CHECK(ranges[1] == std::make_pair<int64_t, int64_t>(32 * 784 + 32, 16 * 32));
  CHECK(ranges[2] == std::make_pair<int64_t, int64_t>(32 * 784 + 32 + 16 * 32 + 16, 10 * 16));
  CHECK(train::onebit_ranges(one.model(), {"*"}).empty());
  CHECK(train::onebit_ranges(one.model(), {}).size() == 1);  // everything, merged
  // Before the freeze: no compressed segment, and the same bits as AdamW.
  config a = c;
  a.train.optimizer = "adamw";
  train::trainer ref(a);
  CHECK(one.wire(2, 0).compressed.empty());
  CHECK(one.reduction_type() == comm::grad_type::f32);
  CHECK(run(one, 0, 4) == run(ref, 0, 4));
  // From the freeze on: the weights travel as signs with error memory, the biases as floats.
  one.begin_step();
  const comm::wire_plan plan = one.wire(2, 1);
  REQUIRE(plan.compressed.size() == 3);
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(plan.compressed[i].offset == static_cast<std::size_t>(ranges[i].first));
    CHECK(plan.compressed[i].count == static_cast<std::size_t>(ranges[i].second));
    CHECK(plan.compressed[i].format == comm::wire_format::sign);
  }
  CHECK(plan.memory.worker != nullptr);
  CHECK(plan.memory.server != nullptr);
  // And it goes on learning on its own (a group of one: the momentum is its own).
  train::trainer fresh(c);
  fresh.begin_step();
  const double first = fresh.compute_gradients(0, 0, fresh.micro_batches()) / 64;
  fresh.apply_step(0);
  run(fresh, 1, 12);
  fresh.begin_step();
  const double last = fresh.compute_gradients(12, 0, fresh.micro_batches()) / 64;
  CHECK(std::isfinite(last));
  CHECK(last < first);
  CHECK(run(fresh, 12, 12) != run(ref, 4, 12));
}

TEST_CASE("bitwise with compression: the float wire carries the fixed-point sum, rounded once") {
  config c = small_mlp("bitwise", 3);
  c.comm.compression = comm_compression::fp8;
  train::trainer tr(c), plain(small_mlp("bitwise", 3));
  CHECK(tr.reduction_type() == comm::grad_type::f32);
  CHECK(plain.reduction_type() == comm::grad_type::i64);
  // One replica's DP path (the ready hook) and the single-process path agree bit for bit.
  for (int64_t s = 0; s < 3; ++s) {
    tr.begin_step();
    const comm::wire_plan w = tr.wire(1, 0);
    REQUIRE(w.compressed.size() == 1);
    CHECK(w.memory.worker == nullptr);  // comm.error_feedback is off
    std::vector<int> all;
    for (int i = 0; i < tr.micro_batches(); ++i) all.push_back(i);
    tr.compute_gradients(s, all, [](std::size_t, std::size_t) {});
    tr.apply_step(s);
  }
  CHECK(tr.params_sha256() == run(plain, 0, 3));
}

TEST_CASE("onebit_adam on the GPT compresses the block and head weights, not embeddings or norms") {
  const config c = load_config_text(
      "model: {kind: gpt, n_layer: 2, n_head: 2, d_model: 16, context: 8}\n"
      "data: {dataset: kjv}\n"
      "train: {steps: 2, global_batch: 4, micro_batch: 2, optimizer: onebit_adam}\n",
      "gpt.yaml");
  train::trainer tr(c);
  int64_t want = 0;
  for (const auto& p : tr.model().parameters()) {
    const std::string& n = p.name;
    const bool kept = n.find(".wte.") != std::string::npos ||
                      n.find(".wpe.") != std::string::npos || n.find("ln_") != std::string::npos ||
                      n.compare(n.size() - 5, 5, ".bias") == 0;
    if (!kept) want += p.value.numel();
  }
  int64_t got = 0;
  for (const auto& [off, n] : train::onebit_ranges(tr.model(), c.train.onebit_exclude)) got += n;
  // Per block: c_attn 3C x C, attn.c_proj C x C, c_fc 4C x C, mlp.c_proj C x 4C; the head V x C.
  const int64_t C = 16, V = tr.data().num_classes();
  CHECK(want == 2 * (3 * C * C + C * C + 4 * C * C + 4 * C * C) + V * C);
  CHECK(got == want);
}

TEST_CASE("error memory is checkpointed per rank and regrouped without losing any of it") {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("cohort_feedback_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const std::string step_dir = (dir / "step_00000001").string();
  config c = small_mlp("fast", 4);
  c.comm.compression = comm_compression::fp8;
  c.comm.error_feedback = true;
  // Three ranks of a group of 3 commit one step with known memory: rank r keeps r + 1 as a
  // sender and 10 (r + 1) as a chunk owner, everywhere; each writes its checkpoint parts.
  std::vector<std::string> files;
  for (int r = 0; r < 3; ++r) {
    train::trainer tr(c);
    REQUIRE(tr.keeps_feedback());
    tr.begin_step();
    const comm::wire_plan w = tr.wire(3, r);
    REQUIRE(w.memory.worker != nullptr);
    const auto n = static_cast<std::size_t>(tr.model().num_params());
    std::fill(w.memory.worker, w.memory.worker + n, float(r + 1));
    std::fill(w.memory.server, w.memory.server + n, float(10 * (r + 1)));
    tr.compute_gradients(0, {0, 1, 2, 3}, [](std::size_t, std::size_t) {});
    tr.apply_step(0);
    std::vector<std::string> all;
    const std::vector<shard_snapshot> parts = tr.checkpoint_parts(1, 77, all);
    CHECK(parts.size() == (r == 0 ? 2u : 1u));
    for (const auto& p : parts) write_checkpoint_files(step_dir, p, all);
    files = all;
  }
  CHECK(files.size() == 4);  // the model's shard and feedback_r0..2
  REQUIRE(checkpoint_feedback_parts(step_dir) == 3);

  // Memory rank R of W finds at its first compressed step.
  auto memory = [&](int replicas, int rank) {
    train::trainer tr(c);
    CHECK(tr.load_checkpoint(step_dir) == 1);
    tr.begin_step();
    const comm::wire_plan w = tr.wire(replicas, rank);
    const auto n = static_cast<std::size_t>(tr.model().num_params());
    return std::make_pair(std::vector<float>(w.memory.worker, w.memory.worker + n),
                          std::vector<float>(w.memory.server, w.memory.server + n));
  };
  auto all_equal = [](const std::vector<float>& v, float x) {
    return std::all_of(v.begin(), v.end(), [x](float y) { return y == x; });
  };
  for (int r = 0; r < 3; ++r) {  // the same group: each rank its own memory, bit for bit
    const auto [worker, server] = memory(3, r);
    CHECK(all_equal(worker, float(r + 1)));
    CHECK(all_equal(server, float(10 * (r + 1))));
  }
  // A group of 2: old ranks 0 and 2 fold into new rank 0, old rank 1 into rank 1, sender
  // and owner memory together (the chunks moved): 11 + 33 and 22, the total 66 kept.
  CHECK(all_equal(memory(2, 0).first, 44.0f));
  CHECK(all_equal(memory(2, 0).second, 0.0f));
  CHECK(all_equal(memory(2, 1).first, 22.0f));
  // A group of 4: rank 3 is new and starts from nothing.
  CHECK(all_equal(memory(4, 1).first, 22.0f));
  CHECK(all_equal(memory(4, 3).first, 0.0f));

  // A folder whose marker names feedback_r0 and feedback_r2 but no feedback_r1 is refused.
  const std::string holey = (dir / "step_00000002").string();
  train::trainer tr(c);
  std::vector<std::string> all = {shard_file_name(0, 0), feedback_file_name(0),
                                  feedback_file_name(2)};
  shard_snapshot model = tr.snapshot(2);
  write_checkpoint_files(holey, model, all);
  for (int r : {0, 2}) {
    shard_snapshot part;
    part.file = feedback_file_name(r);
    part.layout = model.layout;
    part.params.assign(model.params.size(), 0.0f);
    part.optimizer_state.emplace_back("server", part.params);
    part.meta = model.meta;
    part.meta.extra = {{"feedback.rank", std::to_string(r)}, {"feedback.replicas", "3"}};
    write_checkpoint_files(holey, part, all);
  }
  CHECK_THROWS_AS(checkpoint_feedback_parts(holey), checkpoint_error);
  CHECK_THROWS_AS(train::trainer(c).load_checkpoint(holey), checkpoint_error);
  fs::remove_all(dir);
}
