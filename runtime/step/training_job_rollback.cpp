// Rollbacks (docs/compression.md, "A killed worker" and "Rollback points in memory"): when a
// member that held state only it had leaves, the whole group goes back to the newest state
// that holds it, a rollback point in the members' memory or a checkpoint, and replays the
// steps since. The rest of the step protocol is training_job.cpp's.
#include "runtime/step/training_job.hpp"

namespace cohort::step {

bool training_job::rolls_back() const {
  return keeps_error_feedback(cfg_) && cfg_.train.determinism == "bitwise" && seat_size_ == 1 &&
         ((cfg_.fault_tolerance.checkpoint_every > 0 && checkpoints_ != nullptr) ||
          cfg_.fault_tolerance.memory_every > 0);
}

void training_job::note_point_ring(const net::step_vote& v) {
  if (!open_ || v.point_ring.empty() || !open_->point_ring.empty()) return;
  // A permutation of the step's ranks, or nothing (a vote that says otherwise is not used).
  const std::size_t w = open_->votes.size();
  if (v.point_ring.size() != w) return;
  std::vector<bool> seen(w, false);
  for (const int32_t k : v.point_ring) {
    if (k < 0 || static_cast<std::size_t>(k) >= w || seen[static_cast<std::size_t>(k)]) return;
    seen[static_cast<std::size_t>(k)] = true;
  }
  open_->point_ring = v.point_ring;
}

std::optional<std::vector<int32_t>> training_job::point_holders(const mb::roster& r) const {
  if (point_.step < 0) return std::nullopt;
  const int w = point_.replicas;
  std::vector<int32_t> now(static_cast<std::size_t>(w), -1);
  for (const auto& [id, rank] : point_.ranks)
    if (const mb::member* m = r.find(id)) now[static_cast<std::size_t>(rank)] = m->rank;
  // Who keeps the copy of each rank's part: the next rank on the point's ring.
  std::vector<int> copy_at(static_cast<std::size_t>(w));
  for (int p = 0; p < w; ++p) {
    const bool ring = static_cast<int>(point_.ring.size()) == w;
    const int at = ring ? point_.ring[static_cast<std::size_t>(p)] : p;
    const int next = ring ? point_.ring[static_cast<std::size_t>((p + 1) % w)] : (p + 1) % w;
    copy_at[static_cast<std::size_t>(at)] = next;
  }
  std::vector<int32_t> holders(static_cast<std::size_t>(w), -1);
  for (int p = 0; p < w; ++p) {
    int32_t h = now[static_cast<std::size_t>(p)];
    if (h < 0 && w > 1) h = now[static_cast<std::size_t>(copy_at[static_cast<std::size_t>(p)])];
    if (h < 0) return std::nullopt;
    holders[static_cast<std::size_t>(p)] = h;
  }
  return holders;
}

int64_t training_job::roll_back(const mb::roster& r, std::vector<int32_t>& restore_parts,
                               job_actions& out) {
  int64_t restore = -1;
  rollback_ = false;
  // (The lookup also knows the checkpoint the run resumed from, checkpoints on or not.)
  const std::optional<int64_t> c = checkpoints_ ? checkpoints_(next_step_) : std::nullopt;
  const auto parts = keeps_points() ? point_holders(r) : std::nullopt;
  if (parts && (!c || point_.step >= *c)) {
    restore = point_.step;
    restore_parts = *parts;
    out.notes.push_back("step " + std::to_string(next_step_) +
                        ": a lost member's error-feedback memory is in the rollback point of "
                        "step " +
                        std::to_string(restore) +
                        " in memory: every member rolls back to it and the steps since are "
                        "replayed");
    next_step_ = restore;
  } else if (c) {
    restore = *c;
    out.notes.push_back("step " + std::to_string(next_step_) +
                        ": a lost member's state (error-feedback memory, or a shard of the "
                        "optimizer state) is only in the checkpoint of step " +
                        std::to_string(restore) +
                        ": every member rolls back to it and the steps since are replayed");
    next_step_ = restore;
    // A point that lost a part stays unusable (its holders do not come back), and one
    // after the checkpoint is ahead of the replay: either way the replay takes that step's
    // point again.
    if (!parts || point_.step > restore) point_ = {};
  } else {
    out.notes.push_back("step " + std::to_string(next_step_) +
                        ": no checkpoint holds the lost member's error-feedback memory: "
                        "training goes on without it (not bit-identical from here)");
    point_ = {};  // of a run that differs from here on: never to be gone back to
  }
  return restore;
}

}  // namespace cohort::step
