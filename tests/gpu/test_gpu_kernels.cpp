// Every CUDA kernel (gpu/cuda_kernels.hpp) against its CPU twin (runtime/cpu/kernels.hpp) on
// random inputs with the same arguments, in both matmul precisions where products are
// involved, plus the device-memory helpers (pinned memory, asynchronous copies) and the
// device pool over real device memory. Runs only where a CUDA device exists;
// gpu_test_main.cpp skips the whole binary (exit 77) otherwise.
#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "gpu/cuda_kernels.hpp"
#include "gpu/device.hpp"
#include "gpu/device_pool.hpp"
#include "runtime/core/rng.hpp"
#include "runtime/cpu/kernels.hpp"

namespace g = cohort::gpu;
namespace cpu = cohort::cpu;
namespace cu = cohort::gpu::cuda;

namespace {

constexpr double k_tol = 1e-4;         // elementwise and row-wise ops
constexpr double k_tol_reduce = 1e-3;  // long float reductions (gemm, column sums)
// Products in matmul_precision::bf16: cuBLAS rounds both inputs to bfloat16 (8-bit
// significand, unit roundoff u = 2^-8 rounding to nearest, 2^-7 truncating), so each term of
// a dot product carries a relative error up to ~2u; over K random-sign terms the errors add
// like sqrt(K) while the dot product itself grows like sqrt(K), so the error is ~u of the
// output's scale whatever K is, and chained products (attention's backward) add a few u.
// Emulating that rounding on the CPU for this file's shapes (200 seeds; 40 for attention)
// needed at most 2^-7.5 in check_close's measure when rounding to nearest, 2^-6.85 when
// truncating (attention's dqkv). 2^-5 leaves a margin of 3.6x over the worst of those.
constexpr double k_tol_bf16 = 1.0 / 32;
// And bf16 must visibly round: the same measure is at least 2^-10 in that emulation (2^-13
// if cuBLAS takes TF32 instead, which CUBLAS_COMPUTE_32F_FAST_16BF allows), while exact FP32
// products stay near 1e-6 of the CPU's. 2^-14 separates the two.
constexpr double k_reduced_floor = 1.0 / 16384;

/// Sets the calling thread's matmul precision for one scope (tests leave it as they found it).
class precision_scope {
 public:
  explicit precision_scope(cu::matmul_precision p) : prev_(cu::matmul_precision_now()) {
    cu::set_matmul_precision(p);
  }
  ~precision_scope() { cu::set_matmul_precision(prev_); }
  precision_scope(const precision_scope&) = delete;
  precision_scope& operator=(const precision_scope&) = delete;

 private:
  cu::matmul_precision prev_;
};

struct precision_case {
  cu::matmul_precision p;
  const char* name;
};
constexpr precision_case k_precisions[] = {{cu::matmul_precision::fp32, "fp32"},
                                           {cu::matmul_precision::bf16, "bf16"}};
/// The tolerance of a product-bearing output: its fp32 tolerance, or k_tol_bf16.
double tol_for(const precision_case& pc, double fp32_tol) {
  return pc.p == cu::matmul_precision::bf16 ? k_tol_bf16 : fp32_tol;
}

std::vector<float> randn(std::size_t n, uint64_t seed, float scale = 1.0f) {
  cohort::rng r(cohort::hash_coords(seed, n));
  std::vector<float> v(n);
  for (auto& x : v) x = r.normal() * scale;
  return v;
}

std::vector<int32_t> rand_ids(std::size_t n, int below, uint64_t seed) {
  cohort::rng r(cohort::hash_coords(seed, n, 7));
  std::vector<int32_t> v(n);
  for (auto& x : v) x = static_cast<int32_t>(r.below(below));
  return v;
}

/// A device copy of a host vector; freed at scope exit.
template <class T>
class dev {
 public:
  explicit dev(const std::vector<T>& host) : n_(host.size()) {
    REQUIRE(g::device_malloc(&p_, bytes()) == g::status::ok);
    REQUIRE(g::copy_to_device(p_, host.data(), bytes()) == g::status::ok);
  }
  ~dev() { (void)g::device_free(p_); }
  dev(const dev&) = delete;
  dev& operator=(const dev&) = delete;
  T* get() { return static_cast<T*>(p_); }
  std::vector<T> host() const {
    std::vector<T> h(n_);
    REQUIRE(g::copy_to_host(h.data(), p_, bytes()) == g::status::ok);
    return h;
  }

 private:
  std::size_t bytes() const { return n_ * sizeof(T); }
  std::size_t n_;
  void* p_ = nullptr;
};

/// The smallest rtol check_close would accept: max over i of |got - want| / (|want| +
/// max|want|) (infinite for NaN).
double needed_rtol(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  double scale = 0.0;
  for (float w : want) scale = std::max(scale, static_cast<double>(std::fabs(w)));
  double worst = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double r = err / (std::fabs(want[i]) + scale);
    if (std::isnan(err)) return std::numeric_limits<double>::infinity();
    worst = std::max(worst, r);
  }
  return worst;
}

/// Compares a product-bearing output at precision `pc`; in bf16 also requires the rounding
/// to be visible (needed_rtol >= k_reduced_floor), which proves the op honours the setting.
void check_product(const std::vector<float>& got, const std::vector<float>& want,
                   const precision_case& pc, double fp32_tol, const std::string& what);

