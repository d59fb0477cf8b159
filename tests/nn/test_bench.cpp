// The training benchmark's bookkeeping (not its speed): sizes, counts and that training
// on its synthetic data lowers the loss.
#include <doctest/doctest.h>

#include <cmath>

#include "runtime/core/error.hpp"
#include "runtime/cpu/kernels.hpp"
#include "runtime/nn/bench.hpp"

using namespace cohort::nn;

TEST_CASE("bench_train reports consistent figures for both models") {
  bench_options o;
  o.model = "mlp";
  o.steps = 30;
  o.warmup = 1;
  o.batch = 16;
  o.hidden = {32};
  o.lr = 1e-2f;
  bench_result r = bench_train(o);
  CHECK(r.batch == 16);
  CHECK(r.tokens_per_step == 16);
  CHECK(r.steps == 30);
  CHECK(r.params == 784 * 32 + 32 + 32 * 10 + 10);
  CHECK(r.samples_per_s == doctest::Approx(16 * 30 / r.seconds));
  CHECK(r.tokens_per_s == 0.0);
  CHECK(r.last_loss < r.first_loss);  // the teacher labels are learnable
  CHECK(r.pool_peak_bytes >= static_cast<std::size_t>(4 * r.params * 4));  // p, g, m, v

  o.model = "gpt";
  o.steps = 2;
  o.batch = 2;
  o.vocab = 11;
  o.context = 8;
  o.n_layer = 1;
  o.n_head = 2;
  o.d_model = 16;
  r = bench_train(o);
  CHECK(r.tokens_per_step == 16);
  CHECK(r.tokens_per_s == doctest::Approx(16 * 2 / r.seconds));
  CHECK(std::isfinite(r.last_loss));
  CHECK(r.first_loss == doctest::Approx(std::log(11.0)).epsilon(0.1));  // near-uniform at init

  CHECK_FALSE(cohort::cpu::flush_denormals());  // the caller's mode is restored

  o.model = "cnn";
  CHECK_THROWS_AS(bench_train(o), cohort::usage_error);
}
