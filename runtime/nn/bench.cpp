#include "runtime/nn/bench.hpp"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <memory>

#include "runtime/core/batch.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/rng.hpp"
#include "runtime/cpu/kernels.hpp"
#include "runtime/nn/device.hpp"
#include "runtime/nn/gpt.hpp"
#include "runtime/nn/mlp.hpp"
#include "runtime/nn/optim.hpp"

namespace cohort::nn {

namespace {

// A few distinct batches, cycled, so the timed loop does no data work and still does not
// see the same batch every step.
constexpr int k_distinct_batches = 8;

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

// Inputs are pixel-like values in [0, 1); labels come from a fixed random linear "teacher"
// (argmax of T x), so the task is learnable like a real one without being memorised in a
// few steps the way random labels are.
std::vector<batch> synth_mlp(int n, int features, int classes, uint64_t seed) {
  std::vector<float> teacher(static_cast<std::size_t>(classes) * features);
  rng tr(hash_coords(seed, 0xB0, 0xFFFF));
  for (float& w : teacher) w = tr.normal();
  std::vector<batch> out(k_distinct_batches);
  for (int k = 0; k < k_distinct_batches; ++k) {
    rng r(hash_coords(seed, 0xB0, k));
    batch& b = out[k];
    b.n = n;
    b.features = features;
    b.x.resize(static_cast<std::size_t>(n) * features);
    for (float& v : b.x) v = r.uniform();
    b.targets.resize(n);
    for (int i = 0; i < n; ++i) {
      const float* x = b.x.data() + static_cast<std::size_t>(i) * features;
      int best = 0;
      double best_score = -1e300;
      for (int c = 0; c < classes; ++c) {
        double s = 0;
        for (int f = 0; f < features; ++f)
          s += teacher[static_cast<std::size_t>(c) * features + f] * (x[f] - 0.5f);
        if (s > best_score) {
          best_score = s;
          best = c;
        }
      }
      b.targets[i] = best;
    }
  }
  return out;
}

std::vector<batch> synth_gpt(int n, int t, int vocab, uint64_t seed) {
  std::vector<batch> out(k_distinct_batches);
  for (int k = 0; k < k_distinct_batches; ++k) {
    rng r(hash_coords(seed, 0xB1, k));
    batch& b = out[k];
    b.n = n;
    b.t = t;
    // A random stream of t+1 tokens per row; targets are the ids shifted by one.
    std::vector<int32_t> stream(static_cast<std::size_t>(t) + 1);
    for (int i = 0; i < n; ++i) {
      for (int32_t& s : stream) s = static_cast<int32_t>(r.below(vocab));
      b.ids.insert(b.ids.end(), stream.begin(), stream.end() - 1);
      b.targets.insert(b.targets.end(), stream.begin() + 1, stream.end());
    }
  }
  return out;
}

}  // namespace

namespace {

// Sets a device's matrix-product precision for a benchmark and gives the old one back after:
// the device's precision is the process's (the CPU's is one switch).
class precision_scope {
 public:
  precision_scope(device& d, const std::string& precision) : d_(d), was_(d.precision()) {
    d_.set_matmul_precision(parse_precision(precision));
  }
  ~precision_scope() { d_.set_matmul_precision(was_); }
  precision_scope(const precision_scope&) = delete;
  precision_scope& operator=(const precision_scope&) = delete;

