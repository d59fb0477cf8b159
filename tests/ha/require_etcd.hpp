// Skips a test case that needs etcd when this machine has none: the same places `cohort
// launch` looks (/usr/bin/etcd, then PATH). Only for tests.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <string>

#include "runtime/core/error.hpp"
#include "runtime/ha/local_etcd.hpp"

namespace cohort::test {

/// The etcd executable, or the case exits 77 (CTest: skipped) with the reason on stdout.
inline std::string require_etcd() {
  try {
    return cohort::ha::local_etcd::find_binary();
  } catch (const cohort::error& e) {
    std::printf("skipped: %s\n", e.what());
    std::fflush(stdout);
    std::_Exit(77);
  }
}

}  // namespace cohort::test
