// The CUDA twins of the CPU kernels in runtime/cpu/kernels.hpp (namespace cohort::gpu::cuda):
// the same parameter lists, every pointer a DEVICE pointer, the same conventions (row-major
// float32, activation gradients assigned, parameter gradients accumulated), plus the
// per-thread matmul precision. Includable from plain C++ (no CUDA header needed); built only
// when nvcc is found, in gpu/cuda_matmul.cu (precision, gemm, linear, bias_grad),
// gpu/cuda_attention.cu, gpu/cuda_layers.cu (layernorm, embedding, softmax_xent),
// gpu/cuda_elementwise.cu (activations, add, optimizers, sum_squares) and gpu/cuda_context.cu
// (status, per-thread resources). Not here: the CPU twins (runtime/cpu), device memory,
// copies and the thread's stream (gpu/device.hpp, device_pool).
#pragma once
#include <cstdint>

#include "gpu/device.hpp"

namespace cohort::gpu::cuda {

// Calling convention (documented once for every op below):
// - Work is queued on the calling thread's current stream (set_stream; the legacy default
//   stream until set) and runs asynchronously; ops that return a value (softmax_xent_fwd,
//   sum_squares) synchronise that stream to read the result back.
// - Ops that return void on the CPU return a status here: the launch status (bad arguments,
//   cuBLAS failure, launch failure). Errors raised later while the kernel runs surface at the
//   next synchronising call (device_synchronize(), copy_to_host(), a value-returning op).
// - Value-returning ops keep the CPU return type and return NaN on failure; every op also
//   records its outcome for last_status(). Details are in last_error_message().
// - cuBLAS handles and scratch buffers are created lazily per thread and device.
// - Matrix products follow the thread's matmul_precision; everything else is float32.

/// Outcome of the last op called on this thread (ok or the failure it returned).
status last_status();
/// The thread's stream (gpu/device.hpp): ops and asynchronous copies share it, one setting.
using gpu::current_stream;
using gpu::set_stream;
/// Frees this thread's cuBLAS handles, scratch buffers and their events (they are recreated
/// on next use). Call with no work of this thread still queued.
void release_thread_resources();

/// How cuBLAS computes every matrix product of this thread's ops (gemm, linear_fwd/bwd,
/// attention_fwd/bwd). Operands, outputs and accumulation stay float32 in both; only the
/// multiplier inputs differ.
enum class matmul_precision {
  fp32,  ///< exact FP32 (CUBLAS_COMPUTE_32F, no TF32): within ~1e-5 of the CPU twin. Default.
  bf16,  ///< tensor cores: both operands rounded to bfloat16 copies (8-bit significand), the
         ///< product by cuBLAS's bf16 kernels with float32 accumulation and output. Error
         ///< about 2^-8 of a product's scale (docs/gpu.md). COHORT_CUDA_BF16=fast16bf instead
         ///< passes the float32 operands with CUBLAS_COMPUTE_32F_FAST_16BF (cuBLAS then
         ///< chooses, FP32 kernels included for small shapes).
};
/// Sets the calling thread's matmul precision for the ops it queues from now on.
void set_matmul_precision(matmul_precision p);
/// The calling thread's matmul precision (fp32 until set).
matmul_precision matmul_precision_now();

/// C = alpha * op(A) * op(B) + beta * C, row-major, through cuBLAS (column-major C^T form).
status gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
            const float* b, int ldb, float beta, float* c, int ldc);
/// y[rows, out] = x[rows, in] * W^T + b (b may be null). W is [out, in].
status linear_fwd(float* y, const float* x, const float* w, const float* b, int rows, int in,
                  int out);
/// dx = dy * W (assigned, skipped when dx is null); dW += dy^T x; db += colsum(dy) as
/// bias_grad (db may be null).
status linear_bwd(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w,
                  int rows, int in, int out);
