// The one step on two devices: the trainer on a stand-in GPU (tests/nn/shifted_device.hpp:
// the CPU's kernels over memory the host cannot touch) must end on the CPU's bits, with DP sums
// staged through host memory, checkpoints that move between devices, and state handed to a
// joiner. A host read of device memory anywhere on these paths faults the test at once.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "runtime/core/config.hpp"
#include "runtime/core/error.hpp"
#include "runtime/nn/device.hpp"
#include "runtime/train/trainer.hpp"
#include "tests/nn/shifted_device.hpp"
#include "tests/train/dp_by_hand.hpp"

using namespace cohort;

namespace {

config job(const std::string& kind, const std::string& determinism, int64_t steps,
           const std::string& extra = "") {
  const std::string model = kind == "gpt"
                                ? "model: {kind: gpt, n_layer: 2, n_head: 2, d_model: 16, "
                                  "context: 8}\ndata: {dataset: kjv}\n"
                                : "model: {kind: mlp, hidden: [24, 12]}\n";
  return load_config_text(model + "train: {steps: " + std::to_string(steps) +
                              ", global_batch: 16, micro_batch: 4, lr: 0.003, seed: 3, "
                              "grad_clip: 0.5, determinism: " +
                              determinism + ", log_every: 1000" + extra + "}\n",
                          "device.yaml");
}

std::string run(train::trainer& tr, int64_t from, int64_t to) {
  for (int64_t s = from; s < to; ++s) {
    tr.begin_step();
    tr.compute_gradients(s, 0, tr.micro_batches());
    tr.apply_step(s);
  }
  return tr.params_sha256();
}

// Two replicas of a data-parallel group, in one process: each computes its share with
// readiness reports, the reduction buffers are summed by hand (what the transport does),
// each takes the sum and applies the step.
std::string run_dp2(train::trainer& a, train::trainer& b, int64_t from, int64_t to) {
  for (int64_t s = from; s < to; ++s) test::dp2_step_by_hand(a, b, s);
  CHECK(a.params_sha256() == b.params_sha256());
  return a.params_sha256();
}

}  // namespace

TEST_CASE("device: tensors on a stand-in GPU are reached through copies only") {
  test::shifted_device dev;
  nn::pool mem(dev);
  nn::tensor t({5}, mem);
  CHECK_FALSE(t.host_visible());
  CHECK(&t.dev() == &dev);
  t.fill(2.5f);
  nn::tensor u({5}, mem);
  u.copy_from(t);
  CHECK(u.to_vector() == std::vector<float>(5, 2.5f));
  u.zero();
  CHECK(u.to_vector() == std::vector<float>(5, 0.0f));
  CHECK(dev.chunks == 1);
}

TEST_CASE("device: train.device and train.precision are parsed and resolved with advice") {
  CHECK(nn::valid_device_spec("cuda:3"));
  CHECK_FALSE(nn::valid_device_spec("cuda:"));
  CHECK_FALSE(nn::valid_device_spec("gpu"));
  CHECK(nn::resolve_device("cpu", 0).name() == "cpu");
  CHECK_THROWS_AS(nn::resolve_device("cuda:x", 0), usage_error);
  CHECK_THROWS_AS(nn::parse_precision("fp16"), usage_error);
  // The CPU takes bf16 (docs/precision.md) and gives fp32 back.
  nn::cpu_device().set_matmul_precision(nn::matmul_precision::bf16);
  CHECK(nn::cpu_device().precision() == nn::matmul_precision::bf16);
  nn::cpu_device().set_matmul_precision(nn::matmul_precision::fp32);
  CHECK(nn::cpu_device().precision() == nn::matmul_precision::fp32);
  if (nn::cuda_device_count() == 0) {
    CHECK(nn::resolve_device("auto", 3).name() == "cpu");  // no GPU: auto is the CPU
    try {
      nn::resolve_device("cuda", 0);
      FAIL("cuda without a GPU must be refused");
    } catch (const usage_error&) {
      FAIL("a missing GPU is not a config error");
    } catch (const cohort::error& e) {
      CHECK(std::string(e.what()).find("sees none") != std::string::npos);
    }
  }
}

TEST_CASE("device: the step on a stand-in GPU ends on the CPU's bits") {
  for (const char* kind : {"mlp", "gpt"})
    for (const char* det : {"fast", "bitwise"}) {
      CAPTURE(kind);
      CAPTURE(det);
      test::shifted_device dev;
      train::trainer cpu(job(kind, det, 5));
      train::trainer gpu(job(kind, det, 5), &dev);
      CHECK(&gpu.dev() == &dev);
      CHECK(run(gpu, 0, 5) == run(cpu, 0, 5));
      CHECK(gpu.evaluate().loss == cpu.evaluate().loss);
    }
}

