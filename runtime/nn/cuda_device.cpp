// The CUDA device of runtime/nn/device.hpp: the CUDA twins of gpu/ behind the device
// interface, every failure turned into a cohort::error naming the op. Built only with CUDA.
#include "runtime/nn/device.hpp"

#if COHORT_HAVE_CUDA
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <new>
#include <vector>

#include "gpu/cuda_kernels.hpp"
#include "gpu/device.hpp"
#include "runtime/core/error.hpp"

namespace cohort::nn {

namespace {

class cuda_dev final : public device {
 public:
  explicit cuda_dev(int ordinal) : ordinal_(ordinal) {
    select();
    gpu::device_info info;
    if (gpu::device_info_of(ordinal, &info) != gpu::status::ok) fail("cudaGetDeviceProperties");
    info_ = info;
  }

  std::string name() const override { return "cuda:" + std::to_string(ordinal_); }
  std::string describe() const override {
    return name() + " (" + info_.name + ", sm_" + std::to_string(info_.cc_major) +
           std::to_string(info_.cc_minor) + ", " + std::to_string(info_.total_bytes >> 30) +
           " GiB, " + precision_name(precision_) + " matrix products)";
  }
  bool host_visible() const override { return false; }

  void* allocate_chunk(std::size_t bytes, std::size_t) override {
    select();
    void* p = nullptr;
    if (gpu::device_malloc(&p, bytes) != gpu::status::ok || p == nullptr) throw std::bad_alloc();
    return p;
  }
  void free_chunk(void* p) override {
    select();
    gpu::device_free(p);
  }
  void zero(void* p, std::size_t bytes) override {
    if (bytes == 0) return;
    select();
    const op_timer timed(*this, "zero");
    check(gpu::device_zero(p, bytes), "zero");
  }
  void copy(void* dst, const void* src, std::size_t bytes) override {
    if (bytes == 0) return;
    select();
    const op_timer timed(*this, "copy");
    check(gpu::device_copy(dst, src, bytes), "copy");
  }
  void to_host(void* host, const void* src, std::size_t bytes) override {
    if (bytes == 0) return;
    select();
    const op_timer timed(*this, "to_host");
    check(gpu::copy_to_host(host, src, bytes), "copy to host");
  }
  void from_host(void* dst, const void* host, std::size_t bytes) override {
    if (bytes == 0) return;
    select();
    const op_timer timed(*this, "from_host");
    check(gpu::copy_to_device(dst, host, bytes), "copy to device");
  }
  void synchronize() override {
    select();
    check(gpu::device_synchronize(), "synchronize");
  }
  void set_matmul_precision(matmul_precision p) override { precision_ = p; }
  matmul_precision precision() const override { return precision_; }
  std::string profile_report() const override {
    std::vector<std::pair<double, std::string>> rows;
    double total = 0;
    for (const auto& [op, t] : profiled_) {
      rows.emplace_back(t.first, op);
      total += t.first;
    }
    std::sort(rows.rbegin(), rows.rend());
    std::string out;
    char line[160];
    for (const auto& [sec, op] : rows) {
      std::snprintf(line, sizeof line, "  %-18s %10.1f ms %6.1f%% %8ld calls\n", op.c_str(),
                    sec * 1e3, total > 0 ? 100 * sec / total : 0.0, profiled_.at(op).second);
      out += line;
    }
    return out;
  }