/// Bit-for-bit equality (memcmp), with the first differing element when not.
void check_bits(const std::vector<float>& got, const std::vector<float>& want,
                const std::string& what) {
  REQUIRE(got.size() == want.size());
  std::size_t first = got.size();
  for (std::size_t i = 0; i < got.size() && first == got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) first = i;
  INFO(what << ": first differing bits at " << first << " of " << got.size());
  CHECK(first == got.size());
}

/// |got - want| <= rtol * (|want| + max|want|) elementwise: relative for large entries, and
/// relative to the vector's scale for entries that cancel to near zero. NaN always fails.
void check_close(const std::vector<float>& got, const std::vector<float>& want, double rtol,
                 const std::string& what) {
  REQUIRE(got.size() == want.size());
  double scale = 0.0;
  for (float w : want) scale = std::max(scale, static_cast<double>(std::fabs(w)));
  std::size_t bad = 0, first = 0;
  double worst = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(err <= rtol * (std::fabs(want[i]) + scale))) {
      if (bad++ == 0) first = i;
    }
    if (err > worst || std::isnan(err)) worst = err;
  }
  INFO(what << ": " << bad << " of " << got.size() << " outside rtol " << rtol << "; first at "
            << first << " (got " << (bad ? got[first] : 0.0f) << ", want "
            << (bad ? want[first] : 0.0f) << "); max abs error " << worst);
  CHECK(bad == 0);
}

void check_product(const std::vector<float>& got, const std::vector<float>& want,
                   const precision_case& pc, double fp32_tol, const std::string& what) {
  const std::string tag = what + " [" + pc.name + "]";
  check_close(got, want, tol_for(pc, fp32_tol), tag);
  if (pc.p == cu::matmul_precision::bf16) {
    INFO(tag << ": deviation from the FP32 CPU twin " << needed_rtol(got, want)
             << ", below what bf16 inputs give: the product ran in FP32");
    CHECK(needed_rtol(got, want) >= k_reduced_floor);
  }
}

void require_ok(g::status s) {
  INFO(g::status_string(s) << ": " << g::last_error_message());
  REQUIRE(s == g::status::ok);
}

/// A CUDA stream for one test; destroyed (after draining) at scope exit, and the thread's
/// current stream restored to the default. A blocking stream (cudaStreamCreate): its work is
/// ordered after the synchronous copies of `dev`, which run on the legacy default stream.
class test_stream {
 public:
  test_stream() { REQUIRE(cudaStreamCreate(&s_) == cudaSuccess); }
  ~test_stream() {
    (void)cudaStreamSynchronize(s_);
    (void)cudaStreamDestroy(s_);
    g::set_stream(nullptr);
  }
  test_stream(const test_stream&) = delete;
  test_stream& operator=(const test_stream&) = delete;
  void* get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

}  // namespace

TEST_CASE("device info of every device") {
  const int n = g::device_count();
  REQUIRE(n > 0);
  for (int i = 0; i < n; ++i) {
    g::device_info info;
    require_ok(g::device_info_of(i, &info));
    MESSAGE("device " << i << ": " << info.name << ", cc " << info.cc_major << "." << info.cc_minor
                      << ", " << (info.total_bytes >> 20) << " MiB");
    CHECK(!info.name.empty());
    CHECK(info.total_bytes > 0);
    CHECK(info.free_bytes <= info.total_bytes);
    CHECK(info.multiprocessors > 0);
  }
  require_ok(g::set_device(0));
}

TEST_CASE("gemm: all transpose combinations, padded leading dims, alpha and beta") {
  const int m = 37, n = 29, k = 45, pad = 3;
  for (const precision_case& pc : k_precisions) {
    precision_scope scope(pc.p);
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb) {
        // Row-major storage: A is m x k (k x m when transposed), B is k x n (n x k).
        const int a_rows = ta ? k : m, a_cols = ta ? m : k;
        const int b_rows = tb ? n : k, b_cols = tb ? k : n;
        const int lda = a_cols + pad, ldb = b_cols + pad, ldc = n + pad;
        auto a = randn(static_cast<std::size_t>(a_rows) * lda, 1 + ta);
        auto b = randn(static_cast<std::size_t>(b_rows) * ldb, 3 + tb);
        auto c = randn(static_cast<std::size_t>(m) * ldc, 5);
        dev<float> da(a), db(b), dc(c);
        require_ok(
            cu::gemm(ta, tb, m, n, k, 0.7f, da.get(), lda, db.get(), ldb, 0.3f, dc.get(), ldc));
        cpu::gemm(ta, tb, m, n, k, 0.7f, a.data(), lda, b.data(), ldb, 0.3f, c.data(), ldc);
        check_product(dc.host(), c, pc, k_tol_reduce,
                      "gemm ta=" + std::to_string(ta) + " tb=" + std::to_string(tb));
      }
  }
}

