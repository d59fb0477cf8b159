#include "runtime/comm/p2p_bench.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>

#include "runtime/comm/allreduce_bench.hpp"
#include "runtime/comm/local_kv.hpp"
#include "runtime/comm/p2p.hpp"
#include "runtime/net/curve.hpp"

namespace cohort::comm {

namespace {

using clock_type = std::chrono::steady_clock;

int default_iters(std::size_t bytes) {
  // About 512 MiB per size and measure, between 16 and 300 messages: enough for a median
  // that holds still on a shared machine without making 16 MiB take minutes.
  const std::size_t want = (std::size_t(512) << 20) / std::max<std::size_t>(bytes, 1);
  return static_cast<int>(std::clamp<std::size_t>(want, 16, 300));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

std::vector<char> to_bytes(const std::string& s) { return std::vector<char>(s.begin(), s.end()); }

}  // namespace

std::vector<std::size_t> default_p2p_bench_sizes() {
  return {std::size_t(256) << 10, std::size_t(1) << 20, std::size_t(4) << 20,
          std::size_t(16) << 20};
}

std::vector<p2p_bench_row> run_p2p_bench_rank(const p2p_bench_options& opts, int rank,
                                              const std::string& dir) {
  if (rank != 0 && rank != 1)
    throw comm_error(comm_failure::invalid, "p2p bench", "rank must be 0 or 1");
  const int other = 1 - rank;
  const std::chrono::milliseconds timeout(opts.timeout_ms);
  std::vector<p2p_bench_row> rows;
  {
    // The channels meet as pipeline stages do: each binds, publishes its endpoint, connects
    // to the other's.
    file_kv kv(dir + "/kv");
    std::unique_ptr<net::client_keys> keys;
    if (!opts.keys_dir.empty())
      keys = std::make_unique<net::client_keys>(
          net::load_client_keys(opts.keys_dir, net::key_role::worker));
    p2p_channel ch("127.0.0.1", rank, /*generation=*/1, opts.timeout_ms, p2p_limits{}, keys.get(),
                   opts.security);
    kv.set("p2p/endpoint/" + std::to_string(rank), to_bytes(ch.endpoint()));
    const std::vector<char> theirs = kv.get("p2p/endpoint/" + std::to_string(other), timeout);
    ch.connect(other, std::string(theirs.begin(), theirs.end()));

    std::uint64_t tag = 0;  // every message gets its own tag: a mix-up would fail loudly
    char ack = 1;
    for (std::size_t size : opts.sizes) {
      const int iters = opts.iters > 0 ? opts.iters : default_iters(size);
      std::vector<unsigned char> out(size), in(size);
      for (std::size_t i = 0; i < size; ++i) out[i] = static_cast<unsigned char>(i * 131 + rank);
      p2p_bench_row row;
      row.bytes = size;
      row.iters = iters;

      // Ping-pong: rank 0 sends, rank 1 answers with the same size.
      auto round_trip = [&] {
        const std::uint64_t t = tag++;
        if (rank == 0) {
          ch.send(1, t, out.data(), size);
          ch.recv(1, t, in.data(), size);
        } else {
          ch.recv(0, t, in.data(), size);
          ch.send(0, t, out.data(), size);
        }
      };
      for (int i = 0; i < opts.warmup; ++i) round_trip();
      std::vector<double> half;
      for (int i = 0; i < iters; ++i) {
        const auto t0 = clock_type::now();
        round_trip();
        half.push_back(seconds_since(t0) / 2);
      }
      row.pingpong_s = median(half);
      // The answer of the last round trip carries rank 1's bytes: the data path is checked
      // once per size, not only timed.
      if (rank == 0)
        for (std::size_t i = 0; i < size; ++i)
          if (in[i] != static_cast<unsigned char>(i * 131 + 1))
            throw comm_error(comm_failure::invalid, "p2p bench self-check",
                             "byte " + std::to_string(i) + " differs after a round trip");

      // Streaming: rank 0 sends `iters` messages back to back; rank 1 acknowledges the last.
      std::vector<double> per_message;
      for (int r = 0; r < opts.rounds; ++r) {
        const std::uint64_t first = tag;
        tag += iters + 1;
        const auto t0 = clock_type::now();
        if (rank == 0) {
          for (int i = 0; i < iters; ++i) ch.send(1, first + i, out.data(), size);
          ch.recv(1, first + iters, &ack, 1);
        } else {
          for (int i = 0; i < iters; ++i) ch.recv(0, first + i, in.data(), size);
          ch.send(0, first + iters, &ack, 1);
        }
        per_message.push_back(seconds_since(t0) / iters);
      }
      row.stream_s = median(per_message);
      rows.push_back(row);
    }
    // Linger is 0: a frame still queued when its channel closes is lost. Rank 1 sent the
    // last frame (the ack), so it keeps its channel open until rank 0 says it has it.
    if (rank == 0)
      kv.set("p2p/done", to_bytes("1"));
    else
      kv.wait({"p2p/done"}, timeout);
  }

  if (opts.allreduce) {
    allreduce_bench_options ar;
    ar.ranks = 2;
    for (std::size_t s : opts.sizes) ar.sizes.push_back(std::max<std::size_t>(s / 4 * 4, 4));
    ar.iters = opts.iters;
    ar.warmup = opts.warmup;
    ar.timeout_ms = opts.timeout_ms;
    const auto ar_rows = run_allreduce_bench_rank(ar, rank, dir);
    for (std::size_t i = 0; i < rows.size() && i < ar_rows.size(); ++i)
      rows[i].allreduce_s = ar_rows[i].cohort.median;
  }
  return rows;
}

}  // namespace cohort::comm
