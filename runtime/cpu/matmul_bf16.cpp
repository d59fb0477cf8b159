// Matrix products in bf16 with float32 accumulation and output: oneDNN's matmul primitive
// (brgemm kernels on AVX512_BF16 / AMX) where the CPU has bf16 instructions, else the
// portable path: both operands rounded to bf16 (kept as float32, so each product of two of
// them is exact) and multiplied by OpenBLAS's sgemm. Operands are rounded into dense
// per-thread copies; a linear layer's weight is rounded once per forward pass and its copy
// reused by the backward product that needs it (linear_dx).
#include "runtime/cpu/matmul_bf16.hpp"

#include <cblas.h>
#include <omp.h>

#include <atomic>
#include <cstring>
#include <dnnl.hpp>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "runtime/cpu/kernels.hpp"

namespace cohort::cpu {

namespace {

// Bumped by every optimizer step (optim.cpp): a weight copy made before it is stale.
std::atomic<uint64_t> g_param_epoch{0};

// A dense copy of a stored matrix (rs rows of cs elements, ld apart): uint16 bf16 bits on the
// oneDNN path, float32 values rounded to bf16 on the portable path.
struct rounded {
  std::vector<uint16_t> h;
  std::vector<float> f;
  const void* data(bool fast) const {
    return fast ? static_cast<const void*>(h.data()) : static_cast<const void*>(f.data());
  }
};

// Rounds rs rows of cs elements, ld apart, into a dense copy of T (ROUND: to_bf16 or
// round_to_bf16).
template <class T>
void round_rows(std::vector<T>& dst, void (*round)(T*, const float*, int64_t), const float* x,
                int rs, int cs, int ld) {
  const int64_t n = static_cast<int64_t>(rs) * cs;
  if (static_cast<int64_t>(dst.size()) < n) dst.resize(n);
  if (ld == cs) return round(dst.data(), x, n);
  for (int i = 0; i < rs; ++i)
    round(dst.data() + static_cast<int64_t>(i) * cs, x + static_cast<int64_t>(i) * ld, cs);
}

void round_into(rounded& r, bool fast, const float* x, int rs, int cs, int ld) {
  if (fast)
    round_rows(r.h, to_bf16, x, rs, cs, ld);
  else
    round_rows(r.f, round_to_bf16, x, rs, cs, ld);
}

struct weight_copy {
  rounded r;
  int64_t n = 0;
  bool fast = false;
  uint64_t epoch = 0;
};

// One primitive per shape, made on first use (oneDNN's brgemm kernels are generated code:
// creating one costs far more than running it on these sizes).
// The thread count is part of the key: oneDNN fixes it when it creates a primitive (and a
// product's bits can depend on it).
using prim_key = std::tuple<bool, bool, int, int, int, float, float, int>;

// A primitive with its memory objects (pointed at the operands each call) and its
// scratchpad size: the scratchpad is this thread's buffer (scratchpad_mode::user), not an
// allocation per call.
struct prim {
  dnnl::matmul p;
  dnnl::memory a, b, c, scratch;
  std::size_t scratch_bytes = 0;
};

struct onednn {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  std::map<prim_key, prim> prims;
  std::vector<unsigned char> scratch;

