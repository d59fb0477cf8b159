// CUDA twin of runtime/cpu/attention.cpp (declared in gpu/cuda_kernels.hpp): causal
// multi-head self-attention, forward and backward, as cuBLAS strided-batched products (at
// the thread's matmul precision) around two row kernels, the causal softmax and its
// backward. Each product batches over the heads of one batch element, or over the batch
// elements of one head, whichever takes fewer calls. The products run over the whole
// T x T square: the softmax makes P exactly 0 above the diagonal (and dS with it), so the
// extra terms add exact zeros.
// Layout of element (bi, h) (row-major, heads contiguous in C, hs = C / NH):
//   Q = qkv + bi*T*3C + h*hs         [T, hs], leading dim 3C; K = Q + C, V = Q + 2C
//   P = att + (bi*NH + h)*T*T        [T, T], contiguous (scratch, holding dP then dS, alike)
//   Y = out + bi*T*C + h*hs          [T, hs], leading dim C (dout alike)
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cmath>
#include <limits>
#include <string>

#include "gpu/cuda_common.cuh"
#include "gpu/cuda_kernels.hpp"

namespace cohort::gpu::cuda {

// The launch geometry, block reductions and host helpers of gpu/cuda_common.cuh.
using namespace detail;

namespace {

// One block per row (bh, i) of att [B*NH*T, T]: p = softmax(s[0..i]), exactly 0 after i, as
// the CPU twin's causal_softmax_row. Each thread keeps the same j's through the three
// passes, so it only reads what it wrote itself; the block reductions are the only
// cross-thread steps.
__global__ void causal_softmax_kernel(float* att, int t) {
  const int64_t row = blockIdx.x;
  const int i = static_cast<int>(row % t);
  float* a = att + row * t;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j <= i; j += blockDim.x) mx = fmaxf(mx, a[j]);
  mx = block_max(mx);
  float sum = 0.0f;
  for (int j = threadIdx.x; j <= i; j += blockDim.x) {
    const float e = expf(a[j] - mx);
    a[j] = e;
    sum += e;
  }
  const float inv = 1.0f / block_sum(sum);
  for (int j = threadIdx.x; j < t; j += blockDim.x) a[j] = j <= i ? a[j] * inv : 0.0f;
}

// One block per row (bh, i) of ds, which holds dP = dY V^T on entry: the softmax backward
// with the score scale folded in, dS = scale * P (dP - <P_i, dP_i>), 0 above the diagonal,
// as the CPU twin's softmax_bwd_row. Same thread ownership of j as above.
__global__ void causal_softmax_bwd_kernel(float* ds, const float* att, int t, float sc) {
  const int64_t row = blockIdx.x;
  const int i = static_cast<int>(row % t);
  float* d = ds + row * t;
  const float* p = att + row * t;
  float dot = 0.0f;
  for (int j = threadIdx.x; j <= i; j += blockDim.x) dot += p[j] * d[j];
  dot = block_sum(dot);
  for (int j = threadIdx.x; j < t; j += blockDim.x) d[j] = j <= i ? sc * p[j] * (d[j] - dot) : 0.0f;
}

// Where element (bi, h) starts, per step of bi or of h, in each buffer: qkv (Q; K and V
// follow at +C and +2C), att and scratch, and out / dout.
struct strides {
  long long qkv = 0, att = 0, io = 0;
};

// The products batch over one of (batch element, head) and loop over the other, whichever
// needs fewer cuBLAS calls; both are a fixed stride apart in every buffer.
struct attention_plan {
  int hs = 0;
  float scale = 0.0f;
  int rows = 0;   // B*NH*T, the rows of att (one block each in the row kernels)
  int loops = 0;  // calls per product
  int batch = 0;  // products per call
  strides outer;  // the step of one loop iteration
  strides inner;  // the stride between the products of one call
};

status plan_attention(const char* what, int b, int t, int c, int nh, attention_plan* out) {
  if (b < 0 || t < 0 || c <= 0 || nh <= 0 || c % nh != 0)
    return bad(
        (std::string(what) + ": need b, t >= 0, c > 0, nh > 0 and c divisible by nh").c_str());
  const int64_t rows = static_cast<int64_t>(b) * nh * t;
  if (rows > std::numeric_limits<int>::max())
    return bad((std::string(what) + ": b*nh*t beyond the grid limit (2^31 - 1)").c_str());
  const long long tt = static_cast<long long>(t) * t;
  out->hs = c / nh;
  out->scale = 1.0f / sqrtf(static_cast<float>(out->hs));
  out->rows = static_cast<int>(rows);
  const strides per_b{static_cast<long long>(t) * 3 * c, nh * tt, static_cast<long long>(t) * c};
  const strides per_h{out->hs, tt, out->hs};
  const bool loop_b = b <= nh;
  out->loops = loop_b ? b : nh;
  out->batch = loop_b ? nh : b;
  out->outer = loop_b ? per_b : per_h;
  out->inner = loop_b ? per_h : per_b;
  return status::ok;
}

// In bf16 (through copies) a product's operands are bf16 copies of whole buffers, each made
// once per call where the buffer is final (qkv and dY on entry, P after the softmax, dS after
// its backward): converting each product's strided span instead re-read a head's whole qkv
// and att for every head (measured on the H200: 25 ms an attention backward at GPT-2 small's
// shape, 5.5x the FP32 one). In fp32, or with COHORT_CUDA_BF16=fast16bf, the float32 buffers
// go to gemm_rm as they are.
class operands {
 public:
  operands() : copies_(matmul_precision_now() == matmul_precision::bf16 && bf16_via_copies()) {}

