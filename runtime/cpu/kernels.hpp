// The CPU compute kernels of cohort (namespace cohort::cpu): one signature per op, the
// reference every CUDA twin (gpu/cuda_kernels.hpp, namespace cohort::gpu::cuda, same
// parameter lists over device pointers) is checked against, and the CPU training path.
// OpenBLAS for matrix products, plain loops with an AVX2/FMA build for the rest (simd.hpp).
// Knows nothing of CAF, ZeroMQ, YAML or devices; the files here are split by op family.
//
// Conventions (as in llm.c): row-major float32; activation gradients are ASSIGNED
// (dx = ...), parameter gradients are ACCUMULATED (dw += ...), so gradient accumulation
// over micro-batches needs no extra pass. Shapes: B batch, T time, C channels, V vocab,
// NH heads. Linear weights are [out, in] like PyTorch's nn.Linear.
#pragma once
#include <cstdint>
#include <string>

namespace cohort::cpu {

// ---- matrix products, linear, embedding (linear.cpp) ----
/// C = alpha * op(A) * op(B) + beta * C, row-major; op(X) = X^T when tX.
void gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
          const float* b, int ldb, float beta, float* c, int ldc);
/// y[rows, out] = x[rows, in] * W^T + b (b may be null). W is [out, in].
void linear_fwd(float* y, const float* x, const float* w, const float* b, int rows, int in,
                int out);
/// dx = dy * W (assigned, skipped when dx is null); dW += dy^T x; db += colsum(dy) as
/// bias_grad (db may be null).
void linear_bwd(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w,
                int rows, int in, int out);
/// dx[rows, in] = dy[rows, out] * W (assigned): linear_bwd's dx. In bf16 it reuses the rounded
/// copy of W that linear_fwd made, so the contract is a forward pass's: linear_fwd with this W
/// since W last changed (an optimizer step here counts as a change).
void linear_dx(float* dx, const float* dy, const float* w, int rows, int in, int out);
/// db[j] += dy[r][j] for r = 0, 1, ..., rows-1, one row at a time onto db (the order fixes the
/// bits: nn::linear's backward and the CUDA twin add in exactly this order).
void bias_grad(float* db, const float* dy, int rows, int out);
/// out[b,t,:] = wte[ids[b,t],:] + wpe[t,:] (wpe may be null).
void embedding_fwd(float* out, const int32_t* ids, const float* wte, const float* wpe, int b, int t,
                   int c);
void embedding_bwd(float* dwte, float* dwpe, const float* dout, const int32_t* ids, int b, int t,
                   int c);

// ---- activations and the residual add (elementwise.cpp) ----
void relu_fwd(float* y, const float* x, int64_t n);
void relu_bwd(float* dx, const float* dy, const float* x, int64_t n);
/// GELU, tanh approximation (GPT-2; torch.nn.GELU(approximate="tanh")).
void gelu_fwd(float* y, const float* x, int64_t n);
void gelu_bwd(float* dx, const float* dy, const float* x, int64_t n);
/// y += x elementwise (the residual stream between blocks).
void add_inplace(float* y, const float* x, int64_t n);

// ---- normalization (layernorm.cpp) ----
/// LayerNorm over the last dim C; saves mean and rstd [rows] for backward.
void layernorm_fwd(float* y, float* mean, float* rstd, const float* x, const float* w,
                   const float* b, int rows, int c, float eps);
void layernorm_bwd(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w,
                   const float* mean, const float* rstd, int rows, int c);

// ---- attention (attention.cpp) ----
/// Causal multi-head self-attention core. qkv [B,T,3C] (q | k | v, heads contiguous in C);
/// att [B,NH,T,T] saves the softmax probabilities; out [B,T,C].
void attention_fwd(float* out, float* att, const float* qkv, int b, int t, int c, int nh);
/// One query row's attention over N cached positions (serving's paged KV cache, where each
/// position's keys and values are C floats at K[j] and V[j], heads contiguous): for each of
/// NH heads, y_h = sum_j softmax_j(q_h . k_j,h / sqrt(C / NH)) v_j,h. y [C] assigned;
/// SCORES: N floats of scratch. attention_fwd's last row, from a cache.
void attention_decode_row(float* y, const float* q, const float* const* k, const float* const* v,
                          int n, int c, int nh, float* scores);
/// dqkv assigned; scratch needs b*nh*t*t floats.
void attention_bwd(float* dqkv, float* scratch, const float* dout, const float* qkv,
                   const float* att, int b, int t, int c, int nh);

// ---- loss (loss.cpp) ----
/// Softmax cross-entropy over V classes per row. Writes probs [N,V] and losses [N];
/// returns the mean loss. Targets outside [0,V) are a caller bug.
float softmax_xent_fwd(float* probs, float* losses, const float* logits, const int32_t* targets,
                       int n, int v);
/// dlogits = (probs - onehot(target)) * scale (assigned); scale is usually 1/N_total.
void softmax_xent_bwd(float* dlogits, const float* probs, const int32_t* targets, int n, int v,
                      float scale);

