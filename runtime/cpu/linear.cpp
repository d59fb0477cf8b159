// Matrix products (OpenBLAS sgemm), the linear layer around them and its bias gradient, the
// embedding lookup, and the OpenBLAS thread count of the CPU path.
#include <cblas.h>

#include <cstring>
#include <string>

#include "runtime/cpu/kernels.hpp"
#include "runtime/cpu/matmul_bf16.hpp"
#include "runtime/cpu/simd.hpp"

namespace cohort::cpu {

namespace {

// Row by row, so each column is summed in ascending row order onto db's old value; the
// AVX2 build vectorises across columns only, which keeps that order (the same bits).
COHORT_INLINE void bias_grad_body(float* db, const float* dy, int rows, int out) {
  for (int r = 0; r < rows; ++r) {
    const float* d = dy + static_cast<int64_t>(r) * out;
    for (int j = 0; j < out; ++j) db[j] += d[j];
  }
}
COHORT_TWO_BUILDS(void, bias_grad, (float* db, const float* dy, int rows, int out),
                  (db, dy, rows, out))

COHORT_INLINE void bias_rows_body(float* y, const float* b, int rows, int out) {
  for (int r = 0; r < rows; ++r) std::memcpy(y + static_cast<int64_t>(r) * out, b, out * 4);
}
COHORT_TWO_BUILDS(void, bias_rows, (float* y, const float* b, int rows, int out), (y, b, rows, out))

}  // namespace

std::string blas_core() {
  const char* name = openblas_get_corename();
  return name ? name : "unknown";
}

void set_num_threads(int n) { openblas_set_num_threads(n < 1 ? 1 : n); }
int num_threads() { return openblas_get_num_threads(); }

void detail::gemm_fp32(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
                       const float* b, int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n,
              k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
          const float* b, int ldb, float beta, float* c, int ldc) {
  if (matmul_bf16()) return detail::gemm_bf16(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n,
              k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void linear_fwd(float* y, const float* x, const float* w, const float* b, int rows, int in,
                int out) {
  // Bias first, then one sgemm with beta = 1: the bias costs no extra pass over y.
  if (b) bias_rows_dispatch(y, b, rows, out);
  if (matmul_bf16()) return detail::linear_fwd_bf16(y, x, w, b != nullptr, rows, in, out);
  gemm(false, true, rows, out, in, 1.0f, x, in, w, in, b ? 1.0f : 0.0f, y, out);
}

void linear_dx(float* dx, const float* dy, const float* w, int rows, int in, int out) {
  if (matmul_bf16()) return detail::linear_dx_bf16(dx, dy, w, rows, in, out);
  gemm(false, false, rows, in, out, 1.0f, dy, out, w, in, 0.0f, dx, in);
}

void linear_bwd(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w,
                int rows, int in, int out) {
  if (dx) linear_dx(dx, dy, w, rows, in, out);
  gemm(true, false, out, in, rows, 1.0f, dy, out, x, in, 1.0f, dw, in);
  if (db) bias_grad(db, dy, rows, out);
}

void bias_grad(float* db, const float* dy, int rows, int out) {
  bias_grad_dispatch(db, dy, rows, out);
}

void embedding_fwd(float* out, const int32_t* ids, const float* wte, const float* wpe, int b, int t,
                   int c) {
  for (int i = 0; i < b; ++i)
    for (int j = 0; j < t; ++j) {
      const int64_t row = static_cast<int64_t>(i) * t + j;
      float* o = out + row * c;
      const float* e = wte + static_cast<int64_t>(ids[row]) * c;
      if (wpe) {
        const float* p = wpe + static_cast<int64_t>(j) * c;
        for (int k = 0; k < c; ++k) o[k] = e[k] + p[k];
      } else {
        std::memcpy(o, e, sizeof(float) * c);
      }
    }
}

void embedding_bwd(float* dwte, float* dwpe, const float* dout, const int32_t* ids, int b, int t,
                   int c) {
  for (int i = 0; i < b; ++i)
    for (int j = 0; j < t; ++j) {
      const int64_t row = static_cast<int64_t>(i) * t + j;
      const float* d = dout + row * c;
      add_inplace(dwte + static_cast<int64_t>(ids[row]) * c, d, c);
      if (dwpe) add_inplace(dwpe + static_cast<int64_t>(j) * c, d, c);
    }
}

}  // namespace cohort::cpu