TEST_CASE("matmul precision: fp32 is exact FP32, bf16 rounds the inputs and accumulates in FP32") {
  // Closed form: A = 1 + 2^-12 everywhere, B = 1, k = 2056. In FP32 every partial sum
  // j * (1 + 2^-12) is exact (j * 4097 < 2^24), so C = 2056 * 4097 / 4096 = 2056.501953125
  // exactly; TF32 (11-bit significand) or bf16 (8-bit) inputs round 1 + 2^-12 to 1, and an
  // FP32 accumulation of 2056 ones is exactly 2056 (not a bf16 number: its neighbours are
  // 2048 and 2064, so a bf16 accumulation could not give it). Shapes are multiples of 8 so
  // the tensor-core kernels apply.
  const int m = 64, n = 64, k = 2056;
  std::vector<float> a(static_cast<std::size_t>(m) * k, 1.0f + 1.0f / 4096), b(k * n, 1.0f),
      c(m * n, -1.0f);
  dev<float> da(a), db(b), dc(c);
  CHECK(cu::matmul_precision_now() == cu::matmul_precision::fp32);  // the default
  {
    precision_scope scope(cu::matmul_precision::fp32);
    require_ok(cu::gemm(false, false, m, n, k, 1.0f, da.get(), k, db.get(), n, 0.0f, dc.get(), n));
    const auto got = dc.host();
    CHECK(std::all_of(got.begin(), got.end(), [](float v) { return v == 2056.501953125f; }));
    MESSAGE("fp32: C[0] = " << got[0]);
  }
  {
    precision_scope scope(cu::matmul_precision::bf16);
    require_ok(cu::gemm(false, false, m, n, k, 1.0f, da.get(), k, db.get(), n, 0.0f, dc.get(), n));
    const auto got = dc.host();
    CHECK(std::all_of(got.begin(), got.end(), [](float v) { return v == 2056.0f; }));
    MESSAGE("bf16: C[0] = " << got[0]);
  }
  // Per thread: another thread starts at fp32 and its setting does not leak here.
  cu::matmul_precision seen = cu::matmul_precision::bf16;
  std::thread([&] {
    seen = cu::matmul_precision_now();
    cu::set_matmul_precision(cu::matmul_precision::bf16);
  }).join();
  CHECK(seen == cu::matmul_precision::fp32);
  CHECK(cu::matmul_precision_now() == cu::matmul_precision::fp32);
}

TEST_CASE("linear_fwd and linear_bwd, with and without optional outputs") {
  const int rows = 33, in = 47, out = 19;
  auto x = randn(static_cast<std::size_t>(rows) * in, 11);
  auto w = randn(static_cast<std::size_t>(out) * in, 12, 0.2f);
  auto b = randn(out, 13);
  for (const precision_case& pc : k_precisions) {
    precision_scope scope(pc.p);
    for (int with_bias = 0; with_bias < 2; ++with_bias) {
      std::vector<float> y(static_cast<std::size_t>(rows) * out, 0.0f);
      dev<float> dx_(x), dw_(w), db_(b), dy_(y);
      require_ok(cu::linear_fwd(dy_.get(), dx_.get(), dw_.get(), with_bias ? db_.get() : nullptr,
                                rows, in, out));
      cpu::linear_fwd(y.data(), x.data(), w.data(), with_bias ? b.data() : nullptr, rows, in, out);
      check_product(dy_.host(), y, pc, k_tol_reduce,
                    "linear_fwd bias=" + std::to_string(with_bias));
    }
    auto gy = randn(static_cast<std::size_t>(rows) * out, 14);
    for (int full = 0; full < 2; ++full) {
      // Parameter gradients start non-zero: they must be accumulated, not assigned. dx starts
      // as NaN when it is computed: it must be assigned.
      auto gw = randn(w.size(), 15), gb = randn(b.size(), 16);
      std::vector<float> gx(x.size(), full ? std::numeric_limits<float>::quiet_NaN() : 0.0f);
      dev<float> d_gx(gx), d_gw(gw), d_gb(gb), d_gy(gy), d_x(x), d_w(w);
      require_ok(cu::linear_bwd(full ? d_gx.get() : nullptr, d_gw.get(),
                                full ? d_gb.get() : nullptr, d_gy.get(), d_x.get(), d_w.get(), rows,
                                in, out));
      cpu::linear_bwd(full ? gx.data() : nullptr, gw.data(), full ? gb.data() : nullptr, gy.data(),
                      x.data(), w.data(), rows, in, out);
      check_product(d_gw.host(), gw, pc, k_tol_reduce, "linear_bwd dw");
      // db is bias_grad: FP32 sums in either precision (unchanged when null).
      check_close(d_gb.host(), gb, k_tol_reduce, std::string("linear_bwd db [") + pc.name + "]");
      if (full)
        check_product(d_gx.host(), gx, pc, k_tol_reduce, "linear_bwd dx");
      else
        check_bits(d_gx.host(), gx, "linear_bwd dx untouched when null");
    }
  }
}

TEST_CASE("bias_grad: column sums accumulated onto db, the same bits every run") {
  // Magnitudes spread over 1e-3..1e3; rows across several 128-row chunks (two passes).
  for (int rows : {1, 37, 1000}) {
    const int out = 300;  // more than one block of threads
    auto dy = randn(static_cast<std::size_t>(rows) * out, 101);
    for (std::size_t i = 0; i < dy.size(); ++i)
      dy[i] *= std::pow(10.0f, static_cast<float>(static_cast<int>(i % 7) - 3));
    auto db = randn(out, 102);
    dev<float> d_dy(dy), d_db(db), d_db2(db);
    require_ok(cu::bias_grad(d_db.get(), d_dy.get(), rows, out));
    require_ok(cu::bias_grad(d_db2.get(), d_dy.get(), rows, out));
    cpu::bias_grad(db.data(), dy.data(), rows, out);
    check_close(d_db.host(), db, k_tol, "bias_grad rows=" + std::to_string(rows));
    check_bits(d_db2.host(), d_db.host(), "bias_grad twice, rows=" + std::to_string(rows));
  }
}

