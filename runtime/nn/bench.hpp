// The training-throughput benchmark behind `cohort bench train`: full train steps
// (zero_grad, forward, backward, AdamW) of the MLP or the GPT on synthetic data drawn
// from a fixed seed, on the CPU or a GPU, timed after warm-up, with the GPT's model FLOP
// utilisation against the device's peak. Owns data synthesis, timing and the FLOP count;
// the CLI wrapper (tools/cmd_bench_train.cpp) owns parsing and printing.
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
  std::string device = "cpu";      ///< cpu | cuda | cuda:N | auto (train.device)
  std::string precision = "fp32";  ///< fp32 | bf16 (train.precision)
  /// The device's peak in TFLOP/s for the precision in use; 0: the table's figure for a
  /// known GPU (peak_tflops), else no utilisation is reported.
  double peak_tflops = 0;
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
  std::string device;               ///< what the steps ran on (device::describe)
  std::string precision;
  /// Model FLOPs per step (gpt: PaLM's 6 N + 12 L C T per token, N without wpe; mlp: 6 N
  /// per sample), what they make a second, and that against peak_tflops (0 when unknown).
  double flops_per_step = 0, achieved_tflops = 0, peak_tflops = 0, mfu = 0;
  /// The device's per-op times (device::profile_report), when COHORT_DEVICE_PROFILE=1.
  std::string profile;
};

/// The dense peak (TFLOP/s) of a GPU called NAME for PRECISION from NVIDIA's datasheets
/// (H100 / H200 SXM: 989 bf16, 67 fp32; A100: 312 bf16, 19.5 fp32), 0 when not in the table.
double peak_tflops(const std::string& name, const std::string& precision);

/// Runs the benchmark; throws usage_error for a bad model name or size.
bench_result bench_train(const bench_options& o);

/// One matrix product C[m,n] = A[m,k] B[n,k]^T on the CPU in PRECISION (fp32 | bf16, as the
/// step runs it: bf16 includes rounding both operands), best of REPS calls: GFLOP/s.
double bench_cpu_product(int m, int n, int k, const std::string& precision, int reps = 20);

}  // namespace cohort::nn