  void gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
            const float* b, int ldb, float beta, float* c, int ldc) override {
    select();
    const op_timer timed(*this, "gemm");
    check(gpu::cuda::gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc), "gemm");
  }
  void linear_fwd(float* y, const float* x, const float* w, const float* b, int rows, int in,
                  int out) override {
    select();
    const op_timer timed(*this, "linear_fwd");
    check(gpu::cuda::linear_fwd(y, x, w, b, rows, in, out), "linear_fwd");
  }
  void bias_grad(float* db, const float* dy, int rows, int out) override {
    select();
    const op_timer timed(*this, "bias_grad");
    check(gpu::cuda::bias_grad(db, dy, rows, out), "bias_grad");
  }
  void embedding_fwd(float* out, const int32_t* ids, const float* wte, const float* wpe, int b,
                     int t, int c) override {
    select();
    const op_timer timed(*this, "embedding_fwd");
    check(gpu::cuda::embedding_fwd(out, ids, wte, wpe, b, t, c), "embedding_fwd");
  }
  void embedding_bwd(float* dwte, float* dwpe, const float* dout, const int32_t* ids, int b, int t,
                     int c) override {
    select();
    const op_timer timed(*this, "embedding_bwd");
    check(gpu::cuda::embedding_bwd(dwte, dwpe, dout, ids, b, t, c), "embedding_bwd");
  }
  void relu_fwd(float* y, const float* x, int64_t n) override {
    select();
    const op_timer timed(*this, "relu_fwd");
    check(gpu::cuda::relu_fwd(y, x, n), "relu_fwd");
  }
  void relu_bwd(float* dx, const float* dy, const float* x, int64_t n) override {
    select();
    const op_timer timed(*this, "relu_bwd");
    check(gpu::cuda::relu_bwd(dx, dy, x, n), "relu_bwd");
  }
  void gelu_fwd(float* y, const float* x, int64_t n) override {
    select();
    const op_timer timed(*this, "gelu_fwd");
    check(gpu::cuda::gelu_fwd(y, x, n), "gelu_fwd");
  }
  void gelu_bwd(float* dx, const float* dy, const float* x, int64_t n) override {
    select();
    const op_timer timed(*this, "gelu_bwd");
    check(gpu::cuda::gelu_bwd(dx, dy, x, n), "gelu_bwd");
  }
  void add_inplace(float* y, const float* x, int64_t n) override {
    select();
    const op_timer timed(*this, "add_inplace");
    check(gpu::cuda::add_inplace(y, x, n), "add_inplace");
  }
  void layernorm_fwd(float* y, float* mean, float* rstd, const float* x, const float* w,
                     const float* b, int rows, int c, float eps) override {
    select();
    const op_timer timed(*this, "layernorm_fwd");
    check(gpu::cuda::layernorm_fwd(y, mean, rstd, x, w, b, rows, c, eps), "layernorm_fwd");
  }
  void layernorm_bwd(float* dx, float* dw, float* db, const float* dy, const float* x,
                     const float* w, const float* mean, const float* rstd, int rows,
                     int c) override {
    select();
    const op_timer timed(*this, "layernorm_bwd");
    check(gpu::cuda::layernorm_bwd(dx, dw, db, dy, x, w, mean, rstd, rows, c), "layernorm_bwd");
  }
  void attention_fwd(float* out, float* att, const float* qkv, int b, int t, int c,
                     int nh) override {
    select();
    const op_timer timed(*this, "attention_fwd");
    check(gpu::cuda::attention_fwd(out, att, qkv, b, t, c, nh), "attention_fwd");
  }
  void attention_bwd(float* dqkv, float* scratch, const float* dout, const float* qkv,
                     const float* att, int b, int t, int c, int nh) override {
    select();
    const op_timer timed(*this, "attention_bwd");
    check(gpu::cuda::attention_bwd(dqkv, scratch, dout, qkv, att, b, t, c, nh), "attention_bwd");
  }
  float softmax_xent_fwd(float* probs, float* losses, const float* logits, const int32_t* targets,
                         int n, int v) override {
    select();
    const op_timer timed(*this, "softmax_xent_fwd");
    const float loss = gpu::cuda::softmax_xent_fwd(probs, losses, logits, targets, n, v);
    check(gpu::cuda::last_status(), "softmax_xent_fwd");
    return loss;
  }
  void softmax_xent_bwd(float* dlogits, const float* probs, const int32_t* targets, int n, int v,
                        float scale) override {
    select();
    const op_timer timed(*this, "softmax_xent_bwd");
    check(gpu::cuda::softmax_xent_bwd(dlogits, probs, targets, n, v, scale), "softmax_xent_bwd");
  }
  void adamw_step(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int t) override {
    select();
    const op_timer timed(*this, "adamw_step");
    check(gpu::cuda::adamw_step(p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, t),
          "adamw_step");
  }
  void onebit_adam_frozen_step(float* p, const float* momentum, float* m, const float* v, int64_t n,
                               float lr, float beta1, float beta2, float eps, float weight_decay,
                               int t, int frozen_t) override {
    select();
    const op_timer timed(*this, "onebit_adam_frozen_step");
    check(gpu::cuda::onebit_adam_frozen_step(p, momentum, m, v, n, lr, beta1, beta2, eps,
                                             weight_decay, t, frozen_t),
          "onebit_adam_frozen_step");
  }
  void onebit_momentum_share(float* g, const float* m, int64_t n, float a, float b) override {
    select();
    const op_timer timed(*this, "onebit_momentum_share");
    check(gpu::cuda::onebit_momentum_share(g, m, n, a, b), "onebit_momentum_share");
  }
  void onebit_scale_by_denominator(float* g, const float* v, int64_t n, float sqrt_bc2, float eps,
                                   bool divide) override {
    select();
    const op_timer timed(*this, "onebit_scale_by_denominator");
    check(gpu::cuda::onebit_scale_by_denominator(g, v, n, sqrt_bc2, eps, divide),
          "onebit_scale_by_denominator");
  }
  void sgd_step(float* p, const float* g, float* buf, int64_t n, float lr, float momentum,
                float weight_decay) override {
    select();
    const op_timer timed(*this, "sgd_step");
    check(gpu::cuda::sgd_step(p, g, buf, n, lr, momentum, weight_decay), "sgd_step");
  }
  double sum_squares(const float* x, int64_t n) override {
    select();
    const op_timer timed(*this, "sum_squares");
    const double s = gpu::cuda::sum_squares(x, n);
    check(gpu::cuda::last_status(), "sum_squares");
    return s;
  }
  std::vector<double> sum_squares_each(
      const std::vector<std::pair<const float*, int64_t>>& spans) override {
    select();
    std::vector<double> out(spans.size());
    if (spans.empty()) return out;
    if (sums_capacity_ < spans.size()) {
      if (sums_ != nullptr) gpu::device_free(sums_);
      sums_ = nullptr;
      void* p = nullptr;
      check(gpu::device_malloc(&p, spans.size() * sizeof(double)), "sum_squares_each");
      sums_ = static_cast<double*>(p);
      sums_capacity_ = spans.size();
    }
    for (std::size_t i = 0; i < spans.size(); ++i)
      check(gpu::cuda::sum_squares_async(spans[i].first, spans[i].second, sums_ + i),
            "sum_squares_async");
    check(gpu::copy_to_host(out.data(), sums_, out.size() * sizeof(double)), "sum_squares_each");
    return out;
  }
  void scale(float* x, float s, int64_t n) override {
    select();
    const op_timer timed(*this, "scale");
    check(gpu::cuda::scale(x, s, n), "scale");
  }