 private:
  device& d_;
  matmul_precision was_;
};

}  // namespace

double peak_tflops(const std::string& name, const std::string& precision) {
  const bool bf16 = precision == "bf16";
  // Dense (no sparsity) tensor-core bf16 and plain (non-tensor) fp32 rates.
  if (name.find("H100") != std::string::npos || name.find("H200") != std::string::npos)
    return name.find("PCIe") != std::string::npos ? (bf16 ? 756 : 51) : (bf16 ? 989 : 67);
  if (name.find("A100") != std::string::npos) return bf16 ? 312 : 19.5;
  return 0;
}

bench_result bench_train(const bench_options& o) {
  if (o.steps < 1 || o.warmup < 0) throw usage_error("bench train: --steps must be >= 1");
  cpu::set_num_threads(o.threads);
  // The caller's thread gets its floating-point mode back whatever happens.
  struct restore_ftz {
    bool was = cpu::flush_denormals();
    ~restore_ftz() { cpu::set_flush_denormals(was); }
  } restore;
  cpu::set_flush_denormals(o.flush_denormals);
  device& dev = open_device(resolve_device(o.device, 0));
  const precision_scope prec(dev, o.precision);
  // A pool of its own on the device: its peak is the benchmark's whole tensor footprint.
  // Declared before the model and optimizer so it outlives them.
  pool mem(dev);
  bench_result res;
  res.device = dev.describe();
  res.precision = o.precision;
  res.model = o.model;
  res.steps = o.steps;
  res.threads = o.threads;
  std::unique_ptr<model> m;
  std::vector<batch> data;
  if (o.model == "mlp") {
    res.batch = o.batch > 0 ? o.batch : 128;
    res.tokens_per_step = res.batch;
    m = std::make_unique<mlp>(784, o.hidden, 10, res.batch, o.seed, mem);
    data = synth_mlp(res.batch, 784, 10, o.seed);
  } else if (o.model == "gpt") {
    res.batch = o.batch > 0 ? o.batch : 16;
    res.tokens_per_step = res.batch * o.context;
    m = std::make_unique<gpt>(o.vocab, o.context, o.n_layer, o.n_head, o.d_model, res.batch, o.seed,
                              mem);
    data = synth_gpt(res.batch, o.context, o.vocab, o.seed);
  } else {
    throw usage_error("bench train: unknown --model '" + o.model + "' (expected mlp or gpt)");
  }
  res.params = m->num_params();
  optim_options oo;
  oo.kind = "adamw";
  adamw opt(m->flat_values(), m->flat_grads(), oo, mem);

  using clock = std::chrono::steady_clock;
  auto train_step = [&](int i) {
    m->zero_grad();
    const float loss = m->forward_backward(data[i % k_distinct_batches], 1.0f);
    opt.step(o.lr);
    return loss;
  };
  for (int i = 0; i < o.warmup; ++i) train_step(i);
  dev.synchronize();
  double best = 1e300;
  const double c0 = process_cpu_seconds();
  const auto t0 = clock::now();
  for (int i = 0; i < o.steps; ++i) {
    const auto s0 = clock::now();
    const float loss = train_step(o.warmup + i);
    dev.synchronize();  // a step's time includes its optimizer kernels
    best = std::min(best, std::chrono::duration<double>(clock::now() - s0).count());
    if (i == 0) res.first_loss = loss;
    res.last_loss = loss;
  }
  res.seconds = std::chrono::duration<double>(clock::now() - t0).count();
  res.profile = dev.profile_report();
  res.pool_peak_bytes = mem.stats().peak_bytes;
  res.cpu_ms_per_step = 1e3 * (process_cpu_seconds() - c0) / o.steps;
  res.ms_per_step = 1e3 * res.seconds / o.steps;
  res.best_ms = 1e3 * best;
  res.samples_per_s = res.batch * o.steps / res.seconds;
  if (o.model == "gpt")
    res.tokens_per_s = static_cast<double>(res.tokens_per_step) * o.steps / res.seconds;
  if (o.model == "gpt") {
    const double n = static_cast<double>(res.params) - static_cast<double>(o.context) * o.d_model;
    res.flops_per_step = res.tokens_per_step * (6.0 * n + 12.0 * o.n_layer * o.d_model * o.context);
  } else {
    res.flops_per_step = 6.0 * static_cast<double>(res.params) * res.batch;
  }
  res.achieved_tflops = res.flops_per_step * o.steps / res.seconds / 1e12;
  res.peak_tflops = o.peak_tflops > 0 ? o.peak_tflops : peak_tflops(dev.describe(), o.precision);
  if (res.peak_tflops > 0) res.mfu = res.achieved_tflops / res.peak_tflops;
  return res;
}

double bench_cpu_product(int m, int n, int k, const std::string& precision, int reps) {
  device& dev = cpu_device();
  const precision_scope prec(dev, precision);
  std::vector<float> a(static_cast<std::size_t>(m) * k), b(static_cast<std::size_t>(n) * k),
      c(static_cast<std::size_t>(m) * n);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i % 17) * 0.01f;
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i % 13) * 0.01f;
  double best = 1e30;
  for (int r = 0; r < reps + 3; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    dev.gemm(false, true, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, c.data(), n);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r >= 3) best = std::min(best, s);
  }
  return 2.0 * m * n * k / best / 1e9;
}

}  // namespace cohort::nn
