// Layers as thin, stateless wrappers over their device's kernels (runtime/nn/device.hpp, the
// contract of runtime/cpu/kernels.hpp): each binds views of its parameters and gradients and
// its device, and runs forward / backward on caller-owned
// activation buffers (models pre-allocate those once). Activation gradients are assigned,
// parameter gradients accumulated; backward tells a reporter which parameter-gradient spans
// are final, highest addresses first. Owns no memory and no model structure.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>

#include "runtime/nn/device.hpp"
#include "runtime/nn/tensor.hpp"

namespace cohort::nn {

/// The one "these gradients are final" signal, grads ready, on its whole way from a layer's
/// backward to the bucket engine (docs/architecture.md, "One gradient's walk"):
///   layer backward --grads_ready_span--> model::grads_ready --grads_ready_fn--> trainer /
///   stage_trainer (bitwise: into the fixed-point sum) --> seat --> DP group -->
///   bucket_engine::mark_ready.
/// grads_ready_fn: elements [offset, offset + count) of the flat gradient buffer (the
/// reduction buffer from the trainer on) are final for this step.
using grads_ready_fn = std::function<void(std::size_t offset, std::size_t count)>;
/// The same signal where a layer gives it: elements [first, first + count) inside the
/// layer's own dW / db views (the model turns the pointer into an offset). An empty function
/// means nobody listens: layers then skip the calls, never the work.
using grads_ready_span = std::function<void(const float* first, int64_t count)>;

/// Reports two gradients one kernel finished together: as one span when `hi` directly
/// follows `lo` in memory (so nothing is seen half reported), else `hi` first (descending).
inline void report_pair(const grads_ready_span& report, const tensor& lo, const tensor& hi) {
  if (!report) return;
  if (lo.data() + lo.numel() == hi.data()) return report(lo.data(), lo.numel() + hi.numel());
  report(hi.data(), hi.numel());
  report(lo.data(), lo.numel());
}

/// y = x W^T + b with W [out, in] (nn.Linear); bias optional.
struct linear {
  tensor w, b, dw, db;  ///< b and db empty when the layer has no bias
  int in = 0, out = 0;
  device* dev = &cpu_device();  ///< where w, b and the activations live

  /// Rows of W per dW chunk in backward on the CPU: ceil(k_chunk_elements / in) rounded up
  /// to a multiple of k_chunk_row_multiple (at least one multiple), or all `out` rows when
  /// that is not fewer. A device that wants whole matrices (device::chunked_weight_grads()
  /// false: a GPU, where one large product is far faster than many thin ones) takes all
  /// `out` rows in one chunk. Chunks are cut from the last row down, so the lowest chunk (computed
  /// last) takes what is left and the tail after the last report is short. A pure function
  /// of the shape, never of whether a reporter listens: chunking decides which sgemm
  /// computes an element and so, possibly, its bits, and a run with a hook must reproduce
  /// a run without one exactly.
  static int dw_chunk_rows(int out, int in);
  /// ~32K elements (128 KiB) a chunk: fine enough that a 256 KiB bucket fills while
  /// backward still runs, coarse enough that re-packing x for every sgemm costs little.
  static constexpr int64_t k_chunk_elements = 32768;
  /// OpenBLAS's sgemm runs its full-width kernels only when these rows are a multiple of
  /// 16: chunks of 43 rows were up to 40% slower than one whole-matrix sgemm, chunks of 48
  /// or 64 within 5-15% (dW of 256x784 and 512x128 at batch 128..2048, OpenBLAS 0.3.21,
  /// one thread, 2-vCPU EPYC VM, 2026-11).
  static constexpr int k_chunk_row_multiple = 16;

  void forward(float* y, const float* x, int rows) const {
    dev->linear_fwd(y, x, w.data(), b.empty() ? nullptr : b.data(), rows, in, out);
  }
  /// db and dW accumulated, dx assigned (skipped when null): db first, then dW in row
  /// chunks from the LAST rows to the first, each reported right after its sgemm, so spans
  /// come out in descending addresses (bias after weight in memory); dx last, as nothing
  /// waits on it for readiness.
  void backward(float* dx, const float* dy, const float* x, int rows,
                const grads_ready_span& report = {});
};

inline int linear::dw_chunk_rows(int out, int in) {
  const int64_t m = k_chunk_row_multiple;
  const int64_t want = std::max<int64_t>(1, (k_chunk_elements + in - 1) / std::max(1, in));
  const int64_t rows = (want + m - 1) / m * m;
  return static_cast<int>(std::min<int64_t>(rows, std::max(1, out)));
}

inline void linear::backward(float* dx, const float* dy, const float* x, int rows,
                             const grads_ready_span& report) {
  if (!db.empty()) {
    // Column sums of dy added row by row, the order cpu::linear_bwd uses.
    dev->bias_grad(db.data(), dy, rows, out);
    if (report) report(db.data(), out);
  }
  // dW[r0, r1) += dy[:, r0:r1]^T x, last rows first; the lowest chunk takes the remainder.
  const int step = dev->chunked_weight_grads() ? dw_chunk_rows(out, in) : std::max(1, out);
  for (int r1 = out; r1 > 0;) {
    const int r0 = std::max(0, r1 - step);
    float* g = dw.data() + static_cast<int64_t>(r0) * in;
    dev->gemm(true, false, r1 - r0, in, rows, 1.0f, dy + r0, out, x, in, 1.0f, g, in);
    if (report) report(g, static_cast<int64_t>(r1 - r0) * in);
    r1 = r0;
  }
  if (dx) dev->linear_dx(dx, dy, w.data(), rows, in, out);
}

/// LayerNorm over the last dimension with affine weight and bias (nn.LayerNorm).
struct layernorm {
  tensor w, b, dw, db;
  int c = 0;
  float eps = 1e-5f;
  device* dev = &cpu_device();

  /// mean and rstd [rows] are saved for backward.
  void forward(float* y, float* mean, float* rstd, const float* x, int rows) const {
    dev->layernorm_fwd(y, mean, rstd, x, w.data(), b.data(), rows, c, eps);
  }
  /// dx assigned, dW and db accumulated; then reports them: one span when db follows dW
  /// in memory (one kernel writes both), else db then dW.
  void backward(float* dx, const float* dy, const float* x, const float* mean, const float* rstd,
                int rows, const grads_ready_span& report = {}) {
    dev->layernorm_bwd(dx, dw.data(), db.data(), dy, x, w.data(), mean, rstd, rows, c);
    report_pair(report, dw, db);
  }
};

/// Token + position embedding (nanoGPT's wte and wpe).
struct embedding {
  tensor wte, wpe, dwte, dwpe;
  int c = 0;
  device* dev = &cpu_device();

  void forward(float* out, const int32_t* ids, int b, int t) const {
    dev->embedding_fwd(out, ids, wte.data(), wpe.data(), b, t, c);
  }
  /// dwte and dwpe accumulated; then reports them: one span when dwpe follows dwte in
  /// memory (one kernel writes both), else dwpe then dwte.
  void backward(const float* dout, const int32_t* ids, int b, int t,
                const grads_ready_span& report = {}) {
    dev->embedding_bwd(dwte.data(), dwpe.data(), dout, ids, b, t, c);
    report_pair(report, dwte, dwpe);
  }
};

}  // namespace cohort::nn
