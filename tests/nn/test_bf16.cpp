// bf16 matrix products on the CPU (runtime/cpu/bf16.cpp, matmul_bf16.cpp): the rounding's
// closed-form cases, the AVX512_BF16 rounding against the portable loop bit for bit, oneDNN's
// products against float32 within the bound bf16 inputs allow, the portable path (forced by
// the test hook) bit for bit against its reference (operands rounded, then sgemm), and the
// weight copy that linear_dx reuses from linear_fwd going stale at an optimizer step.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "runtime/cpu/kernels.hpp"
#include "runtime/nn/device.hpp"

using namespace cohort;

namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::vector<float> randn(std::size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// Restores fp32 products and the CPU's own paths whatever a case does.
struct precision_guard {
  ~precision_guard() {
    cpu::set_matmul_bf16(false);
    cpu::set_portable_bf16(false);
    cpu::set_portable_kernels(false);
  }
};

double ref_entry(bool ta, bool tb, int i, int j, int k, const std::vector<float>& a, int lda,
                 const std::vector<float>& b, int ldb, double* abs_sum) {
  double s = 0.0, as = 0.0;
  for (int p = 0; p < k; ++p) {
    const double x =
        ta ? a[static_cast<std::size_t>(p) * lda + i] : a[static_cast<std::size_t>(i) * lda + p];
    const double y =
        tb ? b[static_cast<std::size_t>(j) * ldb + p] : b[static_cast<std::size_t>(p) * ldb + j];
    s += x * y;
    as += std::fabs(x * y);
  }
  *abs_sum = as;
  return s;
}

}  // namespace

TEST_CASE("bf16 rounding: nearest even, zero for subnormals, quiet NaN, and both builds agree") {
  precision_guard guard;
  auto one = [](float f) {
    uint16_t h = 0;
    cpu::to_bf16(&h, &f, 1);
    return h;
  };
  CHECK(one(1.0f) == 0x3f80);
  CHECK(one(-2.0f) == 0xc000);
  CHECK(one(from_bits(0x3f808000)) == 0x3f80);  // a tie rounds to the even 0x3f80
  CHECK(one(from_bits(0x3f818000)) == 0x3f82);  // a tie rounds up to the even 0x3f82
  CHECK(one(from_bits(0x3f808001)) == 0x3f81);  // above the tie rounds up
  CHECK(one(from_bits(0x00000001)) == 0x0000);  // subnormal: zero
  CHECK(one(from_bits(0x80400000)) == 0x8000);  // negative subnormal: -0
  CHECK(one(std::numeric_limits<float>::infinity()) == 0x7f80);
  CHECK(one(from_bits(0x7f7fffff)) == 0x7f80);  // the largest float rounds to infinity
  CHECK(one(from_bits(0x7f800001)) == 0x7fc0);  // a signalling NaN comes back quiet
  CHECK(cpu::bf16_to_float(0x3f80) == 1.0f);

  // Random values and every special, through the vector build (when the CPU has it) and the
  // portable loop: the same bits; round_to_bf16 is the same rounding kept as float32.
  std::vector<float> x = randn(4099, 3);
  for (uint32_t u : {0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x7f800000u, 0xff800000u,
                     0x7fc00000u, 0x7f800001u, 0xffffffffu, 0x3f808000u, 0x7f7fffffu})
    x.push_back(from_bits(u));
  for (int i = 0; i < 300; ++i) x.push_back(from_bits(0x3f800000u + i * 0x8000u));  // ties
  std::vector<uint16_t> fast(x.size()), slow(x.size());
  cpu::to_bf16(fast.data(), x.data(), static_cast<int64_t>(x.size()));
  cpu::set_portable_kernels(true);
  cpu::to_bf16(slow.data(), x.data(), static_cast<int64_t>(x.size()));
  cpu::set_portable_kernels(false);
  CHECK(fast == slow);
  std::vector<float> r(x.size());
  cpu::round_to_bf16(r.data(), x.data(), static_cast<int64_t>(x.size()));
  for (std::size_t i = 0; i < x.size(); ++i)
    CHECK(bits(r[i]) == static_cast<uint32_t>(fast[i]) << 16);
  MESSAGE(
      "bf16 instructions on this CPU: " << std::string(cpu::bf16_isa_name(cpu::cpu_bf16_isa())));
}