TEST_CASE("relu, gelu, scale, add_inplace") {
  const int64_t n = 100003;  // not a multiple of the block size
  auto x = randn(n, 21, 2.0f), dy = randn(n, 22);
  std::vector<float> y(n), dx(n);
  dev<float> d_x(x), d_dy(dy), d_y(y), d_dx(dx);

  require_ok(cu::relu_fwd(d_y.get(), d_x.get(), n));
  cpu::relu_fwd(y.data(), x.data(), n);
  check_close(d_y.host(), y, 0.0, "relu_fwd");  // a select: bit-exact
  require_ok(cu::relu_bwd(d_dx.get(), d_dy.get(), d_x.get(), n));
  cpu::relu_bwd(dx.data(), dy.data(), x.data(), n);
  check_close(d_dx.host(), dx, 0.0, "relu_bwd");

  require_ok(cu::gelu_fwd(d_y.get(), d_x.get(), n));
  cpu::gelu_fwd(y.data(), x.data(), n);
  check_close(d_y.host(), y, k_tol, "gelu_fwd");
  require_ok(cu::gelu_bwd(d_dx.get(), d_dy.get(), d_x.get(), n));
  cpu::gelu_bwd(dx.data(), dy.data(), x.data(), n);
  check_close(d_dx.host(), dx, k_tol, "gelu_bwd");

  require_ok(cu::scale(d_x.get(), -0.37f, n));
  cpu::scale(x.data(), -0.37f, n);
  check_close(d_x.host(), x, 0.0, "scale");  // one multiply: bit-exact
  require_ok(cu::add_inplace(d_x.get(), d_dy.get(), n));
  cpu::add_inplace(x.data(), dy.data(), n);
  check_close(d_x.host(), x, 0.0, "add_inplace");
}

TEST_CASE("layernorm_fwd and layernorm_bwd") {
  for (int c : {100, 768}) {
    const int rows = 45;
    const std::size_t n = static_cast<std::size_t>(rows) * c;
    auto x = randn(n, 31, 3.0f);
    for (auto& v : x) v += 5.0f;  // |mean| > std: the two-pass variance matters
    auto w = randn(c, 32), b = randn(c, 33), dy = randn(n, 34);
    std::vector<float> y(n), mean(rows), rstd(rows);
    dev<float> d_x(x), d_w(w), d_b(b), d_y(y), d_mean(mean), d_rstd(rstd);
    require_ok(cu::layernorm_fwd(d_y.get(), d_mean.get(), d_rstd.get(), d_x.get(), d_w.get(),
                                 d_b.get(), rows, c, 1e-5f));
    cpu::layernorm_fwd(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), rows, c,
                       1e-5f);
    const std::string tag = " c=" + std::to_string(c);
    check_close(d_y.host(), y, k_tol, "layernorm_fwd y" + tag);
    check_close(d_mean.host(), mean, k_tol, "layernorm_fwd mean" + tag);
    check_close(d_rstd.host(), rstd, k_tol, "layernorm_fwd rstd" + tag);

    auto dw = randn(c, 35), db = randn(c, 36);  // accumulated onto
    std::vector<float> dx(n, 0.0f);
    dev<float> d_dx(dx), d_dw(dw), d_db(db), d_dy(dy);
    require_ok(cu::layernorm_bwd(d_dx.get(), d_dw.get(), d_db.get(), d_dy.get(), d_x.get(),
                                 d_w.get(), d_mean.get(), d_rstd.get(), rows, c));
    cpu::layernorm_bwd(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(),
                       rstd.data(), rows, c);
    check_close(d_dx.host(), dx, k_tol_reduce, "layernorm_bwd dx" + tag);
    check_close(d_dw.host(), dw, k_tol_reduce, "layernorm_bwd dw" + tag);
    check_close(d_db.host(), db, k_tol_reduce, "layernorm_bwd db" + tag);
  }
}

TEST_CASE("embedding_fwd and embedding_bwd with repeated ids") {
  const int b = 4, t = 13, c = 40, vocab = 11;  // 52 ids over 11 rows: many repeats
  auto ids = rand_ids(static_cast<std::size_t>(b) * t, vocab, 41);
  auto wte = randn(static_cast<std::size_t>(vocab) * c, 42), wpe = randn(t * c, 43);
  auto dout = randn(static_cast<std::size_t>(b) * t * c, 44);
  dev<int32_t> d_ids(ids);
  dev<float> d_wte(wte), d_wpe(wpe), d_dout(dout);
  for (int with_pos = 0; with_pos < 2; ++with_pos) {
    std::vector<float> out(static_cast<std::size_t>(b) * t * c);
    dev<float> d_out(out);
    require_ok(cu::embedding_fwd(d_out.get(), d_ids.get(), d_wte.get(),
                                 with_pos ? d_wpe.get() : nullptr, b, t, c));
    cpu::embedding_fwd(out.data(), ids.data(), wte.data(), with_pos ? wpe.data() : nullptr, b, t,
                       c);
    check_close(d_out.host(), out, 0.0, "embedding_fwd pos=" + std::to_string(with_pos));

    auto gte = randn(wte.size(), 45), gpe = randn(wpe.size(), 46);  // accumulated onto
    dev<float> d_gte(gte), d_gpe(gpe);
    require_ok(cu::embedding_bwd(d_gte.get(), with_pos ? d_gpe.get() : nullptr, d_dout.get(),
                                 d_ids.get(), b, t, c));
    cpu::embedding_bwd(gte.data(), with_pos ? gpe.data() : nullptr, dout.data(), ids.data(), b, t,
                       c);
    // The same float adds in the same order as the CPU twin: the same bits.
    check_bits(d_gte.host(), gte, "embedding_bwd dwte");
    check_bits(d_gpe.host(), gpe, "embedding_bwd dwpe");
  }
}

