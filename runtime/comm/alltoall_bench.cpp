#include "runtime/comm/alltoall_bench.hpp"

#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/rendezvous/context.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>

#include "runtime/comm/comm_error.hpp"
#include "runtime/comm/factory.hpp"
#include "runtime/comm/local_kv.hpp"

namespace cohort::comm {

namespace {

using clock_type = std::chrono::steady_clock;

int iters_for(std::size_t bytes) {
  if (bytes <= (64u << 10)) return 200;
  if (bytes <= (1u << 20)) return 60;
  return 16;
}

// Block (from, to) of a rank's send buffer: bytes (from * 131 + to * 7 + k) & 0xff.
void fill(std::vector<std::uint8_t>& buf, int from, int n, std::size_t bytes) {
  for (int to = 0; to < n; ++to)
    for (std::size_t k = 0; k < bytes; ++k)
      buf[static_cast<std::size_t>(to) * bytes + k] =
          static_cast<std::uint8_t>((from * 131 + to * 7 + static_cast<int>(k)) & 0xff);
}

void check(const std::vector<std::uint8_t>& recv, int me, int n, std::size_t bytes,
           const char* path) {
  for (int from = 0; from < n; ++from)
    for (std::size_t k = 0; k < bytes; ++k)
      if (recv[static_cast<std::size_t>(from) * bytes + k] !=
          static_cast<std::uint8_t>((from * 131 + me * 7 + static_cast<int>(k)) & 0xff))
        throw comm_error(comm_failure::invalid, "bench self-check",
                         std::string(path) + " alltoall put a byte of rank " +
                             std::to_string(from) + " in the wrong place");
}

}  // namespace

std::vector<alltoall_bench_row> run_alltoall_bench_rank(const alltoall_bench_options& opts,
                                                        int rank, const std::string& dir) {
  const int n = opts.ranks;
  const std::chrono::milliseconds timeout(opts.timeout_ms);
  file_kv kv(dir + "/kv");
  auto control = bench_control_group(kv, rank, n, opts.timeout_ms);
  transport_options t;
  t.rendezvous_timeout_ms = opts.timeout_ms;
  t.group = "a2a";
  t.transport = opts.transport.kind;
  t.hierarchy = opts.transport.hierarchy;
  auto comm = make_communicator(comm_backend::gloo, "cpu", kv, rank, n, 1, opts.timeout_ms, t);

  auto raw = raw_gloo_context(rank, n, dir + "/raw", timeout);
  auto raw_barrier = [&] {
    gloo::BarrierOptions b(raw);
    b.setTimeout(timeout);
    gloo::barrier(b);
  };

  std::vector<alltoall_bench_row> rows;
  for (std::size_t bytes : opts.sizes) {
    const std::size_t total = bytes * static_cast<std::size_t>(n);
    std::vector<std::uint8_t> send(total), a(total), b(total);
    fill(send, rank, n, bytes);
    auto cohort_once = [&] { comm->alltoall(send.data(), a.data(), bytes); };
    auto raw_once = [&] {
      gloo::AlltoallOptions o(raw);
      o.setInput(reinterpret_cast<char*>(send.data()), total);
      o.setOutput(reinterpret_cast<char*>(b.data()), total);
      o.setTimeout(timeout);
      gloo::alltoall(o);
    };
    cohort_once();
    check(a, rank, n, bytes, "cohort's");
    raw_once();
    check(b, rank, n, bytes, "raw Gloo's");
    const int iters = opts.iters > 0 ? opts.iters : iters_for(bytes);
    for (int i = 0; i < opts.warmup; ++i) {
      cohort_once();
      raw_once();
    }
    raw_barrier();
    const std::vector<std::function<void()>> paths = {cohort_once, raw_once};
    std::vector<std::vector<double>> mine(2);
    auto timed = [&](std::size_t p) {
      const auto t0 = clock_type::now();
      paths[p]();
      mine[p].push_back(std::chrono::duration<double>(clock_type::now() - t0).count());
    };
    for (int i = 0; i < iters; ++i) {  // ABBA: the machine's drift hits both alike
      timed(i % 2 == 0 ? 0 : 1);
      timed(i % 2 == 0 ? 1 : 0);
    }
    alltoall_bench_row row;
    row.bytes = bytes;
    row.iters = iters;
    const std::vector<double> ours = slowest_per_call(*control, mine[0], n);
    const std::vector<double> theirs = slowest_per_call(*control, mine[1], n);
    row.cohort = summarize(ours);
    row.raw = summarize(theirs);
    row.ratio_cohort_raw = paired_ratio(theirs, ours);
    rows.push_back(row);
  }
  control->barrier();
  return rows;
}

}  // namespace cohort::comm
