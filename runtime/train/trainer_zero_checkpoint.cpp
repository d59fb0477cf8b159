// Sharded state's checkpoints (train.zero, docs/checkpoints.md "Sharded state"): each
// member's part (its own shard's ranges, back to back) and rank 0's head with the cut,
// reading ranges of a checkpoint's optimizer state (sharded parts or a replicated shard), and
// loading one for a re-cut to fill from. The cut's arithmetic is zero_shards.hpp's.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/ckpt/checkpoint.hpp"
#include "runtime/ckpt/checkpoint_dir.hpp"
#include "runtime/core/config.hpp"
#include "runtime/core/error.hpp"
#include "runtime/train/trainer.hpp"

namespace cohort::train {

namespace {

// One flat tensor named NAME of N floats at DATA (a sharded part's layout).
tensor_target flat_target(const std::string& name, int64_t n, float* data) {
  tensor_target t;
  t.name = name;
  t.shape = {n};
  t.data = data;
  return t;
}

int zero_parts_of(const training_metadata& head, const std::string& step_dir) {
  return static_cast<int>(metadata_number(head, "zero.parts", 0, 1, step_dir));
}

// The cut a sharded checkpoint's PARTS parts were written in: the head's "zero.cut" (an
// experts' cut), else the even one.
shard_cut checkpoint_cut(const std::string& step_dir, int64_t n, int parts) {
  const training_metadata head = read_checkpoint_metadata(step_dir);
  const auto it = head.extra.find("zero.cut");
  if (it == head.extra.end()) return even_cut(n, parts);
  shard_cut c;
  try {
    c = cut_from_text(it->second, n);
  } catch (const usage_error& e) {
    throw checkpoint_error("checkpoint " + step_dir + ": its zero.cut does not read: " + e.what() +
                           " (the checkpoint is damaged: resume from another)");
  }
  if (c.w() != parts)
    throw checkpoint_error("checkpoint " + step_dir + ": its zero.cut has " + std::to_string(c.w()) +
                           " shards for " + std::to_string(parts) +
                           " parts (the checkpoint is damaged: resume from another)");
  return c;
}

}  // namespace

void read_state_range(const std::string& step_dir, const nn::model& m,
                      const std::vector<std::string>& slots, elem_range range,
                      const std::vector<float*>& out) {
  COHORT_CHECK(out.size() == slots.size());
  const int64_t n = m.num_params();
  if (range.size() <= 0) return;
  const int parts = checkpoint_zero_parts(step_dir);
  if (parts > 0) {
    const shard_cut cut = checkpoint_cut(step_dir, n, parts);
    // Each part overlapping the range is read whole (its shard's ranges back to back) and
    // its overlaps kept.
    for (int p = 0; p < parts; ++p) {
      const std::vector<elem_range>& pr = cut.shards[static_cast<std::size_t>(p)];
      bool overlaps = false;
      for (const elem_range& x : pr) overlaps = overlaps || (x.end > range.begin && x.begin < range.end);
      if (!overlaps) continue;
      const int64_t size = cut.size(p);
      std::vector<float> values(static_cast<std::size_t>(size));
      std::vector<std::vector<float>> state(slots.size(), values);
      std::vector<optimizer_state_target> targets;
      for (std::size_t s = 0; s < slots.size(); ++s)
        targets.push_back({slots[s], flat_target("zero", size, state[s].data())});
      load_checkpoint_file(step_dir, zero_file_name(p),
                           {flat_target("zero", size, values.data())}, targets);
      int64_t at = 0;  // where range x starts in the part
      for (const elem_range& x : pr) {
        const int64_t lo = std::max(x.begin, range.begin), hi = std::min(x.end, range.end);
        if (hi > lo)
          for (std::size_t s = 0; s < slots.size(); ++s)
            std::memcpy(out[s] + (lo - range.begin), state[s].data() + at + (lo - x.begin),
                        static_cast<std::size_t>(hi - lo) * sizeof(float));
        at += x.size();
      }
    }
    return;
  }
  // A checkpoint of replicated state: its whole slots, read once each call.
  std::vector<float> values(static_cast<std::size_t>(n));
  std::vector<std::vector<float>> state(slots.size(), values);
  std::vector<optimizer_state_target> targets;
  for (std::size_t s = 0; s < slots.size(); ++s)
    for (auto& t : param_targets(m, state[s].data())) targets.push_back({slots[s], t});
  load_checkpoint_shard(step_dir, 0, 0, param_targets(m, values.data()), targets);
  for (std::size_t s = 0; s < slots.size(); ++s)
    std::memcpy(out[s], state[s].data() + range.begin,
                static_cast<std::size_t>(range.size()) * sizeof(float));
}

int64_t trainer::zero_load(const std::string& step_dir) {
  const training_metadata head = read_checkpoint_metadata(step_dir);
  require_layout(step_dir, head, 1, 1);
  if (head.optimizer != cfg_.train.optimizer)
    throw checkpoint_error("checkpoint " + step_dir + ": holds " + head.optimizer +
                           " optimizer state but the config says train.optimizer: " +
                           cfg_.train.optimizer + " (use the config the checkpoint was written with)");
  // The parameters now (every member needs all of them); the optimizer state at the re-cut,
  // once this member knows which ranges it holds.
  std::vector<float> params(static_cast<std::size_t>(model_->num_params()));
  training_metadata meta;
  if (zero_parts_of(head, step_dir) > 0) {
    meta = load_checkpoint_shard(step_dir, 0, 0, param_targets(*model_, params.data()), {});
  } else {
    // A replicated checkpoint's shard holds the slots too: loaded to check them, then dropped.
    std::vector<std::vector<float>> slots(zero_->slots().size(), params);
    std::vector<optimizer_state_target> targets;
    for (std::size_t s = 0; s < slots.size(); ++s)
      for (auto& t : param_targets(*model_, slots[s].data()))
        targets.push_back({zero_->slots()[s], t});
    meta = load_checkpoint_shard(step_dir, 0, 0, param_targets(*model_, params.data()), targets);
  }
  model_->flat_values().copy_from_host(params.data());
  const int64_t steps = optimizer_steps_of(meta, step_dir);
  zero_->release();
  zero_->set_steps(steps);
  zero_source_ = step_dir;
  zero_fresh_ = false;
  whole_params_ = true;
  values_whole_ = true;
  return meta.step;
}

void trainer::zero_fill_from_source() {
  if (zero_source_.empty()) return;  // fresh: the zeros hold() made
  for (std::size_t i = 0; i < zero_->ranges().size(); ++i) {
    std::vector<float*> out;
    for (std::size_t s = 0; s < zero_->slots().size(); ++s) out.push_back(zero_->slot(i, s).data());
    read_state_range(zero_source_, *model_, zero_->slots(), zero_->ranges()[i], out);
  }
}

void trainer::zero_hold_alone() {
  zero_->hold(1, 0);
  zero_fill_from_source();
  zero_source_.clear();
}

std::vector<shard_snapshot> trainer::zero_checkpoint_parts(int64_t next_step, uint64_t job_id,
                                                           std::vector<std::string>& all_files) {
  if (!zero_->holds()) zero_hold_alone();
  const int w = zero_->replicas(), r = zero_->rank();
  const std::string job = std::to_string(job_id);
  all_files = {shard_file_name(0, 0)};
  for (int k = 0; k < w; ++k) all_files.push_back(zero_file_name(k));
  std::vector<shard_snapshot> parts;
  const shard_cut& cut = zero_->cut();
  if (r == 0) {
    parts.push_back(snapshot(next_step));  // the parameters, under their names
    parts.back().optimizer_state.clear();
    parts.back().meta.extra["checkpoint.job"] = job;
    parts.back().meta.extra["zero.parts"] = std::to_string(w);
    // An experts' cut is written down: a reader cannot make it without the group's ring.
    if (!(cut == even_cut(cut.n, w))) parts.back().meta.extra["zero.cut"] = cut_text(cut);
  }
  // Its own shard: the first held ranges, back to back (the replica is the neighbour's to
  // write).
  const std::vector<elem_range>& own = cut.shards[static_cast<std::size_t>(r)];
  const int64_t own_size = cut.size(r);
  shard_snapshot s;
  s.file = zero_file_name(r);
  s.layout = {{"zero", {own_size}, 0}};
  const std::vector<float> values = model_->flat_values().to_vector();
  for (const elem_range& x : own)
    s.params.insert(s.params.end(), values.begin() + x.begin, values.begin() + x.end);
  for (std::size_t k = 0; k < zero_->slots().size(); ++k) {
    std::vector<float> data;
    data.reserve(static_cast<std::size_t>(own_size));
    for (std::size_t i = 0; i < own.size(); ++i) {
      COHORT_CHECK(i < zero_->ranges().size() && zero_->ranges()[i] == own[i]);
      const float* from = zero_->slot(i, k).data();
      data.insert(data.end(), from, from + own[i].size());
    }
    s.optimizer_state.emplace_back(zero_->slots()[k], std::move(data));
  }
  s.meta.step = next_step;
  s.meta.config_hash = config_hash(cfg_);
  s.meta.optimizer = cfg_.train.optimizer;
  s.meta.extra["checkpoint.job"] = job;
  s.meta.extra["optimizer.steps"] = std::to_string(zero_->steps());
  s.meta.extra["zero.rank"] = std::to_string(r);
  s.meta.extra["zero.parts"] = std::to_string(w);
  parts.push_back(std::move(s));
  return parts;
}

}  // namespace cohort::train
