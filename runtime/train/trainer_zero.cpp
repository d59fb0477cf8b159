// Sharded optimizer state (train.zero: 1, docs/sharding.md): the re-cut a DP group runs
// when its members or ranks change, the parameters' gather after each applied step, the
// holders of the sums and the sharded norm. Checkpoints: trainer_zero_checkpoint.cpp. The
// arithmetic is zero_shards.hpp's; the optimizer over the held ranges zero_state.hpp's.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "runtime/comm/communicator.hpp"
#include "runtime/core/config.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/host_pages.hpp"
#include "runtime/core/trace.hpp"
#include "runtime/train/param_stats.hpp"
#include "runtime/train/square_sum.hpp"
#include "runtime/train/trainer.hpp"

namespace cohort::train {

zero_reshard trainer::reshard(comm::communicator& c, int64_t step, int64_t held_step,
                              uint64_t host) {
  const int64_t n = model_->num_params();
  const int w = c.size();
  zero_reshard out;
  // What this member holds for STEP.
  zero_facts mine;
  mine.next_step = held_step;
  mine.optimizer_steps = zero_->steps();
  if (held_step == step) {
    if (zero_->holds()) {
      mine.kind = shard_source::layout;
      mine.old_w = zero_->replicas();
      mine.old_rank = zero_->rank();
    } else if (zero_fresh_ || !zero_source_.empty()) {
      mine.kind = shard_source::everything;
    }
    mine.whole_params = whole_params_ ? 1 : 0;
  }
  mine.host = host;
  std::vector<zero_facts> by_rank(static_cast<std::size_t>(w));
  c.allgather(&mine, by_rank.data(), sizeof mine);
  // The new ring from the members' hosts: from here on everything is by ring position (the
  // communicator's ranks only at its calls: rank_at), and every member computes the same plan
  // from the same facts.
  std::vector<uint64_t> hosts;
  for (const zero_facts& x : by_rank) hosts.push_back(x.host);
  const std::vector<int> ring = ring_of_hosts(hosts);
  std::vector<zero_facts> all;  // by new position
  int me = 0;
  for (int p = 0; p < w; ++p) {
    all.push_back(by_rank[static_cast<std::size_t>(ring[static_cast<std::size_t>(p)])]);
    if (ring[static_cast<std::size_t>(p)] == c.rank()) me = p;
  }
  auto rank_at_new = [&](int p) { return ring[static_cast<std::size_t>(p)]; };
  recut_facts f;
  f.n = n;
  int steps_from = -1, whole_from = -1;
  f.members.resize(static_cast<std::size_t>(w));
  for (const zero_facts& x : all)
    if (x.kind == shard_source::layout) {
      f.old_w = x.old_w;  // the first holder's group
      break;
    }
  for (int k = 0; k < w; ++k) {
    const zero_facts& x = all[static_cast<std::size_t>(k)];
    shard_source& s = f.members[static_cast<std::size_t>(k)];
    // A layout of another group than the first one's is of no use here.
    if (x.kind == shard_source::layout && x.old_w == f.old_w)
      s = {shard_source::layout, x.old_rank};
    else if (x.kind == shard_source::everything)
      s = {shard_source::everything, -1};
    if (s.kind != shard_source::nothing && steps_from < 0) steps_from = k;
    if (x.whole_params && whole_from < 0) whole_from = k;
  }
  // The cuts: the new group's from its ring; the old group's from the ring a member of it
  // sends (an experts' cut depends on it; the even cut does not, and nothing travels).
  const shard_cut new_cut = cut_for(w, ring);
  shard_cut old_cut = even_cut(n, f.old_w);
  if (cfg_.parallel.ep > 1 && model_->has_moe()) {
    int old_w = 0;  // the largest old group any member names: every member sends that many
    for (const zero_facts& x : by_rank)
      if (x.kind == shard_source::layout) old_w = std::max(old_w, x.old_w);
    if (old_w > 0) {
      std::vector<int32_t> old_ring(static_cast<std::size_t>(old_w), -1);
      if (mine.kind == shard_source::layout)
        for (int p = 0; p < mine.old_w; ++p) old_ring[static_cast<std::size_t>(p)] = rank_at(p);
      std::vector<int32_t> rings(old_ring.size() * static_cast<std::size_t>(w));
      c.allgather(old_ring.data(), rings.data(), old_ring.size() * sizeof(int32_t));
      for (int k = 0; k < w; ++k) {  // the first member of f.old_w's group, by new position
        const zero_facts& x = all[static_cast<std::size_t>(k)];
        if (x.kind != shard_source::layout || x.old_w != f.old_w) continue;
        const int32_t* r = rings.data() + static_cast<std::size_t>(rank_at_new(k)) * old_ring.size();
        old_cut = cut_for(f.old_w, std::vector<int>(r, r + f.old_w));
        break;
      }
    }
  }
  bool settled = old_cut == new_cut;
  for (int k = 0; k < w; ++k) {
    const zero_facts& x = all[static_cast<std::size_t>(k)];
    settled = settled && x.whole_params && x.kind == shard_source::layout && x.old_w == w &&
              x.old_rank == k;
  }
  if (settled) {  // every member holds its ranges and all the parameters
    ring_ = ring;
    return out;
  }
  // Before the first optimizer step the state is zeros wherever it is held: each member makes
  // its own ranges and nothing moves (a worker that joins at step 0 costs no transfer).
  bool zeros = true;
  for (const zero_facts& x : all)
    zeros = zeros && x.kind != shard_source::nothing && x.optimizer_steps == 0;
  if (zeros) {
    for (shard_source& s : f.members) s = {shard_source::everything, -1};
    if (f.old_w < 1) {
      f.old_w = 1;
      old_cut = even_cut(n, 1);
    }
    // Sharded parameters given back since: no step applied, so they are the initial ones.
    if (shards_params() && !values_whole_) {
      model_->init_parameters(cfg_.train.seed);
      values_whole_ = true;
    }
  }
  out.ran = true;
  out.behind = mine.kind == shard_source::nothing;
  if (steps_from < 0)
    throw shard_lost("no member holds the optimizer state of step " + std::to_string(step) +
                     ": resume from a checkpoint");
  const std::vector<shard_move> moves = plan_recut(f, old_cut, new_cut);
  out.moved_elements = moved_elements(moves);
  const auto bytes_of = [](int64_t elems) { return static_cast<uint64_t>(elems) * sizeof(float); };

  // The parameters: from a member with all of them, else each old shard from a holder.
  float* values = model_->flat_values().data();
  // A member without them (a joiner) gets new shard j of them from rank j when that one
  // holds them all, else from the first that does: sent with the state below, spread over
  // the senders, and only to those that lack them.
  std::vector<shard_move> param_moves;
  // Sharded parameters travel as one more slot of the moves below: only what changes holder.
  const bool params_slot = shards_params();
  if (!params_slot && whole_from >= 0) {
    for (int k = 0; k < w; ++k) {
      if (all[static_cast<std::size_t>(k)].whole_params) continue;
      for (int j = 0; j < w; ++j)
        for (const elem_range& r : new_cut.shards[static_cast<std::size_t>(j)])
          if (r.size() > 0)
            param_moves.push_back({all[static_cast<std::size_t>(j)].whole_params ? j : whole_from, k, r});
    }
  } else if (!params_slot) {
    for (int j = 0; j < f.old_w; ++j) {
      int src = -1;
      for (int h : holders_of(f.old_w, j))
        for (int k = 0; k < w && src < 0; ++k)
          if (f.members[static_cast<std::size_t>(k)].kind == shard_source::layout &&
              f.members[static_cast<std::size_t>(k)].old_rank == h)
            src = k;
      for (const elem_range& r : old_cut.shards[static_cast<std::size_t>(j)]) {
        if (src < 0)
          throw shard_lost("the parameters " + to_string(r) + " of step " + std::to_string(step) +
                           " were held only by members that are gone: resume from a checkpoint");
        if (r.size() > 0) c.broadcast(values + r.begin, bytes_of(r.size()), rank_at_new(src));
      }
    }
  }

  // The optimizer state: what this member keeps, then the moves in one padded alltoall.
  const std::size_t slots = zero_->slots().size();
  const std::size_t moved_slots = slots + (params_slot ? 1 : 0);  // the parameters last
  const int64_t old_steps = zero_->steps();
  const zero_optimizer::held old = zero_->release();
  try {
  const shard_source my = f.members[static_cast<std::size_t>(me)];
  // Elements [r) of slot S as this member holds them for sending (or keeping).
  auto source_data = [&](elem_range r, std::size_t s, float* dst) {
    if (s == slots) {  // the parameters: whole, or at least the held ranges the plan reads
      std::memcpy(dst, values + r.begin, bytes_of(r.size()));
      return;
    }
    if (my.kind == shard_source::everything) {
      if (zero_source_.empty()) {
        std::fill(dst, dst + r.size(), 0.0f);
        return;
      }
      std::vector<float> tmp(static_cast<std::size_t>(r.size()) * slots);
      std::vector<float*> outs;
      for (std::size_t k = 0; k < slots; ++k) outs.push_back(tmp.data() + k * r.size());
      read_state_range(zero_source_, *model_, zero_->slots(), r, outs);
      std::memcpy(dst, outs[s], bytes_of(r.size()));
      return;
    }
    for (std::size_t i = 0; i < old.ranges.size(); ++i) {
      const elem_range& h = old.ranges[i];
      const int64_t lo = std::max(h.begin, r.begin), hi = std::min(h.end, r.end);
      if (hi > lo)
        std::memcpy(dst + (lo - r.begin), old.slots[i][s].data() + (lo - h.begin), bytes_of(hi - lo));
    }
  };
  zero_->hold(new_cut, me);
  zero_->set_steps(all[static_cast<std::size_t>(steps_from)].optimizer_steps);
  if (my.kind == shard_source::everything) {
    zero_fill_from_source();
  } else if (my.kind == shard_source::layout) {
    for (std::size_t i = 0; i < zero_->ranges().size(); ++i)
      for (std::size_t s = 0; s < slots; ++s)
        source_data(zero_->ranges()[i], s, zero_->slot(i, s).data());
  }
  // Per pair, the elements that go from src to dst; blocks padded to the largest pair.
  std::map<std::pair<int, int>, int64_t> pair_elems;  // floats per pair
  for (const shard_move& mv : moves)
    pair_elems[{mv.src, mv.dst}] += mv.r.size() * static_cast<int64_t>(moved_slots);
  for (const shard_move& mv : param_moves) pair_elems[{mv.src, mv.dst}] += mv.r.size();
  int64_t block = 0;
  for (const auto& [pair, e] : pair_elems) block = std::max(block, e);
  if (block > 0) {
    const std::size_t block_floats = static_cast<std::size_t>(block);
    std::vector<float> send(block_floats * static_cast<std::size_t>(w), 0.0f);
    std::vector<float> recv(send.size(), 0.0f);
    std::vector<std::size_t> cursor(static_cast<std::size_t>(w), 0);
    for (const shard_move& mv : moves) {
      if (mv.src != me) continue;
      for (std::size_t s = 0; s < moved_slots; ++s) {
        float* at = send.data() + static_cast<std::size_t>(rank_at_new(mv.dst)) * block_floats +
                    cursor[static_cast<std::size_t>(mv.dst)];
        source_data(mv.r, s, at);
        cursor[static_cast<std::size_t>(mv.dst)] += static_cast<std::size_t>(mv.r.size());
      }
      out.bytes_sent += bytes_of(mv.r.size()) * moved_slots;
    }
    for (const shard_move& mv : param_moves) {
      if (mv.src != me) continue;
      float* at = send.data() + static_cast<std::size_t>(rank_at_new(mv.dst)) * block_floats +
                  cursor[static_cast<std::size_t>(mv.dst)];
      std::memcpy(at, values + mv.r.begin, bytes_of(mv.r.size()));
      cursor[static_cast<std::size_t>(mv.dst)] += static_cast<std::size_t>(mv.r.size());
      out.bytes_sent += bytes_of(mv.r.size());
    }
    c.alltoall(send.data(), recv.data(), block_floats * sizeof(float));
    std::fill(cursor.begin(), cursor.end(), 0);
    for (const shard_move& mv : moves) {
      if (mv.dst != me) continue;
      for (std::size_t s = 0; s < moved_slots; ++s) {
        const float* at = recv.data() + static_cast<std::size_t>(rank_at_new(mv.src)) * block_floats +
                          cursor[static_cast<std::size_t>(mv.src)];
        for (std::size_t i = 0; i < zero_->ranges().size(); ++i) {
          const elem_range& h = zero_->ranges()[i];
          const int64_t lo = std::max(h.begin, mv.r.begin), hi = std::min(h.end, mv.r.end);
          if (hi <= lo) continue;
          float* to = s == slots ? values + lo : zero_->slot(i, s).data() + (lo - h.begin);
          std::memcpy(to, at + (lo - mv.r.begin), bytes_of(hi - lo));
        }
        cursor[static_cast<std::size_t>(mv.src)] += static_cast<std::size_t>(mv.r.size());
      }
      out.bytes_received += bytes_of(mv.r.size()) * moved_slots;
    }
    for (const shard_move& mv : param_moves) {
      if (mv.dst != me) continue;
      const float* at = recv.data() + static_cast<std::size_t>(rank_at_new(mv.src)) * block_floats +
                        cursor[static_cast<std::size_t>(mv.src)];
      std::memcpy(values + mv.r.begin, at, bytes_of(mv.r.size()));
      cursor[static_cast<std::size_t>(mv.src)] += static_cast<std::size_t>(mv.r.size());
      out.bytes_received += bytes_of(mv.r.size());
    }
  }
  } catch (...) {
    // A peer lost half way: this member still holds what it held (the next re-cut needs it).
    zero_->restore(old);
    zero_->set_steps(old_steps);
    throw;
  }
  whole_params_ = true;
  zero_source_.clear();
  zero_fresh_ = false;
  ring_ = ring;
  holding_.reset();  // the holders follow the ring
  // Sharded parameters: this member keeps its ranges of them, the rest goes back (a group
  // of one holds them all).
  if (params_slot) {
    values_whole_ = w == 1;
    if (w > 1 && cfg_.train.zero_release) release_params_in(0, n);
  }
  return out;
}

void trainer::gather_params(comm::communicator& c) {
  // Until every shard is in (sharded parameters: the held ranges stay as they are).
  if (!shards_params()) whole_params_ = false;
  values_whole_ = false;
  gather_range(c, 0, model_->num_params());
  whole_params_ = true;
  values_whole_ = true;
}

model_state_bytes trainer::state_bytes() const {
  model_state_bytes b;
  const int64_t n = model_->num_params();
  b.params = n * static_cast<int64_t>(sizeof(float));
  // Sharded parameters: the most the kernel was seen holding of them during the steps
  // (on_params; before the first gather, the held ranges' share).
  if (shards_params() && zero_->holds() && zero_->replicas() > 1)
    b.params = params_peak_ > 0 ? params_peak_
                                : elements_held(zero_->cut(), zero_->rank()) *
                                      static_cast<int64_t>(sizeof(float));
  b.grads = b.params + static_cast<int64_t>(fixed_.size() * sizeof(int64_t));
  // Sharded gradients: the most the kernel was seen holding of the two gradient buffers
  // (sample_grads; before the first sample, the held ranges' share).
  if (shards_grads()) {
    const int64_t held = zero_->holds() ? elements_held(zero_->cut(), zero_->rank()) : n;
    b.grads = grads_peak_ > 0 ? grads_peak_
                              : held * static_cast<int64_t>(sizeof(float) +
                                                            (fixed_.empty() ? 0 : sizeof(int64_t)));
  }
  if (zero_) {
    b.replica = zero_->replica_bytes();
    b.optimizer = zero_->held_bytes() - b.replica;
  } else {
    for (auto& [slot, t] : opt_->state()) b.optimizer += static_cast<int64_t>(t.bytes());
  }
  return b;
}

}  // namespace cohort::train

