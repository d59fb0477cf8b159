// Every CUDA kernel (gpu/cuda_kernels.hpp) against its CPU twin (runtime/cpu/kernels.hpp) on
// random inputs with the same arguments, plus the device pool over real device memory. Runs
// only where a CUDA device exists; gpu_test_main.cpp skips the whole binary (exit 77) otherwise.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
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

void require_ok(g::status s) {
  INFO(g::status_string(s) << ": " << g::last_error_message());
  REQUIRE(s == g::status::ok);
}

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
      check_close(dc.host(), c, k_tol_reduce,
                  "gemm ta=" + std::to_string(ta) + " tb=" + std::to_string(tb));
    }
}

TEST_CASE("linear_fwd and linear_bwd, with and without optional outputs") {
  const int rows = 33, in = 47, out = 19;
  auto x = randn(static_cast<std::size_t>(rows) * in, 11);
  auto w = randn(static_cast<std::size_t>(out) * in, 12, 0.2f);
  auto b = randn(out, 13);
  for (int with_bias = 0; with_bias < 2; ++with_bias) {
    std::vector<float> y(static_cast<std::size_t>(rows) * out, 0.0f);
    dev<float> dx_(x), dw_(w), db_(b), dy_(y);
    require_ok(cu::linear_fwd(dy_.get(), dx_.get(), dw_.get(), with_bias ? db_.get() : nullptr,
                              rows, in, out));
    cpu::linear_fwd(y.data(), x.data(), w.data(), with_bias ? b.data() : nullptr, rows, in, out);
    check_close(dy_.host(), y, k_tol_reduce, "linear_fwd bias=" + std::to_string(with_bias));
  }
  auto gy = randn(static_cast<std::size_t>(rows) * out, 14);
  for (int full = 0; full < 2; ++full) {
    // Parameter gradients start non-zero: they must be accumulated, not assigned.
    auto gw = randn(w.size(), 15), gb = randn(b.size(), 16);
    std::vector<float> gx(x.size(), 0.0f);
    dev<float> d_gx(gx), d_gw(gw), d_gb(gb), d_gy(gy), d_x(x), d_w(w);
    require_ok(cu::linear_bwd(full ? d_gx.get() : nullptr, d_gw.get(), full ? d_gb.get() : nullptr,
                              d_gy.get(), d_x.get(), d_w.get(), rows, in, out));
    cpu::linear_bwd(full ? gx.data() : nullptr, gw.data(), full ? gb.data() : nullptr, gy.data(),
                    x.data(), w.data(), rows, in, out);
    check_close(d_gw.host(), gw, k_tol_reduce, "linear_bwd dw");
    check_close(d_gb.host(), gb, k_tol_reduce, "linear_bwd db");  // unchanged when db is null
    check_close(d_gx.host(), gx, k_tol_reduce, "linear_bwd dx");  // stays 0 when dx is null
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
    check_close(d_gte.host(), gte, k_tol, "embedding_bwd dwte");
    check_close(d_gpe.host(), gpe, k_tol, "embedding_bwd dwpe");
  }
}

TEST_CASE("attention_fwd and attention_bwd") {
  struct shape {
    int b, t, c, nh;
  };
  for (shape s : {shape{2, 17, 24, 3}, shape{1, 64, 128, 4}}) {
    const std::size_t nqkv = static_cast<std::size_t>(s.b) * s.t * 3 * s.c;
    const std::size_t natt = static_cast<std::size_t>(s.b) * s.nh * s.t * s.t;
    const std::size_t nout = static_cast<std::size_t>(s.b) * s.t * s.c;
    auto qkv = randn(nqkv, 51), dout = randn(nout, 52);
    std::vector<float> out(nout), att(natt, 1.0f), scratch(natt);
    dev<float> d_qkv(qkv), d_dout(dout), d_out(out), d_att(att), d_scratch(scratch);
    const std::string tag = " t=" + std::to_string(s.t) + " c=" + std::to_string(s.c);
    require_ok(cu::attention_fwd(d_out.get(), d_att.get(), d_qkv.get(), s.b, s.t, s.c, s.nh));
    cpu::attention_fwd(out.data(), att.data(), qkv.data(), s.b, s.t, s.c, s.nh);
    check_close(d_out.host(), out, k_tol_reduce, "attention_fwd out" + tag);
    check_close(d_att.host(), att, k_tol, "attention_fwd att" + tag);  // zeros above diagonal too

    // dqkv starts as NaN: every element must be assigned, or the NaN shows.
    std::vector<float> dqkv(nqkv, std::numeric_limits<float>::quiet_NaN());
    dev<float> d_dqkv(dqkv);
    require_ok(cu::attention_bwd(d_dqkv.get(), d_scratch.get(), d_dout.get(), d_qkv.get(),
                                 d_att.get(), s.b, s.t, s.c, s.nh));
    cpu::attention_bwd(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), s.b, s.t,
                       s.c, s.nh);
    check_close(d_dqkv.host(), dqkv, k_tol_reduce, "attention_bwd dqkv" + tag);
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

TEST_CASE("sum_squares: matches the CPU and is deterministic") {
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{1000003}}) {
    auto x = randn(n, 91);
    dev<float> d_x(x);
    const double gpu = cu::sum_squares(d_x.get(), n);
    REQUIRE(cu::last_status() == g::status::ok);
    const double ref = cpu::sum_squares(x.data(), n);
    CHECK(gpu == doctest::Approx(ref).epsilon(1e-9));  // both accumulate in double
    const double again = cu::sum_squares(d_x.get(), n);
    CHECK(std::memcmp(&gpu, &again, sizeof gpu) == 0);  // same bits: fixed reduction order
  }
  CHECK(cu::sum_squares(nullptr, 0) == 0.0);
}

TEST_CASE("bad arguments come back as invalid_argument with a message") {
  CHECK(cu::gemm(false, false, -1, 2, 2, 1.0f, nullptr, 2, nullptr, 2, 0.0f, nullptr, 2) ==
        g::status::invalid_argument);
  CHECK(cu::last_status() == g::status::invalid_argument);
  CHECK(std::string(g::last_error_message()).find("gemm") != std::string::npos);
  CHECK(cu::attention_fwd(nullptr, nullptr, nullptr, 1, 4, 10, 3) == g::status::invalid_argument);
  CHECK(std::isnan(cu::sum_squares(nullptr, -5)));
  CHECK(cu::last_status() == g::status::invalid_argument);
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
