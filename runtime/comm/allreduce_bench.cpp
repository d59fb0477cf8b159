#include "runtime/comm/allreduce_bench.hpp"

#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <optional>

#include "runtime/comm/buckets.hpp"
#include "runtime/comm/compressed_allreduce.hpp"
#include "runtime/comm/factory.hpp"
#include "runtime/comm/local_kv.hpp"

namespace cohort::comm {

namespace {

using clock_type = std::chrono::steady_clock;
using reduce_fn = void (*)(void*, const void*, const void*, std::size_t);

int default_iters(std::size_t bytes) {
  // About 1 GiB moved per path, between 16 and 300 calls: enough calls for a median
  // that holds still on a shared machine.
  const std::size_t want = (std::size_t(1) << 30) / std::max<std::size_t>(bytes, 1);
  return static_cast<int>(std::clamp<std::size_t>(want, 16, 300));
}

}  // namespace

std::vector<std::string> bench_transport::words() {
  return {"gloo", "shm", "hierarchical", "auto"};
}

bench_transport bench_transport::parse(const std::string& word) {
  bench_transport b;
  if (word == "hierarchical") {  // not a comm.transport word: automatic, per host
    b.kind = comm_transport::automatic;
    b.hierarchy = comm_hierarchy::hierarchical;
    return b;
  }
  const std::optional<comm_transport> t = parse_choice<comm_transport>(word);
  if (!t)
    throw usage_error("--transport '" + word + "' is not one of: gloo, shm, hierarchical, auto");
  b.kind = *t;
  return b;
}

std::string bench_transport::word() const {
  return hierarchy == comm_hierarchy::hierarchical ? "hierarchical" : to_string(kind);
}

std::vector<std::size_t> default_bench_sizes() {
  std::vector<std::size_t> s;
  for (std::size_t b = 1024; b <= (std::size_t(64) << 20); b *= 4) s.push_back(b);
  return s;
}

double algbw_gbps(std::size_t bytes, double seconds) {
  return seconds > 0 ? double(bytes) / seconds / 1e9 : 0.0;
}

double busbw_gbps(std::size_t bytes, double seconds, int ranks) {
  return algbw_gbps(bytes, seconds) * 2.0 * (ranks - 1) / ranks;
}

std::shared_ptr<gloo::rendezvous::Context> raw_gloo_context(int rank, int n,
                                                            const std::string& dir,
                                                            std::chrono::milliseconds timeout) {
  gloo::rendezvous::FileStore store(dir);
  auto raw = std::make_shared<gloo::rendezvous::Context>(rank, n);
  raw->setTimeout(timeout);
  auto device = gloo::transport::tcp::CreateDevice("127.0.0.1");
  raw->connectFullMesh(store, device);
  return raw;
}

std::unique_ptr<communicator> bench_control_group(kv_client& kv, int rank, int n, int timeout_ms) {
  transport_options t;
  t.rendezvous_timeout_ms = timeout_ms;
  t.group = "control";
  return make_communicator(comm_backend::gloo, "cpu", kv, rank, n, /*generation=*/1, timeout_ms, t);
}

std::vector<double> slowest_per_call(communicator& control, const std::vector<double>& mine, int n) {
  const std::size_t iters = mine.size();
  std::vector<double> all(static_cast<std::size_t>(n) * iters), slowest(iters, 0.0);
  control.allgather(mine.data(), all.data(), sizeof(double) * iters);
  for (int r = 0; r < n; ++r)
    for (std::size_t i = 0; i < iters; ++i)
      slowest[i] = std::max(slowest[i], all[static_cast<std::size_t>(r) * iters + i]);
  return slowest;
}

path_stats summarize(std::vector<double> times) {
  path_stats st;
  if (times.empty()) return st;
  for (double x : times) st.mean += x / static_cast<double>(times.size());
  std::sort(times.begin(), times.end());
  st.median = times[times.size() / 2];
  st.min = times.front();
  return st;
}

double paired_ratio(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> q(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) q[i] = a[i] / b[i];
  std::sort(q.begin(), q.end());
  return q.empty() ? 0 : q[q.size() / 2];
}

std::vector<allreduce_bench_row> run_allreduce_bench_rank(const allreduce_bench_options& opts,
                                                          int rank, const std::string& dir) {
  const int n = opts.ranks;
  const std::chrono::milliseconds timeout(opts.timeout_ms);

  file_kv kv(dir + "/kv");
  auto control = bench_control_group(kv, rank, n, opts.timeout_ms);
  transport_options t;
  t.rendezvous_timeout_ms = opts.timeout_ms;

  // cohort's path: the factory over the file store, as a worker builds it.
  t.group = "dp";
  t.transport = opts.transport.kind;
  t.hierarchy = opts.transport.hierarchy;
  if (opts.hosts > 1) t.host_id = "bench-host-" + std::to_string(rank * opts.hosts / n);
  auto comm = make_communicator(comm_backend::gloo, "cpu", kv, rank, n, /*generation=*/1,
                                opts.timeout_ms, t);
  // The bucket path's further lanes, as a worker builds them (none over shared memory alone).
  std::vector<std::unique_ptr<communicator>> extra;
  std::vector<communicator*> lanes{comm.get()};
  for (int l = 1; l < opts.lanes && !comm->memory_bound(); ++l) {
    t.group = "dp.l" + std::to_string(l);
    extra.push_back(make_communicator(comm_backend::gloo, "cpu", kv, rank, n, /*generation=*/1,
                                      opts.timeout_ms, t));
    lanes.push_back(extra.back().get());
  }

  // Raw Gloo: its own file store, device and context; nothing of cohort in its loop.
  auto raw = raw_gloo_context(rank, n, dir + "/raw", timeout);
  auto raw_barrier = [&] {
    gloo::BarrierOptions b(raw);
    b.setTimeout(timeout);
    gloo::barrier(b);
  };

  // Correctness once: rank r contributes r + 1.
  {
    std::vector<float> v(1000, float(rank + 1));
    comm->allreduce_sum(v.data(), v.size());
    const float want = float(n * (n + 1) / 2);
    for (float x : v)
      if (x != want)
        throw comm_error(comm_failure::invalid, "bench self-check",
                         "allreduce gave " + std::to_string(x) + ", want " + std::to_string(want));
  }

  std::vector<allreduce_bench_row> rows;
  for (std::size_t size : opts.sizes) {
    const std::size_t count = std::max<std::size_t>(size / sizeof(float), 1);
    const std::size_t bytes = count * sizeof(float);
    const int iters = opts.iters > 0 ? opts.iters : default_iters(bytes);
    // Zeros stay zeros however often they are summed: no overflow to inf over iterations.
    std::vector<float> a(count, 0.0f), b(count, 0.0f), c(count, 0.0f), z(count, 0.0f);
    bucket_engine engine(lanes, count, grad_type::f32, opts.bucket_mb);
    const wire_format format = opts.compression;
    std::vector<float> worker(opts.error_feedback ? count : 0), server(worker.size());
    const error_memory memory{opts.error_feedback ? worker.data() : nullptr,
                              opts.error_feedback ? server.data() : nullptr};

    auto cohort_once = [&] { comm->allreduce_sum(a.data(), count); };
    auto buckets_once = [&] {
      engine.begin(c.data());
      engine.mark_ready(0, count);
      engine.wait_all();
    };
    auto raw_once = [&] {
      gloo::AllreduceOptions o(raw);
      o.setOutput(b.data(), count);
      o.setReduceFunction(static_cast<reduce_fn>(&gloo::sum<float>));
      o.setTimeout(timeout);
      gloo::allreduce(o);
    };
    auto compressed_once = [&] {
      compressed_allreduce_sum(*comm, z.data(), count, format, memory);
    };
    std::vector<std::function<void()>> paths = {cohort_once, buckets_once, raw_once};
    const bool compressing = format != wire_format::f32;
    if (compressing) {
      paths.push_back(compressed_once);  // path 3
      paths.push_back(raw_once);         // path 4: raw Gloo again, paired with path 3
    }
    for (auto& p : paths)
      for (int i = 0; i < opts.warmup; ++i) p();
    raw_barrier();

    // cohort and raw Gloo alternate call by call in ABBA order (c r, r c, c r, ...), so
    // the drift of a shared machine and any effect of the previous call hit both alike.
    // The bucket path follows in its own block: its extra thread must not colour them.
    std::vector<std::vector<double>> mine(paths.size());
    std::size_t row_bytes_compressed = 0, row_bytes_fp32 = 0;
    auto timed = [&](std::size_t path) {
      const auto t0 = clock_type::now();
      paths[path]();
      mine[path].push_back(std::chrono::duration<double>(clock_type::now() - t0).count());
    };
    for (int i = 0; i < iters; ++i) {
      timed(i % 2 == 0 ? 0 : 2);
      timed(i % 2 == 0 ? 2 : 0);
    }
    raw_barrier();
    for (int i = 0; i < iters; ++i) timed(1);
    if (compressing) {
      // Interleaved with raw Gloo like cohort's row, with its bytes counted once first, and
      // an fp32 sum's on the same communicator as their reference.
      raw_barrier();
      const comm_traffic t0 = comm->traffic();
      compressed_once();
      const comm_traffic t1 = comm->traffic();
      cohort_once();
      row_bytes_compressed = t1.sent - t0.sent;
      row_bytes_fp32 = comm->traffic().sent - t1.sent;
      raw_barrier();
      for (int i = 0; i < iters; ++i) {
        timed(i % 2 == 0 ? 3 : 4);
        timed(i % 2 == 0 ? 4 : 3);
      }
    }
    // Per iteration the slowest rank's time (gathered after the timed loop), then the
    // median over iterations: robust to the scheduling spikes of a shared machine.
    allreduce_bench_row row;
    row.bytes = bytes;
    row.iters = iters;
    std::vector<std::vector<double>> slowest(paths.size());
    for (std::size_t path = 0; path < paths.size(); ++path) {
      slowest[path] = slowest_per_call(*control, mine[path], n);
      const path_stats st = summarize(slowest[path]);
      if (path == 0) row.cohort = st;
      if (path == 1) row.buckets = st;
      if (path == 2) row.raw = st;
      if (path == 3) row.compressed = st;
    }
    // Paired ratios: call i of each path ran back to back, so raw_i / path_i compares
    // them under the same machine state; the median of those is the steadiest estimate.
    auto paired = [&](std::size_t path, std::size_t reference = 2) {
      return paired_ratio(slowest[reference], slowest[path]);
    };
    row.ratio_cohort_raw = paired(0);
    row.ratio_buckets_raw = paired(1);
    if (compressing) {
      row.ratio_compressed_raw = paired(3, 4);
      row.compressed_sent = row_bytes_compressed;
      row.fp32_sent = row_bytes_fp32;
    }
    rows.push_back(row);
  }
  control->barrier();
  return rows;
}

}  // namespace cohort::comm