namespace cohort::train {

std::shared_ptr<const comm::holding> trainer::holding_of(int w) {
  if (holding_ && holding_->ranks() == w) return holding_;
  auto h = std::make_shared<comm::holding>();
  const shard_cut cut = cut_of(w);
  for (int r = 0; r < w; ++r) {
    std::vector<std::pair<std::size_t, std::size_t>> mine;
    for (const elem_range& e : ranges_held(cut, position_of(r)))
      if (e.size() > 0)
        mine.emplace_back(static_cast<std::size_t>(e.begin), static_cast<std::size_t>(e.end));
    std::sort(mine.begin(), mine.end());
    h->ranges.push_back(std::move(mine));
  }
  holding_ = h;
  return h;
}

void trainer::grads_reduced(std::size_t offset, std::size_t count) {
  const auto& held = holding_->ranges[static_cast<std::size_t>(rank_at(zero_->rank()))];
  std::size_t at = offset;
  const std::size_t end = offset + count;
  const bool release = cfg_.train.zero_release;
  // The float gradients outside the held ranges: nobody reads them again this step.
  auto give_back = [&](std::size_t b, std::size_t e) {
    if (release && b < e)
      release_pages(model_->flat_grads().data() + b, (e - b) * sizeof(float));
  };
  grad_buffers buf = buffers(sharded_step_);
  for (const auto& [b, e] : held) {
    if (e <= at) continue;
    if (b >= end) break;
    give_back(at, std::min(b, end));
    // The held sums' after-sum stages now (bitwise mode: back to floats), so that the
    // fixed-point sum is read no more.
    const std::size_t lo = std::max(b, offset), hi = std::min(e, end);
    run_stages(pipeline_.after_sum, buf, static_cast<int64_t>(lo), static_cast<int64_t>(hi - lo));
    at = std::max(at, e);
  }
  give_back(at, end);
  if (release && !fixed_.empty()) release_pages(fixed_.data() + offset, count * sizeof(int64_t));
}

int64_t trainer::sample_grads() {
  if (!shards_grads()) return 0;
  const nn::tensor& g = model_->flat_grads();
  const long long f = resident_bytes(g.data(), static_cast<std::size_t>(g.bytes()));
  const long long q = resident_bytes(fixed_.data(), fixed_.size() * sizeof(int64_t));
  if (f < 0 || q < 0) return 0;
  grads_peak_ = std::max<int64_t>(grads_peak_, f + q);
  return f + q;
}

const std::vector<std::pair<std::size_t, std::size_t>>* trainer::held_elements() {
  if (!shards_grads() || !cfg_.train.zero_release) return nullptr;
  static const std::vector<std::pair<std::size_t, std::size_t>> none;
  if (!zero_->holds()) return &none;
  return &holding_of(zero_->replicas())->ranges[static_cast<std::size_t>(rank_at(zero_->rank()))];
}

void trainer::finish_sharded_sum(comm::communicator& c, int64_t step) {
  COHORT_CHECK(shards_grads() && zero_->holds() && zero_->replicas() == c.size() &&
               zero_->rank() == position_of(c.rank()));
  take_sum();  // the after-sum stages ran bucket by bucket (grads_reduced)
  // Each member's part of every parameter's sum of squares: its own shard only (the replica
  // holder's copy counts once, at its owner).
  std::vector<std::pair<int64_t, int64_t>> own;
  for (const elem_range& x : zero_->cut().shards[static_cast<std::size_t>(zero_->rank())])
    own.emplace_back(x.begin, x.end);
  const std::vector<square_sum> parts = grad_square_sums_in(*model_, own);
  constexpr std::size_t per = square_sum::digits + 1;
  std::vector<int64_t> mine(parts.size() * per);
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const auto w = parts[i].words();
    std::copy(w.begin(), w.end(), mine.begin() + static_cast<std::ptrdiff_t>(i * per));
  }
  std::vector<int64_t> all(mine.size() * static_cast<std::size_t>(c.size()));
  c.allgather(mine.data(), all.data(), mine.size() * sizeof(int64_t));
  std::vector<double> per_param(parts.size());
  for (std::size_t i = 0; i < parts.size(); ++i) {
    square_sum s;
    for (int k = 0; k < c.size(); ++k)
      s.merge(square_sum::from_words(all.data() + (static_cast<std::size_t>(k) * parts.size() + i) * per));
    per_param[i] = s.value();
  }
  sharded_norm_ = std::sqrt(ordered_sum(per_param));
  sharded_norm_step_ = step;
}

}  // namespace cohort::train
