// The error-feedback memory as training state: each DP rank's part of a checkpoint, and
// taking the parts back after a resume, at the same group size or another
// (docs/compression.md, "Exact state"). A part is keyed by DP rank and group size alone:
// the compressed sum's chunks depend on nothing else, not on the transport nor on which
// ranks share a host (runtime/comm/compressed_allreduce.hpp), so a resume on another host
// layout takes part R bit for bit.
#include <string>
#include <utility>
#include <vector>

#include "runtime/ckpt/checkpoint.hpp"
#include "runtime/ckpt/checkpoint_dir.hpp"
#include "runtime/core/config.hpp"
#include "runtime/train/trainer.hpp"

namespace cohort::train {

void trainer::feedback::reset(std::size_t n) {
  worker.assign(n, 0.0f);
  server.assign(n, 0.0f);
  replicas = 0;
  rank = -1;
}

void trainer::feedback::fold_owner_into_sender() {
  for (std::size_t i = 0; i < worker.size(); ++i) {
    worker[i] += server[i];
    server[i] = 0.0f;
  }
}

void trainer::feedback::fold_in(const float* w, const float* s) {
  for (std::size_t i = 0; i < worker.size(); ++i) worker[i] += w[i] + s[i];
}

void trainer::restore_feedback(int replicas, int rank) {
  const auto n = static_cast<std::size_t>(model_->num_params());
  feedback f;
  f.reset(n);
  auto load = [&](int part, float* worker, float* server) {
    std::vector<optimizer_state_target> s;
    for (auto& t : param_targets(*model_, server)) s.push_back({"server", t});
    load_checkpoint_file(pending_.step_dir, feedback_file_name(part),
                         param_targets(*model_, worker), s);
  };
  if (pending_.replicas == replicas) {
    load(rank, f.worker.data(), f.server.data());  // the same seat: bit for bit
  } else {
    // Another group size: the old ranks R, R + W, ... fold into new rank R, all of what they
    // kept as senders and as chunk owners (the new chunks differ) becoming sender memory.
    std::vector<float> w(n), s(n);
    for (int part = rank; part < pending_.replicas; part += replicas) {
      load(part, w.data(), s.data());
      f.fold_in(w.data(), s.data());
    }
  }
  f.replicas = replicas;
  f.rank = rank;
  kept_ = f;
  next_ = std::move(f);
  pending_ = {};
}

std::vector<shard_snapshot> trainer::checkpoint_parts(int64_t next_step, uint64_t job_id,
                                                      std::vector<std::string>& all_files) {
  const int replicas = committed_replicas_, rank = committed_rank_;
  // Not taken since the resume (onebit_adam's warm-up compresses nothing): taken now.
  if (pending_.replicas > 0) restore_feedback(replicas, rank);
  const std::string job = std::to_string(job_id);
  std::vector<shard_snapshot> parts;
  all_files = {shard_file_name(0, 0)};
  for (int r = 0; r < replicas; ++r) all_files.push_back(feedback_file_name(r));
  if (rank == 0) {
    parts.push_back(snapshot(next_step));
    parts.back().meta.extra["checkpoint.job"] = job;
  }
  feedback f = kept_;
  // Kept in another group (no compressed step since it changed): its chunks are gone.
  if (f.replicas != replicas || f.rank != rank) f.fold_owner_into_sender();
  shard_snapshot s;
  s.file = feedback_file_name(rank);
  s.layout = param_layout(*model_);
  s.params = std::move(f.worker);
  s.optimizer_state.emplace_back("server", std::move(f.server));
  s.meta.step = next_step;
  s.meta.config_hash = config_hash(cfg_);
  s.meta.optimizer = cfg_.train.optimizer;
  s.meta.extra["checkpoint.job"] = job;
  s.meta.extra["feedback.rank"] = std::to_string(rank);
  s.meta.extra["feedback.replicas"] = std::to_string(replicas);
  parts.push_back(std::move(s));
  return parts;
}

}  // namespace cohort::train
