// CUDA twins of the elementwise ops of runtime/cpu/kernels.hpp (declared in
// gpu/cuda_kernels.hpp): relu, gelu, the residual add, scale, the AdamW and SGD updates, one
// grid-stride kernel each with the same scalar arithmetic as the CPU twin, and the sum of
// squares (read back, or left on the device) through the deterministic reduction of
// gpu/cuda_context.cu.
#include <cuda_runtime.h>

#include <cmath>
#include <limits>

#include "gpu/cuda_common.cuh"
#include "gpu/cuda_kernels.hpp"

namespace cohort::gpu::cuda {

// The launch geometry, block reductions and host helpers of gpu/cuda_common.cuh.
using namespace detail;

namespace {

constexpr float k_gelu_c = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float k_gelu_a = 0.044715f;

__global__ void relu_fwd_kernel(float* y, const float* x, int64_t n) {
  COHORT_GRID_STRIDE(i, n) { y[i] = x[i] > 0.0f ? x[i] : 0.0f; }
}

__global__ void relu_bwd_kernel(float* dx, const float* dy, const float* x, int64_t n) {
  COHORT_GRID_STRIDE(i, n) { dx[i] = x[i] > 0.0f ? dy[i] : 0.0f; }
}

// 0.5 x (1 + tanh(u)) written as x * sigmoid(2u), as the CPU twin does (same rounding path).
__global__ void gelu_fwd_kernel(float* y, const float* x, int64_t n) {
  COHORT_GRID_STRIDE(i, n) {
    const float xi = x[i];
    const float u = k_gelu_c * (xi + k_gelu_a * xi * xi * xi);
    y[i] = xi / (1.0f + expf(-2.0f * u));
  }
}

__global__ void gelu_bwd_kernel(float* dx, const float* dy, const float* x, int64_t n) {
  COHORT_GRID_STRIDE(i, n) {
    const float xi = x[i];
    const float u = k_gelu_c * (xi + k_gelu_a * xi * xi * xi);
    const float s = 1.0f / (1.0f + expf(-2.0f * u));
    const float du = k_gelu_c * (1.0f + 3.0f * k_gelu_a * xi * xi);
    dx[i] = dy[i] * (s + 2.0f * xi * s * (1.0f - s) * du);
  }
}

// Same scalar order as the CPU twin (torch.optim.AdamW, non-fused); the bias corrections are
// computed once on the host in double, exactly as the CPU does.
__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, int64_t n, float beta1,
                             float beta2, float eps, float decay, float step_size, float sqrt_bc2) {
  COHORT_GRID_STRIDE(i, n) {
    const float gi = g[i];
    const float mi = m[i] * beta1 + (1.0f - beta1) * gi;
    const float vi = v[i] * beta2 + (1.0f - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float denom = sqrtf(vi) / sqrt_bc2 + eps;
    p[i] = p[i] * decay - step_size * (mi / denom);
  }
}

// 1-bit Adam after the freeze: the CPU twin's scalar order (cpu/optim.cpp). No fused
// multiply-add: the host twin (x86-64-v2) has none, and the twins must agree to the bit.
__global__ void onebit_frozen_kernel(float* p, const float* momentum, float* m, const float* v,
                                     int64_t n, float eps, float decay, float step_size,
                                     float sqrt_bc2) {
  COHORT_GRID_STRIDE(i, n) {
    const float mi = v[i] == 0.0f ? 0.0f : momentum[i];
    m[i] = mi;
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v[i]), sqrt_bc2), eps);
    p[i] = __fsub_rn(__fmul_rn(p[i], decay), __fmul_rn(step_size, __fdiv_rn(mi, denom)));
  }
}

__global__ void onebit_share_kernel(float* g, const float* m, int64_t n, float a, float b) {
  COHORT_GRID_STRIDE(i, n) { g[i] = __fadd_rn(__fmul_rn(a, m[i]), __fmul_rn(b, g[i])); }
}

__global__ void onebit_denominator_kernel(float* g, const float* v, int64_t n, float sqrt_bc2,
                                          float eps, bool divide) {
  COHORT_GRID_STRIDE(i, n) {
    const float gi = v[i] == 0.0f ? 0.0f : g[i];
    const float d = __fadd_rn(__fdiv_rn(__fsqrt_rn(v[i]), sqrt_bc2), eps);
    g[i] = divide ? __fdiv_rn(gi, d) : __fmul_rn(gi, d);
  }
}

__global__ void sgd_kernel(float* p, const float* g, float* buf, int64_t n, float lr,
                           float momentum, float weight_decay) {
  COHORT_GRID_STRIDE(i, n) {
    const float gi = g[i] + weight_decay * p[i];
    const float bi = momentum * buf[i] + gi;
    buf[i] = bi;
    p[i] -= lr * bi;
  }
}

__global__ void scale_kernel(float* x, float s, int64_t n) {
  COHORT_GRID_STRIDE(i, n) { x[i] *= s; }
}

__global__ void add_inplace_kernel(float* y, const float* x, int64_t n) {
  COHORT_GRID_STRIDE(i, n) { y[i] += x[i]; }
}

}  // namespace

status relu_fwd(float* y, const float* x, int64_t n) {
  if (n <= 0) return record(n < 0 ? bad("relu_fwd: negative n") : status::ok);
  relu_fwd_kernel<<<blocks_for(n), k_threads, 0, stream()>>>(y, x, n);
  return record(launched("relu_fwd_kernel"));
}

