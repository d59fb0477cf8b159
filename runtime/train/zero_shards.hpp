// The arithmetic of sharded optimizer state (train.zero: 1, docs/sharding.md): how N
// parameter elements are cut into one contiguous shard per position of the group's ring,
// which positions hold each shard (its owner, and a replica on the next position, on
// another host where there is one, so that no single death loses it), and
// what moves when the group changes: a plan every member computes alike from the same facts
// (gathered among the members), so that no coordinator is asked. Pure arithmetic: no
// tensors, no collectives.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/core/error.hpp"

namespace cohort::train {

/// Optimizer state or parameters that no member holds any more (both holders of a shard
/// left at once): only a checkpoint has them.
class shard_lost : public cohort::error {
 public:
  using cohort::error::error;
};

/// Elements [begin, end) of the flattened parameters.
struct elem_range {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const elem_range& o) const { return begin == o.begin && end == o.end; }
};

/// Shard boundaries are multiples of this many elements: every element of a shard but the
/// last shard's tail sits where the optimizer's vector loop reaches it in the whole-model
/// update too, so a sharded update is the unsharded one bit for bit.
inline constexpr int64_t shard_align = 64;

/// Shard R of N elements among W ranks: [b(R), b(R + 1)) with b(k) = min(N, floor(k U / W)
/// align) and U = ceil(N / align): contiguous, in rank order, sizes within `align` of each
/// other (a shard may be empty when N < W align). Throws usage_error unless 0 <= R < W.
elem_range shard_of(int64_t n, int w, int r);
/// The ranks that hold shard J in a group of W: its owner J, then the replica holder
/// (J + 1) % W; only {0} when W == 1.
std::vector<int> holders_of(int w, int j);
/// The shards rank R holds in a group of W: its own R, then the replica of (R - 1 + W) % W
/// (only its own when W == 1).
std::vector<int> shards_held(int w, int r);
/// shards_held's shards as element ranges, in the same order.
std::vector<elem_range> ranges_held(int64_t n, int w, int r);
/// Elements rank R holds: its shards' sizes summed.
int64_t elements_held(int64_t n, int w, int r);

/// The ring of shards for a group whose rank K runs on host HOST[K] (any key, equal for the
/// ranks of one host): RING[P] is the rank at position P, which owns shard P and holds the
/// replica of shard P - 1, so that a shard's two holders are neighbours on the ring. The
/// hosts take turns (in the order of their lowest rank, each host's ranks ascending), so
/// that neighbours, and with them a shard's two copies, are on different hosts wherever the
/// hosts' sizes allow: a host lost whole then loses no shard. One host: the identity.
std::vector<int> ring_of_hosts(const std::vector<uint64_t>& host);

/// What one member of the new group brings to a re-cut.
struct shard_source {
  enum kind_t : int32_t {
    nothing = 0,     ///< a joiner, or state of another step: it holds nothing usable
    layout = 1,      ///< the shards of `old_rank` in the old group (shards_held)
    everything = 2,  ///< can make any range itself (fresh zeros, or a checkpoint on disk)
  };
  kind_t kind = nothing;
  int old_rank = -1;  ///< layout only
};

/// Everything a re-cut depends on: N, the old group's size, and per rank of the new group
/// (members[k] is new rank k) what it holds.
struct recut_facts {
  int64_t n = 0;
  int old_w = 1;
  std::vector<shard_source> members;
};

/// A range of optimizer state that goes from new rank `src` to new rank `dst`.
struct shard_move {
  int src = 0, dst = 0;
  elem_range r;
  bool operator==(const shard_move& o) const {
    return src == o.src && dst == o.dst && r == o.r;
  }
};

/// The moves that give every new rank k the ranges ranges_held(n, new W, k) it does not
/// hold already: each missing piece (split at the old shards' boundaries) comes from its
/// old owner when that is a member, else from its old replica holder, else from the lowest
/// member that holds everything. A member holding everything moves nothing to itself.
/// Sorted by (src, dst, begin), adjacent pieces of one pair merged. Throws shard_lost
/// naming the first range no member holds (both of its holders gone), or usage_error for
/// facts that contradict each other (an old rank outside the old group, or twice).
std::vector<shard_move> plan_recut(const recut_facts& f);

/// Elements the moves carry, summed (per optimizer slot).
int64_t moved_elements(const std::vector<shard_move>& moves);

/// "[b, e)" for messages.
std::string to_string(const elem_range& r);

}  // namespace cohort::train
