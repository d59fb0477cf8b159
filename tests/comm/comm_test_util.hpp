// Helpers for the collective tests: ranks as threads over one in-process store, each
// thread's exception carried back to the test thread (assertions stay on that thread).
#pragma once
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "runtime/comm/gloo_comm.hpp"
#include "runtime/comm/kv_client.hpp"
#include "runtime/comm/local_kv.hpp"

namespace cohort::comm::test {

/// Runs fn(rank) on n threads; returns each rank's exception (null when it returned).
inline std::vector<std::exception_ptr> run_ranks(int n, const std::function<void(int)>& fn) {
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

/// Rethrows the first rank's exception, if any (for REQUIRE_NOTHROW around run_ranks).
inline void rethrow_first(const std::vector<std::exception_ptr>& errors) {
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
}

/// Builds a Gloo group of n ranks (rendezvous needs every rank at once: one thread each).
inline std::vector<std::unique_ptr<gloo_comm>> make_gloo_group(kv_client& kv, int n,
                                                               std::uint64_t generation,
                                                               std::chrono::milliseconds timeout,
                                                               const std::string& prefix = "gloo") {
  std::vector<std::unique_ptr<gloo_comm>> comms(n);
  rethrow_first(run_ranks(n, [&](int r) {
    kv_gloo_store store(kv, generation, std::chrono::milliseconds(20000));
    gloo_options o;
    o.prefix = prefix;
    o.timeout = timeout;
    o.rendezvous_timeout = std::chrono::milliseconds(20000);
    comms[r] = std::make_unique<gloo_comm>(store, r, n, o);
  }));
  return comms;
}

/// Seconds since `t0`.
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace cohort::comm::test
