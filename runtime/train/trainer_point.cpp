// Rollback points in memory (fault_tolerance.memory_every, docs/compression.md "A killed
// worker"): every K steps each DP member copies its own training state and its error memory,
// and keeps a copy of its predecessor's error memory, so that a member lost with the memory
// only it had is restored from its successor instead of a checkpoint on disk. The parts are
// the checkpoint's feedback_r<R> parts, held in memory: taken back the same way at the same
// group size (bit for bit) or another (R, R + W, ... folded).
#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "runtime/comm/communicator.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/trace.hpp"
#include "runtime/train/trainer.hpp"
#include "runtime/train/zero_shards.hpp"

namespace cohort::train {

namespace {

// T's elements into INTO, whose storage is reused when it has room (a recycled point's:
// its pages are in RAM already, where fresh ones would cost a page fault each).
void copy_out(const nn::tensor& t, std::vector<float>& into) {
  into.resize(static_cast<std::size_t>(t.numel()));
  if (t.numel() > 0) t.dev().to_host(into.data(), t.data(), t.bytes());
}

}  // namespace

const trainer::feedback* trainer::memory_point::part(int p) const {
  if (own.rank == p) return &own;
  if (pred.rank == p && !pred.worker.empty()) return &pred;
  return nullptr;
}

std::vector<int32_t> trainer::take_point(int64_t step, int64_t keep_from, comm::communicator& c,
                                         uint64_t host) {
  COHORT_CHECK(error_feedback_ && zero_ == nullptr);
  const int w = c.size(), r = c.rank();
  const auto n = static_cast<std::size_t>(model_->num_params());
  trace::span traced("rollback point", "state", trace::track::control,
                     trace::args({{"step", step}}));
  // A resumed checkpoint's parts not taken yet (no compressed step since): taken now, as
  // wire() would at this step.
  if (pending_.replicas > 0) restore_feedback(w, r);
  memory_point p = std::move(spare_);
  spare_ = {};
  p.step = step;
  copy_out(model_->flat_values(), p.values);
  std::vector<std::pair<std::string, nn::tensor>> slots = opt_->state();
  p.slots.resize(slots.size());
  for (std::size_t i = 0; i < slots.size(); ++i) copy_out(slots[i].second, p.slots[i]);
  p.opt_steps = opt_->steps();
  p.own = kept_;
  // Kept in another group (no compressed step since it changed): its chunks are gone, as
  // wire() would fold them at this step.
  if (p.own.replicas != w || p.own.rank != r) p.own.fold_owner_into_sender();
  p.own.replicas = w;
  p.own.rank = r;
  // The members' hosts: the copy goes to the next member on the ring of hosts, on another
  // host wherever the hosts' sizes allow (the zero shards' ring, zero_shards.hpp).
  std::vector<uint64_t> hosts(static_cast<std::size_t>(w));
  c.allgather(&host, hosts.data(), sizeof host);
  const std::vector<int> ring = ring_of_hosts(hosts);
  const auto at = static_cast<std::size_t>(
      std::find(ring.begin(), ring.end(), r) - ring.begin());
  if (w > 1) {
    // Each rank's part to every member; its successor on the ring keeps it.
    const int from = ring[(at + ring.size() - 1) % ring.size()];
    p.pred.worker.resize(n);  // every element is written by the broadcasts below
    p.pred.server.resize(n);
    p.pred.replicas = w;
    p.pred.rank = from;
    std::vector<float>& scratch = point_scratch_;  // the parts this member does not keep
    scratch.resize(n);
    for (int q = 0; q < w; ++q) {
      for (int half = 0; half < 2; ++half) {
        std::vector<float>& mine = half == 0 ? p.own.worker : p.own.server;
        std::vector<float>& kept = half == 0 ? p.pred.worker : p.pred.server;
        float* buf = q == r ? mine.data() : q == from ? kept.data() : scratch.data();
        c.broadcast(buf, n * sizeof(float), q);
      }
    }
  } else {
    p.pred = {};  // a group of one keeps no copy (nor a recycled point's)
  }
  // Kept: the point the coordinator holds good (KEEP_FROM), the one it may name next. One
  // it never counted (a step a resync passed over) will not be named: dropped.
  drop_points([&](const memory_point& m) { return m.step != keep_from; });
  points_.push_back(std::move(p));
  return std::vector<int32_t>(ring.begin(), ring.end());
}

void trainer::drop_points(const std::function<bool(const memory_point&)>& gone) {
  for (auto it = points_.begin(); it != points_.end();) {
    if (!gone(*it)) {
      ++it;
      continue;
    }
    // One dropped point's storage is kept for the next point to write into.
    if (spare_.values.empty()) spare_ = std::move(*it);
    it = points_.erase(it);
  }
}

void trainer::confirm_point(int64_t step) {
  drop_points([&](const memory_point& m) { return m.step < step; });
}

bool trainer::holds_point(int64_t step) const {
  return std::any_of(points_.begin(), points_.end(),
                     [&](const memory_point& m) { return m.step == step; });
}

bool trainer::restore_point(int64_t step, const std::vector<int32_t>& holders,
                            comm::communicator& c) {
  COHORT_CHECK(error_feedback_ && zero_ == nullptr);
  const int w = c.size(), r = c.rank();
  const int old = static_cast<int>(holders.size());
  const auto n = static_cast<std::size_t>(model_->num_params());
  const auto it = std::find_if(points_.begin(), points_.end(),
                               [&](const memory_point& m) { return m.step == step; });
  const memory_point* p = it == points_.end() ? nullptr : &*it;
  // Named the holder of a part it does not have, or a rank the group has not: the
  // coordinator and this worker disagree; said before any collective (the others'
  // broadcasts then fail on the dropped links).
  for (const int32_t h : holders)
    if (h < 0 || h >= w)
      throw cohort::error("rolling back to the point of step " + std::to_string(step) +
                          ": a part's holder is rank " + std::to_string(h) + ", not one of the " +
                          std::to_string(w) + " ranks of the group");
  if (old == 0)
    throw cohort::error("rolling back to the point of step " + std::to_string(step) +
                        ": no part of its error memory is named");
  for (int q = 0; q < old; ++q) {
    if (holders[static_cast<std::size_t>(q)] != r) continue;
    if (p == nullptr || p->own.replicas != old || p->part(q) == nullptr)
      throw cohort::error("rolling back to the point of step " + std::to_string(step) +
                          ": named the holder of error-memory part " + std::to_string(q) +
                          " of " + std::to_string(old) + ", which this worker does not hold");
  }
  trace::span traced("rollback from memory", "state", trace::track::control,
                     trace::args({{"step", step}}));
  bool restored = false;
  if (p != nullptr) {
    model_->flat_values().copy_from_host(p->values.data());
    std::vector<std::pair<std::string, nn::tensor>> slots = opt_->state();
    COHORT_CHECK(slots.size() == p->slots.size());
    for (std::size_t i = 0; i < slots.size(); ++i) slots[i].second.copy_from_host(p->slots[i].data());
    opt_->set_steps(p->opt_steps);
    restored = true;
  }
  // The error memory: part q to rank q % W, moved only where its holder is another rank.
  feedback f;
  f.reset(n);
  const bool same = old == w;
  std::vector<float> worker(n), server(n);
  for (int q = 0; q < old; ++q) {
    const int h = holders[static_cast<std::size_t>(q)], to = q % w;
    const feedback* src = nullptr;
    if (h == to) {
      if (r != to) continue;
      src = p->part(q);
    } else if (r == h) {
      // Sent from the point itself (a broadcast's root only reads).
      const feedback* mine = p->part(q);
      c.broadcast(const_cast<float*>(mine->worker.data()), n * sizeof(float), h);
      c.broadcast(const_cast<float*>(mine->server.data()), n * sizeof(float), h);
      continue;
    } else {
      c.broadcast(worker.data(), n * sizeof(float), h);
      c.broadcast(server.data(), n * sizeof(float), h);
      if (r != to) continue;
    }
    const float* sw = src != nullptr ? src->worker.data() : worker.data();
    const float* ss = src != nullptr ? src->server.data() : server.data();
    if (same) {
      std::copy(sw, sw + n, f.worker.begin());
      std::copy(ss, ss + n, f.server.begin());
    } else {
      f.fold_in(sw, ss);  // another group size: all the old ranks kept is sender memory
    }
  }
  f.replicas = w;
  f.rank = r;
  kept_ = f;
  next_ = std::move(f);
  pending_ = {};
  committed_replicas_ = w;
  committed_rank_ = r;
  choose_pipeline();
  // Points after STEP are of steps about to be replayed; they are taken again.
  drop_points([&](const memory_point& m) { return m.step != step; });
  return restored;
}

int64_t trainer::point_bytes() const {
  std::size_t floats = 0;
  auto add = [&floats](const memory_point& m) {
    floats += m.values.capacity() + m.own.worker.capacity() + m.own.server.capacity() +
              m.pred.worker.capacity() + m.pred.server.capacity();
    for (const auto& s : m.slots) floats += s.capacity();
  };
  for (const memory_point& m : points_) add(m);
  add(spare_);
  floats += point_scratch_.capacity();
  return static_cast<int64_t>(floats * sizeof(float));
}

}  // namespace cohort::train
