// The gradient pipeline as a whole (runtime/train/grad_pipeline.hpp): which stages each
// config mode chooses, that the trainer chooses again when 1-bit Adam's phase changes, and
// that the trainer running its pipeline reproduces, bit for bit, the gradient path written
// out inline (the code the pipeline replaced), on a small model.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "runtime/core/config.hpp"
#include "runtime/data/dataset.hpp"
#include "runtime/nn/optim.hpp"
#include "runtime/train/fixed_point.hpp"
#include "runtime/train/grad_pipeline.hpp"
#include "runtime/train/onebit.hpp"
#include "runtime/train/param_stats.hpp"
#include "runtime/train/trainer.hpp"

using namespace cohort;
using namespace cohort::train;
using names = std::vector<std::string>;

namespace {

config small_mlp(const std::string& determinism, const std::string& optimizer,
                 const std::string& compression = "none", bool feedback = false) {
  return load_config_text(
      "model: {kind: mlp, hidden: [32, 16]}\n"
      "train: {steps: 6, global_batch: 64, micro_batch: 16, lr: 0.003, seed: 5, grad_clip: 0.5, "
      "determinism: " +
          determinism + ", optimizer: " + optimizer +
          ", onebit: {freeze_step: 2}, log_every: 1000}\n"
          "comm: {compression: " +
          compression + ", error_feedback: " + (feedback ? "true" : "false") + "}\n",
      "test.yaml");
}

}  // namespace

TEST_CASE("the pipeline each config mode chooses, as stage names") {
  // 1-bit Adam's phase is the optimizer's: a fresh trainer is in warm-up (freeze_step 2).
  struct row {
    const char* determinism;
    const char* optimizer;
    const char* compression;
    bool feedback;
    names want;
  };
  const std::vector<row> table = {
      {"fast", "adamw", "none", false, {"sum_f32", "clip"}},
      {"bitwise",
       "adamw",
       "none",
       false,
       {"fixed_point_sum", "sum_i64_rank_order", "fixed_to_float", "clip"}},
      {"fast", "sgd", "fp8", false, {"compressed_sum_fp8", "clip"}},
      {"fast", "adamw", "bf16", true, {"error_feedback", "compressed_sum_bf16", "clip"}},
      {"bitwise",
       "adamw",
       "fp16",
       true,
       {"fixed_point_sum", "fixed_to_float", "error_feedback", "compressed_sum_fp16_rank_order",
        "clip"}},
      {"fast", "onebit_adam", "none", false, {"sum_f32", "clip"}},
      {"bitwise",
       "onebit_adam",
       "none",
       false,
       {"fixed_point_sum", "fixed_to_float", "sum_f32_rank_order", "clip"}},
  };
  for (const row& r : table) {
    CAPTURE(r.determinism);
    CAPTURE(r.optimizer);
    CAPTURE(r.compression);
    trainer tr(small_mlp(r.determinism, r.optimizer, r.compression, r.feedback));
    CHECK(tr.pipeline().names() == r.want);
  }
}

TEST_CASE("1-bit Adam's freeze changes the pipeline: momentum shares as signs, no clipping") {
  for (const std::string det : {"fast", "bitwise"}) {
    CAPTURE(det);
    trainer tr(small_mlp(det, "onebit_adam"));
    const names before = tr.pipeline().names();
    for (int64_t s = 0; s < 2; ++s) {
      CHECK(tr.pipeline().names() == before);
      tr.begin_step();
      tr.compute_gradients(s, 0, tr.micro_batches());
      tr.apply_step(s);
    }
    names want = {"momentum_share", "divide_by_denominator", "error_feedback",
                  "compressed_sum_sign", "multiply_by_denominator"};
    if (det == "bitwise") {
      want.insert(want.begin(), {"fixed_point_sum", "fixed_to_float"});
      want[5] = "compressed_sum_sign_rank_order";
    }
    CHECK(tr.pipeline().names() == want);
    // Restoring an earlier step count (a joiner, a resume) goes back to the warm-up's.
    tr.set_optimizer_steps(1);
    CHECK(tr.pipeline().names() == before);
  }
}

