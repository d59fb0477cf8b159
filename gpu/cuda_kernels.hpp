// The CUDA twins of the CPU kernels in runtime/cpu/kernels.hpp (namespace cohort::gpu::cuda):
// the same parameter lists, every pointer a DEVICE pointer, the same conventions (row-major
// float32, activation gradients assigned, parameter gradients accumulated). Includable from
// plain C++ (no CUDA header needed); built only when nvcc is found, in gpu/cuda_layers.cu
// (gemm .. softmax_xent), gpu/cuda_elementwise.cu (activations, add, optimizers, sum_squares)
// and gpu/cuda_context.cu (streams, status, per-thread resources).
// Not here: the CPU twins (runtime/cpu), device memory (gpu/device.hpp, device_pool).
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
// - cuBLAS handles and a small reduction scratch are created lazily per thread and device.

/// Outcome of the last op called on this thread (ok or the failure it returned).
status last_status();
/// Queue subsequent ops of this thread on `stream` (a cudaStream_t; nullptr = default stream).
void set_stream(void* stream);
/// The calling thread's current stream (a cudaStream_t).
void* current_stream();
/// Frees this thread's cuBLAS handles and scratch (they are recreated on next use).
void release_thread_resources();

/// C = alpha * op(A) * op(B) + beta * C, row-major, through cuBLAS (column-major C^T form).
status gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
            const float* b, int ldb, float beta, float* c, int ldc);
/// y[rows, out] = x[rows, in] * W^T + b (b may be null). W is [out, in].
status linear_fwd(float* y, const float* x, const float* w, const float* b, int rows, int in,
                  int out);
/// dx = dy * W (assigned, skipped when dx is null); dW += dy^T x; db += colsum(dy) (db may be
/// null).
status linear_bwd(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w,
                  int rows, int in, int out);
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
/// dwte, dwpe accumulated (dwpe may be null); repeated ids accumulate with atomicAdd.
status embedding_bwd(float* dwte, float* dwpe, const float* dout, const int32_t* ids, int b, int t,
                     int c);
/// Causal multi-head self-attention core; att [B,NH,T,T] holds the probabilities (0 above the
/// diagonal).
status attention_fwd(float* out, float* att, const float* qkv, int b, int t, int c, int nh);
/// dqkv assigned; scratch needs b*nh*t*t floats (device).
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
/// SGD with momentum (PyTorch convention), weight decay added to g.
status sgd_step(float* p, const float* g, float* buf, int64_t n, float lr, float momentum,
                float weight_decay);
/// Sum of squares with double accumulation, in a fixed order (deterministic for a given n);
/// synchronises; NaN on failure.
double sum_squares(const float* x, int64_t n);
status scale(float* x, float s, int64_t n);
/// y += x elementwise (the residual add).
status add_inplace(float* y, const float* x, int64_t n);

}  // namespace cohort::gpu::cuda
