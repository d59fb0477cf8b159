#include "runtime/nn/device.hpp"

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>

#include "gpu/device.hpp"
#include "runtime/core/cpu_bind.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/rules.hpp"
#include "runtime/cpu/kernels.hpp"

namespace cohort::nn {

const char* precision_name(matmul_precision p) {
  return p == matmul_precision::bf16 ? "bf16" : "fp32";
}

matmul_precision parse_precision(const std::string& s) {
  if (s == "fp32") return matmul_precision::fp32;
  if (s == "bf16") return matmul_precision::bf16;
  throw usage_error("train.precision '" + s + "' is not one of: fp32, bf16");
}

namespace {

// The CPU twins of runtime/cpu, one call each: the device interface adds a virtual call per
// kernel and nothing else, so the CPU path's bits are what they were before it existed.
class cpu_dev final : public device {
 public:
  std::string name() const override { return "cpu"; }
  std::string describe() const override {
    std::string prec = "fp32";
    if (cpu::matmul_bf16())
      prec = cpu::fast_bf16()
                 ? std::string("bf16 on oneDNN, ") + cpu::bf16_isa_name(cpu::cpu_bf16_isa())
                 : std::string("bf16 PORTABLE (slow: ") +
                       (cpu::cpu_bf16_isa() == cpu::bf16_isa::none
                            ? "this CPU has neither avx512_bf16 nor amx_bf16"
                            : "forced by COHORT_CPU_BF16=portable") +
                       ")";
    return std::string("cpu (") + (cpu::simd_kernels() ? "AVX2/FMA" : "portable") + " kernels, " +
           std::to_string(cpu::num_threads()) + " OpenBLAS " + cpu::blas_core() + " thread(s), " +
           prec + ")";
  }
  bool host_visible() const override { return true; }

  void* allocate_chunk(std::size_t bytes, std::size_t alignment) override {
    void* p = std::aligned_alloc(alignment, (bytes + alignment - 1) / alignment * alignment);
    if (!p) throw std::bad_alloc();
    return p;
  }
  void free_chunk(void* p) override { std::free(p); }
  void zero(void* p, std::size_t bytes) override {
    if (bytes) std::memset(p, 0, bytes);
  }
  void copy(void* dst, const void* src, std::size_t bytes) override {
    if (bytes) std::memmove(dst, src, bytes);
  }
  void to_host(void* host, const void* src, std::size_t bytes) override { copy(host, src, bytes); }
  void from_host(void* dst, const void* host, std::size_t bytes) override {
    copy(dst, host, bytes);
  }
  void synchronize() override {}
  void set_matmul_precision(matmul_precision p) override {
    cpu::set_matmul_bf16(p == matmul_precision::bf16);
  }
  matmul_precision precision() const override {
    return cpu::matmul_bf16() ? matmul_precision::bf16 : matmul_precision::fp32;
  }

