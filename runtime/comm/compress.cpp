#include "runtime/comm/compress.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "runtime/core/error.hpp"

namespace cohort::comm {

namespace {

constexpr std::size_t kHeader = sizeof(float);
constexpr float kFp8Max = 448.0f;
constexpr float kFp16Max = 65504.0f;

float read_header(const std::uint8_t* in) {
  float s;
  std::memcpy(&s, in, sizeof s);
  return s;
}

void write_header(std::uint8_t* out, float s) { std::memcpy(out, &s, sizeof s); }

std::uint32_t bits_of(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

// s (as bits) when `up` is 1, -s when it is 0: the sign bit flipped, exactly what -s is.
float signed_scale(std::uint32_t s_bits, std::uint32_t up) {
  const std::uint32_t u = s_bits ^ ((up ^ 1u) << 31);
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

std::uint16_t bf16_bits(float x) {
  std::uint32_t u = bits_of(x);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return static_cast<std::uint16_t>((u >> 16) | 0x40u);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);                         // round to nearest, ties to even
  return static_cast<std::uint16_t>(u >> 16);
}

float from_bf16(std::uint16_t b) {
  const std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

std::uint16_t fp16_bits(float x) {
  const _Float16 h = static_cast<_Float16>(x);  // the compiler's IEEE conversion (ties to even)
  std::uint16_t b;
  std::memcpy(&b, &h, sizeof b);
  return b;
}

float from_fp16(std::uint16_t b) {
  _Float16 h;
  std::memcpy(&h, &b, sizeof h);
  return static_cast<float>(h);
}

// E4M3FN: bias 7; exponent field 0 holds the subnormals m/8 * 2^-6; 0x7f / 0xff are NaN.
std::array<float, 256> make_fp8_table() {
  std::array<float, 256> t{};
  for (int c = 0; c < 256; ++c) {
    const int e = (c >> 3) & 0xf, m = c & 7;
    float v = e == 0 ? std::ldexp(static_cast<float>(m), -9)
                     : std::ldexp(1.0f + static_cast<float>(m) / 8.0f, e - 7);
    if ((c & 0x7f) == 0x7f) v = NAN;
    t[c] = (c & 0x80) ? -v : v;
  }
  return t;
}

const std::array<float, 256>& fp8_table() {
  static const std::array<float, 256> t = make_fp8_table();
  return t;
}

std::uint8_t fp8_bits(float x) {
  if (std::isnan(x)) return 0x7f;
  const std::uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const float a = std::fabs(x);
  if (a >= kFp8Max) return sign | 0x7e;
  int code;
  if (a < 0.015625f) {  // below 2^-6: subnormals, m * 2^-9; m == 8 is the smallest normal
    code = static_cast<int>(std::nearbyint(a * 512.0f));
  } else {
    int k;
    const float f = std::frexp(a, &k);  // a = f * 2^k, f in [0.5, 1)
    int e = k - 1;                      // a = (2f) * 2^e, 2f in [1, 2)
    int m = static_cast<int>(std::nearbyint((2.0f * f - 1.0f) * 8.0f));
    if (m == 8) {
      m = 0;
      ++e;
    }
    code = std::min(((e + 7) << 3) | m, 0x7e);
  }
  return sign | static_cast<std::uint8_t>(code);
}

// The power of two that brings the block's largest magnitude within `limit`; 1 for a zero
// block; NaN when the block holds a non-finite value (the decoded block is then NaN too).
float pow2_scale(float amax, float limit) {
  if (!std::isfinite(amax)) return NAN;
  if (amax == 0.0f) return 1.0f;
  int k;
  const float f = std::frexp(amax / limit, &k);  // amax / limit = f * 2^k
  return std::ldexp(1.0f, f == 0.5f ? k - 1 : k);
}

// x + error into error (when feeding back), and the largest magnitude / sum of squares.
const float* with_feedback(const float* x, std::size_t n, float* error) {
  if (error == nullptr) return x;
  for (std::size_t i = 0; i < n; ++i) error[i] += x[i];
  return error;
}

float max_abs(const float* v, std::size_t n) {
  float m = 0.0f;
  for (std::size_t i = 0; i < n; ++i) {
    const float a = std::fabs(v[i]);
    if (!(a <= m)) m = a;  // keeps a NaN once seen
  }
  return m;
}

template <class Bits, class Value>
void encode_scaled(const float* v, std::size_t n, float* error, float scale, std::uint8_t* out,
                   Bits bits, Value value) {
  using code_t = decltype(bits(0.0f));
  write_header(out, scale);
  std::uint8_t* p = out + kHeader;
  const float inv = 1.0f / scale;  // exact: a power of two
  for (std::size_t i = 0; i < n; ++i) {
    const code_t c = bits(v[i] * inv);
    std::memcpy(p + i * sizeof(code_t), &c, sizeof c);
    if (error) error[i] = v[i] - value(c) * scale;
  }
}

template <class Code, class Value, class Out>
void decode_scaled(const std::uint8_t* in, std::size_t n, Value value, Out put) {
  const float scale = read_header(in);
  const std::uint8_t* p = in + kHeader;
  for (std::size_t i = 0; i < n; ++i) {
    Code c;
    std::memcpy(&c, p + i * sizeof c, sizeof c);
    put(i, value(c) * scale);
  }
}

template <class Out>
void decode_into(wire_format f, const std::uint8_t* in, std::size_t n, Out put) {
  switch (f) {
    case wire_format::f32: {
      const std::uint8_t* p = in + kHeader;
      for (std::size_t i = 0; i < n; ++i) {
        float v;
        std::memcpy(&v, p + i * sizeof v, sizeof v);
        put(i, v);
      }
      return;
    }
    case wire_format::bf16:
      return decode_scaled<std::uint16_t>(in, n, from_bf16, put);
    case wire_format::fp16:
      return decode_scaled<std::uint16_t>(in, n, from_fp16, put);
    case wire_format::fp8:
      return decode_scaled<std::uint8_t>(
          in, n, [](std::uint8_t c) { return fp8_table()[c]; }, put);
    case wire_format::sign: {
      // Branch-free: a set bit is +s, a clear one -s (s with its sign bit flipped). Signs
      // of gradients are coin flips, and a branch on each mispredicts half the time.
      const std::uint32_t sb = bits_of(read_header(in));
      const std::uint8_t* p = in + kHeader;
      std::size_t i = 0;
      for (; i + 8 <= n; i += 8) {
        const std::uint32_t b = p[i >> 3];
        for (std::uint32_t k = 0; k < 8; ++k) put(i + k, signed_scale(sb, (b >> k) & 1u));
      }
      for (; i < n; ++i) put(i, signed_scale(sb, (p[i >> 3] >> (i & 7)) & 1u));
      return;
    }
  }
}

}  // namespace

wire_format parse_wire_format(const std::string& name) {
  if (name == "none" || name == "f32") return wire_format::f32;
  if (name == "bf16") return wire_format::bf16;
  if (name == "fp16") return wire_format::fp16;
  if (name == "fp8") return wire_format::fp8;
  if (name == "sign") return wire_format::sign;
  throw usage_error("unknown wire format '" + name + "' (expected none, bf16, fp16, fp8 or sign)");
}

wire_format wire_format_of(comm_compression c) {
  switch (c) {
    case comm_compression::none:
      return wire_format::f32;
    case comm_compression::bf16:
      return wire_format::bf16;
    case comm_compression::fp16:
      return wire_format::fp16;
    case comm_compression::fp8:
      return wire_format::fp8;
  }
  throw usage_error("comm.compression " + std::to_string(static_cast<int>(c)) +
                    " is not one of: none, bf16, fp16, fp8");
}

const char* name_of(wire_format f) {
  switch (f) {
    case wire_format::f32:
      return "f32";
    case wire_format::bf16:
      return "bf16";
    case wire_format::fp16:
      return "fp16";
    case wire_format::fp8:
      return "fp8";
    case wire_format::sign:
      return "sign";
  }
  return "?";
}

std::size_t encoded_bytes(wire_format f, std::size_t n) {
  switch (f) {
    case wire_format::f32:
      return kHeader + 4 * n;
    case wire_format::bf16:
    case wire_format::fp16:
      return kHeader + 2 * n;
    case wire_format::fp8:
      return kHeader + n;
    case wire_format::sign:
      return kHeader + (n + 7) / 8;
  }
  return 0;
}

void encode(wire_format f, const float* x, std::size_t n, float* error, std::uint8_t* out) {
  const float* v = with_feedback(x, n, error);
  switch (f) {
    case wire_format::f32:
      write_header(out, 1.0f);
      std::memcpy(out + kHeader, v, n * sizeof(float));
      if (error) std::fill(error, error + n, 0.0f);
      return;
    case wire_format::bf16:
      return encode_scaled(v, n, error, 1.0f, out, bf16_bits, from_bf16);
    case wire_format::fp16:
      return encode_scaled(v, n, error, pow2_scale(max_abs(v, n), kFp16Max), out, fp16_bits,
                           from_fp16);
    case wire_format::fp8:
      return encode_scaled(v, n, error, pow2_scale(max_abs(v, n), kFp8Max), out, fp8_bits,
                           [](std::uint8_t c) { return fp8_table()[c]; });
    case wire_format::sign: {
      // Four running sums, added in a fixed order at the end: the same bits on every
      // machine, without one long chain of dependent additions.
      double lane[4] = {0.0, 0.0, 0.0, 0.0};
      std::size_t i = 0;
      for (; i + 4 <= n; i += 4)
        for (std::size_t k = 0; k < 4; ++k) lane[k] += std::fabs(static_cast<double>(v[i + k]));
      for (; i < n; ++i) lane[0] += std::fabs(static_cast<double>(v[i]));
      const double sum_abs = (lane[0] + lane[1]) + (lane[2] + lane[3]);
      const float s = n == 0 ? 0.0f : static_cast<float>(sum_abs / static_cast<double>(n));
      write_header(out, s);
      // Branch-free, a byte at a time (see decode_into); the error loop runs apart so that
      // it vectorizes. v may be `error` itself: each element is read before it is written.
      const std::uint32_t sb = bits_of(s);
      std::uint8_t* p = out + kHeader;
      std::fill(p, p + (n + 7) / 8, std::uint8_t{0});
      for (i = 0; i + 8 <= n; i += 8) {
        std::uint32_t b = 0;
        for (std::uint32_t k = 0; k < 8; ++k)
          b |= static_cast<std::uint32_t>(v[i + k] >= 0.0f) << k;
        p[i >> 3] = static_cast<std::uint8_t>(b);
      }
      for (; i < n; ++i)
        p[i >> 3] |= static_cast<std::uint8_t>(static_cast<std::uint32_t>(v[i] >= 0.0f) << (i & 7));
      if (error)
        for (std::size_t j = 0; j < n; ++j) error[j] = v[j] - signed_scale(sb, v[j] >= 0.0f);
      return;
    }
  }
}

void decode(wire_format f, const std::uint8_t* in, std::size_t n, float* out) {
  decode_into(f, in, n, [out](std::size_t i, float v) { out[i] = v; });
}

void decode_add(wire_format f, const std::uint8_t* in, std::size_t n, float* acc) {
  decode_into(f, in, n, [acc](std::size_t i, float v) { acc[i] += v; });
}

float round_fp8(float x) { return fp8_table()[fp8_bits(x)]; }
float round_bf16(float x) { return from_bf16(bf16_bits(x)); }
float round_fp16(float x) {
  if (std::isnan(x)) return x;
  return from_fp16(fp16_bits(std::clamp(x, -kFp16Max, kFp16Max)));
}

}  // namespace cohort::comm
