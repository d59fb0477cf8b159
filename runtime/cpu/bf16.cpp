// bf16 on the CPU: what the processor offers (cpuid), the rounding of float32 to bfloat16
// (round to nearest even, as the VCVTNEPS2BF16 instruction does, with a portable twin that
// gives the same bits), and the process-wide switch that sends matrix products to bf16
// (matmul_bf16.cpp computes them).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>

#include "runtime/cpu/kernels.hpp"
#include "runtime/cpu/simd.hpp"

#if COHORT_X86
#include <cpuid.h>
#endif

namespace cohort::cpu {

namespace {

std::atomic<bool> g_bf16{false};
// -1: not decided (the first use reads COHORT_CPU_BF16); 0: the ISA's path; 1: portable.
std::atomic<int> g_force_portable{-1};

#if COHORT_X86
// XCR0: which register states the OS saves (0 when it offers no XGETBV).
uint64_t xcr0() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return 0;  // OSXSAVE
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

bf16_isa detect() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return bf16_isa::none;
  const bool avx512f = b & (1u << 16);
  const bool amx_bf16 = d & (1u << 22);
  const unsigned max_sub = a;
  bool avx512_bf16 = false;
  if (max_sub >= 1) {
    unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
    __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1);
    avx512_bf16 = a1 & (1u << 5);
  }
  // The rounding runs VCVTNE2PS2BF16 on either path, so AVX512_BF16 and the AVX-512 state
  // (XCR0 bits 1-2 and 5-7) are needed for both; AMX also needs the tile state (bits 17-18),
  // which a kernel or a VM may withhold while cpuid still shows AMX.
  const uint64_t x = xcr0();
  if (!avx512f || !avx512_bf16 || (x & 0xe6u) != 0xe6u) return bf16_isa::none;
  if (amx_bf16 && (x & 0x60000u) == 0x60000u) return bf16_isa::amx_bf16;
  return bf16_isa::avx512_bf16;
}
#else
bf16_isa detect() { return bf16_isa::none; }
#endif

// float32 -> bfloat16 bits as VCVTNEPS2BF16 computes them: a zero or subnormal input gives
// a signed zero, a NaN a quiet NaN with the same sign and top payload bits, the rest round to
// nearest, ties to even (infinities stay infinities, overflow rounds to infinity).
COHORT_INLINE uint16_t round_one(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  if ((u & 0x7f800000u) == 0) return static_cast<uint16_t>((u >> 16) & 0x8000u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

void to_bf16_portable(uint16_t* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = round_one(x[i]);
}

#if COHORT_X86
__attribute__((target("avx512f,avx512bf16,avx512vl"))) void to_bf16_avx512(uint16_t* y,
                                                                           const float* x,
                                                                           int64_t n) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512bh r = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i));
    _mm512_storeu_si512(y + i, reinterpret_cast<const __m512i&>(r));
  }
  for (; i + 16 <= n; i += 16) {
    const __m256bh r = _mm512_cvtneps_pbh(_mm512_loadu_ps(x + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), reinterpret_cast<const __m256i&>(r));
  }
  for (; i < n; ++i) y[i] = round_one(x[i]);
}
#endif

#if COHORT_X86
// Twelve independent accumulator chains (more than the FMA pipes' latency x width), N rounds:
// the loop runs at the instruction's throughput and touches no memory.
template <bool bf16>
__attribute__((target("avx512f,avx512bf16"), noinline)) float peak_loop(int64_t rounds) {
  __m512 a0 = _mm512_set1_ps(0.0f), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0,
         a8 = a0, a9 = a0, a10 = a0, a11 = a0;
  __m512 x = _mm512_set1_ps(1e-8f);
  __asm__ volatile("" : "+v"(x));  // not a constant the compiler could fold
  const __m512bh h = reinterpret_cast<const __m512bh&>(x);
  for (int64_t r = 0; r < rounds; ++r) {
#define COHORT_STEP(a) a = bf16 ? _mm512_dpbf16_ps(a, h, h) : _mm512_fmadd_ps(x, x, a)
    COHORT_STEP(a0);
    COHORT_STEP(a1);
    COHORT_STEP(a2);
    COHORT_STEP(a3);
    COHORT_STEP(a4);
    COHORT_STEP(a5);
    COHORT_STEP(a6);
    COHORT_STEP(a7);
    COHORT_STEP(a8);
    COHORT_STEP(a9);
    COHORT_STEP(a10);
    COHORT_STEP(a11);
#undef COHORT_STEP
  }
  const __m512 s =
      _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                                  _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7))),
                    _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));
  return _mm512_reduce_add_ps(s);
}
#endif

}  // namespace

bf16_isa cpu_bf16_isa() {
  static const bf16_isa isa = detect();
  return isa;
}

const char* bf16_isa_name(bf16_isa isa) {
  switch (isa) {
    case bf16_isa::amx_bf16:
      return "amx_bf16";
    case bf16_isa::avx512_bf16:
      return "avx512_bf16";
    case bf16_isa::none:
      break;
  }
  return "none";
}

double peak_gflops(bool bf16) {
#if COHORT_X86
  if (cpu_bf16_isa() == bf16_isa::none) return 0.0;
  const int64_t rounds = 4000000;
  double best = 0.0;
  for (int trial = 0; trial < 3; ++trial) {
    const auto t0 = std::chrono::steady_clock::now();
    volatile float sink = bf16 ? peak_loop<true>(rounds) : peak_loop<false>(rounds);
    (void)sink;
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // A 512-bit FMA: 16 lanes x 2 flops; VDPBF16PS: 16 lanes x 2 products x 2 flops.
    const double flops = static_cast<double>(rounds) * 12 * (bf16 ? 64 : 32);
    best = std::max(best, flops / secs / 1e9);
  }
  return best;
#else
  (void)bf16;
  return 0.0;
#endif
}

void set_matmul_bf16(bool on) { g_bf16.store(on, std::memory_order_relaxed); }
bool matmul_bf16() { return g_bf16.load(std::memory_order_relaxed); }

void set_portable_bf16(bool on) { g_force_portable.store(on ? 1 : 0); }

bool fast_bf16() {
  int forced = g_force_portable.load();
  if (forced < 0) {
    const char* v = std::getenv("COHORT_CPU_BF16");
    forced = (v && std::string(v) == "portable") ? 1 : 0;
    int expected = -1;
    g_force_portable.compare_exchange_strong(expected, forced);
    forced = g_force_portable.load();
  }
  return forced == 0 && cpu_bf16_isa() != bf16_isa::none;
}

void to_bf16(uint16_t* y, const float* x, int64_t n) {
#if COHORT_X86
  if (cpu_bf16_isa() != bf16_isa::none && detail::use_avx2()) return to_bf16_avx512(y, x, n);
#endif
  to_bf16_portable(y, x, n);
}

void round_to_bf16(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = static_cast<uint32_t>(round_one(x[i])) << 16;
    std::memcpy(y + i, &u, 4);
  }
}

float bf16_to_float(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace cohort::cpu