 private:
  // The CUDA device and the matrix precision are per thread; the device is used by one
  // thread at a time, but which thread may change (actor threads), so every op makes sure.
  void select() {
    thread_local int current = -1;
    thread_local matmul_precision set_precision = matmul_precision::fp32;
    if (current != ordinal_) {
      if (gpu::set_device(ordinal_) != gpu::status::ok) fail("cudaSetDevice");
      current = ordinal_;
    }
    if (set_precision != precision_) {
      gpu::cuda::set_matmul_precision(precision_ == matmul_precision::bf16
                                          ? gpu::cuda::matmul_precision::bf16
                                          : gpu::cuda::matmul_precision::fp32);
      set_precision = precision_;
    }
  }
  // COHORT_DEVICE_PROFILE=1: wall time of each op between two waits for the device.
  struct op_timer {
    cuda_dev& d;
    const char* op;
    std::chrono::steady_clock::time_point t0;
    op_timer(cuda_dev& dev, const char* name) : d(dev), op(name) {
      if (!d.profile_) return;
      gpu::device_synchronize();
      t0 = std::chrono::steady_clock::now();
    }
    ~op_timer() {
      if (!d.profile_) return;
      gpu::device_synchronize();
      auto& slot = d.profiled_[op];
      slot.first += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      ++slot.second;
    }
  };

  void check(gpu::status s, const char* op) {
    if (s != gpu::status::ok) fail(op);
  }
  [[noreturn]] void fail(const char* op) {
    throw cohort::error(name() + ": " + op + " failed: " + gpu::last_error_message());
  }

  int ordinal_;
  gpu::device_info info_;
  const bool profile_ = [] {
    const char* v = std::getenv("COHORT_DEVICE_PROFILE");
    return v != nullptr && std::string(v) == "1";
  }();
  std::map<std::string, std::pair<double, long>> profiled_;  // op -> seconds, calls
  double* sums_ = nullptr;  // sum_squares_each's results on the device
  std::size_t sums_capacity_ = 0;
  matmul_precision precision_ = matmul_precision::fp32;
};

}  // namespace

std::unique_ptr<device> make_cuda_device(int ordinal) {
  return std::make_unique<cuda_dev>(ordinal);
}

}  // namespace cohort::nn
#endif