TEST_CASE("device: whole-matrix weight gradients (a GPU's) report every element once") {
  // The trainer checks that the reported ranges tile the buffer exactly once (COHORT_CHECK);
  // the parameters stay within float rounding of the CPU's chunked products.
  test::shifted_device d0, d1;
  d0.chunked = d1.chunked = false;
  train::trainer c0(job("gpt", "fast", 3)), c1(job("gpt", "fast", 3));
  train::trainer g0(job("gpt", "fast", 3), &d0), g1(job("gpt", "fast", 3), &d1);
  run_dp2(c0, c1, 0, 3);
  run_dp2(g0, g1, 0, 3);
  const std::vector<float> want = c0.model().flat_values().to_vector();
  const std::vector<float> got = g0.model().flat_values().to_vector();
  double num = 0, den = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  CHECK(std::sqrt(num / den) < 1e-5);
}

TEST_CASE("device: a GPU group's sums staged through host memory give the group's bits") {
  for (const char* det : {"fast", "bitwise"}) {
    CAPTURE(det);
    test::shifted_device d0, d1;
    train::trainer c0(job("gpt", det, 4)), c1(job("gpt", det, 4));
    train::trainer g0(job("gpt", det, 4), &d0), g1(job("gpt", det, 4), &d1);
    const std::string want = run_dp2(c0, c1, 0, 4);
    CHECK(run_dp2(g0, g1, 0, 4) == want);
    // fast: every gradient went to the host for the sum and the sum came back.
    if (std::string(det) == "fast") {
      const auto grads = static_cast<std::size_t>(g0.model().num_params()) * sizeof(float);
      CHECK(d0.to_host_bytes >= 4 * grads);
      CHECK(d0.from_host_bytes >= 4 * grads);
    }
  }
}

TEST_CASE("device: a checkpoint written on one device resumes on the other, bit for bit") {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("cohort_device_ckpt_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  train::trainer straight(job("gpt", "fast", 8));
  const std::string want = run(straight, 0, 8);
  for (int gpu_first = 0; gpu_first < 2; ++gpu_first) {
    CAPTURE(gpu_first);
    const std::string path = (dir / ("step_" + std::to_string(gpu_first))).string();
    test::shifted_device dev;
    train::trainer first(job("gpt", "fast", 8), gpu_first ? &dev : nullptr);
    run(first, 0, 4);
    first.save_checkpoint(path, 4);
    train::trainer second(job("gpt", "fast", 8), gpu_first ? nullptr : &dev);
    CHECK(second.load_checkpoint(path) == 4);
    CHECK(run(second, 4, 8) == want);
  }
  fs::remove_all(dir);
}

TEST_CASE("device: a joiner on a GPU takes a CPU donor's state, and the other way round") {
  train::trainer straight(job("mlp", "fast", 6));
  const std::string want = run(straight, 0, 6);
  for (int gpu_donor = 0; gpu_donor < 2; ++gpu_donor) {
    CAPTURE(gpu_donor);
    test::shifted_device dev;
    train::trainer donor(job("mlp", "fast", 6), gpu_donor ? &dev : nullptr);
    train::trainer joiner(job("mlp", "fast", 6), gpu_donor ? nullptr : &dev);
    run(donor, 0, 3);
    // What the state transfer does: the donor's buffers are copied into the joiner's, every
    // member is told (a GPU's host copies go back on the device), then the step counters.
    auto from = donor.state_buffers();
    auto to = joiner.state_buffers();
    REQUIRE(from.size() == to.size());
    for (std::size_t i = 0; i < from.size(); ++i) {
      REQUIRE(from[i].second == to[i].second);
      std::copy(from[i].first, from[i].first + from[i].second, to[i].first);
    }
    donor.state_received();
    joiner.state_received();
    donor.set_optimizer_steps(donor.optimizer_steps());
    joiner.set_optimizer_steps(donor.optimizer_steps());
    CHECK(joiner.params_sha256() == donor.params_sha256());
    CHECK(run(joiner, 3, 6) == want);
  }
}

TEST_CASE("device: 1-bit Adam on a stand-in GPU ends on the CPU's bits, through its freeze") {
  // Warm-up (plain AdamW), then frozen: the momentum shares and the frozen denominator run
  // on the device's gradients, the DP sum in host memory, the frozen update on the device.
  const std::string onebit = ", optimizer: onebit_adam, onebit: {freeze_step: 3}";
  for (const char* kind : {"mlp", "gpt"}) {
    CAPTURE(kind);
    {
      test::shifted_device dev;
      train::trainer cpu(job(kind, "fast", 8, onebit));
      train::trainer gpu(job(kind, "fast", 8, onebit), &dev);
      CHECK(run(gpu, 0, 8) == run(cpu, 0, 8));
    }
    test::shifted_device d0, d1;
    train::trainer c0(job(kind, "fast", 8, onebit)), c1(job(kind, "fast", 8, onebit));
    train::trainer g0(job(kind, "fast", 8, onebit), &d0), g1(job(kind, "fast", 8, onebit), &d1);
    const std::string want = run_dp2(c0, c1, 0, 8);
    CHECK(run_dp2(g0, g1, 0, 8) == want);
    // Past the freeze (step 3 on), and it changed the parameters: not AdamW's bits.
    train::trainer a0(job(kind, "fast", 8)), a1(job(kind, "fast", 8));
    CHECK(run_dp2(a0, a1, 0, 8) != want);
  }
}