  prim& get(bool ta, bool tb, int m, int n, int k, float alpha, float beta, int threads) {
    const prim_key key{ta, tb, m, n, k, alpha, beta, threads};
    auto it = prims.find(key);
    if (it != prims.end()) return it->second;
    using dt = dnnl::memory::data_type;
    using dims = dnnl::memory::dims;
    const dnnl::memory::desc a({m, k}, dt::bf16, ta ? dims{1, m} : dims{k, 1});
    const dnnl::memory::desc b({k, n}, dt::bf16, tb ? dims{1, k} : dims{n, 1});
    const dnnl::memory::desc c({m, n}, dt::f32, dims{n, 1});
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
    if (beta != 0.0f) {
      dnnl::post_ops po;
      po.append_sum(beta);
      attr.set_post_ops(po);
    }
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, eng);
    prim e{dnnl::matmul(pd),
           dnnl::memory(a, eng, nullptr),
           dnnl::memory(b, eng, nullptr),
           dnnl::memory(c, eng, nullptr),
           dnnl::memory(pd.scratchpad_desc(), eng, nullptr),
           pd.scratchpad_desc().get_size()};
    return prims.emplace(key, std::move(e)).first->second;
  }
};

struct thread_state {
  rounded a, b;
  std::vector<float> out;  // a dense result when C's rows are not dense
  std::unordered_map<const float*, weight_copy> weights;
  std::unique_ptr<onednn> dnn;
};

thread_state& state() {
  thread_local thread_state s;
  return s;
}

// C = alpha op(A) op(B) + beta C from dense rounded copies (A stored ta ? k x m : m x k,
// B stored tb ? n x k : k x n).
void multiply(thread_state& s, bool fast, bool ta, bool tb, int m, int n, int k, float alpha,
              const void* a, const void* b, float beta, float* c, int ldc) {
  if (!fast) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n,
                k, alpha, static_cast<const float*>(a), ta ? m : k, static_cast<const float*>(b),
                tb ? k : n, beta, c, ldc);
    return;
  }
  const int want = num_threads();
  if (omp_get_max_threads() != want) omp_set_num_threads(want);
  try {
    if (!s.dnn) s.dnn = std::make_unique<onednn>();
    // oneDNN's brgemm kernels need a dense C: other strides are computed into s.out first.
    const bool dense = ldc == n;
    float* dst = c;
    if (!dense) {
      if (s.out.size() < static_cast<std::size_t>(m) * n)
        s.out.resize(static_cast<std::size_t>(m) * n);
      dst = s.out.data();
    }
    prim& p = s.dnn->get(ta, tb, m, n, k, alpha, dense ? beta : 0.0f, want);
    p.a.set_data_handle(const_cast<void*>(a));
    p.b.set_data_handle(const_cast<void*>(b));
    p.c.set_data_handle(dst);
    if (s.dnn->scratch.size() < p.scratch_bytes) s.dnn->scratch.resize(p.scratch_bytes);
    p.scratch.set_data_handle(s.dnn->scratch.data());
    p.p.execute(s.dnn->strm, {{DNNL_ARG_SRC, p.a},
                              {DNNL_ARG_WEIGHTS, p.b},
                              {DNNL_ARG_DST, p.c},
                              {DNNL_ARG_SCRATCHPAD, p.scratch}});
    s.dnn->strm.wait();
    if (!dense)
      for (int i = 0; i < m; ++i) {
        float* ci = c + static_cast<int64_t>(i) * ldc;
        const float* ti = dst + static_cast<int64_t>(i) * n;
        if (beta == 0.0f)
          std::memcpy(ci, ti, sizeof(float) * n);
        else
          for (int j = 0; j < n; ++j) ci[j] = ti[j] + beta * ci[j];
      }
  } catch (const dnnl::error& e) {
    throw std::runtime_error("bf16 matmul " + std::to_string(m) + "x" + std::to_string(n) + "x" +
                             std::to_string(k) + " (oneDNN): " + e.what());
  }
}

const weight_copy& weight(thread_state& s, bool fast, const float* w, int out, int in,
                          bool refresh) {
  if (s.weights.size() > 4096) s.weights.clear();  // models come and go (tests): stay bounded
  weight_copy& e = s.weights[w];
  const int64_t n = static_cast<int64_t>(out) * in;
  const uint64_t epoch = g_param_epoch.load(std::memory_order_relaxed);
  if (refresh || e.n != n || e.fast != fast || e.epoch != epoch) {
    round_into(e.r, fast, w, out, in, in);
    e.n = n;
    e.fast = fast;
    e.epoch = epoch;
  }
  return e;
}

}  // namespace

namespace detail {

void params_changed() { g_param_epoch.fetch_add(1, std::memory_order_relaxed); }

void gemm_bf16(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
               const float* b, int ldb, float beta, float* c, int ldc) {
  if (m <= 0 || n <= 0) return;
  thread_state& s = state();
  const bool fast = fast_bf16();
  if (k <= 0) {  // no products: C = beta C
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) {
        float& x = c[static_cast<int64_t>(i) * ldc + j];
        x = beta == 0.0f ? 0.0f : beta * x;
      }
    return;
  }
  round_into(s.a, fast, a, ta ? k : m, ta ? m : k, lda);
  round_into(s.b, fast, b, tb ? n : k, tb ? k : n, ldb);
  multiply(s, fast, ta, tb, m, n, k, alpha, s.a.data(fast), s.b.data(fast), beta, c, ldc);
}

void linear_fwd_bf16(float* y, const float* x, const float* w, bool bias, int rows, int in,
                     int out) {
  if (rows <= 0 || out <= 0 || in <= 0) return;
  thread_state& s = state();
  const bool fast = fast_bf16();
  const weight_copy& wc = weight(s, fast, w, out, in, /*refresh=*/true);
  round_into(s.a, fast, x, rows, in, in);
  multiply(s, fast, false, true, rows, out, in, 1.0f, s.a.data(fast), wc.r.data(fast),
           bias ? 1.0f : 0.0f, y, out);
}

void linear_dx_bf16(float* dx, const float* dy, const float* w, int rows, int in, int out) {
  if (rows <= 0 || out <= 0 || in <= 0) return;
  thread_state& s = state();
  const bool fast = fast_bf16();
  const weight_copy& wc = weight(s, fast, w, out, in, /*refresh=*/false);
  round_into(s.a, fast, dy, rows, out, out);
  multiply(s, fast, false, false, rows, in, out, 1.0f, s.a.data(fast), wc.r.data(fast), 0.0f, dx,
           in);
}

}  // namespace detail

}  // namespace cohort::cpu
