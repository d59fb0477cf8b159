// A stand-in GPU for tests on machines without one: the CPU twins behind the device interface,
// over memory whose addresses the host cannot use. Every pointer it hands out is the real one
// plus 2^47, a non-canonical x86-64 address, so the host dereferencing "device" memory faults at
// once (SIGSEGV) instead of silently working as it would on the CPU device; its kernels and
// copies take the shift off before calling runtime/cpu. Results are the CPU's bits, so a run on it
// must equal a run on the CPU exactly: what differs is only who may touch the memory.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "runtime/cpu/kernels.hpp"
#include "runtime/nn/device.hpp"

namespace cohort::test {

class shifted_device final : public nn::device {
 public:
  static constexpr std::uintptr_t shift = std::uintptr_t{1} << 47;

  std::string name() const override { return "shifted"; }
  std::string describe() const override { return "shifted (a stand-in GPU: CPU kernels)"; }
  bool host_visible() const override { return false; }
  /// The CPU's row chunks by default, so that results are the CPU's bits whatever OpenBLAS
  /// does with a thinner product; false takes a GPU's whole-matrix products.
  bool chunked = true;
  bool chunked_weight_grads() const override { return chunked; }

  void* allocate_chunk(std::size_t bytes, std::size_t alignment) override {
    void* p = std::aligned_alloc(alignment, (bytes + alignment - 1) / alignment * alignment);
    if (!p) throw std::bad_alloc();
    ++chunks;
    return out(p);
  }
  void free_chunk(void* p) override { std::free(in(p)); }
  void zero(void* p, std::size_t bytes) override {
    if (bytes) std::memset(in(p), 0, bytes);
  }
  void copy(void* dst, const void* src, std::size_t bytes) override {
    if (bytes) std::memmove(in(dst), in(src), bytes);
  }
  void to_host(void* host, const void* src, std::size_t bytes) override {
    if (bytes) std::memcpy(host, in(src), bytes);
    to_host_bytes += bytes;
  }
  void from_host(void* dst, const void* host, std::size_t bytes) override {
    if (bytes) std::memcpy(in(dst), host, bytes);
    from_host_bytes += bytes;
  }
  void synchronize() override { ++syncs; }
  void set_matmul_precision(nn::matmul_precision p) override { precision_ = p; }
  nn::matmul_precision precision() const override { return precision_; }

