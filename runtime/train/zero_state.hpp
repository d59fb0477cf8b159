// The optimizer of a member whose optimizer state is sharded (train.zero: 1,
// docs/sharding.md): it updates only the parameter ranges this member holds (its own shard
// and the replica of its neighbour's, zero_shards.hpp), each with an ordinary optimizer over
// a view of the parameters and gradients, so the state it keeps is the held ranges' alone.
// Which ranges it holds is set from outside (the trainer's re-cut); it holds none until then.
// Knows nothing of collectives or checkpoints.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/nn/optim.hpp"
#include "runtime/train/zero_shards.hpp"

namespace cohort::train {

/// A sharded member's facts, as every member of a new group gathers them before a re-cut
/// (a fixed 40-byte record: it travels through allgather as bytes).
struct zero_facts {
  int64_t next_step = -1;     ///< the first step whose update this member's state lacks
  int32_t kind = 0;           ///< shard_source::kind_t for the step the group runs
  int32_t old_w = 0;          ///< layout: the group it held its shards in
  int32_t old_rank = -1;      ///< layout: its position on that group's ring (ring_of_hosts)
  int32_t whole_params = 0;   ///< 1: its parameters are all of that step's
  int64_t optimizer_steps = 0;
  uint64_t host = 0;          ///< its host (a hash of comm.host_id or the detected identity)
};
static_assert(sizeof(zero_facts) == 40, "zero_facts travels as 40 bytes");

class zero_optimizer final : public nn::optimizer {
 public:
  /// O.kind: adamw or sgd (usage_error otherwise). State tensors come from P.
  zero_optimizer(nn::tensor params, nn::tensor grads, nn::optim_options o,
                 nn::pool& p = nn::pool::global());
  /// Each held range's update; the step count advances once.
  void step(float lr) override;
  /// The whole model's state tensors when this member holds all of them (a group of one:
  /// `cohort train`), else none (checkpoints then go through the trainer's parts).
  std::vector<std::pair<std::string, nn::tensor>> state() override;

  /// The optimizer's slot names ("exp_avg", "exp_avg_sq" / "momentum_buffer").
  const std::vector<std::string>& slots() const { return slots_; }
  /// True once hold() set a layout.
  bool holds() const { return w_ > 0; }
  int replicas() const { return w_; }
  int rank() const { return r_; }
  /// The cut the held ranges are of (hold's).
  const shard_cut& cut() const { return cut_; }
  /// The held ranges (ranges_held(cut(), rank()), the empty ones left out).
  const std::vector<elem_range>& ranges() const { return ranges_; }
  /// Slot S of held range I: a tensor of that range's size.
  nn::tensor slot(std::size_t i, std::size_t s);
  /// Position R of cut C from now on, with zero state: what was held is dropped (take it
  /// first with release()).
  void hold(const shard_cut& c, int r);
  /// hold(even_cut(n, W), R).
  void hold(int w, int r);
  /// Hands the held ranges' state over (ranges, then per range its slots) and holds nothing.
  struct held {
    std::vector<elem_range> ranges;
    std::vector<std::vector<nn::tensor>> slots;  ///< [range][slot]
    int w = 0, r = -1;
    shard_cut cut;
  };
  held release();
  /// Holds H again, as it was before release() (a re-cut that failed half way).
  void restore(const held& h);
  /// Bytes of state held (all slots of all held ranges).
  int64_t held_bytes() const;
  /// Bytes the replica range's state takes (0 in a group of one).
  int64_t replica_bytes() const;

 private:
  nn::optim_options o_;
  nn::pool* pool_;
  std::vector<std::string> slots_;
  int w_ = 0, r_ = -1;
  shard_cut cut_;
  std::vector<elem_range> ranges_;
  std::vector<bool> replica_;  ///< per range: the neighbour's shard, not this rank's own
  std::vector<std::unique_ptr<nn::optimizer>> parts_;
};

}  // namespace cohort::train
