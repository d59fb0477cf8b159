// The training-throughput benchmark behind `cohort bench train`: full train steps
// (zero_grad, forward, backward, AdamW) of the MLP or the GPT on synthetic data drawn
// from a fixed seed, timed after warm-up. Owns data synthesis and timing; the CLI wrapper
// (tools/cmd_bench_train.cpp) owns parsing and printing.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace cohort::nn {

struct bench_options {
  std::string model = "mlp";  ///< mlp | gpt
  int steps = 50;             ///< timed steps
  int warmup = 5;             ///< untimed steps first
  int batch = 0;              ///< rows per step; 0: 128 (mlp) or 16 sequences (gpt)
  int threads = 1;            ///< OpenBLAS threads
  uint64_t seed = 1;
  bool flush_denormals = true;  ///< FTZ/DAZ on the benchmark thread (see cpu::set_flush_denormals)
  float lr = 1e-3f;
  std::vector<int> hidden{256, 128};                                      ///< mlp
  int vocab = 80, context = 128, n_layer = 4, n_head = 4, d_model = 128;  ///< gpt
};

struct bench_result {
  std::string model;
  int batch = 0;            ///< samples (mlp) or sequences (gpt) per step
  int tokens_per_step = 0;  ///< batch * context for gpt, batch for mlp
  int steps = 0;
  int threads = 1;
  int64_t params = 0;
  double seconds = 0;      ///< wall time of the timed steps
  double ms_per_step = 0;  ///< mean
  double best_ms = 0;      ///< fastest single step
  /// Process CPU time per step: on a shared, loaded machine this tracks the work done
  /// better than wall time (with one thread it is the compute thread's time).
  double cpu_ms_per_step = 0;
  double samples_per_s = 0;
  double tokens_per_s = 0;  ///< gpt only (0 for mlp)
  float first_loss = 0, last_loss = 0;
  std::size_t pool_peak_bytes = 0;  ///< tensors of model, activations and optimizer
};

/// Runs the benchmark; throws usage_error for a bad model name or size.
bench_result bench_train(const bench_options& o);

}  // namespace cohort::nn
