// Wire formats of compressed communication (comm.compression, train.optimizer: onebit_adam):
// how a block of floats is encoded for the wire (bf16, fp16, fp8 with a power-of-two scale,
// or 1-bit signs with one magnitude), decoded, and how error feedback carries what the
// encoding lost into the next block. Pure arithmetic on host memory: owns no collective
// (runtime/comm/compressed_allreduce.hpp does the sums) and no training state.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "runtime/core/comm_choices.hpp"

namespace cohort::comm {

/// How floats travel. f32: as they are (no loss). bf16: the upper 16 bits, rounded to
/// nearest even. fp16 and fp8 (OCP E4M3FN: 4 exponent bits, 3 mantissa bits, largest 448,
/// no infinities): the block is first divided by a power of two chosen so that its
/// largest magnitude fits the format (exact: only the exponent moves), then rounded to
/// nearest even; values too small for the format flush to zero. sign: one bit per value
/// (value >= 0) and one magnitude for the block, mean |x|: the magnitude closest to x in
/// least squares, which one outlier moves by 1/n of itself where the root mean square
/// (DeepSpeed's choice) moves by 1/sqrt(n). 1-bit Adam sends its momentum this way.
enum class wire_format { f32, bf16, fp16, fp8, sign };

/// "none" | "f32" -> f32, "bf16", "fp16", "fp8", "sign"; throws usage_error otherwise.
wire_format parse_wire_format(const std::string& name);
const char* name_of(wire_format f);
/// The wire format of comm.compression (none: f32), as the config layer parsed it.
wire_format wire_format_of(comm_compression c);

/// Bytes of one encoded block of n values: a 4-byte float header (the scale: the power
/// of two of fp16/fp8, the magnitude of sign, 1 for f32/bf16) and the values.
std::size_t encoded_bytes(wire_format f, std::size_t n);

/// Encodes x[0, n) into out (encoded_bytes(f, n) bytes). With error feedback (`error`
/// non-null, n floats): encodes x + error instead and leaves in `error` what the encoding
/// lost, (x + error) - decode(out), so that the next block carries it. x is read only.
/// Non-finite inputs give a non-finite scale or values: they are not hidden.
void encode(wire_format f, const float* x, std::size_t n, float* error, std::uint8_t* out);
/// out[i] = the value block `in` (n values, encoded by encode) stands for.
void decode(wire_format f, const std::uint8_t* in, std::size_t n, float* out);
/// acc[i] += the value block `in` stands for (in fp32, element by element).
void decode_add(wire_format f, const std::uint8_t* in, std::size_t n, float* acc);

/// One value through the E4M3FN format without scaling: the nearest representable value
/// (ties to even), saturated at +-448, signed zero kept. For tests and the docs' tables.
float round_fp8(float x);
/// The same through bf16 and IEEE fp16 (saturating at +-65504 rather than overflowing).
float round_bf16(float x);
float round_fp16(float x);

}  // namespace cohort::comm
