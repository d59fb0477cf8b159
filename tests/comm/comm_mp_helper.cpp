// One rank process of test_comm_mp: meets the others through a file store and runs a
// scenario. Usage: comm_mp_helper MODE RANK SIZE DIR TIMEOUT_MS
//   sum   exact allreduce (float, int64), allgather and bucket engine; exit 0 when right
//   die   one allreduce, then the last rank SIGKILLs itself; the others keep reducing
//   hang  one allreduce, then the last rank SIGSTOPs itself; the others keep reducing
// Exit codes: 0 ok, 1 wrong values, 3 comm_error (its message on stderr), 4 other error.
#include <signal.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/comm/buckets.hpp"
#include "runtime/comm/factory.hpp"
#include "runtime/comm/local_kv.hpp"

using namespace cohort::comm;
using cohort::comm_backend;

namespace {

int run_sum(communicator& c) {
  const int n = c.size(), r = c.rank();
  for (std::size_t count : {std::size_t(1), std::size_t(1000), std::size_t(300000)}) {
    std::vector<float> f(count);
    for (std::size_t i = 0; i < count; ++i) f[i] = float(r) + float(i % 3);
    c.allreduce_sum(f.data(), count);
    for (std::size_t i = 0; i < count; ++i)
      if (f[i] != float(n * (n - 1) / 2) + float(n) * float(i % 3)) return 1;
    std::vector<std::int64_t> g(count, (std::int64_t(1) << 40) * r + 1);
    c.allreduce_sum(g.data(), count);
    for (auto v : g)
      if (v != (std::int64_t(1) << 40) * (n * (n - 1) / 2) + n) return 1;
  }
  std::vector<int> all(n, -1);
  const int mine = 100 + r;
  c.allgather(&mine, all.data(), sizeof(int));
  for (int k = 0; k < n; ++k)
    if (all[k] != 100 + k) return 1;
  std::vector<float> grads(250000);
  bucket_engine engine(c, grads.size(), grad_type::f32, 0.3);
  engine.begin(grads.data());
  for (std::size_t end = grads.size(); end > 0;) {  // backward: last layers first
    const std::size_t begin = end > 7001 ? end - 7001 : 0;
    for (std::size_t i = begin; i < end; ++i) grads[i] = float(r + 1);
    engine.mark_ready(begin, end - begin);
    end = begin;
  }
  engine.wait_all();
  for (float v : grads)
    if (v != float(n * (n + 1) / 2)) return 1;
  c.barrier();
  return 0;
}

int run_failure(communicator& c, int signal_number) {
  std::vector<float> buf(std::size_t(1) << 18, 1.0f);
  c.allreduce_sum(buf.data(), buf.size());
  if (c.rank() == c.size() - 1) raise(signal_number);
  for (int i = 0; i < 1000; ++i) c.allreduce_sum(buf.data(), buf.size());
  return 0;  // reached only if the failure went unnoticed
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: comm_mp_helper sum|die|hang RANK SIZE DIR TIMEOUT_MS\n");
    return 2;
  }
  const std::string mode = argv[1];
  const int rank = std::atoi(argv[2]), size = std::atoi(argv[3]);
  const int timeout_ms = std::atoi(argv[5]);
  try {
    file_kv kv(argv[4]);
    transport_options t;
    t.rendezvous_timeout_ms = 30000;  // processes start at different times on a busy machine
    auto c = make_communicator(comm_backend::gloo, "cpu", kv, rank, size, 1, timeout_ms, t);
    if (mode == "sum") return run_sum(*c);
    if (mode == "die") return run_failure(*c, SIGKILL);
    if (mode == "hang") return run_failure(*c, SIGSTOP);
    return 2;
  } catch (const comm_error& e) {
    std::fprintf(stderr, "rank %d: comm_error (%s): %s\n", rank, to_string(e.kind()), e.what());
    return 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: error: %s\n", rank, e.what());
    return 4;
  }
}
