// The CPU kernels (runtime/cpu/kernels.hpp): forward results against independent double-precision
// formulas, backward results against central finite differences of the forward kernels.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "runtime/cpu/kernels.hpp"
#include "tests/nn/grad_check.hpp"

namespace k = cohort::cpu;
using namespace cohort::nn::testing;

namespace {
constexpr double k_fd_tol = 5e-3;  // central differences of float kernels, eps = 1e-2
}

TEST_CASE("gemm matches a naive product for every transpose and leading dimension") {
  const int m = 5, n = 7, kk = 3;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      // Stored shapes: op(A) is m x k, so A is k x m when transposed; pad rows by 2.
      const int lda = (ta ? m : kk) + 2, ldb = (tb ? kk : n) + 2, ldc = n + 1;
      auto a = randn((ta ? kk : m) * lda, 1), b = randn((tb ? n : kk) * ldb, 2);
      auto c = randn(m * ldc, 3);
      auto expect = c;
      for (int i = 0; i < m; ++i)
        for (int j = 0; j < n; ++j) {
          double s = 0;
          for (int p = 0; p < kk; ++p)
            s += double(ta ? a[p * lda + i] : a[i * lda + p]) *
                 (tb ? b[j * ldb + p] : b[p * ldb + j]);
          expect[i * ldc + j] = float(0.5 * s + 2.0 * c[i * ldc + j]);
        }
      k::gemm(ta, tb, m, n, kk, 0.5f, a.data(), lda, b.data(), ldb, 2.0f, c.data(), ldc);
      CHECK(rel_error(c, expect) < 1e-6);
    }
}

TEST_CASE("linear forward is x W^T + b and backward matches finite differences") {
  const int rows = 4, in = 5, out = 3;
  auto x = randn(rows * in, 10), w = randn(out * in, 11), b = randn(out, 12),
       r = randn(rows * out, 13);
  std::vector<float> y(rows * out);
  auto loss = [&] {
    k::linear_fwd(y.data(), x.data(), w.data(), b.data(), rows, in, out);
    return project(y, r);
  };
  loss();
  for (int i = 0; i < rows; ++i)
    for (int o = 0; o < out; ++o) {
      double s = b[o];
      for (int j = 0; j < in; ++j) s += double(x[i * in + j]) * w[o * in + j];
      CHECK(y[i * out + o] == doctest::Approx(s).epsilon(1e-5));
    }
  std::vector<float> dx(rows * in, 99.0f), dw(out * in, 0.0f), db(out, 0.0f);
  k::linear_bwd(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), rows, in, out);
  CHECK(rel_error(dx, numeric_grad(x, loss)) < k_fd_tol);
  CHECK(rel_error(dw, numeric_grad(w, loss)) < k_fd_tol);
  CHECK(rel_error(db, numeric_grad(b, loss)) < k_fd_tol);

  SUBCASE("parameter grads accumulate, input grads are assigned") {
    auto dx1 = dx, dw1 = dw, db1 = db;
    k::linear_bwd(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), rows, in, out);
    CHECK(dx == dx1);
    for (std::size_t i = 0; i < dw.size(); ++i) CHECK(dw[i] == doctest::Approx(2 * dw1[i]));
    for (std::size_t i = 0; i < db.size(); ++i) CHECK(db[i] == doctest::Approx(2 * db1[i]));
  }
  SUBCASE("null bias and null dx are allowed") {
    std::vector<float> dw2(out * in, 0.0f);
    k::linear_fwd(y.data(), x.data(), w.data(), nullptr, rows, in, out);
    CHECK(y[0] ==
          doctest::Approx(x[0] * w[0] + x[1] * w[1] + x[2] * w[2] + x[3] * w[3] + x[4] * w[4]));
    k::linear_bwd(nullptr, dw2.data(), nullptr, r.data(), x.data(), w.data(), rows, in, out);
    CHECK(rel_error(dw2, dw) < 1e-6);
  }
}

