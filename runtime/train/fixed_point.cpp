#include "runtime/train/fixed_point.hpp"

#include <cmath>

#include "runtime/core/error.hpp"

namespace cohort::train {

namespace {
constexpr double scale = static_cast<double>(int64_t{1} << fixed_point_bits);
}

int64_t fixed_accumulate(int64_t* acc, const float* x, int64_t n) {
  // Validate first so that a failure leaves acc untouched (no half-applied micro-batch).
  for (int64_t i = 0; i < n; ++i) {
    double v = x[i];
    if (!std::isfinite(v) || std::fabs(v) > fixed_point_max_value) return i;
    int64_t q = std::llrint(v * scale);
    int64_t s;
    if (__builtin_add_overflow(acc[i], q, &s)) return i;
  }
  // llrint rounds to nearest-even in the default rounding mode: the same on every worker.
  for (int64_t i = 0; i < n; ++i) acc[i] += std::llrint(static_cast<double>(x[i]) * scale);
  return -1;
}

void accumulate_gradients(int64_t* acc, const float* grads, int64_t offset, int64_t count,
                          const std::string& where) {
  const int64_t bad = fixed_accumulate(acc + offset, grads + offset, count);
  if (bad < 0) return;
  throw cohort::error("bitwise determinism: gradient element " + std::to_string(bad + offset) +
                      " of " + where + " (value " + std::to_string(grads[bad + offset]) +
                      ") is not finite or exceeds the fixed-point range +-" +
                      std::to_string(fixed_point_max_value) +
                      " (the run diverged: lower train.lr or set train.grad_clip)");
}

void fixed_to_float(float* out, const int64_t* acc, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(static_cast<double>(acc[i]) / scale);
}

int64_t fixed_add(int64_t* a, const int64_t* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    int64_t s;
    if (__builtin_add_overflow(a[i], b[i], &s)) return i;
    a[i] = s;
  }
  return -1;
}

}  // namespace cohort::train
