// Sharded parameters (train.zero: 3, docs/sharding.md "Stage 3"): between steps a member
// holds only its shards of the parameters (its own and its replica, as the optimizer state);
// forward and backward gather each block's values from the shards' owners just before they
// read them and give back what this member does not hold just after (the model's params
// hook), as FSDP does per wrapped module. When the group changes, the parameters are re-cut
// with the optimizer state (trainer::reshard); a checkpoint, an evaluation or the final
// digest first gathers them whole (trainer::gather_params) and gives them back afterwards.
#include <algorithm>
#include <string>
#include <vector>

#include "runtime/comm/communicator.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/host_pages.hpp"
#include "runtime/core/trace.hpp"
#include "runtime/train/trainer.hpp"
#include "runtime/train/zero_shards.hpp"

namespace cohort::train {

void trainer::on_params(std::size_t block, bool need) {
  comm::communicator* c = params_comm_;
  if (c == nullptr || values_whole_) return;  // all of them are here
  COHORT_CHECK(zero_->holds() && zero_->replicas() == c->size() && zero_->rank() == c->rank());
  const auto [begin, count] = model_->block_elements(block);
  if (count == 0) return;
  if (!need) {
    if (cfg_.train.zero_release) release_params_in(begin, begin + count);
    return;
  }
  trace::span s("gather block", "comm", trace::track::compute,
                trace::args({{"block", static_cast<int64_t>(block)}}));
  // Each shard's piece of the block from its owner, in place: a member that holds the piece
  // (owner or replica holder) has the same bits already, so nothing it holds changes.
  float* values = model_->flat_values().data();
  const int64_t n = model_->num_params();
  for (int j = 0; j < c->size(); ++j) {
    const elem_range r = shard_of(n, c->size(), j);
    const int64_t lo = std::max(r.begin, begin), hi = std::min(r.end, begin + count);
    if (hi > lo) c->broadcast(values + lo, static_cast<std::size_t>(hi - lo) * sizeof(float), j);
  }
  const nn::tensor& v = model_->flat_values();
  const long long here = resident_bytes(v.data(), static_cast<std::size_t>(v.bytes()));
  // (Whole pages: at most the buffer, whose ends share pages with other memory.)
  if (here >= 0) params_peak_ = std::max<int64_t>(params_peak_, std::min<int64_t>(here, v.bytes()));
}

void trainer::release_params_in(int64_t begin, int64_t end) {
  float* values = model_->flat_values().data();
  int64_t at = begin;
  // Whole pages only (release_pages keeps the partial ones at the ends), so a page shared
  // with a held range keeps its bytes.
  std::vector<elem_range> held = zero_->ranges();  // own shard, then the replica
  std::sort(held.begin(), held.end(),
            [](const elem_range& a, const elem_range& b) { return a.begin < b.begin; });
  for (const elem_range& h : held) {
    if (h.end <= at) continue;
    if (h.begin >= end) break;
    if (h.begin > at)
      release_pages(values + at, static_cast<std::size_t>(h.begin - at) * sizeof(float));
    at = std::max(at, h.end);
  }
  if (end > at) release_pages(values + at, static_cast<std::size_t>(end - at) * sizeof(float));
}

void trainer::release_params() {
  if (!shards_params() || !zero_->holds() || zero_->replicas() < 2) return;
  if (cfg_.train.zero_release) release_params_in(0, model_->num_params());
  values_whole_ = false;
}

}  // namespace cohort::train