TEST_CASE("embedding_bwd is deterministic: long runs of one id, growing scratch, two streams") {
  // 8 x 300 positions over 3 ids (runs of ~800), magnitudes spread so order shows in the bits;
  // first a small call, then this one (the sort scratch grows), then two streams in turn.
  const int b = 8, t = 300, c = 96, vocab = 3;
  auto ids = rand_ids(static_cast<std::size_t>(b) * t, vocab, 111);
  auto dout = randn(static_cast<std::size_t>(b) * t * c, 112);
  for (std::size_t i = 0; i < dout.size(); ++i)
    dout[i] *= std::pow(10.0f, static_cast<float>(static_cast<int>(i % 5) - 2));
  const auto gte0 = randn(static_cast<std::size_t>(vocab) * c, 113);
  const auto gpe0 = randn(static_cast<std::size_t>(t) * c, 114);
  dev<int32_t> d_ids(ids);
  dev<float> d_dout(dout);
  {
    dev<float> small(gte0);
    require_ok(cu::embedding_bwd(small.get(), nullptr, d_dout.get(), d_ids.get(), 1, 5, c));
  }
  auto want_te = gte0, want_pe = gpe0;
  cpu::embedding_bwd(want_te.data(), want_pe.data(), dout.data(), ids.data(), b, t, c);
  dev<float> te1(gte0), pe1(gpe0), te2(gte0), pe2(gpe0), te3(gte0), pe3(gpe0);
  require_ok(cu::embedding_bwd(te1.get(), pe1.get(), d_dout.get(), d_ids.get(), b, t, c));
  require_ok(cu::embedding_bwd(te2.get(), pe2.get(), d_dout.get(), d_ids.get(), b, t, c));
  const auto h1 = te1.host(), h2 = te2.host();
  check_bits(h2, h1, "embedding_bwd dwte, second call");
  check_bits(h1, want_te, "embedding_bwd dwte vs CPU");
  check_bits(pe1.host(), want_pe, "embedding_bwd dwpe vs CPU");
  {
    // The same scratch used from two streams without a wait in between: the lease orders them.
    dev<float> te4(gte0);
    require_ok(g::device_synchronize());
    test_stream s1, s2;
    g::set_stream(s1.get());
    require_ok(cu::embedding_bwd(te3.get(), pe3.get(), d_dout.get(), d_ids.get(), b, t, c));
    g::set_stream(s2.get());
    require_ok(cu::embedding_bwd(te4.get(), nullptr, d_dout.get(), d_ids.get(), b, t, c));
    require_ok(g::stream_synchronize());
    g::set_stream(s1.get());
    require_ok(g::stream_synchronize());
    g::set_stream(nullptr);
    check_bits(te3.host(), want_te, "embedding_bwd dwte on stream 1");
    check_bits(te4.host(), want_te, "embedding_bwd dwte on stream 2");
  }
}

TEST_CASE("attention_fwd and attention_bwd") {
  struct shape {
    int b, t, c, nh;
  };
  for (const precision_case& pc : k_precisions) {
    precision_scope scope(pc.p);
    for (shape s : {shape{2, 17, 24, 3}, shape{1, 64, 128, 4}, shape{3, 200, 96, 2}}) {
      const std::size_t nqkv = static_cast<std::size_t>(s.b) * s.t * 3 * s.c;
      const std::size_t natt = static_cast<std::size_t>(s.b) * s.nh * s.t * s.t;
      const std::size_t nout = static_cast<std::size_t>(s.b) * s.t * s.c;
      auto qkv = randn(nqkv, 51), dout = randn(nout, 52);
      std::vector<float> out(nout), att(natt, 1.0f), scratch(natt);
      dev<float> d_qkv(qkv), d_dout(dout), d_out(out), d_att(att), d_scratch(scratch);
      const std::string tag =
          " b=" + std::to_string(s.b) + " t=" + std::to_string(s.t) + " c=" + std::to_string(s.c);
      require_ok(cu::attention_fwd(d_out.get(), d_att.get(), d_qkv.get(), s.b, s.t, s.c, s.nh));
      cpu::attention_fwd(out.data(), att.data(), qkv.data(), s.b, s.t, s.c, s.nh);
      check_product(d_out.host(), out, pc, k_tol_reduce, "attention_fwd out" + tag);
      const auto got_att = d_att.host();
      check_product(got_att, att, pc, k_tol, "attention_fwd att" + tag);
      // Exactly 0 above the diagonal (the buffer started at 1).
      std::size_t nonzero_above = 0;
      for (std::size_t row = 0; row < natt / s.t; ++row)
        for (int j = static_cast<int>(row % s.t) + 1; j < s.t; ++j)
          nonzero_above += got_att[row * s.t + j] != 0.0f;
      CHECK_MESSAGE(nonzero_above == 0, "attention_fwd att above the diagonal" << tag);

      // dqkv starts as NaN: every element must be assigned, or the NaN shows.
      std::vector<float> dqkv(nqkv, std::numeric_limits<float>::quiet_NaN());
      dev<float> d_dqkv(dqkv);
      require_ok(cu::attention_bwd(d_dqkv.get(), d_scratch.get(), d_dout.get(), d_qkv.get(),
                                   d_att.get(), s.b, s.t, s.c, s.nh));
      cpu::attention_bwd(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), s.b, s.t,
                         s.c, s.nh);
      const auto got = d_dqkv.host();
      check_product(got, dqkv, pc, k_tol_reduce, "attention_bwd dqkv" + tag);
      if (pc.p == cu::matmul_precision::fp32) {
        // Same inputs, same bits: cuBLAS and the row kernels run in a fixed order.
        std::vector<float> again(nqkv, 0.0f);
        dev<float> d_again(again);
        require_ok(cu::attention_bwd(d_again.get(), d_scratch.get(), d_dout.get(), d_qkv.get(),
                                     d_att.get(), s.b, s.t, s.c, s.nh));
        check_bits(d_again.host(), got, "attention_bwd twice" + tag);
      }
    }
  }
}