  void gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
            const float* b, int ldb, float beta, float* c, int ldc) override {
    cpu::gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
  void linear_fwd(float* y, const float* x, const float* w, const float* b, int rows, int in,
                  int out) override {
    cpu::linear_fwd(y, x, w, b, rows, in, out);
  }
  void linear_dx(float* dx, const float* dy, const float* w, int rows, int in, int out) override {
    cpu::linear_dx(dx, dy, w, rows, in, out);
  }
  void bias_grad(float* db, const float* dy, int rows, int out) override {
    cpu::bias_grad(db, dy, rows, out);
  }
  void embedding_fwd(float* out, const int32_t* ids, const float* wte, const float* wpe, int b,
                     int t, int c) override {
    cpu::embedding_fwd(out, ids, wte, wpe, b, t, c);
  }
  void embedding_bwd(float* dwte, float* dwpe, const float* dout, const int32_t* ids, int b, int t,
                     int c) override {
    cpu::embedding_bwd(dwte, dwpe, dout, ids, b, t, c);
  }
  void relu_fwd(float* y, const float* x, int64_t n) override { cpu::relu_fwd(y, x, n); }
  void relu_bwd(float* dx, const float* dy, const float* x, int64_t n) override {
    cpu::relu_bwd(dx, dy, x, n);
  }
  void gelu_fwd(float* y, const float* x, int64_t n) override { cpu::gelu_fwd(y, x, n); }
  void gelu_bwd(float* dx, const float* dy, const float* x, int64_t n) override {
    cpu::gelu_bwd(dx, dy, x, n);
  }
  void add_inplace(float* y, const float* x, int64_t n) override { cpu::add_inplace(y, x, n); }
  void layernorm_fwd(float* y, float* mean, float* rstd, const float* x, const float* w,
                     const float* b, int rows, int c, float eps) override {
    cpu::layernorm_fwd(y, mean, rstd, x, w, b, rows, c, eps);
  }
  void layernorm_bwd(float* dx, float* dw, float* db, const float* dy, const float* x,
                     const float* w, const float* mean, const float* rstd, int rows,
                     int c) override {
    cpu::layernorm_bwd(dx, dw, db, dy, x, w, mean, rstd, rows, c);
  }
  void attention_fwd(float* out, float* att, const float* qkv, int b, int t, int c,
                     int nh) override {
    cpu::attention_fwd(out, att, qkv, b, t, c, nh);
  }
  void attention_bwd(float* dqkv, float* scratch, const float* dout, const float* qkv,
                     const float* att, int b, int t, int c, int nh) override {
    cpu::attention_bwd(dqkv, scratch, dout, qkv, att, b, t, c, nh);
  }
  float softmax_xent_fwd(float* probs, float* losses, const float* logits, const int32_t* targets,
                         int n, int v) override {
    return cpu::softmax_xent_fwd(probs, losses, logits, targets, n, v);
  }
  void softmax_xent_bwd(float* dlogits, const float* probs, const int32_t* targets, int n, int v,
                        float scale) override {
    cpu::softmax_xent_bwd(dlogits, probs, targets, n, v, scale);
  }
  void adamw_step(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int t) override {
    cpu::adamw_step(p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, t);
  }
  void onebit_adam_frozen_step(float* p, const float* momentum, float* m, const float* v, int64_t n,
                               float lr, float beta1, float beta2, float eps, float weight_decay,
                               int t, int frozen_t) override {
    cpu::onebit_adam_frozen_step(p, momentum, m, v, n, lr, beta1, beta2, eps, weight_decay, t,
                                 frozen_t);
  }
  void onebit_momentum_share(float* g, const float* m, int64_t n, float a, float b) override {
    cpu::onebit_momentum_share(g, m, n, a, b);
  }
  void onebit_scale_by_denominator(float* g, const float* v, int64_t n, float sqrt_bc2, float eps,
                                   bool divide) override {
    cpu::onebit_scale_by_denominator(g, v, n, sqrt_bc2, eps, divide);
  }
  void sgd_step(float* p, const float* g, float* buf, int64_t n, float lr, float momentum,
                float weight_decay) override {
    cpu::sgd_step(p, g, buf, n, lr, momentum, weight_decay);
  }
  double sum_squares(const float* x, int64_t n) override { return cpu::sum_squares(x, n); }
  void scale(float* x, float s, int64_t n) override { cpu::scale(x, s, n); }
};

}  // namespace

device& cpu_device() {
  static cpu_dev* d = new cpu_dev();  // never destroyed: static tensors may outlive statics
  return *d;
}

bool valid_device_spec(const std::string& spec) { return rules::device_spec_valid(spec); }

int cuda_device_count() { return gpu::device_count(); }

int local_rank_from_env() {
  return proc::int_from_env({"COHORT_LOCAL_RANK", "SLURM_LOCALID", "LOCAL_RANK"}, 0,
                            (1 << 20) - 1, 0);
}

device_choice resolve_device(const std::string& spec, int local_rank) {
  if (!valid_device_spec(spec))
    throw usage_error("train.device '" + spec +
                      "' is not one of: cpu, cuda, cuda:N (N a device number), auto");
  device_choice c;
  if (spec == "cpu") return c;
  const int n = cuda_device_count();
  if (spec == "auto") {
    if (n == 0) return c;
    c.cuda = true;
    c.ordinal = (local_rank < 0 ? 0 : local_rank) % n;
    return c;
  }
  if (n == 0)
    throw cohort::error("train.device: " + spec + " asks for a GPU, but this process sees none (" +
                        (COHORT_HAVE_CUDA ? std::string(gpu::last_error_message())
                                          : std::string("this build has no CUDA")) +
                        "); use train.device: cpu or auto, or run on a machine with a GPU");
  c.cuda = true;
  if (spec == "cuda") {
    c.ordinal = (local_rank < 0 ? 0 : local_rank) % n;
  } else {
    c.ordinal = std::stoi(spec.substr(5));
    if (c.ordinal >= n)
      throw cohort::error("train.device: " + spec + " does not exist: this process sees " +
                          std::to_string(n) + " GPU(s), cuda:0 .. cuda:" + std::to_string(n - 1));
  }
  return c;
}

// Defined in cuda_device.cpp in a CUDA build; else below.
std::unique_ptr<device> make_cuda_device(int ordinal);

#if !COHORT_HAVE_CUDA
std::unique_ptr<device> make_cuda_device(int ordinal) {
  throw cohort::error("cuda:" + std::to_string(ordinal) +
                      ": this build of cohort has no CUDA (configure with nvcc present)");
}
#endif

device& open_device(const device_choice& choice) {
  if (!choice.cuda) return cpu_device();
  static std::mutex mu;
  static auto* opened = new std::map<int, std::unique_ptr<device>>();  // never destroyed
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = (*opened)[choice.ordinal];
  if (!slot) slot = make_cuda_device(choice.ordinal);
  return *slot;
}

}  // namespace cohort::nn