TEST_CASE("bias_grad adds rows in ascending order onto db: the same bits as a per-column loop") {
  // 37 rows, 45 columns (not a multiple of the 8-wide SIMD loop); magnitudes spread over
  // 1e-3..1e3 so a different summation order changes the bits of most columns.
  const int rows = 37, out = 45;
  auto dy = randn(rows * out, 20);
  for (int i = 0; i < rows * out; ++i) dy[i] *= std::pow(10.0f, static_cast<float>(i % 7 - 3));
  const auto db0 = randn(out, 21);
  // The float sequence nn::linear's backward and the CUDA twin use, column by column:
  // ((db[j] + dy[0][j]) + dy[1][j]) + ... .
  std::vector<float> want(db0);
  for (int j = 0; j < out; ++j) {
    float acc = db0[j];
    for (int r = 0; r < rows; ++r) acc += dy[r * out + j];
    want[j] = acc;
  }
  for (bool portable : {false, true}) {
    k::set_portable_kernels(portable);
    auto db = db0;
    k::bias_grad(db.data(), dy.data(), rows, out);
    CHECK_MESSAGE(std::memcmp(db.data(), want.data(), sizeof(float) * out) == 0,
                  "portable=" << portable);
    // linear_bwd's bias gradient is the same call.
    std::vector<float> x(rows * 3, 0.5f), w(out * 3, 0.25f), dw(out * 3, 0.0f);
    auto db_lin = db0;
    k::linear_bwd(nullptr, dw.data(), db_lin.data(), dy.data(), x.data(), w.data(), rows, 3, out);
    CHECK(std::memcmp(db_lin.data(), want.data(), sizeof(float) * out) == 0);
  }
  k::set_portable_kernels(false);
  auto db = db0;
  k::bias_grad(db.data(), dy.data(), 0, out);  // no rows: db unchanged
  CHECK(db == db0);
}

TEST_CASE("relu forward and backward") {
  std::vector<float> x{-2.0f, -0.5f, 0.0f, 0.25f, 3.0f}, y(5), dy{1, 2, 3, 4, 5}, dx(5);
  k::relu_fwd(y.data(), x.data(), 5);
  CHECK(y == std::vector<float>{0, 0, 0, 0.25f, 3.0f});
  k::relu_bwd(dx.data(), dy.data(), x.data(), 5);
  CHECK(dx == std::vector<float>{0, 0, 0, 4, 5});
}

TEST_CASE("gelu matches the tanh formula and its backward matches finite differences") {
  // Odd length exercises the vector tail; wide range exercises exp clamping.
  const int n = 37;
  auto x = randn(n, 20, 2.5f);
  x[0] = -30.0f;
  x[1] = 30.0f;
  x[2] = 0.0f;
  std::vector<float> y(n);
  k::gelu_fwd(y.data(), x.data(), n);
  for (int i = 0; i < n; ++i) {
    const double xi = x[i];
    const double ref =
        0.5 * xi * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (xi + 0.044715 * xi * xi * xi)));
    CHECK(y[i] == doctest::Approx(ref).epsilon(1e-5).scale(1e-6));
  }
  auto r = randn(n, 21);
  std::vector<float> dx(n);
  k::gelu_bwd(dx.data(), r.data(), x.data(), n);
  auto loss = [&] {
    k::gelu_fwd(y.data(), x.data(), n);
    return project(y, r);
  };
  CHECK(rel_error(dx, numeric_grad(x, loss, 1e-3f)) < k_fd_tol);
}

TEST_CASE("layernorm forward normalises rows and backward matches finite differences") {
  const int rows = 3, c = 19;
  auto x = randn(rows * c, 30, 3.0f), w = randn(c, 31), b = randn(c, 32), r = randn(rows * c, 33);
  for (float& v : x) v += 5.0f;  // a large mean must not hurt the variance
  std::vector<float> y(rows * c), mean(rows), rstd(rows);
  auto loss = [&] {
    k::layernorm_fwd(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), rows, c,
                     1e-5f);
    return project(y, r);
  };
  loss();
  for (int i = 0; i < rows; ++i) {
    double mu = 0, var = 0;
    for (int j = 0; j < c; ++j) mu += x[i * c + j];
    mu /= c;
    for (int j = 0; j < c; ++j) var += (x[i * c + j] - mu) * (x[i * c + j] - mu);
    var /= c;
    CHECK(mean[i] == doctest::Approx(mu).epsilon(1e-5));
    CHECK(rstd[i] == doctest::Approx(1.0 / std::sqrt(var + 1e-5)).epsilon(1e-5));
    for (int j = 0; j < c; ++j)
      CHECK(y[i * c + j] ==
            doctest::Approx((x[i * c + j] - mu) / std::sqrt(var + 1e-5) * w[j] + b[j])
                .epsilon(1e-4)
                .scale(1e-4));
  }
  std::vector<float> dx(rows * c), dw(c, 0.0f), db(c, 0.0f);
  k::layernorm_bwd(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), mean.data(),
                   rstd.data(), rows, c);
  CHECK(rel_error(dx, numeric_grad(x, loss)) < k_fd_tol);
  CHECK(rel_error(dw, numeric_grad(w, loss)) < k_fd_tol);
  CHECK(rel_error(db, numeric_grad(b, loss)) < k_fd_tol);
}

