// The schema tables' shorthands (config.cpp, config_keys_runtime.cpp): a key's bounds and
// where it lives in `config`. Only for those two files.
#pragma once
#include <cmath>

#include "runtime/core/config_schema.hpp"

namespace cohort::config_schema {

inline bounds at_least(double v) { return {v, false, HUGE_VAL, false}; }
inline bounds above(double v) { return {v, true, HUGE_VAL, false}; }
inline bounds fraction() { return {0.0, false, 1.0, true}; }  // [0, 1): betas and momentum
inline bounds above_up_to(double lo, double hi) { return {lo, true, hi, false}; }  // (lo, hi]
inline bounds unbounded() { return {}; }
inline bounds from_to(double lo, double hi) { return {lo, false, hi, false}; }  // [lo, hi]

/// The rows of fault_tolerance, elastic, control, ha and faults (config_keys_runtime.cpp).
std::vector<key_spec> runtime_keys();

}  // namespace cohort::config_schema

#define COHORT_FIELD(member) [](config& c) -> field_ref { return &c.member; }
