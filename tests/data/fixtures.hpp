// Test helper: the real data sets, loaded once per test binary (Fashion-MNIST takes
// ~0.5 s to decompress; KJV is cached in a per-process temporary folder).
#pragma once
#include "runtime/data/fashion_mnist.hpp"
#include "runtime/data/kjv.hpp"
#include "temp_dir.hpp"

namespace cohort::test {

inline const fashion_mnist& fashion() {
  static const fashion_mnist ds(fashion_mnist::default_dir);
  return ds;
}

/// The KJV text as `bible` prints it (run once per binary, not cached in $HOME).
inline const std::string& kjv_text() {
  static const std::string text = kjv::run_bible();
  return text;
}

}  // namespace cohort::test