TEST_CASE("embedding forward gathers rows and backward scatters (repeated ids accumulate)") {
  const int b = 2, t = 3, c = 4, v = 5;
  const std::vector<int32_t> ids{1, 4, 1, 0, 1, 3};
  auto wte = randn(v * c, 40), wpe = randn(t * c, 41), r = randn(b * t * c, 42);
  std::vector<float> out(b * t * c);
  auto loss = [&] {
    k::embedding_fwd(out.data(), ids.data(), wte.data(), wpe.data(), b, t, c);
    return project(out, r);
  };
  loss();
  CHECK(out[(1 * t + 2) * c + 3] == doctest::Approx(wte[3 * c + 3] + wpe[2 * c + 3]));
  std::vector<float> dwte(v * c, 0.0f), dwpe(t * c, 0.0f);
  k::embedding_bwd(dwte.data(), dwpe.data(), r.data(), ids.data(), b, t, c);
  CHECK(rel_error(dwte, numeric_grad(wte, loss)) < k_fd_tol);
  CHECK(rel_error(dwpe, numeric_grad(wpe, loss)) < k_fd_tol);
  CHECK(dwte[2 * c] == 0.0f);  // id 2 never appears
}

// Independent reference: per (b, h), scores, causal softmax and weighted sum in double.
static std::vector<double> attention_ref(const std::vector<float>& qkv, int B, int T, int C,
                                         int NH) {
  const int hs = C / NH;
  std::vector<double> out(B * T * C, 0.0);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int i = 0; i < T; ++i) {
        std::vector<double> s(i + 1);
        double mx = -1e300;
        for (int j = 0; j <= i; ++j) {
          double d = 0;
          for (int e = 0; e < hs; ++e)
            d += double(qkv[(b * T + i) * 3 * C + h * hs + e]) *
                 qkv[(b * T + j) * 3 * C + C + h * hs + e];
          s[j] = d / std::sqrt(double(hs));
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (double& v : s) z += (v = std::exp(v - mx));
        for (int j = 0; j <= i; ++j)
          for (int e = 0; e < hs; ++e)
            out[(b * T + i) * C + h * hs + e] +=
                s[j] / z * qkv[(b * T + j) * 3 * C + 2 * C + h * hs + e];
      }
  return out;
}

TEST_CASE(
    "causal attention forward matches a direct formula and backward matches finite differences") {
  // T = 70 spans several row blocks of the blocked causal products, the last one partial.
  int B = 2, T = 5, C = 8, NH = 2;
  SUBCASE("one block") {}
  SUBCASE("several blocks") {
    B = 1;
    T = 70;
    C = 4;
  }
  auto qkv = randn(B * T * 3 * C, 50), r = randn(B * T * C, 51);
  std::vector<float> out(B * T * C), att(B * NH * T * T);
  auto loss = [&] {
    k::attention_fwd(out.data(), att.data(), qkv.data(), B, T, C, NH);
    return project(out, r);
  };
  loss();
  CHECK(rel_error(out, attention_ref(qkv, B, T, C, NH)) < 1e-5);
  // Saved probabilities: rows sum to one, nothing above the diagonal.
  for (int row = 0; row < B * NH * T; ++row) {
    const int i = row % T;
    double s = 0;
    for (int j = 0; j < T; ++j) {
      s += att[row * T + j];
      if (j > i) CHECK(att[row * T + j] == 0.0f);
    }
    CHECK(s == doctest::Approx(1.0).epsilon(1e-5));
  }
  std::vector<float> dqkv(B * T * 3 * C, 7.0f), scratch(B * NH * T * T);
  k::attention_bwd(dqkv.data(), scratch.data(), r.data(), qkv.data(), att.data(), B, T, C, NH);
  CHECK(rel_error(dqkv, numeric_grad(qkv, loss)) < k_fd_tol);
}