/// db[j] += the sum over rows of dy[r][j], FP32: column sums of 128-row chunks in parallel,
/// then the chunks in order (the same bits every run for a shape; within float rounding of
/// cpu::bias_grad, which adds the rows one by one).
status bias_grad(float* db, const float* dy, int rows, int out);
status relu_fwd(float* y, const float* x, int64_t n);
status relu_bwd(float* dx, const float* dy, const float* x, int64_t n);
/// GELU, tanh approximation (GPT-2).
status gelu_fwd(float* y, const float* x, int64_t n);
status gelu_bwd(float* dx, const float* dy, const float* x, int64_t n);
/// LayerNorm over the last dim C; saves mean and rstd [rows] for backward.
status layernorm_fwd(float* y, float* mean, float* rstd, const float* x, const float* w,
                     const float* b, int rows, int c, float eps);
/// dx assigned; dw, db accumulated.
status layernorm_bwd(float* dx, float* dw, float* db, const float* dy, const float* x,
                     const float* w, const float* mean, const float* rstd, int rows, int c);
/// out[b,t,:] = wte[ids[b,t],:] + wpe[t,:] (wpe may be null). ids live on the device.
status embedding_fwd(float* out, const int32_t* ids, const float* wte, const float* wpe, int b,
                     int t, int c);
/// dwte, dwpe accumulated (dwpe may be null), deterministic: positions are sorted by token id
/// (stable), and each dwte element adds its rows in ascending position order onto its old
/// value, as the CPU twin does, so both give the same bits (likewise dwpe). Uses a per-thread
/// scratch that grows with b*t.
status embedding_bwd(float* dwte, float* dwpe, const float* dout, const int32_t* ids, int b, int t,
                     int c);
/// Causal multi-head self-attention core; att [B,NH,T,T] holds the probabilities (exactly 0
/// above the diagonal). Needs c > 0 divisible by nh.
status attention_fwd(float* out, float* att, const float* qkv, int b, int t, int c, int nh);
/// dqkv assigned (every element); scratch needs b*nh*t*t floats (device), it holds dS.
status attention_bwd(float* dqkv, float* scratch, const float* dout, const float* qkv,
                     const float* att, int b, int t, int c, int nh);
/// Writes probs [N,V] and losses [N]; returns the mean loss (synchronises; NaN on failure).
float softmax_xent_fwd(float* probs, float* losses, const float* logits, const int32_t* targets,
                       int n, int v);
/// dlogits = (probs - onehot(target)) * scale (assigned).
status softmax_xent_bwd(float* dlogits, const float* probs, const int32_t* targets, int n, int v,
                        float scale);
/// One AdamW update (decoupled weight decay), t is the 1-based step count.
status adamw_step(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1,
                  float beta2, float eps, float weight_decay, int t);
/// AdamW with v frozen at step frozen_t (1-bit Adam after its freeze): cpu::onebit_adam_frozen_step.
status onebit_adam_frozen_step(float* p, const float* momentum, float* m, const float* v, int64_t n,
                               float lr, float beta1, float beta2, float eps, float weight_decay,
                               int t, int frozen_t);
/// g = a * m + b * g (cpu::onebit_momentum_share).
status onebit_momentum_share(float* g, const float* m, int64_t n, float a, float b);
/// g divided (DIVIDE) or multiplied by sqrt(v) / sqrt_bc2 + eps; 0 where v is 0
/// (cpu::onebit_scale_by_denominator).
status onebit_scale_by_denominator(float* g, const float* v, int64_t n, float sqrt_bc2, float eps,
                                   bool divide);
/// SGD with momentum (PyTorch convention), weight decay added to g.
status sgd_step(float* p, const float* g, float* buf, int64_t n, float lr, float momentum,
                float weight_decay);
/// Sum of squares with double accumulation, in a fixed order (deterministic for a given n);
/// synchronises; NaN on failure.
double sum_squares(const float* x, int64_t n);
/// sum_squares without the wait: queues the same reduction (the same bits) and writes the
/// result to *out_device (one double in device memory) on the current stream.
status sum_squares_async(const float* x, int64_t n, double* out_device);
status scale(float* x, float s, int64_t n);
/// y += x elementwise (the residual add).
status add_inplace(float* y, const float* x, int64_t n);

}  // namespace cohort::gpu::cuda