TEST_CASE("softmax_xent_fwd and softmax_xent_bwd") {
  const int n = 37, v = 301;  // v above the block size: the strided row loops are exercised
  auto logits = randn(static_cast<std::size_t>(n) * v, 61, 4.0f);
  auto targets = rand_ids(n, v, 62);
  std::vector<float> probs(logits.size()), losses(n), dl(logits.size());
  dev<float> d_logits(logits), d_probs(probs), d_losses(losses), d_dl(dl);
  dev<int32_t> d_targets(targets);
  const float mean_gpu =
      cu::softmax_xent_fwd(d_probs.get(), d_losses.get(), d_logits.get(), d_targets.get(), n, v);
  REQUIRE(cu::last_status() == g::status::ok);
  const float mean_cpu =
      cpu::softmax_xent_fwd(probs.data(), losses.data(), logits.data(), targets.data(), n, v);
  CHECK(mean_gpu == doctest::Approx(mean_cpu).epsilon(k_tol));
  check_close(d_probs.host(), probs, k_tol, "softmax_xent_fwd probs");
  check_close(d_losses.host(), losses, k_tol, "softmax_xent_fwd losses");

  require_ok(cu::softmax_xent_bwd(d_dl.get(), d_probs.get(), d_targets.get(), n, v, 1.0f / n));
  cpu::softmax_xent_bwd(dl.data(), probs.data(), targets.data(), n, v, 1.0f / n);
  check_close(d_dl.host(), dl, k_tol, "softmax_xent_bwd");

  CHECK(cu::softmax_xent_fwd(d_probs.get(), d_losses.get(), d_logits.get(), d_targets.get(), 0,
                             v) == 0.0f);
}

TEST_CASE("adamw_step and sgd_step over several steps") {
  const int64_t n = 5003;
  auto p = randn(n, 71), m = std::vector<float>(n, 0.0f), v = std::vector<float>(n, 0.0f);
  dev<float> d_p(p), d_m(m), d_v(v);
  for (int t = 1; t <= 3; ++t) {
    auto grad = randn(n, 72 + t);
    dev<float> d_g(grad);
    require_ok(cu::adamw_step(d_p.get(), d_g.get(), d_m.get(), d_v.get(), n, 1e-2f, 0.9f, 0.95f,
                              1e-8f, 0.1f, t));
    cpu::adamw_step(p.data(), grad.data(), m.data(), v.data(), n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f,
                    t);
  }
  check_close(d_p.host(), p, k_tol, "adamw p");
  check_close(d_m.host(), m, k_tol, "adamw m");
  check_close(d_v.host(), v, k_tol, "adamw v");

  auto q = randn(n, 81), buf = std::vector<float>(n, 0.0f);
  dev<float> d_q(q), d_buf(buf);
  for (int t = 1; t <= 3; ++t) {
    auto grad = randn(n, 82 + t);
    dev<float> d_g(grad);
    require_ok(cu::sgd_step(d_q.get(), d_g.get(), d_buf.get(), n, 0.05f, 0.9f, 1e-3f));
    cpu::sgd_step(q.data(), grad.data(), buf.data(), n, 0.05f, 0.9f, 1e-3f);
  }
  check_close(d_q.host(), q, k_tol, "sgd p");
  check_close(d_buf.host(), buf, k_tol, "sgd buf");
}

