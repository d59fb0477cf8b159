#include "runtime/comm/compressed_allreduce.hpp"

#include <cstdint>
#include <vector>

namespace cohort::comm {

std::size_t chunk_begin(std::size_t n, int ranks, int j) {
  // n * j fits: n is a buffer's element count, j at most the group size.
  return n * static_cast<std::size_t>(j) / static_cast<std::size_t>(ranks);
}

std::size_t compressed_bytes_sent(wire_format format, std::size_t n, int ranks) {
  if (ranks <= 1) return 0;
  const std::size_t block = encoded_bytes(format, (n + ranks - 1) / ranks);
  return 2 * static_cast<std::size_t>(ranks - 1) * block;
}

namespace {

// The algorithm over any communicator of two or more ranks. It uses only the alltoall and
// the allgather, which move bytes, so every backend (the hierarchy too, whichever ranks
// share a host) gives the same bits.
void chunked_sum(communicator& c, float* data, std::size_t n, wire_format format, error_memory m) {
  const int ranks = c.size(), me = c.rank();
  // Every block has the size of the longest chunk, so one alltoall and one allgather carry
  // them (the ragged tail is a few bytes). Scratch per thread: the bucket engine's lanes
  // run compressed sums at once, each on its own thread.
  const std::size_t block = encoded_bytes(format, (n + ranks - 1) / ranks);
  thread_local std::vector<std::uint8_t> send, recv;
  thread_local std::vector<float> acc;
  send.assign(block * ranks, 0);
  recv.assign(block * ranks, 0);
  for (int j = 0; j < ranks; ++j) {
    const std::size_t b = chunk_begin(n, ranks, j), len = chunk_begin(n, ranks, j + 1) - b;
    encode(format, data + b, len, m.worker ? m.worker + b : nullptr, send.data() + block * j);
  }
  c.alltoall(send.data(), recv.data(), block);

  // This rank's chunk: the ranks' parts added in rank order (the same bits on every run of
  // the same group), encoded once more for everyone.
  const std::size_t mine = chunk_begin(n, ranks, me);
  const std::size_t len = chunk_begin(n, ranks, me + 1) - mine;
  acc.assign(len, 0.0f);
  for (int s = 0; s < ranks; ++s) decode_add(format, recv.data() + block * s, len, acc.data());
  encode(format, acc.data(), len, m.server ? m.server + mine : nullptr, send.data());
  c.allgather(send.data(), recv.data(), block);
  for (int j = 0; j < ranks; ++j) {
    const std::size_t b = chunk_begin(n, ranks, j);
    decode(format, recv.data() + block * j, chunk_begin(n, ranks, j + 1) - b, data + b);
  }
}

}  // namespace

void compressed_allreduce_sum(communicator& c, float* data, std::size_t n, wire_format format,
                              error_memory memory) {
  if (c.size() == 1) return;
  if (format == wire_format::f32 && memory.worker == nullptr && memory.server == nullptr)
    return c.allreduce_sum(data, n);
  chunked_sum(c, data, n, format, memory);
}

void ordered_allreduce_sum(communicator& c, float* data, std::size_t n) {
  if (c.size() > 1) chunked_sum(c, data, n, wire_format::f32, {});
}

}  // namespace cohort::comm