TEST_CASE("decode attention of one row over cached keys equals attention_fwd's row, both builds") {
  // Head size 32 (whole AVX2 lanes) and 12 (a remainder); keys and values reached through
  // per-position pointers in reverse memory order, as blocks of a paged cache may lie.
  for (const auto& [C, NH] : {std::pair<int, int>{128, 4}, std::pair<int, int>{36, 3}}) {
    const int T = 37;
    const auto qkv = randn(T * 3 * C, 70);
    std::vector<float> out(T * C), att(NH * T * T);
    k::attention_fwd(out.data(), att.data(), qkv.data(), 1, T, C, NH);
    std::vector<std::vector<float>> cache(T);
    std::vector<const float*> kp(T), vp(T);
    for (int j = T - 1; j >= 0; --j) {
      cache[j].assign(qkv.begin() + j * 3 * C + C, qkv.begin() + (j + 1) * 3 * C);
      kp[j] = cache[j].data();
      vp[j] = cache[j].data() + C;
    }
    for (const bool portable : {false, true}) {
      k::set_portable_kernels(portable);
      for (const int row : {0, 5, T - 1}) {
        std::vector<float> y(C, 9.0f), scores(T);
        k::attention_decode_row(y.data(), qkv.data() + row * 3 * C, kp.data(), vp.data(), row + 1,
                                C, NH, scores.data());
        const std::vector<float> want(out.begin() + row * C, out.begin() + (row + 1) * C);
        CHECK(rel_error(y, want) < 1e-5);
      }
    }
    k::set_portable_kernels(false);
  }
}

TEST_CASE("softmax cross-entropy: loss, probabilities and gradient of the mean loss") {
  const int n = 4, v = 11;
  auto logits = randn(n * v, 60, 3.0f);
  logits[5] = 80.0f;  // a dominant logit must not overflow
  const std::vector<int32_t> targets{3, 0, 10, 7};
  std::vector<float> probs(n * v), losses(n);
  auto loss = [&] {
    return double(
        k::softmax_xent_fwd(probs.data(), losses.data(), logits.data(), targets.data(), n, v));
  };
  const double mean = loss();
  double expect_mean = 0;
  for (int i = 0; i < n; ++i) {
    double mx = -1e300, z = 0;
    for (int j = 0; j < v; ++j) mx = std::max(mx, double(logits[i * v + j]));
    for (int j = 0; j < v; ++j) z += std::exp(logits[i * v + j] - mx);
    const double li = std::log(z) + mx - logits[i * v + targets[i]];
    CHECK(losses[i] == doctest::Approx(li).epsilon(1e-5));
    for (int j = 0; j < v; ++j)
      CHECK(probs[i * v + j] ==
            doctest::Approx(std::exp(logits[i * v + j] - mx) / z).epsilon(1e-5).scale(1e-6));
    expect_mean += li / n;
  }
  CHECK(mean == doctest::Approx(expect_mean).epsilon(1e-6));
  std::vector<float> dlogits(n * v);
  k::softmax_xent_bwd(dlogits.data(), probs.data(), targets.data(), n, v, 1.0f / n);
  CHECK(rel_error(dlogits, numeric_grad(logits, loss, 1e-2f)) < k_fd_tol);
}

TEST_CASE("sum_squares, scale and add_inplace") {
  std::vector<float> x(1001);
  double expect = 0;
  for (int i = 0; i < 1001; ++i) {
    x[i] = 0.001f * i - 0.3f;
    expect += double(x[i]) * x[i];
  }
  CHECK(k::sum_squares(x.data(), 1001) == doctest::Approx(expect).epsilon(1e-12));
  auto y = x;
  k::scale(y.data(), -2.0f, 1001);
  CHECK(y[1000] == -2.0f * x[1000]);
  k::add_inplace(y.data(), x.data(), 1001);
  CHECK(y[17] == doctest::Approx(-x[17]));
}