  /// Makes a bf16 copy of X[0..n) for the products that follow (a no-op in fp32).
  status add(const float* x, int64_t n) {
    if (!copies_ || n <= 0) return status::ok;
    if (count_ == k_max) return bad("attention: more than four bf16 copies");
    entry& e = entries_[count_];
    void* p = nullptr;
    if (status s = e.lease.acquire(static_cast<std::size_t>(n) * 2, &p); s != status::ok) return s;
    e.base = x;
    e.n = n;
    e.copy = p;
    ++count_;
    return to_bf16(p, x, n);
  }

  /// The product C = op(A) op(B) over buffers given to add() (bf16 copies) or as float32.
  status product(const char* what, bool ta, bool tb, int m, int n, int k, float alpha,
                 const float* a, int lda, long long sa, const float* b, int ldb, long long sb,
                 float c_beta, float* c, int ldc, long long sc, int batch) const {
    if (!copies_)
      return gemm_rm(what, ta, tb, m, n, k, alpha, a, lda, sa, b, ldb, sb, c_beta, c, ldc, sc,
                     batch);
    const void* ca = find(a);
    const void* cb = find(b);
    if (ca == nullptr || cb == nullptr) return bad("attention: an operand with no bf16 copy");
    return gemm_rm_typed(what, ta, tb, m, n, k, alpha, ca, lda, sa, cb, ldb, sb, c_beta, c, ldc, sc,
                         batch, true);
  }

 private:
  static constexpr int k_max = 4;
  struct entry {
    explicit entry(scratch_use u) : lease(u) {}
    scratch_lease lease;
    const float* base = nullptr;
    int64_t n = 0;
    void* copy = nullptr;
  };
  const void* find(const float* p) const {
    for (int i = 0; i < count_; ++i)
      if (p >= entries_[i].base && p < entries_[i].base + entries_[i].n)
        return static_cast<const char*>(entries_[i].copy) + (p - entries_[i].base) * 2;
    return nullptr;
  }
  bool copies_;
  int count_ = 0;
  entry entries_[k_max] = {entry(scratch_use::bf16_0), entry(scratch_use::bf16_1),
                           entry(scratch_use::bf16_2), entry(scratch_use::bf16_3)};
};

}  // namespace

