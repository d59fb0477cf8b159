#include "runtime/train/checkpoint_writer.hpp"

#include <spdlog/spdlog.h>

#include <chrono>
#include <utility>

#include "runtime/ckpt/checkpoint.hpp"
#include "runtime/ckpt/checkpoint_dir.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/trace.hpp"
#include "runtime/train/trainer.hpp"

namespace cohort::train {

checkpoint_writer::checkpoint_writer(std::string dir, int keep)
    : dir_(std::move(dir)), keep_(keep) {}

checkpoint_writer::~checkpoint_writer() {
  try {
    wait();
  } catch (const std::exception&) {
    // Already logged by the background thread; a destructor must not throw.
  }
}

bool checkpoint_writer::busy() const {
  return inflight_.valid() &&
         inflight_.wait_for(std::chrono::seconds(0)) != std::future_status::ready;
}

std::string checkpoint_writer::wait() {
  if (inflight_.valid()) {
    // get() invalidates the future whether it returns or throws, so an error is thrown once.
    last_ = inflight_.get();
  }
  return last_;
}

void checkpoint_writer::save(const trainer& tr, int64_t next_step) {
  // The copy is taken here, before training goes on; the thread owns it from now on.
  start({tr.snapshot(next_step)}, {});
}

void checkpoint_writer::save_parts(std::vector<shard_snapshot> snaps,
                                   std::vector<std::string> all_files) {
  start(std::move(snaps), std::move(all_files));
}

void checkpoint_writer::start(std::vector<shard_snapshot> snaps, std::vector<std::string> all) {
  COHORT_CHECK(!snaps.empty());
  wait();
  const int64_t step = snaps.front().meta.step;
  const std::string step_dir = checkpoint_path(dir_, step);
  inflight_ = std::async(
      std::launch::async,
      [step_dir, dir = dir_, keep = keep_, all = std::move(all), step,
       snaps = std::move(snaps)]() -> std::string {
        const shard_snapshot* at = &snaps.front();  // the file being written, for the log
        trace::span traced("checkpoint write", "checkpoint", trace::track::control,
                           trace::args({{"step", snaps.front().meta.step}}));
        try {
          make_checkpoint_folders(dir);  // mode 0700, parents fsynced
          // One writer holds the whole checkpoint; several complete it together.
          bool complete = all.empty();
          if (complete) write_training_checkpoint(step_dir, snaps);
          for (std::size_t i = 0; i < snaps.size() && !all.empty(); ++i) {
            at = &snaps[i];
            complete = write_checkpoint_files(step_dir, snaps[i], all) || complete;
          }
          if (complete) prune_checkpoints(dir, keep, step);
          return step_dir;
        } catch (const std::exception& e) {
          spdlog::error("checkpoint {} of {} was not written: {}", at->file_name(), step_dir,
                        e.what());
          throw;
        }
      });
}

}  // namespace cohort::train
