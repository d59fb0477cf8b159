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
/// How the flattened parameters are cut into a group's shards: shard P (ring position P) is a
/// list of sorted, disjoint, non-adjacent ranges, every range's ends multiples of shard_align
/// but n; the shards together cover [0, n) once. The even cut has one range a shard
/// (shard_of); the experts' cut (unit_cut) keeps each expert of a mixture of experts whole in
/// the shard of the position that computes it.
struct shard_cut {
  int64_t n = 0;
  std::vector<std::vector<elem_range>> shards;
  int w() const { return static_cast<int>(shards.size()); }
  /// Elements of shard J.
  int64_t size(int j) const;
  bool operator==(const shard_cut& o) const { return n == o.n && shards == o.shards; }
};
/// shard_of's cut of N elements among W positions.
shard_cut even_cut(int64_t n, int w);
/// A cut that gives position OWNER[i] unit UNITS[i] whole (units: sorted, disjoint ranges of
/// [0, n), an expert's parameters), and cuts the other elements evenly over the W positions
/// in their order. Each unit's ends are moved down to a multiple of shard_align first (a few
/// of an expert's elements may go with the range before it), so that every element is updated
/// in the same lane of the optimizer's loop as in the whole-model update. Throws usage_error
/// for units out of order or outside [0, n), or an owner outside [0, W).
shard_cut unit_cut(int64_t n, int w, const std::vector<elem_range>& units,
                   const std::vector<int>& owner);
/// The ranges position R holds under cut C: its own shard's, then its neighbour's (R - 1),
/// whose replica it keeps (only its own when W == 1).
std::vector<elem_range> ranges_held(const shard_cut& c, int r);
/// Elements position R holds under cut C.
int64_t elements_held(const shard_cut& c, int r);
/// Text for a checkpoint's metadata ("b-e,b-e;b-e;...": shard by shard), and back (throws
/// usage_error naming what is wrong with TEXT for a cut of N elements).
std::string cut_text(const shard_cut& c);
shard_cut cut_from_text(const std::string& text, int64_t n);

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

/// The moves that give every new rank k the ranges ranges_held(new cut, k) it does not
/// hold already: each missing piece (split at the old shards' boundaries) comes from its
/// old owner when that is a member, else from its old replica holder, else from the lowest
/// member that holds everything. A member holding everything moves nothing to itself.
/// Sorted by (src, dst, begin), adjacent pieces of one pair merged. Throws shard_lost
/// naming the first range no member holds (both of its holders gone), or usage_error for
/// facts that contradict each other (an old rank outside the old group, or twice).
std::vector<shard_move> plan_recut(const recut_facts& f);
/// The same between cuts OLD_CUT (of the old group, old_w shards) and NEW_CUT (of
/// members.size()); plan_recut(f) is this with the even cuts.
std::vector<shard_move> plan_recut(const recut_facts& f, const shard_cut& old_cut,
                                   const shard_cut& new_cut);

/// Elements the moves carry, summed (per optimizer slot).
int64_t moved_elements(const std::vector<shard_move>& moves);

/// "[b, e)" for messages.
std::string to_string(const elem_range& r);

}  // namespace cohort::train
