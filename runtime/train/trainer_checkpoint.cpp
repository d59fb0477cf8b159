// The trainer's checkpoints (trainer.hpp): a whole model's state as one shard of a
// checkpoint folder and back, with the metadata that says which run, grid and data position
// wrote it. Sharded state's parts are trainer_zero.cpp's; error-feedback parts
// trainer_feedback.cpp's.
#include <algorithm>
#include <cstring>

#include "runtime/ckpt/checkpoint.hpp"
#include "runtime/core/error.hpp"
#include "runtime/train/param_stats.hpp"
#include "runtime/train/resume_plan.hpp"
#include "runtime/train/trainer.hpp"

namespace cohort::train {

void require_layout(const std::string& step_dir, const training_metadata& meta, int pp, int tp) {
  auto get = [&](const char* key) {
    auto it = meta.extra.find(key);
    return it == meta.extra.end() ? std::string("1") : it->second;
  };
  const std::string cpp = get("parallel.pp"), ctp = get("parallel.tp");
  if (cpp != std::to_string(pp) || ctp != std::to_string(tp))
    throw usage_error("checkpoint " + step_dir + " was written by a grid of pp = " + cpp +
                      " x tp = " + ctp +
                      " (one shard per stage and TP rank), not pp = " + std::to_string(pp) +
                      " x tp = " + std::to_string(tp) + "; resume it with parallel.pp: " + cpp +
                      " and parallel.tp: " + ctp + " (dp may change)");
}

std::vector<shard_snapshot::entry> param_layout(const nn::model& m) {
  std::vector<shard_snapshot::entry> out;
  for (const auto& p : m.parameters())
    out.push_back({p.name, p.value.shape(), static_cast<std::size_t>(p.offset)});
  return out;
}

std::vector<tensor_target> param_targets(const nn::model& m, float* base) {
  std::vector<tensor_target> out;
  for (const auto& p : m.parameters()) {
    tensor_target v;
    v.name = p.name;
    v.shape = p.value.shape();
    v.data = base + p.offset;
    out.push_back(v);
  }
  return out;
}

shard_snapshot snapshot_state(const config& c, const cohort::dataset& data, const nn::model& m,
                              nn::optimizer& opt, int64_t next_step, int stage, int tp_rank) {
  shard_snapshot s;
  s.stage = stage;
  s.tp_rank = tp_rank;
  s.layout = param_layout(m);
  // Copies on the host whatever the device: the checkpoint layout is the same for both.
  s.params = const_cast<nn::model&>(m).flat_values().to_vector();
  for (auto& [slot, t] : opt.state()) s.optimizer_state.emplace_back(slot, t.to_vector());
  training_metadata& meta = s.meta;
  meta.step = next_step;
  meta.config_hash = config_hash(c);
  meta.optimizer = c.train.optimizer;
  meta.extra = data.position(c.train.seed, next_step, c.train.global_batch).to_metadata();
  for (auto& [k, v] : data.preprocessing_metadata()) meta.extra[k] = v;
  meta.extra["optimizer.steps"] = std::to_string(opt.steps());
  for (auto& [k, v] : model_metadata(c)) meta.extra[k] = v;
  meta.extra[run_identity_key] = run_identity(c);  // which run --resume may go on from
  meta.extra["train.determinism"] = c.train.determinism;
  meta.extra["parallel.pp"] = std::to_string(c.parallel.pp);
  meta.extra["parallel.tp"] = std::to_string(c.parallel.tp);
  return s;
}

int64_t metadata_number(const training_metadata& meta, const std::string& key, int64_t absent,
                        int64_t min, const std::string& step_dir) {
  const auto it = meta.extra.find(key);
  if (it == meta.extra.end()) return absent;
  std::size_t used = 0;
  int64_t value = min - 1;
  try {
    value = std::stoll(it->second, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != it->second.size() || it->second.empty() || value < min)
    throw checkpoint_error("checkpoint " + step_dir + ": metadata " + key +
                           " is not a whole number >= " + std::to_string(min) + ": '" + it->second +
                           "' (the checkpoint is damaged: resume from an earlier one)");
  return value;
}

int64_t load_state(const std::string& step_dir, const config& c, nn::model& m, nn::optimizer& opt,
                   int stage, int tp_rank) {
  training_metadata head = read_checkpoint_metadata(step_dir);
  require_layout(step_dir, head, c.parallel.pp, c.parallel.tp);
  if (head.optimizer != c.train.optimizer)
    throw checkpoint_error("checkpoint " + step_dir + ": holds " + head.optimizer +
                           " optimizer state but the config says train.optimizer: " +
                           c.train.optimizer + " (use the config the checkpoint was written with)");
  if (head.extra.count("zero.parts") > 0) {
    // Written with sharded optimizer state: the parameters from p0_t0, each slot from the
    // zero_r<R> parts.
    const int64_t n = m.num_params();
    std::vector<float> values(static_cast<std::size_t>(n));
    std::vector<std::pair<std::string, nn::tensor>> slots = opt.state();
    std::vector<std::vector<float>> host(slots.size(), values);
    std::vector<std::string> names;
    std::vector<float*> out;
    for (std::size_t i = 0; i < slots.size(); ++i) {
      names.push_back(slots[i].first);
      out.push_back(host[i].data());
    }
    const training_metadata meta =
        load_checkpoint_shard(step_dir, stage, tp_rank, param_targets(m, values.data()), {});
    read_state_range(step_dir, m, names, {0, n}, out);
    m.flat_values().copy_from_host(values.data());
    for (std::size_t i = 0; i < slots.size(); ++i) slots[i].second.copy_from_host(host[i].data());
    opt.set_steps(optimizer_steps_of(meta, step_dir));
    return meta.step;
  }
  // Loaded into host memory, then copied to a GPU: the same files load on either device.
  const bool direct = m.flat_values().host_visible();
  const auto n = static_cast<std::size_t>(m.num_params());
  std::vector<std::pair<std::string, nn::tensor>> slots = opt.state();
  std::vector<std::vector<float>> host(direct ? 0 : 1 + slots.size(), std::vector<float>(n));
  std::vector<tensor_target> params =
      param_targets(m, direct ? m.flat_values().data() : host[0].data());
  std::vector<optimizer_state_target> state;
  for (std::size_t i = 0; i < slots.size(); ++i)
    for (auto& v : param_targets(m, direct ? slots[i].second.data() : host[1 + i].data()))
      state.push_back({slots[i].first, v});
  training_metadata meta = load_checkpoint_shard(step_dir, stage, tp_rank, params, state);
  if (!direct) {
    m.flat_values().copy_from_host(host[0].data());
    for (std::size_t i = 0; i < slots.size(); ++i)
      slots[i].second.copy_from_host(host[1 + i].data());
  }
  opt.set_steps(optimizer_steps_of(meta, step_dir));
  return meta.step;
}

shard_snapshot trainer::snapshot(int64_t next_step) const {
  // Sharded state released at a resume and no step since (a final checkpoint written at once):
  // alone, load all of it; that changes nothing a caller sees, hence the const_cast.
  if (zero_ && !zero_->holds()) const_cast<trainer*>(this)->zero_hold_alone();
  if (!values_whole_)
    throw checkpoint_error("a checkpoint needs every parameter, and this member holds only its "
                           "shards of them (train.zero: 3): gather them first");
  shard_snapshot s = snapshot_state(cfg_, *data_, *model_, *opt_, next_step);
  // The whole model in one shard, whatever grid the config names.
  s.meta.extra["parallel.pp"] = s.meta.extra["parallel.tp"] = "1";
  return s;
}

void trainer::save_checkpoint(const std::string& step_dir, int64_t next_step) const {
  write_training_checkpoint(step_dir, {snapshot(next_step)});
}

int64_t trainer::load_checkpoint(const std::string& step_dir) {
  // The whole model is shard p0_t0 of a pp = tp = 1 checkpoint (whatever this config's
  // grid: `cohort train` runs the whole model).
  if (zero_) return zero_load(step_dir);
  config whole = cfg_;
  whole.parallel.pp = whole.parallel.tp = 1;
  const int64_t step = load_state(step_dir, whole, *model_, *opt_, 0, 0);
  choose_pipeline();
  pending_ = {};
  if (error_feedback_) {
    kept_.reset(static_cast<std::size_t>(model_->num_params()));
    next_ = kept_;
    pending_ = {step_dir, checkpoint_feedback_parts(step_dir)};
  }
  return step;
}

}  // namespace cohort::train
