// CUDA twins of the matrix products of runtime/cpu/linear.cpp (declared in
// gpu/cuda_kernels.hpp): the thread's matmul precision, the row-major (batched) product over
// cuBLAS that every op's products go through (gemm_rm, also used by gpu/cuda_attention.cu),
// gemm, the linear layer, and bias_grad, the bias gradient in the CPU twin's order.
// Not here: attention (gpu/cuda_attention.cu), the other layers (gpu/cuda_layers.cu).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "gpu/cublas_loader.hpp"
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

// Column sums in two passes, so that a (rows x out) gradient keeps the whole device busy (one
// thread per column walking all rows left most of it idle): part[chunk][j] = the sum of dy's
// rows of one chunk (k_column_chunk_rows, ascending), one thread per (chunk, column), adjacent
// threads on adjacent columns (coalesced); then db[j] += part[0][j] + part[1][j] + ... in chunk
// order. The bits depend only on the shape, run after run.
__global__ void column_partials_kernel(float* part, const float* dy, int rows, int out) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= out) return;
  const int r0 = blockIdx.y * k_column_chunk_rows;
  const int r1 = min(rows, r0 + k_column_chunk_rows);
  float acc = 0.0f;
  for (int r = r0; r < r1; ++r) acc += dy[static_cast<int64_t>(r) * out + j];
  part[static_cast<int64_t>(blockIdx.y) * out + j] = acc;
}

__global__ void column_finish_kernel(float* db, const float* part, int chunks, int out) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= out) return;
  float acc = db[j];
  for (int k = 0; k < chunks; ++k) acc += part[static_cast<int64_t>(k) * out + j];
  db[j] = acc;
}

__global__ void to_bf16_kernel(__nv_bfloat16* y, const float* x, int64_t n) {
  COHORT_GRID_STRIDE(i, n) { y[i] = __float2bfloat16_rn(x[i]); }
}

// Elements from an operand's first to its last: ROWS rows of COLS (row-major, leading
// dimension LD), BATCH of them STRIDE apart.
int64_t operand_span(int rows, int cols, int ld, long long stride, int batch) {
  if (rows == 0 || cols == 0) return 0;
  return static_cast<int64_t>(batch - 1) * stride + static_cast<int64_t>(rows - 1) * ld + cols;
}