status attention_fwd(float* out, float* att, const float* qkv, int b, int t, int c, int nh) {
  attention_plan pl;
  if (status s = plan_attention("attention_fwd", b, t, c, nh, &pl); s != status::ok)
    return record(s);
  if (pl.rows == 0) return record(status::ok);
  const int ld3 = 3 * c;
  const strides& o = pl.outer;
  const strides& in = pl.inner;
  const int64_t n_qkv = static_cast<int64_t>(b) * t * ld3;
  const int64_t n_att = static_cast<int64_t>(pl.rows) * t;
  operands ops;
  if (status s = ops.add(qkv, n_qkv); s != status::ok) return record(s);
  for (int i = 0; i < pl.loops; ++i) {
    const float* q = qkv + i * o.qkv;
    // S = scale * Q K^T into att (every entry; the softmax fixes the upper triangle).
    if (status s =
            ops.product("attention_fwd S", false, true, t, t, pl.hs, pl.scale, q, ld3, in.qkv,
                        q + c, ld3, in.qkv, 0.0f, att + i * o.att, t, in.att, pl.batch);
        s != status::ok)
      return record(s);
  }
  causal_softmax_kernel<<<pl.rows, k_threads, 0, stream()>>>(att, t);
  if (status s = launched("causal_softmax_kernel"); s != status::ok) return record(s);
  if (status s = ops.add(att, n_att); s != status::ok) return record(s);
  for (int i = 0; i < pl.loops; ++i) {
    // Y = P V, written into each head's columns of out.
    if (status s = ops.product("attention_fwd Y", false, false, t, pl.hs, t, 1.0f, att + i * o.att,
                               t, in.att, qkv + i * o.qkv + 2 * c, ld3, in.qkv, 0.0f,
                               out + i * o.io, c, in.io, pl.batch);
        s != status::ok)
      return record(s);
  }
  return record(status::ok);
}

status attention_bwd(float* dqkv, float* scratch, const float* dout, const float* qkv,
                     const float* att, int b, int t, int c, int nh) {
  attention_plan pl;
  if (status s = plan_attention("attention_bwd", b, t, c, nh, &pl); s != status::ok)
    return record(s);
  if (pl.rows == 0) return record(status::ok);
  const int ld3 = 3 * c;
  const strides& o = pl.outer;
  const strides& in = pl.inner;
  const int64_t n_qkv = static_cast<int64_t>(b) * t * ld3;
  const int64_t n_io = static_cast<int64_t>(b) * t * c;
  const int64_t n_att = static_cast<int64_t>(pl.rows) * t;
  operands ops;
  if (status s = ops.add(qkv, n_qkv); s != status::ok) return record(s);
  if (status s = ops.add(dout, n_io); s != status::ok) return record(s);
  if (status s = ops.add(att, n_att); s != status::ok) return record(s);
  for (int i = 0; i < pl.loops; ++i) {
    // dP = dY V^T into scratch.
    if (status s = ops.product("attention_bwd dP", false, true, t, t, pl.hs, 1.0f, dout + i * o.io,
                               c, in.io, qkv + i * o.qkv + 2 * c, ld3, in.qkv, 0.0f,
                               scratch + i * o.att, t, in.att, pl.batch);
        s != status::ok)
      return record(s);
  }
  causal_softmax_bwd_kernel<<<pl.rows, k_threads, 0, stream()>>>(scratch, att, t, pl.scale);
  if (status s = launched("causal_softmax_bwd_kernel"); s != status::ok) return record(s);
  if (status s = ops.add(scratch, n_att); s != status::ok) return record(s);
  for (int i = 0; i < pl.loops; ++i) {
    const float* q = qkv + i * o.qkv;
    const float* dy = dout + i * o.io;
    const float* ds = scratch + i * o.att;
    const float* p = att + i * o.att;
    float* dq = dqkv + i * o.qkv;
    // dQ = dS K; dK = dS^T Q; dV = P^T dY (the scale is already in dS). beta = 0: every
    // element of dqkv is assigned, whatever it held.
    if (status s = ops.product("attention_bwd dQ", false, false, t, pl.hs, t, 1.0f, ds, t, in.att,
                               q + c, ld3, in.qkv, 0.0f, dq, ld3, in.qkv, pl.batch);
        s != status::ok)
      return record(s);
    if (status s = ops.product("attention_bwd dK", true, false, t, pl.hs, t, 1.0f, ds, t, in.att, q,
                               ld3, in.qkv, 0.0f, dq + c, ld3, in.qkv, pl.batch);
        s != status::ok)
      return record(s);
    if (status s = ops.product("attention_bwd dV", true, false, t, pl.hs, t, 1.0f, p, t, in.att, dy,
                               c, in.io, 0.0f, dq + 2 * c, ld3, in.qkv, pl.batch);
        s != status::ok)
      return record(s);
  }
  return record(status::ok);
}

}  // namespace cohort::gpu::cuda