TEST_CASE("1-bit Adam's frozen update, momentum share and denominator give the CPU's bits") {
  // Every op is one IEEE-rounded add, multiply, divide or square root on both sides (no fused
  // multiply-add: the kernels spell the roundings out), so the twins agree to the bit.
  const int64_t n = 5003;
  auto v = randn(n, 101);
  for (int64_t i = 0; i < n; ++i) v[i] = i % 7 == 0 ? 0.0f : v[i] * v[i] * 1e-3f;  // some never had a gradient
  auto p = randn(n, 102), mom = randn(n, 103), m = std::vector<float>(n, 0.5f);
  dev<float> d_p(p), d_mom(mom), d_m(m), d_v(v);
  for (int t = 4; t <= 6; ++t) {
    require_ok(cu::onebit_adam_frozen_step(d_p.get(), d_mom.get(), d_m.get(), d_v.get(), n, 1e-2f,
                                           0.9f, 0.95f, 1e-8f, 0.1f, t, 3));
    cpu::onebit_adam_frozen_step(p.data(), mom.data(), m.data(), v.data(), n, 1e-2f, 0.9f, 0.95f,
                                 1e-8f, 0.1f, t, 3);
  }
  CHECK(d_p.host() == p);
  CHECK(d_m.host() == m);
  auto grad = randn(n, 104);
  dev<float> d_g(grad);
  require_ok(cu::onebit_momentum_share(d_g.get(), d_mom.get(), n, 0.9f / 4, 0.1f));
  cpu::onebit_momentum_share(grad.data(), mom.data(), n, 0.9f / 4, 0.1f);
  CHECK(d_g.host() == grad);
  const float sqrt_bc2 = static_cast<float>(std::sqrt(1.0 - std::pow(0.95, 3.0)));
  for (const bool divide : {true, false}) {
    require_ok(cu::onebit_scale_by_denominator(d_g.get(), d_v.get(), n, sqrt_bc2, 1e-8f, divide));
    cpu::onebit_scale_by_denominator(grad.data(), v.data(), n, sqrt_bc2, 1e-8f, divide);
    CHECK(d_g.host() == grad);
  }
  CHECK(grad[0] == 0.0f);  // v[0] == 0: nothing travels for it
  CHECK(cu::onebit_adam_frozen_step(d_p.get(), d_mom.get(), d_m.get(), d_v.get(), n, 1e-2f, 0.9f,
                                    0.95f, 1e-8f, 0.1f, 4, 0) == g::status::invalid_argument);
}

TEST_CASE("sum_squares: matches the CPU, is deterministic, and the async form gives its bits") {
  double* d_out = nullptr;
  require_ok(g::device_malloc(reinterpret_cast<void**>(&d_out), sizeof(double)));
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{1000003}}) {
    auto x = randn(n, 91);
    dev<float> d_x(x);
    const double gpu = cu::sum_squares(d_x.get(), n);
    REQUIRE(cu::last_status() == g::status::ok);
    const double ref = cpu::sum_squares(x.data(), n);
    CHECK(gpu == doctest::Approx(ref).epsilon(1e-9));  // both accumulate in double
    const double again = cu::sum_squares(d_x.get(), n);
    CHECK(std::memcmp(&gpu, &again, sizeof gpu) == 0);  // same bits: fixed reduction order
    require_ok(cu::sum_squares_async(d_x.get(), n, d_out));
    double async = -1.0;
    require_ok(g::copy_to_host(&async, d_out, sizeof async));
    CHECK(std::memcmp(&gpu, &async, sizeof gpu) == 0);
  }
  CHECK(cu::sum_squares(nullptr, 0) == 0.0);
  require_ok(cu::sum_squares_async(nullptr, 0, d_out));
  double zero = -1.0;
  require_ok(g::copy_to_host(&zero, d_out, sizeof zero));
  CHECK(zero == 0.0);
  {
    // Two streams in turn share the reduction's scratch: each result is still its own.
    auto x1 = randn(300000, 92), x2 = randn(500000, 93);
    dev<float> d_x1(x1), d_x2(x2);
    std::vector<double> out2(2, -1.0);
    dev<double> d_out2(out2);
    test_stream s1, s2;
    g::set_stream(s1.get());
    require_ok(cu::sum_squares_async(d_x1.get(), 300000, d_out2.get()));
    g::set_stream(s2.get());
    require_ok(cu::sum_squares_async(d_x2.get(), 500000, d_out2.get() + 1));
    require_ok(g::stream_synchronize());
    g::set_stream(s1.get());
    require_ok(g::stream_synchronize());
    g::set_stream(nullptr);
    const auto got = d_out2.host();
    CHECK(got[0] == cu::sum_squares(d_x1.get(), 300000));
    CHECK(got[1] == cu::sum_squares(d_x2.get(), 500000));
  }
  require_ok(g::device_free(d_out));
}