// ---- optimizers and gradient clipping (optim.cpp) ----
/// One AdamW update (decoupled weight decay), t is the 1-based step count.
void adamw_step(float* p, const float* g, float* m, float* v, int64_t n, float lr, float beta1,
                float beta2, float eps, float weight_decay, int t);
/// 1-bit Adam after the variance froze: m = momentum (the group's compressed sum), then the
/// AdamW update with v frozen: p = p*(1 - lr*wd) - lr/(1 - beta1^t) * m / (sqrt(v)/sqrt(1 -
/// beta2^frozen_t) + eps), where frozen_t is the step at which v stopped changing. An element
/// whose v is 0 never had a gradient: its m stays 0 and p only decays.
void onebit_adam_frozen_step(float* p, const float* momentum, float* m, const float* v, int64_t n,
                             float lr, float beta1, float beta2, float eps, float weight_decay,
                             int t, int frozen_t);
/// 1-bit Adam's momentum share after the freeze: g = a * m + b * g (a = beta1 / replicas,
/// b = 1 - beta1: this replica's share of the new momentum).
void onebit_momentum_share(float* g, const float* m, int64_t n, float a, float b);
/// 1-bit Adam's frozen denominator d = sqrt(v) / sqrt_bc2 + eps: g = g / d (DIVIDE) or
/// g * d; an element whose v is 0 (it never had a gradient) becomes 0.
void onebit_scale_by_denominator(float* g, const float* v, int64_t n, float sqrt_bc2, float eps,
                                 bool divide);
/// SGD with momentum (PyTorch convention: buf = mu*buf + g; p -= lr*buf), weight decay in g.
void sgd_step(float* p, const float* g, float* buf, int64_t n, float lr, float momentum,
              float weight_decay);
/// sum of squares (double accumulation) for gradient-norm clipping.
double sum_squares(const float* x, int64_t n);
void scale(float* x, float s, int64_t n);

// ---- CPU-only helpers (no CUDA twin needed) ----
// The thread count of the CPU path (linear.cpp), the SIMD choice and flush-to-zero (simd.cpp).
/// The kernel family OpenBLAS runs ("Cooperlake", "Haswell", ...): its own choice for the
/// CPU, or what OPENBLAS_CORETYPE in the environment forced (the run's header names it).
std::string blas_core();
/// Sets the threads OpenBLAS uses (>= 1); results must not depend on the machine's cores.
void set_num_threads(int n);
/// Threads OpenBLAS currently uses.
int num_threads();
/// Forces the portable (non-SIMD) loops when on; off restores what the CPU supports. The
/// two paths compute the same formulas; tests use this to check one against the other.
void set_portable_kernels(bool on);
/// True when the AVX2/FMA loops are in use.
bool simd_kernels();
// ---- bf16 matrix products (bf16.cpp, matmul_bf16.cpp) ----
/// The bf16 instructions this CPU has (cpuid, and AVX-512 state saved by the OS).
enum class bf16_isa { none, avx512_bf16, amx_bf16 };
bf16_isa cpu_bf16_isa();
/// "none" | "avx512_bf16" | "amx_bf16".
const char* bf16_isa_name(bf16_isa isa);
/// Process-wide: when on, gemm, linear_fwd and linear_dx (not attention's products, which
/// stay float32: attention.cpp) take bf16
/// inputs (rounded to nearest even) with float32 accumulation and output (train.precision:
/// bf16). Everything else (norms, softmax, the loss, optimizers) stays float32.
void set_matmul_bf16(bool on);
bool matmul_bf16();
/// True when bf16 products run on oneDNN's kernels for the CPU's bf16 instructions; false on
/// the portable path (a CPU with neither AVX512_BF16 nor AMX, or forced): operands rounded to
/// bf16 and multiplied by sgemm. COHORT_CPU_BF16=portable in the environment forces it, as
/// does set_portable_bf16(true) (a test hook).
bool fast_bf16();
void set_portable_bf16(bool on);
/// y[i] = the bf16 bits of x[i], rounded to nearest even (VCVTNEPS2BF16's rule: zero and
/// subnormal inputs give a signed zero, NaN a quiet NaN). The AVX512_BF16 build and the
/// portable loop give the same bits.
void to_bf16(uint16_t* y, const float* x, int64_t n);
/// y[i] = x[i] rounded to bf16, as a float32 (the portable path's operands).
void round_to_bf16(float* y, const float* x, int64_t n);
float bf16_to_float(uint16_t h);
/// One core's measured peak in GFLOP/s of 512-bit FMAs (bf16 false) or VDPBF16PS (true): a
/// loop of independent chains that touches no memory, best of three ~0.1 s runs. 0 on a CPU
/// without AVX512_BF16 (the benchmark then states no peak).
double peak_gflops(bool bf16);

/// Flush-to-zero and denormals-are-zero for the CALLING thread's SSE/AVX arithmetic (on by
/// default in no thread). Subnormal floats (|x| < 1.2e-38, e.g. Adam's second moment of a
/// vanishing gradient) are 10-100x slower to compute with and carry no useful information
/// for training, so compute threads turn this on.
void set_flush_denormals(bool on);
/// Whether flush-to-zero is on for the calling thread.
bool flush_denormals();

}  // namespace cohort::cpu
