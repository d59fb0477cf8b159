// A worker's seat in its data-parallel group: what one DP step needs from the model this
// worker trains, the whole model (trainer) or one pipeline stage / tensor-parallel shard
// (stage_trainer). The data plane (bucket engine, overlap, traffic, state transfer to a
// joiner) and the step protocol (actors/dp_group) serve both through this interface and do
// not know which one they hold. Knows nothing of sockets, actors or the coordinator.
//
// One step, from the DP group's thread:
//
//   s.begin_step();
//   engine.set_wire(s.wire(replicas, rank));
//   engine.begin(s.reduction_buffer());
//   s.compute_gradients(step, micro, [&](off, n) { engine.mark_ready(off, n); });
//   engine.wait_all();                  // reduction_buffer() now holds the group's sum
//   s.finish_gradients(step);           // a stage: the whole model's gradient norm
//   ... vote; on commit: s.apply_step(step);
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/config.hpp"
#include "runtime/train/stage_trainer.hpp"
#include "runtime/train/trainer.hpp"

namespace cohort::train {

class checkpoint_writer;

/// What a seat says about itself in the run's final report.
struct seat_report {
  /// combine_param_digests over the seat's parameters (a stage: over its part of the model;
  /// the coordinator combines the stages' param_digests into the whole model's).
  std::string params_sha256;
  /// A stage: SHA-256 of each of its parameters by name (TP shards: "name#t<rank>").
  std::map<std::string, std::string> param_digests;
  int64_t model_params = 0;  ///< parameter elements of the whole model
  int64_t peak_pool_bytes = 0;
  bool staged = false;  ///< the fields below are a stage's
  int stage = -1, tp_rank = -1;
  stage_timing timing;
  std::size_t activation_bytes = 0;  ///< measured peak of the activation pool
  int peak_held = 0;                 ///< most micro-batches held between forward and backward
  model_state_bytes state;           ///< the whole model's seat: its model state now
};

class seat {
 public:
  virtual ~seat() = default;

  /// The seat's place in the replica's grid: (pipeline stage, TP rank); (0, 0) for the
  /// whole model.
  virtual std::pair<int, int> position() const = 0;
  /// The device the seat computes on, as its DP group is told ("cpu", "cuda:N"): what the
  /// group's device check compares and where a DP communicator over NCCL finds the
  /// reduction buffer.
  virtual std::string device_name() const { return "cpu"; }
  /// Micro-batches of a whole step (all replicas together).
  virtual int micro_batches() const = 0;
  /// reduction_buffer()'s element type: int64 fixed point (train.determinism: bitwise,
  /// uncompressed) or f32.
  virtual comm::grad_type reduction_type() const = 0;
  /// Elements of reduction_buffer(): the seat's parameters.
  virtual std::size_t elements() = 0;
  /// The seat's links for one generation: a stage's neighbours and TP group (a whole model
  /// has none and ignores them).
  virtual void set_links(stage_links links) = 0;

  virtual void begin_step() = 0;
  /// This replica's micro-batches `micro` of `step`; each range of reduction_buffer() goes
  /// to `ready` once, as soon as it is final (during the last micro-batch's backward).
  /// Returns the sum of mean loss * rows where this seat sees the loss (speaks_for_loss).
  virtual double compute_gradients(int64_t step, const std::vector<int>& micro,
                                   const nn::grads_ready_fn& ready) = 0;
  virtual void* reduction_buffer() = 0;
  /// How reduction_buffer() travels this step in a DP group of `replicas` where this seat is
  /// `rank` (trainer::wire); after begin_step. The seat keeps the plan's memory alive.
  virtual comm::wire_plan wire(int replicas, int rank) = 0;
  /// After the DP sum, before the vote: what still needs the seat's links (a stage: the whole
  /// model's gradient norm, continued stage to stage). May throw comm_error.
  virtual void finish_gradients(int64_t step) = 0;
  /// Applies the step (clip, optimizer). No communication: a commit can always be carried out.
  virtual void apply_step(int64_t step) = 0;
  /// Whether this seat's loss and rows are its replica's (the whole model; the last stage's
  /// TP rank 0).
  virtual bool speaks_for_loss() const = 0;

  /// The training state a joiner takes from a donor (parameters, optimizer slots).
  virtual std::vector<std::pair<float*, std::size_t>> state_buffers() = 0;
  /// A transfer wrote into what state_buffers() handed out (on every member, donor too): a
  /// seat whose buffers were host copies of device memory puts them back.
  virtual void state_received() {}
  virtual int64_t optimizer_steps() const = 0;
  virtual void set_optimizer_steps(int64_t steps) = 0;
  /// Loads the seat's shard of a complete checkpoint folder; returns the next step.
  virtual int64_t load_checkpoint(const std::string& step_dir) = 0;
  /// Hands the state before `next_step` to `w` (written in the background). A stage writes
  /// its shard of the whole checkpoint; `job_id` marks the shards of one run.
  virtual void save(checkpoint_writer& w, int64_t next_step, uint64_t job_id) = 0;
  /// True when every DP rank writes a part of each checkpoint (its error-feedback memory),
  /// not DP rank 0 alone.
  virtual bool saves_every_rank() const = 0;
  /// Held-out evaluation, run by every seat of one replica together (tag: a step number
  /// the pipeline's messages are tagged with). count is 0 where the loss is not seen.
  virtual evaluation evaluate(int64_t tag) = 0;
  /// What the final report says about the seat.
  virtual seat_report report() = 0;
  /// The most bytes the seat's memory pool has held so far (cheap: telemetry each step).
  virtual int64_t peak_pool_bytes() const = 0;
  /// The whole model's trainer when train.zero shards its optimizer state (null otherwise):
  /// the DP group re-cuts it when the group changes and gathers the parameters after each
  /// commit (trainer::reshard, trainer::gather_params).
  virtual trainer* sharded() { return nullptr; }
  /// The whole model's trainer (null for a pipeline stage or TP shard): where the DP group
  /// keeps rollback points in memory (fault_tolerance.memory_every, trainer::take_point).
  virtual trainer* whole_model() { return nullptr; }
};

/// The whole model on one worker (the adapter lives with trainer, in trainer.cpp).
std::unique_ptr<seat> make_whole_seat(const config& c);
/// Pipeline stage `stage`, TP rank `tp_rank` of c's grid (in stage_trainer.cpp), on the
/// device train.device names, or GIVEN (a test's stand-in GPU).
std::unique_ptr<seat> make_stage_seat(const config& c, int stage, int tp_rank,
                                      nn::device* given = nullptr);

}  // namespace cohort::train
