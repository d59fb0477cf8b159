#include "runtime/comm/holders_sum.hpp"

#include <algorithm>
#include <cstring>

#include "runtime/core/error.hpp"

namespace cohort::comm {

std::vector<std::pair<std::size_t, std::size_t>> holding::inside(int r, std::size_t offset,
                                                                 std::size_t count) const {
  std::vector<std::pair<std::size_t, std::size_t>> out;
  const std::size_t end = offset + count;
  for (const auto& [b, e] : ranges[static_cast<std::size_t>(r)]) {
    const std::size_t lo = std::max(b, offset), hi = std::min(e, end);
    if (lo < hi) out.emplace_back(lo, hi);
  }
  return out;
}

namespace {

std::size_t share(const std::vector<std::pair<std::size_t, std::size_t>>& pieces) {
  std::size_t n = 0;
  for (const auto& [b, e] : pieces) n += e - b;
  return n;
}

std::size_t largest_share(const holding& h, std::size_t offset, std::size_t count) {
  std::size_t most = 0;
  for (int r = 0; r < h.ranks(); ++r) most = std::max(most, share(h.inside(r, offset, count)));
  return most;
}

// Elements [offset, offset + count) of DATA: each element this rank holds becomes the ranks'
// sum, added in rank order, through one alltoall of blocks padded to the largest rank's share
// (SCRATCH holds both sets of blocks). What communicator::holders_sum does unless a backend
// overrides it.
template <class T>
void sum_to_holders(communicator& c, T* data, std::size_t offset, std::size_t count,
                    const holding& h, std::vector<char>& scratch) {
  const int w = c.size();
  if (w == 1 || count == 0) return;
  COHORT_CHECK(h.ranks() == w);
  const std::size_t block = largest_share(h, offset, count);
  if (block == 0) return;  // nobody holds any of it: every rank makes the same choice
  const std::size_t bytes = block * sizeof(T);
  scratch.resize(2 * static_cast<std::size_t>(w) * bytes);
  T* send = reinterpret_cast<T*>(scratch.data());
  T* recv = send + static_cast<std::size_t>(w) * block;
  for (int j = 0; j < w; ++j) {
    T* to = send + static_cast<std::size_t>(j) * block;
    for (const auto& [b, e] : h.inside(j, offset, count)) {
      std::memcpy(to, data + b, (e - b) * sizeof(T));
      to += e - b;
    }
  }
  c.alltoall(send, recv, bytes);
  // Rank 0's piece, then + rank 1's, ...: one order for every holder of an element.
  std::size_t at = 0;
  for (const auto& [b, e] : h.inside(c.rank(), offset, count)) {
    const std::size_t n = e - b;
    T* out = data + b;
    std::memcpy(out, recv + at, n * sizeof(T));
    for (int r = 1; r < w; ++r) {
      const T* in = recv + static_cast<std::size_t>(r) * block + at;
      for (std::size_t i = 0; i < n; ++i) out[i] += in[i];
    }
    at += n;
  }
}

// The blocks of the calling thread (a bucket engine's lane), kept between its buckets.
thread_local std::vector<char> lane_scratch;
}  // namespace

void communicator::holders_sum(float* data, std::size_t offset, std::size_t count,
                               const holding& h) {
  sum_to_holders(*this, data, offset, count, h, lane_scratch);
}

void communicator::holders_sum(std::int64_t* data, std::size_t offset, std::size_t count,
                               const holding& h) {
  sum_to_holders(*this, data, offset, count, h, lane_scratch);
}

std::size_t holders_sum_bytes_sent(const holding& h, std::size_t offset, std::size_t count,
                                   std::size_t element_bytes) {
  if (h.ranks() <= 1) return 0;
  return static_cast<std::size_t>(h.ranks() - 1) * largest_share(h, offset, count) *
         element_bytes;
}

}  // namespace cohort::comm
