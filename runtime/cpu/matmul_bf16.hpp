// Internal to runtime/cpu: the bf16 products matmul_bf16.cpp computes, called by linear.cpp
// when matmul_bf16() is on, and the signal optimizers give that weights changed. Not a public
// header: callers use runtime/cpu/kernels.hpp.
#pragma once

namespace cohort::cpu::detail {

/// gemm in float32 whatever matmul_bf16() says (attention's small products).
void gemm_fp32(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
               const float* b, int ldb, float beta, float* c, int ldc);
/// gemm's contract with bf16 operands (fast_bf16(): oneDNN, else the portable path).
void gemm_bf16(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
               const float* b, int ldb, float beta, float* c, int ldc);
/// y = x W^T (+ y when BIAS: the caller wrote the bias rows); rounds W into this thread's
/// copy of it, which linear_dx_bf16 then reuses.
void linear_fwd_bf16(float* y, const float* x, const float* w, bool bias, int rows, int in,
                     int out);
/// dx = dy W with the copy of W the last linear_fwd_bf16 made (made again when missing or
/// older than the last params_changed()).
void linear_dx_bf16(float* dx, const float* dy, const float* w, int rows, int in, int out);
/// Called by every optimizer step: rounded weight copies made before it are stale.
void params_changed();

}  // namespace cohort::cpu::detail