TEST_CASE("bf16 gemm: every transpose, alpha, beta and ldc within the bound of bf16 inputs") {
  precision_guard guard;
  // |C - C_exact| <= 2 * 2^-8 * sum_p |a_ip b_pj| (each input off by at most 2^-9 relative,
  // so each product by 2^-8 + 2^-18) + float32 accumulation; the bound says 2^-7.
  const int m = 37, n = 45, k = 70;
  for (const bool portable : {false, true})
    for (const bool ta : {false, true})
      for (const bool tb : {false, true})
        for (const float alpha : {1.0f, 0.5f})
          for (const float beta : {0.0f, 1.0f})
            for (const int pad : {0, 3}) {
              CAPTURE(portable);
              CAPTURE(ta);
              CAPTURE(tb);
              CAPTURE(alpha);
              CAPTURE(beta);
              CAPTURE(pad);
              cpu::set_portable_bf16(portable);
              const int lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
              const std::vector<float> a = randn(static_cast<std::size_t>(ta ? k : m) * lda, 11);
              const std::vector<float> b = randn(static_cast<std::size_t>(tb ? n : k) * ldb, 12);
              const std::vector<float> c0 = randn(static_cast<std::size_t>(m) * ldc, 13);
              std::vector<float> c = c0;
              cpu::set_matmul_bf16(true);
              cpu::gemm(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
              cpu::set_matmul_bf16(false);
              double worst = 0.0;
              for (int i = 0; i < m; ++i)
                for (int j = 0; j < n; ++j) {
                  double abs_sum = 0.0;
                  const double exact =
                      alpha * ref_entry(ta, tb, i, j, k, a, lda, b, ldb, &abs_sum) +
                      beta * c0[static_cast<std::size_t>(i) * ldc + j];
                  const double err = std::fabs(c[static_cast<std::size_t>(i) * ldc + j] - exact);
                  worst = std::max(worst, err / (alpha * abs_sum * std::ldexp(1.0, -7) + 1e-6));
                }
              CHECK(worst <= 1.0);
              // Padding after each row of C is not written.
              for (int i = 0; i < m; ++i)
                for (int j = n; j < ldc; ++j)
                  CHECK(c[static_cast<std::size_t>(i) * ldc + j] ==
                        c0[static_cast<std::size_t>(i) * ldc + j]);
            }
}

TEST_CASE("bf16 portable path: the same bits as rounding both operands and multiplying in fp32") {
  precision_guard guard;
  const int m = 64, n = 48, k = 96;
  const std::vector<float> a = randn(static_cast<std::size_t>(m) * k, 21);
  const std::vector<float> b = randn(static_cast<std::size_t>(n) * k, 22);
  std::vector<float> ra(a.size()), rb(b.size());
  cpu::round_to_bf16(ra.data(), a.data(), static_cast<int64_t>(a.size()));
  cpu::round_to_bf16(rb.data(), b.data(), static_cast<int64_t>(b.size()));
  std::vector<float> want(static_cast<std::size_t>(m) * n), got(want.size());
  cpu::gemm(false, true, m, n, k, 1.0f, ra.data(), k, rb.data(), k, 0.0f, want.data(), n);
  cpu::set_portable_bf16(true);
  cpu::set_matmul_bf16(true);
  CHECK_FALSE(cpu::fast_bf16());
  cpu::gemm(false, true, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, got.data(), n);
  CHECK(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0);
  // The CPU device names the path in the run's header line.
  CHECK(nn::cpu_device().describe().find("bf16 PORTABLE") != std::string::npos);
  cpu::set_portable_bf16(false);
  if (cpu::cpu_bf16_isa() != cpu::bf16_isa::none)
    CHECK(nn::cpu_device().describe().find("bf16 on oneDNN") != std::string::npos);
}

TEST_CASE("bf16 linear: forward and dx use one rounded copy of W, which an optimizer step stales") {
  precision_guard guard;
  const int rows = 32, in = 40, out = 24;
  std::vector<float> w = randn(static_cast<std::size_t>(out) * in, 31);
  const std::vector<float> x = randn(static_cast<std::size_t>(rows) * in, 32);
  const std::vector<float> dy = randn(static_cast<std::size_t>(rows) * out, 33);
  for (const bool portable : {false, true}) {
    CAPTURE(portable);
    cpu::set_portable_bf16(portable);
    cpu::set_matmul_bf16(true);
    std::vector<float> y(static_cast<std::size_t>(rows) * out), y_ref(y.size());
    cpu::linear_fwd(y.data(), x.data(), w.data(), nullptr, rows, in, out);
    cpu::gemm(false, true, rows, out, in, 1.0f, x.data(), in, w.data(), in, 0.0f, y_ref.data(),
              out);
    CHECK(y == y_ref);  // linear_fwd is gemm on the same rounded operands
    std::vector<float> dx(static_cast<std::size_t>(rows) * in), dx_ref(dx.size());
    cpu::linear_dx(dx.data(), dy.data(), w.data(), rows, in, out);
    cpu::gemm(false, false, rows, in, out, 1.0f, dy.data(), out, w.data(), in, 0.0f, dx_ref.data(),
              in);
    CHECK(dx == dx_ref);
    // W changes by an optimizer step: linear_dx must not use the copy forward made.
    std::vector<float> g(w.size(), 1.0f), m1(w.size(), 0.0f), v1(w.size(), 0.0f);
    cpu::adamw_step(w.data(), g.data(), m1.data(), v1.data(), static_cast<int64_t>(w.size()), 0.5f,
                    0.9f, 0.999f, 1e-8f, 0.0f, 1);
    cpu::linear_dx(dx.data(), dy.data(), w.data(), rows, in, out);
    cpu::gemm(false, false, rows, in, out, 1.0f, dy.data(), out, w.data(), in, 0.0f, dx_ref.data(),
              in);
    CHECK(dx == dx_ref);
    cpu::set_matmul_bf16(false);
  }
}
