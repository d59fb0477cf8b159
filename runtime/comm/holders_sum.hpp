// The DP sum of sharded gradients (train.zero: 2): each element's sum goes only to the
// ranks that hold it (its shard's owner and its replica holder), not to every rank as an
// allreduce's does: a reduce-scatter where a shard may have two destinations. One alltoall
// per bucket carries to each rank the pieces of the bucket it holds; each holder adds the
// ranks' pieces in rank order, so the two holders of an element compute the same bits
// (floats too) on every transport. Owns the packing and the order; not the layout (the
// trainer's zero_shards), nor the buffer.
#pragma once
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "runtime/comm/communicator.hpp"

namespace cohort::comm {

/// Which elements each rank of a group holds: per rank, sorted disjoint [begin, end) ranges
/// of the flat buffer. The same on every rank of the group.
struct holding {
  std::vector<std::vector<std::pair<std::size_t, std::size_t>>> ranges;
  int ranks() const { return static_cast<int>(ranges.size()); }
  /// Ranges of rank R inside [offset, offset + count), clipped to it, in order.
  std::vector<std::pair<std::size_t, std::size_t>> inside(int r, std::size_t offset,
                                                          std::size_t count) const;
};

/// Bytes one holders_sum of [offset, offset + count) hands to the transport on each rank:
/// (ranks - 1) blocks of the largest share (elements of ELEMENT_BYTES).
std::size_t holders_sum_bytes_sent(const holding& h, std::size_t offset, std::size_t count,
                                   std::size_t element_bytes);

}  // namespace cohort::comm
