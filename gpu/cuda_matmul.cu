// CUDA twins of the matrix products of runtime/cpu/linear.cpp (declared in
// gpu/cuda_kernels.hpp): the thread's matmul precision, the row-major (batched) product over
// cuBLAS that every op's products go through (gemm_rm, also used by gpu/cuda_attention.cu),
// gemm, the linear layer, and bias_grad, the bias gradient in the CPU twin's order.
// Not here: attention (gpu/cuda_attention.cu), the other layers (gpu/cuda_layers.cu).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "gpu/cuda_common.cuh"
#include "gpu/cuda_kernels.hpp"

namespace cohort::gpu::cuda {

// The launch geometry and host helpers of gpu/cuda_common.cuh.
using namespace detail;

namespace {

// Per thread, like the stream: a worker thread picks its precision once, and threads that
// drive other work (tests, a CPU comparison) are not affected.
thread_local matmul_precision precision_ = matmul_precision::fp32;

// y[r, j] += b[j]: cuBLAS has no bias epilogue for a plain product, so the bias is its own pass.
__global__ void add_bias_rows_kernel(float* y, const float* b, int64_t rows, int out) {
  COHORT_GRID_STRIDE(i, rows * out) { y[i] += b[i % out]; }
}

// db[j] = (((db[j] + dy[0][j]) + dy[1][j]) + ...): one thread per column walks the rows in
// ascending order, adding onto db's old value, exactly the CPU twin's sequence of float adds
// (row by row, g[j] += d[j]), so both give the same bits. Adjacent threads read adjacent
// addresses (coalesced).
__global__ void bias_grad_kernel(float* db, const float* dy, int rows, int out) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= out) return;
  float acc = db[j];
  for (int r = 0; r < rows; ++r) acc += dy[static_cast<int64_t>(r) * out + j];
  db[j] = acc;
}

status compute_type_of(matmul_precision p, cublasComputeType_t* out) {
  switch (p) {
    case matmul_precision::fp32:
      *out = CUBLAS_COMPUTE_32F;
      return status::ok;
    case matmul_precision::bf16:
      *out = CUBLAS_COMPUTE_32F_FAST_16BF;
      return status::ok;
  }
  return bad("matmul precision: not fp32 or bf16");
}

}  // namespace

void set_matmul_precision(matmul_precision p) { precision_ = p; }
matmul_precision matmul_precision_now() { return precision_; }

namespace detail {

status gemm_rm(const char* what, bool ta, bool tb, int m, int n, int k, float alpha, const float* a,
               int lda, long long sa, const float* b, int ldb, long long sb, float beta, float* c,
               int ldc, long long sc, int batch) {
  if (m < 0 || n < 0 || k < 0 || batch < 1)
    return bad((std::string(what) + ": negative size or batch < 1").c_str());
  if (m == 0 || n == 0) return status::ok;  // nothing to write
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  if (status s = compute_type_of(precision_, &compute); s != status::ok) return s;
  cublasHandle_t h = nullptr;
  if (status s = blas_handle(&h); s != status::ok) return s;
  // cuBLAS is column-major. A row-major matrix is its transpose read column-major, so
  // C = op(A) op(B) (row-major) is C^T = op(B)^T op(A)^T (column-major): swap the operands
  // and m/n, keep each operand's own transpose flag, leading dimension and stride. Operands
  // and C are float32 in both precisions; only the compute type differs.
  const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasStatus_t st =
      batch == 1 ? cublasGemmEx(h, opb, opa, n, m, k, &alpha, b, CUDA_R_32F, ldb, a, CUDA_R_32F,
                                lda, &beta, c, CUDA_R_32F, ldc, compute, CUBLAS_GEMM_DEFAULT)
                 : cublasGemmStridedBatchedEx(h, opb, opa, n, m, k, &alpha, b, CUDA_R_32F, ldb, sb,
                                              a, CUDA_R_32F, lda, sa, &beta, c, CUDA_R_32F, ldc, sc,
                                              batch, compute, CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS)
    return set_error(status::cublas_error,
                     std::string(what) + ": " +
                         (batch == 1 ? "cublasGemmEx: " : "cublasGemmStridedBatchedEx: ") +
                         cublasGetStatusString(st));
  return status::ok;
}

}  // namespace detail

status gemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
            const float* b, int ldb, float beta, float* c, int ldc) {
  return record(gemm_rm("gemm", ta, tb, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, ldc, 0, 1));
}

status linear_fwd(float* y, const float* x, const float* w, const float* b, int rows, int in,
                  int out) {
  if (status s = gemm_rm("linear_fwd", false, true, rows, out, in, 1.0f, x, in, 0, w, in, 0, 0.0f,
                         y, out, 0, 1);
      s != status::ok)
    return record(s);
  if (b == nullptr || rows == 0 || out == 0) return record(status::ok);
  const int64_t n = static_cast<int64_t>(rows) * out;
  add_bias_rows_kernel<<<blocks_for(n), k_threads, 0, stream()>>>(y, b, rows, out);
  return record(launched("add_bias_rows_kernel"));
}

status linear_bwd(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w,
                  int rows, int in, int out) {
  if (dx) {
    if (status s = gemm_rm("linear_bwd dx", false, false, rows, in, out, 1.0f, dy, out, 0, w, in, 0,
                           0.0f, dx, in, 0, 1);
        s != status::ok)
      return record(s);
  }
  if (status s = gemm_rm("linear_bwd dw", true, false, out, in, rows, 1.0f, dy, out, 0, x, in, 0,
                         1.0f, dw, in, 0, 1);
      s != status::ok)
    return record(s);
  if (db == nullptr) return record(status::ok);
  return bias_grad(db, dy, rows, out);
}

status bias_grad(float* db, const float* dy, int rows, int out) {
  if (rows < 0 || out < 0) return record(bad("bias_grad: negative rows or out"));
  if (out > 0 && (db == nullptr || (rows > 0 && dy == nullptr)))
    return record(bad("bias_grad: null db or dy"));
  if (rows == 0 || out == 0) return record(status::ok);  // nothing to add
  bias_grad_kernel<<<(out + k_threads - 1) / k_threads, k_threads, 0, stream()>>>(db, dy, rows,
                                                                                  out);
  return record(launched("bias_grad_kernel"));
}

}  // namespace cohort::gpu::cuda