TEST_CASE("pinned memory and asynchronous copies on the current stream") {
  const std::size_t n = 1 << 20;
  float* pinned = nullptr;
  require_ok(g::host_alloc_pinned(reinterpret_cast<void**>(&pinned), n * sizeof(float)));
  REQUIRE(pinned != nullptr);
  for (std::size_t i = 0; i < n; ++i) pinned[i] = static_cast<float>(i % 1000);
  void* a = nullptr;
  void* b = nullptr;
  require_ok(g::device_malloc(&a, n * sizeof(float)));
  require_ok(g::device_malloc(&b, n * sizeof(float)));
  {
    test_stream st;
    g::set_stream(st.get());
    CHECK(cu::current_stream() == st.get());  // one stream for ops and copies
    // Copy in, double on the device, copy to a second buffer, zero the first, copy back: all
    // queued on one stream, in order, with one wait at the end.
    require_ok(g::copy_to_device_async(a, pinned, n * sizeof(float)));
    require_ok(cu::scale(static_cast<float*>(a), 2.0f, static_cast<int64_t>(n)));
    require_ok(g::device_copy(b, a, n * sizeof(float)));
    require_ok(g::device_fill_zero_async(a, n * sizeof(float) / 2));
    require_ok(g::copy_to_host_async(pinned, b, n * sizeof(float)));
    require_ok(g::stream_synchronize());
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i) wrong += pinned[i] != 2.0f * static_cast<float>(i % 1000);
    CHECK(wrong == 0);
    require_ok(g::copy_to_host_async(pinned, a, n * sizeof(float)));
    require_ok(g::stream_synchronize());
    std::size_t nonzero = 0;
    for (std::size_t i = 0; i < n / 2; ++i) nonzero += pinned[i] != 0.0f;
    CHECK(nonzero == 0);
    CHECK(pinned[n / 2] == 2.0f * static_cast<float>((n / 2) % 1000));  // past the fill
  }
  CHECK(g::current_stream() == nullptr);
  // Argument rules: null with bytes is refused, zero bytes is a no-op.
  CHECK(g::copy_to_device_async(nullptr, pinned, 4) == g::status::invalid_argument);
  CHECK(std::string(g::last_error_message()).find("copy_to_device_async") != std::string::npos);
  CHECK(g::copy_to_host_async(pinned, nullptr, 4) == g::status::invalid_argument);
  CHECK(g::device_copy(a, nullptr, 4) == g::status::invalid_argument);
  CHECK(g::device_fill_zero_async(nullptr, 4) == g::status::invalid_argument);
  CHECK(g::device_copy(nullptr, nullptr, 0) == g::status::ok);
  CHECK(g::host_alloc_pinned(nullptr, 4) == g::status::invalid_argument);
  require_ok(g::device_free(a));
  require_ok(g::device_free(b));
  require_ok(g::host_free_pinned(pinned));
  require_ok(g::host_free_pinned(nullptr));
}

TEST_CASE("bad arguments come back as invalid_argument with a message") {
  CHECK(cu::gemm(false, false, -1, 2, 2, 1.0f, nullptr, 2, nullptr, 2, 0.0f, nullptr, 2) ==
        g::status::invalid_argument);
  CHECK(cu::last_status() == g::status::invalid_argument);
  CHECK(std::string(g::last_error_message()).find("gemm") != std::string::npos);
  CHECK(cu::attention_fwd(nullptr, nullptr, nullptr, 1, 4, 10, 3) == g::status::invalid_argument);
  CHECK(std::string(g::last_error_message()).find("attention_fwd") != std::string::npos);
  CHECK(cu::attention_bwd(nullptr, nullptr, nullptr, nullptr, nullptr, 1, 4, 0, 2) ==
        g::status::invalid_argument);
  CHECK(cu::bias_grad(nullptr, nullptr, -1, 3) == g::status::invalid_argument);
  CHECK(cu::bias_grad(nullptr, nullptr, 2, 3) == g::status::invalid_argument);
  CHECK(std::string(g::last_error_message()).find("bias_grad") != std::string::npos);
  CHECK(cu::bias_grad(nullptr, nullptr, 5, 0) == g::status::ok);  // no columns: nothing to do
  CHECK(cu::embedding_bwd(nullptr, nullptr, nullptr, nullptr, -1, 2, 2) ==
        g::status::invalid_argument);
  CHECK(cu::embedding_bwd(nullptr, nullptr, nullptr, nullptr, 0, 2, 2) == g::status::ok);
  CHECK(std::isnan(cu::sum_squares(nullptr, -5)));
  CHECK(cu::last_status() == g::status::invalid_argument);
  CHECK(cu::sum_squares_async(nullptr, 4, nullptr) == g::status::invalid_argument);
  CHECK(cu::relu_fwd(nullptr, nullptr, 0) == g::status::ok);  // empty is not an error
}

TEST_CASE("device_pool over device memory") {
  g::device_pool::options o;
  o.chunk_bytes = 1 << 20;
  g::device_pool pool(g::cuda_chunks(), o);
  std::vector<void*> blocks;
  for (int i = 0; i < 6; ++i) {
    void* p = nullptr;
    require_ok(pool.allocate(&p, 4000 + 100 * i));
    blocks.push_back(p);
  }
  // Each block holds its own data: write distinct patterns, read them all back.
  for (int i = 0; i < 6; ++i) {
    std::vector<float> h(1000, static_cast<float>(i + 1));
    require_ok(g::copy_to_device(blocks[i], h.data(), h.size() * sizeof(float)));
  }
  for (int i = 0; i < 6; ++i) {
    std::vector<float> h(1000, 0.0f);
    require_ok(g::copy_to_host(h.data(), blocks[i], h.size() * sizeof(float)));
    CHECK(std::all_of(h.begin(), h.end(), [&](float v) { return v == i + 1; }));
  }
  g::pool_stats s = pool.stats();
  CHECK(s.chunks == 1);
  CHECK(s.blocks_in_use == 6);
  require_ok(pool.release(blocks[2]));
  void* again = nullptr;
  require_ok(pool.allocate(&again, 4200));  // the same class as blocks[2]
  CHECK(again == blocks[2]);
  CHECK(pool.stats().chunk_allocations == 1);
  // A kernel can run on pool memory like on any device memory.
  require_ok(cu::scale(static_cast<float*>(again), 2.0f, 1000));
  std::vector<float> h(1000);
  require_ok(g::copy_to_host(h.data(), again, h.size() * sizeof(float)));
  CHECK(h[999] == 6.0f);
}