TEST_CASE("thread count and denormal flushing are settable") {
  k::set_num_threads(1);
  CHECK(k::num_threads() == 1);
#if defined(__x86_64__)
  volatile float tiny = 1e-39f;  // subnormal
  CHECK_FALSE(k::flush_denormals());
  CHECK(tiny * 0.5f != 0.0f);
  k::set_flush_denormals(true);
  CHECK(k::flush_denormals());
  CHECK(tiny * 0.5f == 0.0f);
  k::set_flush_denormals(false);
  CHECK(tiny * 0.5f != 0.0f);
#endif
}

TEST_CASE("portable and SIMD loops agree") {
  if (!k::simd_kernels()) {
    MESSAGE("no AVX2/FMA on this CPU: only the portable path exists");
    return;
  }
  const int B = 2, T = 9, C = 16, NH = 2, rows = B * T, V = 13;
  auto x = randn(rows * C, 70, 2.0f), w = randn(C, 71), bias = randn(C, 72),
       dy = randn(rows * C, 73);
  auto qkv = randn(rows * 3 * C, 74), logits = randn(rows * V, 75, 4.0f);
  std::vector<int32_t> targets(rows);
  for (int i = 0; i < rows; ++i) targets[i] = (i * 5) % V;
  struct outputs {
    std::vector<float> gelu, dgelu, ln, dln, dlnw, att, datt, probs, dlogits, adam;
    double ssq;
  };
  auto run = [&] {
    outputs o;
    o.gelu.resize(rows * C);
    o.dgelu.resize(rows * C);
    k::gelu_fwd(o.gelu.data(), x.data(), rows * C);
    k::gelu_bwd(o.dgelu.data(), dy.data(), x.data(), rows * C);
    std::vector<float> mean(rows), rstd(rows);
    o.ln.resize(rows * C);
    o.dln.resize(rows * C);
    o.dlnw.assign(2 * C, 0.0f);
    k::layernorm_fwd(o.ln.data(), mean.data(), rstd.data(), x.data(), w.data(), bias.data(), rows,
                     C, 1e-5f);
    k::layernorm_bwd(o.dln.data(), o.dlnw.data(), o.dlnw.data() + C, dy.data(), x.data(), w.data(),
                     mean.data(), rstd.data(), rows, C);
    std::vector<float> p(B * NH * T * T), scratch(B * NH * T * T);
    o.att.resize(rows * C);
    o.datt.resize(rows * 3 * C);
    k::attention_fwd(o.att.data(), p.data(), qkv.data(), B, T, C, NH);
    k::attention_bwd(o.datt.data(), scratch.data(), dy.data(), qkv.data(), p.data(), B, T, C, NH);
    std::vector<float> losses(rows);
    o.probs.resize(rows * V);
    o.dlogits.resize(rows * V);
    k::softmax_xent_fwd(o.probs.data(), losses.data(), logits.data(), targets.data(), rows, V);
    k::softmax_xent_bwd(o.dlogits.data(), o.probs.data(), targets.data(), rows, V, 0.1f);
    o.adam = x;
    std::vector<float> m(rows * C, 0.1f), v(rows * C, 0.2f);
    k::adamw_step(o.adam.data(), dy.data(), m.data(), v.data(), rows * C, 1e-2f, 0.9f, 0.999f,
                  1e-8f, 0.1f, 3);
    o.ssq = k::sum_squares(x.data(), rows * C);
    return o;
  };
  const outputs simd = run();
  k::set_portable_kernels(true);
  CHECK_FALSE(k::simd_kernels());
  const outputs portable = run();
  k::set_portable_kernels(false);
  CHECK(k::simd_kernels());
  CHECK(rel_error(simd.gelu, portable.gelu) < 1e-6);
  CHECK(rel_error(simd.dgelu, portable.dgelu) < 1e-6);
  CHECK(rel_error(simd.ln, portable.ln) < 1e-6);
  CHECK(rel_error(simd.dln, portable.dln) < 1e-5);
  CHECK(rel_error(simd.dlnw, portable.dlnw) < 1e-6);
  CHECK(rel_error(simd.att, portable.att) < 1e-6);
  CHECK(rel_error(simd.datt, portable.datt) < 1e-5);
  CHECK(rel_error(simd.probs, portable.probs) < 1e-6);
  CHECK(rel_error(simd.dlogits, portable.dlogits) < 1e-6);
  CHECK(rel_error(simd.adam, portable.adam) < 1e-6);
  CHECK(simd.ssq == doctest::Approx(portable.ssq).epsilon(1e-12));
}
