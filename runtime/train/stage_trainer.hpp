// One pipeline stage / tensor-parallel shard of the GPT training step: the stage's model
// (nn::gpt_stage), its optimizer and fixed-point gradient sums, the micro-batch schedule
// (GPipe or 1F1B) with activations and activation gradients exchanged with the neighbouring
// stages, the whole-model gradient norm continued from stage to stage, evaluation through
// the pipeline, and the stage's checkpoint shard. Knows nothing of sockets, actors or the
// coordinator: the links to the neighbours and the TP group are functions it is given.
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/ckpt/checkpoint.hpp"
#include "runtime/core/config.hpp"
#include "runtime/data/dataset.hpp"
#include "runtime/nn/gpt_stage.hpp"
#include "runtime/nn/optim.hpp"
#include "runtime/train/pipeline_schedule.hpp"
#include "runtime/train/trainer.hpp"

namespace cohort::train {

/// How a stage reaches its neighbours and its tensor-parallel group for one generation.
/// send/recv throw (comm_error) when the peer is gone or the generation was aborted.
struct stage_links {
  /// Sends `bytes` bytes tagged `tag` to pipeline stage `stage` of the same replica and TP rank.
  std::function<void(int stage, uint64_t tag, const void* data, std::size_t bytes)> send;
  /// Receives the message tagged `tag` from stage `stage` into data (exactly `bytes`).
  std::function<void(int stage, uint64_t tag, void* data, std::size_t bytes)> recv;
  /// Sums in place over the TP group (tp > 1 only). Handed host memory, unless
  /// tp_reads_device: then the stage's device memory itself (NCCL's group).
  std::function<void(float* data, int64_t count)> tp_allreduce;
  bool tp_reads_device = false;
  std::function<void(double* data, int64_t count)> tp_allreduce_f64;
  /// Optional: called at the end of each forward and backward pass with its duration,
  /// inside the timed compute (a fault wrapper stretches passes with it: `slow`).
  std::function<void(std::chrono::steady_clock::duration spent)> after_compute;
};

/// Tag of a pipeline message: what it is, for which step and micro-batch.
enum class stage_msg : uint64_t {
  activation = 1,
  gradient = 2,
  norm_up = 3,
  norm_down = 4,
  eval = 5
};
uint64_t stage_tag(stage_msg kind, int64_t step, int micro);

/// Where one stage's time went during a step (or summed over a run), microseconds.
struct stage_timing {
  uint64_t schedule_us = 0;  ///< wall time of the micro-batch schedule
  uint64_t compute_us = 0;   ///< forward and backward passes
  uint64_t forward_us = 0;   ///< the forward passes alone (compute_us - forward_us: backward)
  uint64_t forwards = 0;     ///< micro-batches forwarded (each also backwarded)
  uint64_t wait_us = 0;      ///< blocked receiving from a neighbour (the bubble, plus transfer)
  uint64_t send_us = 0;      ///< handing messages to the neighbours
  uint64_t p2p_bytes = 0;    ///< activation / gradient bytes sent
  uint64_t tp_us = 0;        ///< time inside the TP group's allreduce
  /// This stage's own bubble: schedule time not spent computing (waiting, sending). The
  /// run summary measures it against the pipeline's makespan instead (docs/pipeline.md).
  uint64_t bubble_us() const { return schedule_us > compute_us ? schedule_us - compute_us : 0; }
};

class stage_trainer {
 public:
  /// Builds the data set, stage `stage` of the config's partition (parallel.pp stages,
  /// parallel.stage_layers or balanced) with TP rank `tp_rank` of parallel.tp, its optimizer,
  /// and activation slots for the schedule. Throws usage_error (not a GPT, bad grid) or
  /// data_error.
  /// On the device train.device names (or GIVEN, a test's stand-in GPU): the stage's
  /// parameters, gradients, optimizer state and activations live there; what crosses the
  /// links (activations, their gradients, host-transport TP sums, the DP sum's buffer) is
  /// copied through host memory.
  stage_trainer(const config& c, int stage, int tp_rank, nn::device* given = nullptr);
  nn::device& dev() const { return model_->dev(); }

  const config& cfg() const { return cfg_; }
  nn::gpt_stage& model() { return *model_; }
  int stage() const { return stage_; }
  int stages() const { return stages_; }
  int tp_rank() const { return tp_rank_; }
  int micro_batches() const { return micro_batches_; }
  bool bitwise() const { return bitwise_; }
  schedule_kind schedule() const { return kind_; }

  /// The links of the current generation (replaced at every rebuild).
  void set_links(stage_links l) { links_ = std::move(l); }