  void gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
            const float* b, int ldb, float beta, float* c, int ldc) override {
    cpu::gemm(ta, tb, m, n, k, alpha, in(a), lda, in(b), ldb, beta, in(c), ldc);
  }
  void linear_fwd(float* y, const float* x, const float* w, const float* b, int rows, int i,
                  int o) override {
    cpu::linear_fwd(in(y), in(x), in(w), b ? in(b) : nullptr, rows, i, o);
  }
  void bias_grad(float* db, const float* dy, int rows, int o) override {
    nn::cpu_device().bias_grad(in(db), in(dy), rows, o);
  }
  void embedding_fwd(float* o, const int32_t* ids, const float* wte, const float* wpe, int b, int t,
                     int c) override {
    cpu::embedding_fwd(in(o), in(ids), in(wte), wpe ? in(wpe) : nullptr, b, t, c);
  }
  void embedding_bwd(float* dwte, float* dwpe, const float* dout, const int32_t* ids, int b, int t,
                     int c) override {
    cpu::embedding_bwd(in(dwte), dwpe ? in(dwpe) : nullptr, in(dout), in(ids), b, t, c);
  }
  void relu_fwd(float* y, const float* x, int64_t n) override { cpu::relu_fwd(in(y), in(x), n); }
  void relu_bwd(float* dx, const float* dy, const float* x, int64_t n) override {
    cpu::relu_bwd(in(dx), in(dy), in(x), n);
  }
  void gelu_fwd(float* y, const float* x, int64_t n) override { cpu::gelu_fwd(in(y), in(x), n); }
  void gelu_bwd(float* dx, const float* dy, const float* x, int64_t n) override {
    cpu::gelu_bwd(in(dx), in(dy), in(x), n);
  }
  void add_inplace(float* y, const float* x, int64_t n) override {
    cpu::add_inplace(in(y), in(x), n);
  }
  void layernorm_fwd(float* y, float* mean, float* rstd, const float* x, const float* w,
                     const float* b, int rows, int c, float eps) override {
    cpu::layernorm_fwd(in(y), in(mean), in(rstd), in(x), in(w), in(b), rows, c, eps);
  }
  void layernorm_bwd(float* dx, float* dw, float* db, const float* dy, const float* x,
                     const float* w, const float* mean, const float* rstd, int rows,
                     int c) override {
    cpu::layernorm_bwd(in(dx), in(dw), in(db), in(dy), in(x), in(w), in(mean), in(rstd), rows, c);
  }
  void attention_fwd(float* o, float* att, const float* qkv, int b, int t, int c, int nh) override {
    cpu::attention_fwd(in(o), in(att), in(qkv), b, t, c, nh);
  }
  void attention_bwd(float* dqkv, float* scratch, const float* dout, const float* qkv,
                     const float* att, int b, int t, int c, int nh) override {
    cpu::attention_bwd(in(dqkv), in(scratch), in(dout), in(qkv), in(att), b, t, c, nh);
  }
  float softmax_xent_fwd(float* probs, float* losses, const float* logits, const int32_t* targets,
                         int n, int v) override {
    return cpu::softmax_xent_fwd(in(probs), in(losses), in(logits), in(targets), n, v);
  }
  void softmax_xent_bwd(float* dlogits, const float* probs, const int32_t* targets, int n, int v,
                        float scale) override {
    cpu::softmax_xent_bwd(in(dlogits), in(probs), in(targets), n, v, scale);
  }
  void adamw_step(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int t) override {
    cpu::adamw_step(in(p), in(g), in(m), in(v), n, lr, beta1, beta2, eps, weight_decay, t);
  }
  void onebit_adam_frozen_step(float* p, const float* momentum, float* m, const float* v, int64_t n,
                               float lr, float beta1, float beta2, float eps, float weight_decay,
                               int t, int frozen_t) override {
    cpu::onebit_adam_frozen_step(in(p), in(momentum), in(m), in(v), n, lr, beta1, beta2, eps,
                                 weight_decay, t, frozen_t);
  }
  void onebit_momentum_share(float* g, const float* m, int64_t n, float a, float b) override {
    cpu::onebit_momentum_share(in(g), in(m), n, a, b);
  }
  void onebit_scale_by_denominator(float* g, const float* v, int64_t n, float sqrt_bc2, float eps,
                                   bool divide) override {
    cpu::onebit_scale_by_denominator(in(g), in(v), n, sqrt_bc2, eps, divide);
  }
  void sgd_step(float* p, const float* g, float* buf, int64_t n, float lr, float momentum,
                float weight_decay) override {
    cpu::sgd_step(in(p), in(g), in(buf), n, lr, momentum, weight_decay);
  }
  double sum_squares(const float* x, int64_t n) override { return cpu::sum_squares(in(x), n); }
  void scale(float* x, float s, int64_t n) override { cpu::scale(in(x), s, n); }

  /// Traffic between host and "device", and waits, for tests that count them.
  std::size_t to_host_bytes = 0, from_host_bytes = 0, syncs = 0, chunks = 0;

  /// The real address of a pointer this device handed out.
  template <class T>
  static T* in(T* p) {
    return reinterpret_cast<T*>(reinterpret_cast<std::uintptr_t>(p) - shift);
  }
  template <class T>
  static T* out(T* p) {
    return reinterpret_cast<T*>(reinterpret_cast<std::uintptr_t>(p) + shift);
  }

 private:
  nn::matmul_precision precision_ = nn::matmul_precision::fp32;
};

}  // namespace cohort::test
