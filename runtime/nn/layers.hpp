// Layers of the CPU path as thin, stateless wrappers over gpu/kernels.hpp: each binds
// views of its parameters and gradients and runs forward / backward on caller-owned
// activation buffers (models pre-allocate those once). Activation gradients are assigned,
// parameter gradients accumulated. Owns no memory and no model structure.
#pragma once
#include "gpu/kernels.hpp"
#include "runtime/nn/tensor.hpp"

namespace cohort::nn {

/// y = x W^T + b with W [out, in] (nn.Linear); bias optional.
struct linear {
  tensor w, b, dw, db;  ///< b and db empty when the layer has no bias
  int in = 0, out = 0;

  void forward(float* y, const float* x, int rows) const {
    gpu::cpu::linear_fwd(y, x, w.data(), b.empty() ? nullptr : b.data(), rows, in, out);
  }
  /// dx (assigned; skipped when null); dW, db accumulated.
  void backward(float* dx, const float* dy, const float* x, int rows) {
    gpu::cpu::linear_bwd(dx, dw.data(), db.empty() ? nullptr : db.data(), dy, x, w.data(), rows, in,
                         out);
  }
};

/// LayerNorm over the last dimension with affine weight and bias (nn.LayerNorm).
struct layernorm {
  tensor w, b, dw, db;
  int c = 0;
  float eps = 1e-5f;

  /// mean and rstd [rows] are saved for backward.
  void forward(float* y, float* mean, float* rstd, const float* x, int rows) const {
    gpu::cpu::layernorm_fwd(y, mean, rstd, x, w.data(), b.data(), rows, c, eps);
  }
  void backward(float* dx, const float* dy, const float* x, const float* mean, const float* rstd,
                int rows) {
    gpu::cpu::layernorm_bwd(dx, dw.data(), db.data(), dy, x, w.data(), mean, rstd, rows, c);
  }
};

/// Token + position embedding (nanoGPT's wte and wpe).
struct embedding {
  tensor wte, wpe, dwte, dwpe;
  int c = 0;

  void forward(float* out, const int32_t* ids, int b, int t) const {
    gpu::cpu::embedding_fwd(out, ids, wte.data(), wpe.data(), b, t, c);
  }
  void backward(const float* dout, const int32_t* ids, int b, int t) {
    gpu::cpu::embedding_bwd(dwte.data(), dwpe.data(), dout, ids, b, t, c);
  }
};

}  // namespace cohort::nn