  /// Clears the gradient sums of the step about to run.
  void begin_step();
  /// Runs this stage's part of the schedule over the replica's micro-batches `micro`
  /// (ascending, global indices): forwards and backwards in stage_ops order, activations
  /// from stage-1 and gradients from stage+1. Returns the sum of mean loss * rows over the
  /// micro-batches on the last stage, 0 elsewhere. Adds to timing().
  ///
  /// With `ready` set, reports readiness the way trainer::compute_gradients does: during the
  /// stage's LAST backward of the step each range the stage model reports final goes to
  /// `ready` at once (in bitwise mode after it was added to the fixed-point sum), in
  /// descending offsets; with no micro-batches every block range is reported at once. Every
  /// element is reported exactly once per call, so a bucket engine can sum the stage's
  /// gradients across replicas while the last micro-batches' backward goes on.
  double compute_gradients(int64_t step, const std::vector<int>& micro,
                           const nn::grads_ready_fn& ready = {});
  /// The buffer the DP group sums (int64 in bitwise mode, float otherwise), num_params long.
  void* reduction_buffer();
  /// After the DP sum: converts fixed point to float (bitwise) and computes the whole
  /// model's gradient norm, continued from stage 0 to the last and sent back (same bits as
  /// trainer::apply_step). Communicates with the neighbours: call it before voting.
  double finish_gradients(int64_t step);
  /// Clips with the norm of finish_gradients and applies the optimizer for `step`. No
  /// communication, so a commit can always be carried out.
  void apply_step(int64_t step);

  /// Loss and accuracy over the held-out split, run through the pipeline by every stage
  /// (and TP rank) of one replica together; meaningful on the last stage only (count 0
  /// elsewhere).
  evaluation evaluate(int64_t tag_step);

  /// This stage's shard of the checkpoint before `next_step`.
  shard_snapshot snapshot(int64_t next_step) const;
  /// Loads shard (stage, tp_rank) of a complete checkpoint folder; returns the next step.
  int64_t load_checkpoint(const std::string& step_dir);

  /// The state a joiner takes (parameters, optimizer slots): host copies on a GPU, which
  /// state_received puts back after the transfer wrote them.
  std::vector<std::pair<float*, std::size_t>> state_buffers();
  void state_received();
  int64_t optimizer_steps() const { return opt_->steps(); }
  void set_optimizer_steps(int64_t s) { opt_->set_steps(s); }

  /// SHA-256 of each parameter, keyed by name (TP shards: "name#t<rank>").
  std::map<std::string, std::string> param_digests() const;
  int64_t peak_pool_bytes() const;
  /// Parameter elements of the whole model (every stage, whole tensors).
  int64_t model_params() const { return model_params_; }
  /// Most bytes of activation memory the stage held at once so far (measured by its
  /// activation pool: micro-batches between forward and backward, and the shared set under
  /// activation checkpointing).
  std::size_t activation_bytes() const { return model_->activation_stats().peak_bytes; }
  /// Most micro-batches held between forward and backward at once so far.
  int peak_held() const { return peak_held_; }
  stage_timing& timing() { return timing_; }

 private:
  void tp_sum(float* data, int64_t count);
  /// BYTES of device memory at DEV where the links read them (DEV itself on the CPU, else a
  /// copy in `buf`).
  const void* to_link(const float* dev, std::size_t bytes, std::vector<float>& buf);
  /// The received BYTES in recv_buf_ where the model reads them (on a GPU: in_dev_).
  const float* from_link(std::size_t bytes);
  /// Float mode on a GPU: range [offset, offset + count) of the gradients copied to the
  /// host buffer the DP group sums.
  void stage_for_sum(int64_t offset, int64_t count);
  /// Bitwise mode: adds flat_grads()[offset, offset + count) into fixed_ or throws.
  void accumulate_fixed(int64_t step, int64_t offset, int64_t count);

  config cfg_;
  int stage_ = 0, stages_ = 1, tp_rank_ = 0, tp_size_ = 1;
  std::unique_ptr<cohort::dataset> data_;
  std::unique_ptr<nn::pool> device_pool_;  ///< a GPU's memory (null on the CPU)
  std::unique_ptr<nn::gpt_stage> model_;
  std::unique_ptr<nn::optimizer> opt_;
  schedule_kind kind_ = schedule_kind::one_f_one_b;
  int micro_batches_ = 1;
  bool bitwise_ = false;
  std::vector<int64_t> fixed_;
  double norm_ = 0;
  stage_links links_;
  cohort::batch batch_;
  std::vector<float> recv_buf_;
  // A GPU only: the links' copies of device memory. send_buf_ (activations and their
  // gradients out), in_dev_ (what recv_buf_ received, on the device), tp_buf_ (a host TP
  // sum), host_grads_ (the float DP sum; in bitwise mode the range being converted),
  // state_host_ (a transfer's copies).
  std::vector<float> send_buf_, tp_buf_, host_grads_;
  nn::tensor in_dev_;
  std::vector<std::vector<float>> state_host_;
  bool sum_pending_ = false;  ///< host_grads_ holds staged ranges the DP group sums
  int peak_held_ = 0;
  bool in_schedule_ = false;  ///< TP time counts toward timing() inside schedules only
  int64_t model_params_ = 0;
  stage_timing timing_;
};

}  // namespace cohort::train
