// A replica's side of a mixture of experts (model.moe, parallel.ep; docs/moe.md): the EP
// group's communicator lent to the trainer for a step, and the MoE layers' counters into the
// step's timing and the run's tokens per expert.
#include <algorithm>
#include <utility>

#include "runtime/step/balance.hpp"
#include "runtime/step/replica_step.hpp"
#include "runtime/train/seat.hpp"
#include "runtime/train/trainer.hpp"

namespace cohort::step {

train::trainer* replica_step::lend_experts(const net::step_open& o, int rank) {
  train::trainer* w = seat_->whole_model();
  if (w == nullptr || cfg_->parallel.ep <= 1 || !w->model().has_moe()) return nullptr;
  // Sharded parameters: each member gathers the experts it computes, not the others'; every
  // member knows every member's place (a group of one too, which has no exchange).
  if (w->shards_params()) {
    std::vector<std::pair<int, int>> places;
    for (int k = 0; k < o.replicas; ++k) {
      const expert_place p = expert_group(cfg_->parallel.ep, o.replicas, k);
      places.emplace_back(p.rank, p.size);
    }
    w->set_expert_places(std::move(places));
  }
  if (links_.experts) {
    const expert_place ep = expert_group(cfg_->parallel.ep, o.replicas, rank);
    w->set_experts_comm(links_.experts.get(), most_micro_batches(o, rank - ep.rank, ep.size));
  }
  return w;
}

int replica_step::most_micro_batches(const net::step_open& o, int first, int count) const {
  std::size_t most = 0;  // every member's micro-batches are the same pure function
  for (int r = first; r < first + count; ++r)
    most = std::max(most, micro_batches_of(o.shares, seat_->micro_batches(), o.replicas, r).size());
  return static_cast<int>(most);
}

void replica_step::count_moe(train::trainer& w, net::step_timing& t) {
  train::trainer::moe_counters m = w.take_moe_counters();
  for (int64_t n : m.expert_tokens) t.moe_tokens += static_cast<uint64_t>(n);
  pending_expert_tokens_ = std::move(m.expert_tokens);
  t.moe_dropped = static_cast<uint64_t>(m.dropped);
  t.alltoall_calls = m.alltoall_calls;
  t.alltoall_bytes = m.alltoall_bytes;
  t.alltoall_us = m.alltoall_us;
}

void replica_step::expert_tokens_applied() {
  if (moe_expert_tokens_.size() < pending_expert_tokens_.size())
    moe_expert_tokens_.resize(pending_expert_tokens_.size(), 0);
  for (std::size_t e = 0; e < pending_expert_tokens_.size(); ++e)
    moe_expert_tokens_[e] += pending_expert_tokens_[e];
  pending_expert_tokens_.clear();
}

}  // namespace cohort::step
