// The device a model computes on: its memory and its kernels behind one interface, so that
// the model, its layers, the optimizers and the gradient path are ONE code path on every
// device (the CPU twins of runtime/cpu, the CUDA twins of gpu/). Owns the choice of device
// (train.device) and the copies between host and device memory; does not own tensors
// (tensor.hpp), pools (pool.hpp), streams of collectives or configs.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace cohort::nn {

/// The precision of matrix products (train.precision). Master weights, optimizer state,
/// norms, softmax and the loss are fp32 in both.
enum class matmul_precision {
  fp32,  ///< fp32 products (no TF32 on a GPU)
  bf16,  ///< bf16 inputs, fp32 accumulation (tensor cores on a GPU)
};

/// "fp32" / "bf16".
const char* precision_name(matmul_precision p);
/// Parses train.precision; throws usage_error naming the accepted values otherwise.
matmul_precision parse_precision(const std::string& s);

/// One compute device. Kernels have the contract of runtime/cpu/kernels.hpp (same names, same
/// parameter lists, pointers into THIS device's memory); a failure throws cohort::error naming
/// the op. Work may run asynchronously on the device: results are visible to the host after
/// to_host(), synchronize() or a value-returning op. A device is used by one thread at a time
/// (the worker's compute thread), like a CUDA stream.
class device {
 public:
  virtual ~device() = default;

  /// "cpu" or "cuda:N".
  virtual std::string name() const = 0;
  /// A line for the run's header: the model, the memory, the precision in use.
  virtual std::string describe() const = 0;
  /// True when the host reads and writes this device's memory directly (the CPU).
  virtual bool host_visible() const = 0;
  /// Whether a linear layer's weight gradient is computed in row chunks, each reported ready
  /// at once (the CPU: buckets fill while backward runs), or as one product (a GPU).
  virtual bool chunked_weight_grads() const { return host_visible(); }

  // ---- memory ----
  /// `bytes` of device memory aligned to ALIGNMENT (a power of two; a GPU gives at least 256
  /// bytes whatever is asked); throws std::bad_alloc.
  virtual void* allocate_chunk(std::size_t bytes, std::size_t alignment) = 0;
  virtual void free_chunk(void* p) = 0;
  virtual void zero(void* p, std::size_t bytes) = 0;
  /// Device to device.
  virtual void copy(void* dst, const void* src, std::size_t bytes) = 0;
  /// Device to host; the host buffer holds the bytes when the call returns.
  virtual void to_host(void* host, const void* src, std::size_t bytes) = 0;
  /// Host to device; the host buffer may be reused when the call returns.
  virtual void from_host(void* dst, const void* host, std::size_t bytes) = 0;
  /// Waits for the work queued so far.
  virtual void synchronize() = 0;

  /// With COHORT_DEVICE_PROFILE=1 in the environment a GPU times each kernel call (waiting
  /// before and after it, so the step runs slower): one line per op, busiest first; "" when
  /// not profiling or nothing ran.
  virtual std::string profile_report() const { return ""; }

  /// The precision of matrix products from now on. Throws usage_error where the device has
  /// no such path.
  virtual void set_matmul_precision(matmul_precision p) = 0;
  virtual matmul_precision precision() const = 0;

