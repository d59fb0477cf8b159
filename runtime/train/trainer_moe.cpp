// The trainer's side of expert parallelism (parallel.ep; docs/moe.md): the exchange it lends
// the model's MoE layers for a step (the EP group's all-to-all, timed, counted and traced;
// in bitwise mode another rank's share of an expert's gradients settled into the fixed-point
// sum on its own, as that rank would have converted it), and the MoE counters a step reports.
#include <algorithm>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "runtime/comm/communicator.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/trace.hpp"
#include "runtime/nn/gpt.hpp"
#include "runtime/train/fixed_point.hpp"
#include "runtime/train/trainer.hpp"

namespace cohort::train {

void trainer::set_experts_comm(comm::communicator* c, int passes) {
  experts_comm_ = c;
  experts_passes_ = c != nullptr ? passes : 0;
  if (c == nullptr) {
    model_->set_moe_exchange(nullptr);
    return;
  }
  experts_.ranks = c->size();
  experts_.rank = c->rank();
  experts_.alltoall = [this](const void* send, void* recv, std::size_t bytes) {
    const auto t0 = std::chrono::steady_clock::now();
    {
      trace::span s("alltoall", "comm", trace::track::compute,
                    trace::args({{"bytes", static_cast<int64_t>(bytes * experts_comm_->size())}}));
      experts_comm_->alltoall(send, recv, bytes);
    }
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(
        std::chrono::steady_clock::now() - t0);
    ++moe_.alltoall_calls;
    // What this rank sends the others (its own block stays here).
    moe_.alltoall_bytes += static_cast<uint64_t>(bytes) * static_cast<uint64_t>(experts_comm_->size() - 1);
    moe_.alltoall_us += static_cast<uint64_t>(us.count());
  };
  experts_.settle = nullptr;
  if (bitwise_) {
    // Another rank's rows alone are in these gradients, computed from zero: converted as that
    // rank converts its micro-batch's (fixed_sum_stage), then cleared for the next.
    experts_.settle = [this](nn::linear& fc, nn::linear& proj) {
      float* base = model_->flat_grads().data();
      for (nn::tensor* g : {&proj.db, &proj.dw, &fc.db, &fc.dw}) {
        if (g->numel() == 0) continue;
        const int64_t offset = g->data() - base;
        accumulate_gradients(fixed_.data(), base, offset, g->numel(),
                             "step " + std::to_string(sharded_step_) + " (an expert's gradient)");
        std::fill(g->data(), g->data() + g->numel(), 0.0f);
      }
    };
  }
  model_->set_moe_exchange(&experts_);
}

void trainer::count_moe() {
  const auto* g = dynamic_cast<const nn::gpt*>(model_.get());
  if (g == nullptr || !g->has_moe()) return;
  const nn::gpt::moe_stats st = g->last_moe();
  if (moe_.expert_tokens.size() < st.tokens.size()) moe_.expert_tokens.resize(st.tokens.size(), 0);
  for (std::size_t e = 0; e < st.tokens.size(); ++e) moe_.expert_tokens[e] += st.tokens[e];
  moe_.dropped += st.dropped;
}

std::vector<std::vector<elem_range>> expert_block_needs(
    const nn::model& m, std::size_t block, const std::vector<std::pair<int, int>>& places) {
  const nn::block_info& b = m.blocks().at(block);
  std::vector<std::vector<elem_range>> out(places.size());
  for (std::size_t k = 0; k < places.size(); ++k) {
    const auto [rank, size] = places[k];
    COHORT_CHECK(size >= 1 && rank >= 0 && rank < size);
    for (std::size_t i = b.first; i < b.first + b.count; ++i) {
      const nn::parameter& p = m.parameters()[i];
      const int e = nn::expert_of_param(p.name);
      if (e >= 0 && e % size != rank) continue;
      const elem_range r{p.offset, p.offset + p.value.numel()};
      if (!out[k].empty() && out[k].back().end == r.begin)
        out[k].back().end = r.end;
      else
        out[k].push_back(r);
    }
  }
  return out;
}

shard_cut trainer::cut_for(int w, const std::vector<int>& ring) const {
  const int64_t n = model_->num_params();
  const int ep = cfg_.parallel.ep;
  if (ep <= 1 || w <= 1 || !model_->has_moe()) return even_cut(n, w);
  std::vector<int> position(static_cast<std::size_t>(w));
  for (int p = 0; p < w; ++p)
    position[static_cast<std::size_t>(p < static_cast<int>(ring.size()) ? ring[static_cast<std::size_t>(p)] : p)] = p;
  const int groups = (w + ep - 1) / ep;
  // Each expert's parameters (consecutive), in order. Every EP group computes each expert (on
  // its rank e mod its size); the expert goes to the one of those ranks that holds the fewest
  // experts' elements so far (the lowest group on a tie), so that a smaller last group's
  // ranks, each computing more experts, do not also hold more of them.
  std::vector<elem_range> units;
  std::vector<int> owner;
  std::vector<int64_t> load(static_cast<std::size_t>(w), 0);
  int last_block = -1, last_expert = -1;
  for (std::size_t b = 0; b < model_->blocks().size(); ++b) {
    const nn::block_info& blk = model_->blocks()[b];
    for (std::size_t i = blk.first; i < blk.first + blk.count; ++i) {
      const nn::parameter& p = model_->parameters()[i];
      const int e = nn::expert_of_param(p.name);
      if (e < 0) continue;
      const elem_range r{p.offset, p.offset + p.value.numel()};
      if (static_cast<int>(b) == last_block && e == last_expert && units.back().end == r.begin) {
        units.back().end = r.end;
        load[static_cast<std::size_t>(owner.back())] += r.size();
        continue;
      }
      last_block = static_cast<int>(b);
      last_expert = e;
      int best = -1;
      for (int g = 0; g < groups; ++g) {
        const int rank = g * ep + e % nn::expert_group(ep, w, g * ep).size;
        const int p = position[static_cast<std::size_t>(rank)];
        if (best < 0 || load[static_cast<std::size_t>(p)] < load[static_cast<std::size_t>(best)])
          best = p;
      }
      units.push_back(r);
      owner.push_back(best);
      load[static_cast<std::size_t>(best)] += r.size();
    }
  }
  return unit_cut(n, w, units, owner);
}

bool trainer::gather_block_experts(comm::communicator& c, std::size_t block) {
  if (expert_places_.empty()) return false;
  COHORT_CHECK(static_cast<int>(expert_places_.size()) == c.size());
  const nn::block_info& b = model_->blocks().at(block);
  bool experts = false;
  for (std::size_t i = b.first; i < b.first + b.count && !experts; ++i)
    experts = nn::expert_of_param(model_->parameters()[i].name) >= 0;
  if (!experts) return false;
  const int w = c.size(), me = c.rank();
  COHORT_CHECK(zero_->holds() && zero_->replicas() == w);
  const shard_cut& cut = zero_->cut();
  const std::vector<std::vector<elem_range>> needs = expert_block_needs(*model_, block, expert_places_);
  const comm::holding& held = *holding_of(w);
  // The pieces each rank reads and does not hold, each split at the shards' boundaries and
  // sent by its shard's owner; every member lists the same pieces in the same order.
  struct piece {
    int src, dst;
    elem_range r;
  };
  std::vector<piece> pieces;
  for (int k = 0; k < w; ++k) {
    const auto& mine = held.ranges[static_cast<std::size_t>(k)];
    for (const elem_range& want : needs[static_cast<std::size_t>(k)]) {
      int64_t at = want.begin;
      auto lack = [&](int64_t lo, int64_t hi) {  // [lo, hi) is not held by k
        for (int j = 0; j < w && lo < hi; ++j)
          for (const elem_range& s : cut.shards[static_cast<std::size_t>(j)]) {
            const int64_t a = std::max(lo, s.begin), z = std::min(hi, s.end);
            if (z > a) pieces.push_back({rank_at(j), k, {a, z}});
          }
      };
      for (const auto& [hb, he] : mine) {
        const auto b0 = static_cast<int64_t>(hb), e0 = static_cast<int64_t>(he);
        if (e0 <= at) continue;
        if (b0 >= want.end) break;
        lack(at, std::min(b0, want.end));
        at = std::max(at, e0);
      }
      lack(at, want.end);
    }
  }
  std::vector<int64_t> pair(static_cast<std::size_t>(w) * static_cast<std::size_t>(w), 0);
  int64_t block_floats = 0;
  for (const piece& p : pieces) {
    int64_t& e = pair[static_cast<std::size_t>(p.src * w + p.dst)];
    e += p.r.size();
    block_floats = std::max(block_floats, e);
  }
  if (block_floats == 0) return true;  // every member holds what it reads
  trace::span s("gather experts", "comm", trace::track::compute,
                trace::args({{"block", static_cast<int64_t>(block)}}));
  const auto blk = static_cast<std::size_t>(block_floats);
  std::vector<float> send(blk * static_cast<std::size_t>(w), 0.0f), recv(send.size(), 0.0f);
  std::vector<std::size_t> cursor(static_cast<std::size_t>(w), 0);
  float* values = model_->flat_values().data();
  for (const piece& p : pieces) {
    if (p.src != me) continue;
    std::copy(values + p.r.begin, values + p.r.end,
              send.data() + static_cast<std::size_t>(p.dst) * blk + cursor[static_cast<std::size_t>(p.dst)]);
    cursor[static_cast<std::size_t>(p.dst)] += static_cast<std::size_t>(p.r.size());
  }
  c.alltoall(send.data(), recv.data(), blk * sizeof(float));
  std::fill(cursor.begin(), cursor.end(), 0);
  for (const piece& p : pieces) {
    if (p.dst != me) continue;
    const float* from = recv.data() + static_cast<std::size_t>(p.src) * blk + cursor[static_cast<std::size_t>(p.src)];
    std::copy(from, from + p.r.size(), values + p.r.begin);
    cursor[static_cast<std::size_t>(p.src)] += static_cast<std::size_t>(p.r.size());
  }
  return true;
}

trainer::moe_counters trainer::take_moe_counters() {
  moe_counters out = std::move(moe_);
  moe_ = moe_counters{};
  return out;
}

}  // namespace cohort::train
