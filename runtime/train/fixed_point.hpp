// Fixed-point gradient sums for `train.determinism: bitwise`. Float sums depend on their
// order; int64 sums do not, so gradients converted to fixed point once per micro-batch can
// be summed in any order, in any process, and converted back to the same bits.
// Owns the scale, the conversion and overflow detection; not the collectives.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace cohort::train {

/// Fractional bits: a value v is stored as round(v * 2^40). Resolution 2^-40 (~9.1e-13);
/// a sum may reach +-2^23 (~8.4e6) before int64 overflows. Gradients of a mean loss are
/// orders of magnitude below that; a run that gets there has diverged, and conversion or
/// accumulation reports an overflow error instead of wrapping.
inline constexpr int fixed_point_bits = 40;
/// Largest magnitude a single value may have to be converted (2^62 / 2^40 = 2^22).
inline constexpr double fixed_point_max_value = 4194304.0;

/// acc[i] += round(x[i] * 2^40). Returns the index of the first element that is not
/// finite, exceeds fixed_point_max_value, or would overflow the sum; -1 when all fit
/// (on failure acc is left unchanged).
int64_t fixed_accumulate(int64_t* acc, const float* x, int64_t n);

/// acc[offset + i] += the fixed point of grads[offset + i] for i < count, where grads is a
/// step's whole gradient buffer; throws cohort::error naming the element, its value and
/// `where` (e.g. "step 12") when one does not fit (the run diverged; acc is left unchanged).
void accumulate_gradients(int64_t* acc, const float* grads, int64_t offset, int64_t count,
                          const std::string& where);

/// out[i] = float(acc[i] * 2^-40), rounded once.
void fixed_to_float(float* out, const int64_t* acc, int64_t n);

/// Adds b into a elementwise as integers (what an allreduce of fixed-point sums does).
/// Returns the first index that would overflow, or -1; elements before it are summed,
/// that one and the rest are left as they were.
int64_t fixed_add(int64_t* a, const int64_t* b, int64_t n);

}  // namespace cohort::train
