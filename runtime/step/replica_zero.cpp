// A replica's part in sharded model state (train.zero, docs/sharding.md): the re-cut when
// its group changed, before the step's gradients; the sums to the shards' holders (zero 2);
// the blocks' gathers lent to the step (zero 3); and the parameters' gather after a commit.
// The arithmetic and the data movement are the trainer's (runtime/train/trainer_zero.cpp,
// trainer_params.cpp); here: when they run, over which links, and what the vote reports.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "runtime/comm/buckets.hpp"
#include "runtime/comm/comm_error.hpp"
#include "runtime/comm/communicator.hpp"
#include "runtime/core/trace.hpp"
#include "runtime/step/balance.hpp"
#include "runtime/step/replica_step.hpp"
#include "runtime/train/trainer.hpp"

namespace cohort::step {

// Once per generation (and after a rollback loaded a checkpoint): every member says what
// it holds, and the state is re-cut for this group. A member behind the step (a joiner)
// holds the step's state afterwards, as a donor's transfer would have left it.
void replica_step::reshard(train::trainer& z, const net::step_open& o, net::step_timing& t) {
  if (resharded_generation_ == o.generation && o.restore < 0) return;
  const auto ts = io_.now();
  const auto trace_ts = trace::now_ns();
  // The ring places a shard's two copies on different hosts where it can.
  const train::zero_reshard r = z.reshard(*links_.comm, o.step, next_step_, host_key());
  resharded_generation_ = o.generation;
  next_step_ = o.step;
  if (!r.ran || (r.moved_elements == 0 && r.bytes_received == 0 && r.bytes_sent == 0))
    return;  // nothing held yet (the first cut) or nothing to move: no re-cut to report
  ++reshards_;
  t.reshard_us = std::max<uint64_t>(1, micros(io_.now() - ts));
  t.reshard_bytes = r.bytes_received;
  if (r.behind) {
    t.state_bytes = r.bytes_received;
    t.state_us = t.reshard_us;
  }
  spdlog::info("dp group: sharded state re-cut for {} members at step {}: {} elements per slot "
               "moved in the group, {} bytes received here",
               o.replicas, o.step, r.moved_elements, r.bytes_received);
  trace::complete("reshard", "state", trace_ts, trace::now_ns(), trace::track::control,
                  trace::args({{"step", o.step},
                               {"members", o.replicas},
                               {"moved_elements", r.moved_elements},
                               {"bytes_received", static_cast<int64_t>(r.bytes_received)}}));
}

train::trainer* replica_step::sum_to_holders(comm::bucket_engine& engine, int replicas) {
  train::trainer* z = seat_->sharded();
  if (z == nullptr || !z->shards_grads()) {
    if (engine.holders() != nullptr) engine.set_holders(nullptr);
    return nullptr;
  }
  // Each bucket's sum goes to its two holders, and the rest of it back to the kernel as soon
  // as it is summed.
  engine.set_holders(z->holding_of(replicas),
                     [z](std::size_t off, std::size_t n) { z->grads_reduced(off, n); });
  return z;
}

train::trainer* replica_step::lend_params(const net::step_open& o) {
  train::trainer* z = seat_->sharded();
  if (z == nullptr || !z->shards_params()) return nullptr;
  z->set_params_comm(links_.params.get());
  z->set_params_passes(most_micro_batches(o, 0, o.replicas));
  return z;
}

bool replica_step::gather(train::trainer& z, const pending_step& p) {
  if (links_.size == 1 && links_.comm) return true;  // a group of one holds all of it
  // Sharded parameters: the steps gather block by block; only a checkpoint, an evaluation
  // or the final digest reads them whole.
  const int64_t every = cfg_->fault_tolerance.checkpoint_every;
  const int64_t eval_every = cfg_->train.eval_every;
  if (z.shards_params() && next_step_ != end_step() &&
      !(every > 0 && next_step_ % every == 0) && !(eval_every > 0 && next_step_ % eval_every == 0))
    return true;
  try {
    if (!links_.comm || links_.generation != p.generation)
      throw comm::comm_error(comm::comm_failure::invalid, "gather",
                             "the links of generation " + std::to_string(p.generation) +
                                 " are gone");
    trace::span traced("gather params", "comm", trace::track::compute,
                       trace::args({{"step", p.step}}));
    const auto t0 = io_.now();
    const comm::comm_traffic before = links_.traffic();
    z.gather_params(*links_.comm);
    // The run's totals count the gather with the sums: both are the step's traffic.
    const comm::comm_traffic after = links_.traffic();
    if (after.measured) {
      total_.bytes_sent += after.sent - before.sent;
      total_.bytes_recv += after.received - before.received;
    }
    total_.comm_wait_us += micros(io_.now() - t0);
    return true;
  } catch (const std::exception& e) {
    // Each member applied its own shards; the next re-cut takes the parameters from them.
    spdlog::warn("dp group: the parameters' gather after step {} failed: {}", p.step, e.what());
    z.params_partial();
    // The next open re-cuts even in this generation: the re-cut is what makes them whole.
    resharded_generation_ = 0;
    links_.drop(*shared_);
    return false;
  }
}

}  // namespace cohort::step