// A bf16 copy of SPAN elements at X in the lease's memory.
status bf16_copy(scratch_lease& lease, const float* x, int64_t span, __nv_bfloat16** out) {
  void* p = nullptr;
  if (status s = lease.acquire(static_cast<std::size_t>(std::max<int64_t>(span, 1)) * 2, &p);
      s != status::ok)
    return s;
  *out = static_cast<__nv_bfloat16*>(p);
  return to_bf16(*out, x, span);
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

// How a bf16 product runs: by default its operands are rounded to bf16 copies (one pass
// each) and multiplied by cuBLAS's bf16 kernels (CUDA_R_16BF inputs, FP32 accumulation and
// output); COHORT_CUDA_BF16=fast16bf hands cuBLAS the FP32 operands with
// CUBLAS_COMPUTE_32F_FAST_16BF instead (cuBLAS then chooses the kernel, FP32 ones included
// for small shapes). Read once per process: it is a benchmark's switch between the two
// designs (docs/gpu_training.md), not a setting.
bool bf16_via_copies() {
  static const bool copies = [] {
    const char* v = std::getenv("COHORT_CUDA_BF16");
    return v == nullptr || std::strcmp(v, "fast16bf") != 0;
  }();
  return copies;
}

status to_bf16(void* y, const float* x, int64_t n) {
  if (n <= 0) return status::ok;
  to_bf16_kernel<<<blocks_for(n), k_threads, 0, stream()>>>(static_cast<__nv_bfloat16*>(y), x, n);
  return launched("to_bf16_kernel");
}

status gemm_rm_typed(const char* what, bool ta, bool tb, int m, int n, int k, float alpha,
                     const void* a, int lda, long long sa, const void* b, int ldb, long long sb,
                     float beta, float* c, int ldc, long long sc, int batch, bool bf16) {
  if (m < 0 || n < 0 || k < 0 || batch < 1)
    return bad((std::string(what) + ": negative size or batch < 1").c_str());
  if (m == 0 || n == 0) return status::ok;  // nothing to write
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  if (!bf16) {
    if (status s = compute_type_of(precision_, &compute); s != status::ok) return s;
  }
  const cudaDataType_t type = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  cublasHandle_t h = nullptr;
  if (status s = blas_handle(&h); s != status::ok) return s;
  // Column-major cuBLAS: C^T = op(B)^T op(A)^T (see gemm_rm).
  const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const blas::api& bl = *blas::get();  // loaded: blas_handle succeeded
  const cublasStatus_t st =
      batch == 1 ? bl.gemm_ex(h, opb, opa, n, m, k, &alpha, b, type, ldb, a, type, lda, &beta, c,
                              CUDA_R_32F, ldc, compute, CUBLAS_GEMM_DEFAULT)
                 : bl.gemm_strided_batched_ex(h, opb, opa, n, m, k, &alpha, b, type, ldb, sb, a,
                                              type, lda, sa, &beta, c, CUDA_R_32F, ldc, sc, batch,
                                              compute, CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS)
    return set_error(status::cublas_error,
                     std::string(what) + ": " +
                         (batch == 1 ? "cublasGemmEx: " : "cublasGemmStridedBatchedEx: ") +
                         bl.status_string(st));
  return status::ok;
}

status gemm_rm(const char* what, bool ta, bool tb, int m, int n, int k, float alpha, const float* a,
               int lda, long long sa, const float* b, int ldb, long long sb, float beta, float* c,
               int ldc, long long sc, int batch) {
  if (m < 0 || n < 0 || k < 0 || batch < 1)
    return bad((std::string(what) + ": negative size or batch < 1").c_str());
  if (m == 0 || n == 0) return status::ok;  // nothing to write
  // cuBLAS is column-major. A row-major matrix is its transpose read column-major, so
  // C = op(A) op(B) (row-major) is C^T = op(B)^T op(A)^T (column-major): gemm_rm_typed swaps
  // the operands and m/n, keeping each operand's own transpose flag, leading dimension and
  // stride. C is float32 in both precisions.
  if (precision_ != matmul_precision::bf16 || !bf16_via_copies())
    return gemm_rm_typed(what, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, beta, c, ldc, sc,
                         batch, false);
  // bf16 through copies: each operand's whole span (strided batches included) rounded once;
  // the leases keep the copies until the product has run (an event on release).
  scratch_lease lease_a(scratch_use::matmul_a), lease_b(scratch_use::matmul_b);
  __nv_bfloat16 *ca = nullptr, *cb = nullptr;
  if (status s = bf16_copy(lease_a, a, operand_span(ta ? k : m, ta ? m : k, lda, sa, batch), &ca);
      s != status::ok)
    return s;
  if (status s = bf16_copy(lease_b, b, operand_span(tb ? n : k, tb ? k : n, ldb, sb, batch), &cb);
      s != status::ok)
    return s;
  return gemm_rm_typed(what, ta, tb, m, n, k, alpha, ca, lda, sa, cb, ldb, sb, beta, c, ldc, sc,
                       batch, true);
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
  const int chunks = (rows + k_column_chunk_rows - 1) / k_column_chunk_rows;
  if (chunks > 65535)
    return record(bad("bias_grad: more than 65535 * 128 rows (the grid's y limit)"));
  scratch_lease lease(scratch_use::column_partials);
  void* p = nullptr;
  if (status s = lease.acquire(sizeof(float) * static_cast<std::size_t>(chunks) * out, &p);
      s != status::ok)
    return record(s);
  float* part = static_cast<float*>(p);
  const int col_blocks = (out + k_threads - 1) / k_threads;
  column_partials_kernel<<<dim3(col_blocks, chunks), k_threads, 0, stream()>>>(part, dy, rows, out);
  if (status s = launched("column_partials_kernel"); s != status::ok) return record(s);
  column_finish_kernel<<<col_blocks, k_threads, 0, stream()>>>(db, part, chunks, out);
  return record(launched("column_finish_kernel"));
}

}  // namespace cohort::gpu::cuda