namespace {

// The gradient path of a whole-model step as it was written inline in the trainer before
// the pipeline, for one process: micro-batches summed (in fixed point when bitwise), 1-bit
// Adam's momentum share and denominator once frozen, the norm, clipping unless frozen, the
// optimizer. MODEL and DATA belong to a trainer of config C whose own step is never run.
std::string inline_path(const config& c, nn::model& model, const cohort::dataset& data,
                        int64_t steps) {
  const auto& t = c.train;
  const bool bitwise = t.determinism == "bitwise";
  nn::optim_options o = optim_options_from(t);
  if (o.kind == "onebit_adam") o.compressed = onebit_ranges(model, t.onebit_exclude);
  auto opt = nn::make_optimizer(model.flat_values(), model.flat_grads(), o);
  auto* onebit = dynamic_cast<nn::onebit_adam*>(opt.get());
  const int64_t n = model.num_params();
  std::vector<int64_t> fixed(static_cast<std::size_t>(n));
  cohort::batch batch;
  const int micro = (t.global_batch + t.micro_batch - 1) / t.micro_batch;
  for (int64_t step = 0; step < steps; ++step) {
    model.zero_grad();
    std::fill(fixed.begin(), fixed.end(), 0);
    float* g = model.flat_grads().data();
    for (int i = 0; i < micro; ++i) {
      data.train_micro_batch(t.seed, step, i, t.micro_batch, t.global_batch, batch);
      const int rows = micro_batch_rows(i, t.micro_batch, t.global_batch);
      if (bitwise) model.flat_grads().zero();
      model.forward_backward(batch, static_cast<float>(rows) / static_cast<float>(t.global_batch));
      if (bitwise) accumulate_gradients(fixed.data(), g, 0, n, "inline");
    }
    if (bitwise) fixed_to_float(g, fixed.data(), n);
    const bool frozen = onebit != nullptr && onebit->frozen();
    if (frozen) {
      add_momentum_share(*onebit, g, 1, 0, n);
      scale_by_denominator(*onebit, g, 0, n, true);
      scale_by_denominator(*onebit, g, 0, n, false);
    }
    const double norm = std::sqrt(ordered_sum(grad_sum_squares_by_param(model)));
    if (!frozen) clip_grads(model, norm, t.grad_clip);
    opt->step(learning_rate(t, step));
  }
  return combine_param_digests(param_digests(model));
}

// The trainer's DP path for a group of one: the ready hook runs the before-sum stages range
// by range; a group of one sums nothing, so its buffer goes on to apply_step as it is.
std::string pipeline_path(trainer& tr, int64_t steps) {
  std::vector<int> all;
  for (int i = 0; i < tr.micro_batches(); ++i) all.push_back(i);
  for (int64_t s = 0; s < steps; ++s) {
    tr.begin_step();
    tr.wire(1, 0);
    tr.compute_gradients(s, all, [](std::size_t, std::size_t) {});
    tr.apply_step(s);
  }
  return tr.params_sha256();
}

}  // namespace

TEST_CASE("the pipeline reproduces the inline gradient path bit for bit") {
  for (const std::string det : {"fast", "bitwise"})
    for (const std::string optimizer : {"adamw", "onebit_adam"}) {
      CAPTURE(det);
      CAPTURE(optimizer);
      const config c = small_mlp(det, optimizer);
      trainer ref(c), hooked(c), whole(c);
      const std::string want = inline_path(c, ref.model(), ref.data(), 5);
      CHECK(pipeline_path(hooked, 5) == want);  // stages range by range (the DP path)
      for (int64_t s = 0; s < 5; ++s) {         // stages on the whole buffer (one process)
        whole.begin_step();
        whole.compute_gradients(s, 0, whole.micro_batches());
        whole.apply_step(s);
      }
      CHECK(whole.params_sha256() == want);
    }
}