  // ---- kernels (runtime/cpu/kernels.hpp) ----
  virtual void gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
                    const float* b, int ldb, float beta, float* c, int ldc) = 0;
  virtual void linear_fwd(float* y, const float* x, const float* w, const float* b, int rows,
                          int in, int out) = 0;
  /// dx[rows, in] = dy[rows, out] W (assigned), after linear_fwd with this W (runtime/cpu/
  /// kernels.hpp, linear_dx: in bf16 the CPU reuses the rounded W that forward made).
  virtual void linear_dx(float* dx, const float* dy, const float* w, int rows, int in, int out) {
    gemm(false, false, rows, in, out, 1.0f, dy, out, w, in, 0.0f, dx, in);
  }
  /// db[j] += sum over rows, in ascending row order, of dy[r, j].
  virtual void bias_grad(float* db, const float* dy, int rows, int out) = 0;
  virtual void embedding_fwd(float* out, const int32_t* ids, const float* wte, const float* wpe,
                             int b, int t, int c) = 0;
  virtual void embedding_bwd(float* dwte, float* dwpe, const float* dout, const int32_t* ids, int b,
                             int t, int c) = 0;
  virtual void relu_fwd(float* y, const float* x, int64_t n) = 0;
  virtual void relu_bwd(float* dx, const float* dy, const float* x, int64_t n) = 0;
  virtual void gelu_fwd(float* y, const float* x, int64_t n) = 0;
  virtual void gelu_bwd(float* dx, const float* dy, const float* x, int64_t n) = 0;
  virtual void add_inplace(float* y, const float* x, int64_t n) = 0;
  virtual void layernorm_fwd(float* y, float* mean, float* rstd, const float* x, const float* w,
                             const float* b, int rows, int c, float eps) = 0;
  virtual void layernorm_bwd(float* dx, float* dw, float* db, const float* dy, const float* x,
                             const float* w, const float* mean, const float* rstd, int rows,
                             int c) = 0;
  virtual void attention_fwd(float* out, float* att, const float* qkv, int b, int t, int c,
                             int nh) = 0;
  virtual void attention_bwd(float* dqkv, float* scratch, const float* dout, const float* qkv,
                             const float* att, int b, int t, int c, int nh) = 0;
  virtual float softmax_xent_fwd(float* probs, float* losses, const float* logits,
                                 const int32_t* targets, int n, int v) = 0;
  virtual void softmax_xent_bwd(float* dlogits, const float* probs, const int32_t* targets, int n,
                                int v, float scale) = 0;
  virtual void adamw_step(float* p, const float* g, float* m, float* v, int64_t n, float lr,
                          float beta1, float beta2, float eps, float weight_decay, int t) = 0;
  /// 1-bit Adam's frozen step (runtime/cpu/kernels.hpp); the CPU only.
  virtual void onebit_adam_frozen_step(float* p, const float* momentum, float* m, const float* v,
                                       int64_t n, float lr, float beta1, float beta2, float eps,
                                       float weight_decay, int t, int frozen_t) = 0;
  /// 1-bit Adam's gradient path after the freeze (cpu::onebit_momentum_share,
  /// cpu::onebit_scale_by_denominator).
  virtual void onebit_momentum_share(float* g, const float* m, int64_t n, float a, float b) = 0;
  virtual void onebit_scale_by_denominator(float* g, const float* v, int64_t n, float sqrt_bc2,
                                           float eps, bool divide) = 0;
  virtual void sgd_step(float* p, const float* g, float* buf, int64_t n, float lr, float momentum,
                        float weight_decay) = 0;
  /// Sum of squares, double accumulation (synchronises).
  virtual double sum_squares(const float* x, int64_t n) = 0;
  /// sum_squares of each span, the same bits, with one wait for all of them (a GPU queues
  /// every reduction and reads the results back once).
  virtual std::vector<double> sum_squares_each(
      const std::vector<std::pair<const float*, int64_t>>& spans) {
    std::vector<double> out;
    out.reserve(spans.size());
    for (const auto& [x, n] : spans) out.push_back(sum_squares(x, n));
    return out;
  }
  virtual void scale(float* x, float s, int64_t n) = 0;
};

/// The process's CPU device (never destroyed).
device& cpu_device();

/// What train.device names, resolved for a worker: "cpu", "cuda" (device local_rank mod the
/// devices present), "cuda:N", or "auto" (cuda by local rank when a GPU is present, else cpu).
struct device_choice {
  bool cuda = false;
  int ordinal = 0;
  std::string name() const { return cuda ? "cuda:" + std::to_string(ordinal) : "cpu"; }
};
/// Parses and resolves SPEC (train.device) for LOCAL_RANK. Throws usage_error for a malformed
/// spec (exit 2) and cohort::error when a CUDA device is asked for and none is present or the
/// build has no CUDA (exit 1), naming the device and how to fix it.
device_choice resolve_device(const std::string& spec, int local_rank);
/// The worker's rank among the workers of its host, from the environment its launcher set:
/// COHORT_LOCAL_RANK (cohort launch), SLURM_LOCALID, LOCAL_RANK (torchrun's); 0 when none.
int local_rank_from_env();
/// Syntax check only (config time): "cpu", "auto", "cuda", "cuda:N" with N >= 0.
bool valid_device_spec(const std::string& spec);
/// The device CHOICE names, opened once per process (CUDA devices are never closed: the CUDA
/// context outlives every tensor). Throws cohort::error when it cannot be opened.
device& open_device(const device_choice& choice);
/// The CUDA devices this process sees (0 without CUDA or a driver).
int cuda_device_count();

}  // namespace cohort::nn
