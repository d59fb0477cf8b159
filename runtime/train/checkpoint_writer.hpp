// Background checkpoint writing: a save copies the trainer's state on the caller's thread
// (a memory copy), then a background thread writes the checkpoint folder (shards, COMPLETE
// marker) and prunes old ones, so training never waits for the disk. Owns that thread and
// the error reporting; not the format (runtime/ckpt) nor when checkpoints are taken.
#pragma once
#include <cstdint>
#include <future>
#include <string>
#include <utility>
#include <vector>

#include "runtime/ckpt/checkpoint.hpp"

namespace cohort::train {

class trainer;

/// One checkpoint in flight at most; a write error is logged when it happens and thrown
/// from the next save() or wait(), never from the background thread.
class checkpoint_writer {
 public:
  /// Checkpoints go to DIR/step_NNNNNNNN (created when needed); after each write the newest
  /// KEEP complete ones are kept (prune_checkpoints).
  checkpoint_writer(std::string dir, int keep);
  /// Waits for the write in flight; its error, if any, was already logged.
  ~checkpoint_writer();
  checkpoint_writer(const checkpoint_writer&) = delete;
  checkpoint_writer& operator=(const checkpoint_writer&) = delete;

  /// Waits for the write in flight (throwing its error, which is then cleared: call save
  /// again to retry), then snapshots `tr` as the checkpoint before `next_step` on this
  /// thread and starts writing it in the background. `tr` may change as soon as this
  /// returns.
  void save(const trainer& tr, int64_t next_step);
  /// The same for this writer's parts (in order) of a checkpoint several workers write
  /// together, whose files are ALL_FILES: a pipeline stage's shard, or a DP rank's
  /// error-feedback part (beside rank 0's shard, trainer::checkpoint_parts). Whichever
  /// writer finishes last writes the marker (write_checkpoint_files); wait() then returns the
  /// folder once this writer's parts are in.
  void save_parts(std::vector<shard_snapshot> snaps, std::vector<std::string> all_files);
  /// Waits for the write in flight and returns the newest folder this writer completed
  /// ("" when none). Throws the write's checkpoint_error (once).
  std::string wait();
  /// True while a write is in flight.
  bool busy() const;

 private:
  /// Waits for the write in flight, then writes SNAPS in the background: the whole
  /// checkpoint when ALL is empty, else this writer's parts of it (write_checkpoint_files).
  void start(std::vector<shard_snapshot> snaps, std::vector<std::string> all);

  std::string dir_;
  int keep_;
  std::future<std::string> inflight_;
  std::string last_;
};

}  // namespace cohort::train