status relu_bwd(float* dx, const float* dy, const float* x, int64_t n) {
  if (n <= 0) return record(n < 0 ? bad("relu_bwd: negative n") : status::ok);
  relu_bwd_kernel<<<blocks_for(n), k_threads, 0, stream()>>>(dx, dy, x, n);
  return record(launched("relu_bwd_kernel"));
}

status gelu_fwd(float* y, const float* x, int64_t n) {
  if (n <= 0) return record(n < 0 ? bad("gelu_fwd: negative n") : status::ok);
  gelu_fwd_kernel<<<blocks_for(n), k_threads, 0, stream()>>>(y, x, n);
  return record(launched("gelu_fwd_kernel"));
}

status gelu_bwd(float* dx, const float* dy, const float* x, int64_t n) {
  if (n <= 0) return record(n < 0 ? bad("gelu_bwd: negative n") : status::ok);
  gelu_bwd_kernel<<<blocks_for(n), k_threads, 0, stream()>>>(dx, dy, x, n);
  return record(launched("gelu_bwd_kernel"));
}

status adamw_step(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int t) {
  if (n < 0 || t < 1) return record(bad("adamw_step: need n >= 0 and step t >= 1"));
  if (n == 0) return record(status::ok);
  const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), t);
  const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), t);
  const float decay = 1.0f - lr * weight_decay;
  const float step_size = static_cast<float>(lr / bc1);
  const float sqrt_bc2 = static_cast<float>(std::sqrt(bc2));
  adamw_kernel<<<blocks_for(n), k_threads, 0, stream()>>>(p, g, m, v, n, beta1, beta2, eps, decay,
                                                          step_size, sqrt_bc2);
  return record(launched("adamw_kernel"));
}

status onebit_adam_frozen_step(float* p, const float* momentum, float* m, const float* v, int64_t n,
                               float lr, float beta1, float beta2, float eps, float weight_decay,
                               int t, int frozen_t) {
  if (n < 0 || t < 1 || frozen_t < 1)
    return record(bad("onebit_adam_frozen_step: need n >= 0, t >= 1 and frozen_t >= 1"));
  if (n == 0) return record(status::ok);
  // The bias corrections on the host in double, exactly as the CPU twin computes them.
  const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), t);
  const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), frozen_t);
  const float decay = 1.0f - lr * weight_decay;
  const float step_size = static_cast<float>(lr / bc1);
  const float sqrt_bc2 = static_cast<float>(std::sqrt(bc2));
  onebit_frozen_kernel<<<blocks_for(n), k_threads, 0, stream()>>>(p, momentum, m, v, n, eps, decay,
                                                                  step_size, sqrt_bc2);
  return record(launched("onebit_frozen_kernel"));
}

status onebit_momentum_share(float* g, const float* m, int64_t n, float a, float b) {
  if (n <= 0) return record(n < 0 ? bad("onebit_momentum_share: negative n") : status::ok);
  onebit_share_kernel<<<blocks_for(n), k_threads, 0, stream()>>>(g, m, n, a, b);
  return record(launched("onebit_share_kernel"));
}

status onebit_scale_by_denominator(float* g, const float* v, int64_t n, float sqrt_bc2, float eps,
                                   bool divide) {
  if (n <= 0) return record(n < 0 ? bad("onebit_scale_by_denominator: negative n") : status::ok);
  onebit_denominator_kernel<<<blocks_for(n), k_threads, 0, stream()>>>(g, v, n, sqrt_bc2, eps,
                                                                       divide);
  return record(launched("onebit_denominator_kernel"));
}

status sgd_step(float* p, const float* g, float* buf, int64_t n, float lr, float momentum,
                float weight_decay) {
  if (n <= 0) return record(n < 0 ? bad("sgd_step: negative n") : status::ok);
  sgd_kernel<<<blocks_for(n), k_threads, 0, stream()>>>(p, g, buf, n, lr, momentum, weight_decay);
  return record(launched("sgd_kernel"));
}

double sum_squares(const float* x, int64_t n) {
  double total = 0.0;
  status s = status::ok;
  if (n < 0) s = bad("sum_squares: negative n");
  if (n > 0) s = reduce_to_host(&total, x, n, true);
  record(s);
  return s == status::ok ? total : std::numeric_limits<double>::quiet_NaN();
}

status sum_squares_async(const float* x, int64_t n, double* out_device) {
  if (n < 0 || out_device == nullptr)
    return record(bad("sum_squares_async: need n >= 0 and a device output"));
  return record(reduce_to_device(out_device, x, n, true));
}

status scale(float* x, float s, int64_t n) {
  if (n <= 0) return record(n < 0 ? bad("scale: negative n") : status::ok);
  scale_kernel<<<blocks_for(n), k_threads, 0, stream()>>>(x, s, n);
  return record(launched("scale_kernel"));
}

status add_inplace(float* y, const float* x, int64_t n) {
  if (n <= 0) return record(n < 0 ? bad("add_inplace: negative n") : status::ok);
  add_inplace_kernel<<<blocks_for(n), k_threads, 0, stream()>>>(y, x, n);
  return record(launched("add_inplace_kernel"));
}

}  // namespace cohort::gpu::cuda
