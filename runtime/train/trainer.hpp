// The single-process training step every distributed run must reproduce: which samples a
// step holds, how micro-batch gradients are summed (float or fixed point), the learning-rate
// schedule, clipping, the optimizer, evaluation and checkpoints. Knows nothing of workers
// or collectives: a data-parallel worker calls compute_gradients for its share of the
// micro-batches (told range by range which gradients are final), sums reduction_buffer()
// with its peers, then calls apply_step.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/ckpt/checkpoint.hpp"
#include "runtime/comm/buckets.hpp"
#include "runtime/comm/holders_sum.hpp"
#include "runtime/core/config.hpp"
#include "runtime/data/dataset.hpp"
#include "runtime/nn/model.hpp"
#include "runtime/nn/moe.hpp"
#include "runtime/nn/optim.hpp"
#include "runtime/train/grad_pipeline.hpp"
#include "runtime/train/onebit.hpp"
#include "runtime/train/zero_state.hpp"

namespace cohort::comm {
class communicator;
}

namespace cohort::train {

/// Held-out evaluation of the whole model.
struct evaluation {
  double loss = 0.0;      ///< mean loss per prediction
  double accuracy = 0.0;  ///< share of argmax predictions equal to the target
  int64_t count = 0;      ///< predictions (images, or tokens for a language model)
};

/// Learning rate of `step` (0-based): linear warm-up over warmup_steps, then constant or a
/// cosine from lr down to min_lr at the last step.
float learning_rate(const train_config& t, int64_t step);

/// Micro-batches of a step that DP replica `d` of `dp` computes: i in [0, micro_batches)
/// with i % dp == d, ascending. A pure function of (micro_batches, dp, d), so data order
/// never depends on timing; every i belongs to exactly one replica. Throws usage_error
/// unless 0 <= d < dp and micro_batches >= 0.
std::vector<int> replica_micro_batches(int micro_batches, int dp, int d);

/// Throws usage_error (exit 2) unless the checkpoint in STEP_DIR (metadata META) was written by
/// a pp x tp grid equal to PP x TP (checkpoints hold one shard per stage and TP rank).
void require_layout(const std::string& step_dir, const training_metadata& meta, int pp, int tp);

/// The training state of M and OPT as shard (STAGE, TP_RANK) of the checkpoint before
/// NEXT_STEP, with the run's metadata (config hash, data position, optimizer steps, grid).
/// Owns its memory: training may go on while it is written.
shard_snapshot snapshot_state(const config& c, const cohort::dataset& data, const nn::model& m,
                              nn::optimizer& opt, int64_t next_step, int stage = 0,
                              int tp_rank = 0);
/// Loads shard (STAGE, TP_RANK) of the complete checkpoint folder STEP_DIR into M and OPT,
/// after checking that it was written by C's pp x tp grid (require_layout) and optimizer;
/// returns the next step to run. Throws checkpoint_error (usage_error for another grid).
int64_t load_state(const std::string& step_dir, const config& c, nn::model& m, nn::optimizer& opt,
                   int stage, int tp_rank);

/// Where each parameter of M lies in its flat buffers (a shard's layout).
std::vector<shard_snapshot::entry> param_layout(const nn::model& m);
/// Per-parameter load targets of a flat buffer laid out like M's parameters (the values, an
/// optimizer slot, an error memory).
std::vector<tensor_target> param_targets(const nn::model& m, float* base);

/// Every float of the training state of M and OPT, in one fixed order: the parameters,
/// then each optimizer slot (optimizer::state() order), each num_params() long; views into
/// the live tensors (what a joiner receives from a donor).
std::vector<std::pair<float*, std::size_t>> state_buffers_of(nn::model& m, nn::optimizer& opt);
/// VIEWS where a transfer over host transports reads and writes them: VIEWS themselves on a
/// host-visible DEV, else host copies kept in HOST (state_from_host puts them back).
std::vector<std::pair<float*, std::size_t>> state_on_host(
    nn::device& dev, const std::vector<std::pair<float*, std::size_t>>& views,
    std::vector<std::vector<float>>& host);
/// After a transfer wrote the copies state_on_host handed out: back into VIEWS, HOST emptied
/// (nothing when HOST is empty: the views themselves were handed out).
void state_from_host(nn::device& dev, const std::vector<std::pair<float*, std::size_t>>& views,
                     std::vector<std::vector<float>>& host);
/// The device a trainer's step runs on: GIVEN (a test's stand-in), else the one
/// train.device names for this worker's local rank, its products at train.precision.
nn::device& step_device(const train_config& t, nn::device* given);
/// Expert parallelism with sharded parameters: the elements of M's block BLOCK each rank k of
/// a DP group reads in a training pass, where PLACES[k] is k's (rank, size) in its EP group:
/// the block's dense parameters and the experts e with e % size == rank (the experts it
/// computes); sorted, adjacent parameters merged.
std::vector<std::vector<elem_range>> expert_block_needs(
    const nn::model& m, std::size_t block, const std::vector<std::pair<int, int>>& places);
/// The optimizer settings of train.* (kind, betas, eps, weight decay, momentum).
nn::optim_options optim_options_from(const train_config& t);

/// Elements RANGE of each optimizer slot SLOTS (optimizer::state() names) of the complete
/// checkpoint folder STEP_DIR, laid out like M's parameters, into OUT[s] (RANGE.size() floats
/// each): from its sharded-state parts (zero_r<R>, train.zero) when it has them, else from
/// shard p0_t0's whole tensors. Throws checkpoint_error.
void read_state_range(const std::string& step_dir, const nn::model& m,
                      const std::vector<std::string>& slots, elem_range range,
                      const std::vector<float*>& out);

/// What a worker's model state takes, in bytes (the summary's and the metrics' figures).
struct model_state_bytes {
  int64_t params = 0;     ///< the parameters (all of them: zero 1 shards only the optimizer)
  int64_t grads = 0;      ///< float gradients, plus bitwise mode's int64 sum
  int64_t optimizer = 0;  ///< optimizer state held, this member's own shard's or all of it
  int64_t replica = 0;    ///< the neighbour's shard's state kept as its second copy
  int64_t total() const { return params + grads + optimizer + replica; }
};

/// What one re-cut of sharded optimizer state did on this member.
struct zero_reshard {
  bool ran = false;            ///< false: every member already held what it needs
  int64_t moved_elements = 0;  ///< per slot, over the whole group (the plan's sum)
  uint64_t bytes_sent = 0, bytes_received = 0;  ///< this member's, state and parameters
  bool behind = false;  ///< this member held nothing of the step (a joiner)
};

/// A whole number >= MIN that a checkpoint's metadata records under KEY; ABSENT when the key
/// is not there. Throws checkpoint_error naming STEP_DIR and KEY for anything else.
int64_t metadata_number(const training_metadata& meta, const std::string& key, int64_t absent,
                        int64_t min, const std::string& step_dir);
/// The optimizer's step count a checkpoint records (optimizer.steps; its step when absent).
inline int64_t optimizer_steps_of(const training_metadata& meta, const std::string& step_dir) {
  return metadata_number(meta, "optimizer.steps", meta.step, 0, step_dir);
}

class block_prefetch;  // trainer_params.cpp

class trainer {
 public:
  /// Builds the data set and the model (initialised from train.seed) the config names, on
  /// the device train.device names (or DEV when given: tests run the device path on a
  /// stand-in), and sets the compute thread count. Throws data_error when a data package is
  /// missing, cohort::error when the device cannot be opened.
  explicit trainer(const config& c, nn::device* dev = nullptr);
  ~trainer();
  trainer(const trainer&) = delete;
  trainer& operator=(const trainer&) = delete;

  const config& cfg() const { return cfg_; }
  nn::model& model() { return *model_; }
  const cohort::dataset& data() const { return *data_; }
  /// Micro-batches per step: ceil(global_batch / micro_batch).
  int micro_batches() const { return micro_batches_; }

  /// Clears the gradient sums of the step about to run.
  void begin_step();
  /// Forward and backward of micro-batches [first, last) of step `step`, adding their
  /// gradients (scaled so that the sum over the whole global batch is the mean-loss
  /// gradient) into the step's sum: float sums in `fast` mode, int64 fixed point in
  /// `bitwise` mode. Returns the sum over those micro-batches of (mean loss * rows).
  double compute_gradients(int64_t step, int first, int last);
  /// Like compute_gradients(step, first, last) over the listed micro-batches (strictly
  /// ascending, each in [0, micro_batches()), possibly empty; usage_error otherwise), with
  /// the same result bits, and reports readiness: during the LAST listed micro-batch's
  /// backward each range the model reports final (model::set_grads_ready_hook: a bias, a
  /// chunk of weight rows, a LayerNorm parameter, ...) goes to `ready` at once (in bitwise
  /// mode after that range was converted and added to fixed_grads()), in descending
  /// offsets. With an empty list every block range is reported at once (the zeros
  /// begin_step left), last block first. Every element is reported exactly once per call.
  /// After a fixed-point overflow error fixed_grads() holds a partial sum: begin_step again.
  double compute_gradients(int64_t step, const std::vector<int>& micro,
                           const nn::grads_ready_fn& ready);
  /// In bitwise mode, the step's int64 gradient sum (what peers add together); empty in
  /// fast mode, where model().flat_grads() holds the float sum.
  std::vector<int64_t>& fixed_grads() { return fixed_; }
  /// True in `train.determinism: bitwise` mode.
  bool bitwise() const { return bitwise_; }
  /// The buffer peers sum each step, model().num_params() elements: fixed_grads().data()
  /// (int64) in bitwise mode, else model().flat_grads().data() (float). Both are already
  /// scaled so that the plain sum over all replicas is the global-batch mean gradient.
  /// With comm.compression the sum travels as floats in every mode: in bitwise mode the
  /// step's fixed-point sum is converted range by range as compute_gradients reports it.
  void* reduction_buffer();
  /// reduction_buffer()'s element type (int64 only in bitwise mode without compression).
  comm::grad_type reduction_type() const;
  /// The gradient path chosen for this config and 1-bit phase (grad_pipeline.hpp).
  const grad_pipeline& pipeline() const { return pipeline_; }
  /// How reduction_buffer() travels this step in a data-parallel group of `replicas` where
  /// this worker is `rank` (comm.compression, comm.error_feedback); call after begin_step.
  /// The error memory is this worker's training state: a step changes it only when
  /// apply_step commits the step, and when the group differs from the last committed
  /// step's, what this worker kept for the chunks it owned joins what it keeps as a sender
  /// (the total is unchanged; chunk ownership moved).
  comm::wire_plan wire(int replicas, int rank);
  /// Clips, applies the optimizer for step `step` and returns the gradient norm before
  /// clipping. In bitwise mode first converts the fixed-point sum to floats, once.
  double apply_step(int64_t step);

  /// Loss and accuracy over the whole held-out split.
  evaluation evaluate();

  /// A copy of the whole training state (parameters, optimizer state, metadata) as shard
  /// p0_t0 of the checkpoint before `next_step` (the first step not yet applied). Owns its
  /// memory: training may go on while it is written (checkpoint_writer does that).
  shard_snapshot snapshot(int64_t next_step) const;
  /// Writes the checkpoint folder `step_dir` (checkpoint_path(dir, next_step)) now, on this
  /// thread: the shard, then the COMPLETE marker. Throws checkpoint_error.
  void save_checkpoint(const std::string& step_dir, int64_t next_step) const;
  /// Loads parameters and optimizer state from the complete checkpoint folder `step_dir`
  /// (shard p0_t0, whole-file SHA-256 checked against the marker); returns the next step to
  /// run. Throws checkpoint_error naming the folder or file on any mismatch or corruption,
  /// leaving the model untouched. The folder's error-feedback parts (feedback_r<R>, one per
  /// DP rank that wrote it) become this worker's memory at the first compressed step, once
  /// its group is known: rank R's own part in a group of the same size (bit for bit), else
  /// the sum of the parts R, R + W, R + 2W, ... of the W ranks it joins now (parts beyond
  /// the old group's size are empty): no error mass is lost, only regrouped.
  int64_t load_checkpoint(const std::string& step_dir);

  /// True when this worker keeps error-feedback memory (comm.compression with
  /// comm.error_feedback, or onebit_adam): then every DP rank writes a part of each
  /// checkpoint (checkpoint_parts).
  bool keeps_feedback() const { return error_feedback_; }
  /// This worker's parts of the checkpoint before `next_step`, taken after the last committed
  /// step in its DP group of W ranks where it is rank R: rank 0 writes the model's shard
  /// (p0_t0) and every rank its feedback_r<R> part (worker and server memory). ALL_FILES gets
  /// every file of the checkpoint (the shard and the W parts); JOB_ID marks this run's.
  std::vector<shard_snapshot> checkpoint_parts(int64_t next_step, uint64_t job_id,
                                               std::vector<std::string>& all_files);

  // ---- rollback points in memory (fault_tolerance.memory_every; trainer_point.cpp) ----
  /// At step STEP's start in the DP group `c` (this worker is c.rank() of c.size(), on host
  /// HOST: any key, equal for the ranks of one host): a rollback point, the training state
  /// before STEP (parameters, optimizer state and steps) and this worker's error memory as
  /// part c.rank() of the group, plus a copy of its predecessor's part on the ring of hosts
  /// (ring_of_hosts of the members' hosts: the copy is on another host wherever the hosts'
  /// sizes allow). One broadcast per rank, each member keeping its predecessor's. Every
  /// other point but KEEP_FROM's (the one the coordinator holds good; -1: none) is dropped,
  /// so at most two are held. Returns the ring (RING[P]: the rank at position P; the copy
  /// of rank RING[P]'s part is at RING[P + 1 mod W]). Throws comm_error.
  std::vector<int32_t> take_point(int64_t step, int64_t keep_from, comm::communicator& c,
                                  uint64_t host);
  /// Drops the points older than STEP (the coordinator's rollback target now).
  void confirm_point(int64_t step);
  /// Whether this worker holds the point of STEP (its own state of then).
  bool holds_point(int64_t step) const;
  /// A rollback to the point of STEP in the group `c`: this worker's own state from it (a
  /// member that holds none takes a donor's afterwards), then the error memory: old part p
  /// (of the point's group of holders.size() ranks) comes from the member at rank
  /// holders[p] of c, its own part or its predecessor's copy. Rank R of W keeps part R bit
  /// for bit when W is the point group's size, else the sum of parts R, R + W, ... (as a
  /// checkpoint's parts are taken). Points other than STEP's are dropped. Returns whether
  /// this worker's own state came from the point. Throws comm_error, cohort::error (a part
  /// this worker was named to hold and does not).
  bool restore_point(int64_t step, const std::vector<int32_t>& holders, comm::communicator& c);
  /// Bytes the rollback points hold now (state and error-memory copies, and the storage of
  /// a dropped one kept for the next).
  int64_t point_bytes() const;

  /// Every float of the training state a joiner needs, in one fixed order: the parameters,
  /// then each optimizer state slot (in optimizer::state() order), each num_params() long.
  /// Views straight into the live tensors (on a GPU, host copies: call state_received()
  /// after writing): writing through them restores the state.
  std::vector<std::pair<float*, std::size_t>> state_buffers();
  /// Optimizer updates applied so far (AdamW's bias correction reads it).
  int64_t optimizer_steps() const { return opt_->steps(); }
  /// After a transfer wrote into what state_buffers() handed out: on a GPU those were host
  /// copies, put back on the device here (a no-op otherwise).
  void state_received();
  /// Restores the optimizer step count (together with state_buffers()).
  void set_optimizer_steps(int64_t steps) {
    opt_->set_steps(steps);
    choose_pipeline();
  }
  /// On a GPU: the DP sum goes where the step reads it (a sum in host memory to the device's
  /// gradients, a fixed-point sum NCCL made on the device to fixed_grads()); once per step, a
  /// no-op otherwise. apply_step calls it; call it before reading the gradients after the sum.
  void take_sum();
  /// The device the step computes on (train.device).
  nn::device& dev() const { return model_->dev(); }

  // ---- sharded optimizer state (train.zero: 1; trainer_zero.cpp, docs/sharding.md) ----
  /// True when train.zero shards the optimizer state over the DP group.
  bool sharded() const { return zero_ != nullptr; }
  /// Before step STEP of a DP group over C (C.rank() of C.size()), this member on host HOST
  /// holding the state before HELD_STEP: the members gather each other's zero_facts, place
  /// themselves on a ring whose neighbours are on different hosts where they can be
  /// (ring_of_hosts: a shard's replica is the next position's) and re-cut the state
  /// for the group (zero_shards.hpp: the moves every member computes alike), sending each
  /// member the ranges it lacks, the parameters to those without all of them, and the
  /// optimizer's step count. Nothing moves when every member already holds its ranges.
  /// Throws comm_error (a peer), cohort::error (a range whose holders are all gone).
  zero_reshard reshard(comm::communicator& c, int64_t step, int64_t held_step, uint64_t host = 0);
  /// The group's ring (zero_shards.hpp, ring_of_hosts, from the members' HOST at the last
  /// re-cut): the communicator rank at position P, and the position of rank R. The
  /// identity before the first re-cut and on one host.
  int rank_at(int p) const {
    return p < static_cast<int>(ring_.size()) ? ring_[static_cast<std::size_t>(p)] : p;
  }
  /// The cut of a group of W whose ring is RING (rank at each position; empty: the identity):
  /// with expert parallelism (parallel.ep > 1 and a model with experts) each expert goes
  /// whole to the position of the rank that computes it (unit_cut; an expert of several EP
  /// groups to one of them in turn), else the even cut.
  shard_cut cut_for(int w, const std::vector<int>& ring) const;
  /// The cut this member holds its ranges in when it is of a group of W, else W's even cut.
  shard_cut cut_of(int w) const {
    return zero_->holds() && zero_->replicas() == w ? zero_->cut()
                                                    : even_cut(model_->num_params(), w);
  }
  int position_of(int r) const {
    for (std::size_t p = 0; p < ring_.size(); ++p)
      if (ring_[p] == r) return static_cast<int>(p);
    return r;
  }
  /// After apply_step in a group: each member's own shard of the parameters to every member
  /// (one broadcast per rank, in place). Throws comm_error; the parameters are then only
  /// partly the step's (whole_params() false) until the next re-cut.
  void gather_params(comm::communicator& c);
  /// False after a gather that failed, until a re-cut made them whole again.
  bool whole_params() const { return whole_params_; }
  /// The parameters are not all of the last applied step (a gather that could not run).
  /// (Sharded parameters: the held ranges are intact, gathers write the same bits; only
  /// the rest is partial.)
  void params_partial() {
    if (!shards_params()) whole_params_ = false;
    values_whole_ = false;
  }
  /// This worker's model state now (with sharded gradients, the gradient buffers' bytes in
  /// RAM as the kernel counts them: what was given back does not count).
  model_state_bytes state_bytes() const;

  // ---- sharded gradients (train.zero: 2; trainer_zero.cpp) ----
  /// True when the DP sum reaches each element's holders only (train.zero >= 2).
  bool shards_grads() const { return zero_ != nullptr && cfg_.train.zero >= 2; }
  /// Who holds which elements in a group of W (ranges_held of every rank): what the bucket
  /// engine sums to (comm::holders_sum). Cached per W.
  std::shared_ptr<const comm::holding> holding_of(int w);
  /// After the engine summed elements [offset, offset + count) to their holders (on its
  /// thread, while backward goes on): the held sums' after-sum stages (bitwise mode: back to
  /// floats), then the pages of the float gradients this member does not hold and of the
  /// bucket's fixed-point sum go back to the kernel.
  void grads_reduced(std::size_t offset, std::size_t count);
  /// In a group, after the DP sum of step STEP: the gradient norm from every member's part
  /// of each parameter (square_sum: exact, so the bits are `cohort train`'s), for
  /// apply_step. Throws comm_error.
  void finish_sharded_sum(comm::communicator& c, int64_t step);
  // ---- sharded parameters (train.zero: 3; trainer_params.cpp) ----
  /// True when each member holds only its shards of the parameters between steps.
  bool shards_params() const { return zero_ != nullptr && cfg_.train.zero >= 3; }
  /// During a step in a group of two or more: the communicator over which forward and
  /// backward gather each block's parameters just before they read them (the group's own
  /// for it, so that the bucket engine's sums on its lanes go on meanwhile); null between
  /// steps. The caller clears it before the communicator goes.
  void set_params_comm(comm::communicator* c);
  /// During a step: the most micro-batches a member of the group computes (every member
  /// takes part in that many passes' gathers; compute_gradients).
  void set_params_passes(int passes) { params_passes_ = passes; }
  // ---- expert parallelism (parallel.ep; trainer_moe.cpp, docs/moe.md) ----
  /// During a step: the communicator of this worker's EP group, over which each MoE layer's
  /// tokens travel to their experts and back; PASSES: the most micro-batches a member of the
  /// group computes (every member takes part in that many passes' exchanges). Null takes it
  /// back (evaluation and inference run every expert here); the caller does so before the
  /// communicator goes.
  void set_experts_comm(comm::communicator* c, int passes);
  /// During a step with sharded parameters: per rank of the DP group, its rank and size in its
  /// EP group (every member, a group of one too, which has no communicator), so that a block's
  /// gather brings each member the dense values and its own experts' only (gather_block);
  /// empty (between steps): every member gathers every value.
  void set_expert_places(std::vector<std::pair<int, int>> places) {
    expert_places_ = std::move(places);
  }
  /// What the MoE layers did since the last call (and resets it): tokens each expert computed
  /// (routed here, summed over the layers), assignments dropped over capacity, and the
  /// exchanges' all-to-all calls, bytes sent and time.
  struct moe_counters {
    std::vector<int64_t> expert_tokens;
    int64_t dropped = 0;
    uint64_t alltoall_calls = 0, alltoall_bytes = 0, alltoall_us = 0;
  };
  moe_counters take_moe_counters();
  /// Whether every parameter's value is here, not only the held ranges' (after a gather,
  /// a load, in a group of one).
  bool params_whole() const { return values_whole_; }
  /// Sharded parameters in a group: the pages of the parameters this member does not hold
  /// go back to the kernel (after what read them whole: a checkpoint, an evaluation).
  void release_params();
  /// Sharded mode's parts of the checkpoint before NEXT_STEP: rank 0 the parameters as shard
  /// p0_t0, every rank its zero_r<R> (its own shard's parameters and optimizer state).
  std::vector<shard_snapshot> zero_checkpoint_parts(int64_t next_step, uint64_t job_id,
                                                    std::vector<std::string>& all_files);

  /// combine_param_digests(param_digests(model())): SHA-256 over the per-parameter SHA-256
  /// digests in name order (so pipeline stages' digests combine to the same value).
  std::string params_sha256() const;
  /// Peak bytes in use of the memory pool so far.
  int64_t peak_pool_bytes() const;

 private:
  /// Forward and backward of micro-batch `i`, added into the step's sum; returns
  /// mean loss * rows. With `ready` set, reports each range the model says is final.
  double run_micro_batch(int64_t step, int i, const nn::grads_ready_fn* ready);

  config cfg_;
  std::unique_ptr<cohort::dataset> data_;
  /// A GPU's memory (null on the CPU, whose tensors come from pool::global()); declared
  /// before everything that holds its tensors.
  std::unique_ptr<nn::pool> device_pool_;
  std::unique_ptr<nn::model> model_;
  /// On a GPU: the gradients where the host works on them (the DP sum over a host
  /// transport, the fixed-point conversion), whether that copy holds a sum the device has
  /// not got yet, and the state copies state_buffers() handed out.
  std::vector<float> host_grads_;
  bool sum_pending_ = false;
  /// comm.backend: nccl on a GPU: the sum runs on the device (the fixed-point one in
  /// fixed_dev_, a device copy of fixed_).
  bool sum_on_device_ = false;
  nn::basic_tensor<int64_t> fixed_dev_;
  std::vector<std::vector<float>> state_host_;
  int micro_batches_ = 1;
  bool bitwise_ = false;
  std::vector<int64_t> fixed_;
  /// The gradient path's choices (read once from the config) and the pipeline of stages
  /// they chose (again whenever 1-bit Adam's phase changes: choose_pipeline).
  grad_mode mode_;
  grad_pipeline pipeline_;
  /// Chooses pipeline_ for mode_ and the optimizer's 1-bit phase now, unless it already is.
  void choose_pipeline();
  /// The buffers the stages work on during step STEP.
  grad_buffers buffers(int64_t step);
  /// On a GPU: elements [offset, offset + count) of the reduction buffer, final for this
  /// step, to where the DP sum reads them (host memory, or the device for NCCL).
  void stage_for_sum(int64_t offset, int64_t count);
  /// This step's before-sum stages ran (range by range, as compute_gradients reported them).
  bool sent_ = false;
  /// The error memory of the compressed sum (comm.compression, 1-bit Adam): the committed
  /// one, and the one the step in flight advances (a copy taken by begin_step).
  struct feedback {
    std::vector<float> worker, server;
    int replicas = 0, rank = -1;  ///< the group it was kept in (0: none yet)
    /// N zeros of each, kept in no group yet.
    void reset(std::size_t n);
    /// What was kept as a chunk owner joins what is kept as a sender (the chunks moved to
    /// others); the total is unchanged.
    void fold_owner_into_sender();
    /// Another rank's part of another group size (W, S: its sender and owner memory, N
    /// each) joins this sender memory: all of it, the chunks being others now.
    void fold_in(const float* w, const float* s);
  };
  bool error_feedback_ = false;
  feedback kept_, next_;
  /// A rollback point (take_point): the state before `step`, this worker's error memory as
  /// part `own.rank` of `own.replicas`, and its predecessor's part.
  struct memory_point {
    int64_t step = -1;
    std::vector<float> values;
    std::vector<std::vector<float>> slots;  ///< optimizer::state() order
    int64_t opt_steps = 0;
    feedback own, pred;
    /// Part P of the point's group, which this worker holds (own or pred); null if neither.
    const feedback* part(int p) const;
  };
  std::vector<memory_point> points_;
  /// A dropped point's storage, which the next take_point writes into (its pages are in
  /// RAM: a fresh point's would fault on every page, most of a point's time).
  memory_point spare_;
  std::vector<float> point_scratch_;  ///< take_point receives the parts it does not keep here
  /// Drops the points GONE says, keeping one's storage as spare_.
  void drop_points(const std::function<bool(const memory_point&)>& gone);
  int replicas_ = 1;  ///< the DP group of the step (wire() sets it; 1 in one process)
  int rank_ = 0;      ///< this worker's rank in it
  int committed_replicas_ = 1, committed_rank_ = 0;  ///< the same for the last applied step
  /// Feedback parts of the checkpoint loaded last, not yet taken (step folder, the size of
  /// the group that wrote them; 0: nothing pending).
  struct pending_feedback {
    std::string step_dir;
    int replicas = 0;
  } pending_;
  /// Turns pending_ into kept_ and next_ for rank RANK of REPLICAS (load_checkpoint says how).
  void restore_feedback(int replicas, int rank);
  std::unique_ptr<nn::optimizer> opt_;
  /// opt_ when train.zero shards it (null otherwise); whether the parameters are all of the
  /// last applied step; and where a re-cut reads ranges nobody holds (a checkpoint loaded
  /// since the last re-cut: every member can read any range; empty with fresh zeros).
  zero_optimizer* zero_ = nullptr;
  /// Sharded gradients: the holders of the last group asked for, and the norm
  /// finish_sharded_sum computed (for step sharded_norm_step_; -1: none).
  std::shared_ptr<const comm::holding> holding_;
  int64_t sharded_norm_step_ = -1;
  int64_t sharded_step_ = 0;  ///< the step compute_gradients last ran (grads_reduced's)
  double sharded_norm_ = 0.0;
  int64_t grads_peak_ = 0;  ///< sample_grads' largest figure
  /// Sharded gradients: the gradient buffers' bytes in RAM now (mincore), kept as the peak
  /// state_bytes() reports; sampled at each micro-batch's end, where it is largest.
  int64_t sample_grads();
  /// Sharded gradients: the element ranges this member holds in its group (none before
  /// its first cut); null without sharded gradients.
  const std::vector<std::pair<std::size_t, std::size_t>>* held_elements();
  bool whole_params_ = true;
  std::vector<int> ring_;  ///< rank_at's table (empty: the identity)
  /// Sharded parameters: the gathers' communicator (set_params_comm), whether every value is
  /// here, and the most the kernel was seen holding of them (sampled after each gather).
  comm::communicator* params_comm_ = nullptr;
  int params_passes_ = 0;
  /// Expert parallelism: the exchange lent to the model's MoE layers (set_experts_comm), its
  /// communicator and passes, and the counters since take_moe_counters.
  nn::moe_exchange experts_;
  comm::communicator* experts_comm_ = nullptr;
  int experts_passes_ = 0;
  std::vector<std::pair<int, int>> expert_places_;  ///< [DP rank]: (EP rank, EP size)
  moe_counters moe_;
  /// Adds the last forward's routing (tokens per expert, drops) to moe_.
  void count_moe();
  /// train.zero_prefetch: the thread that gathers the blocks in the order one pass needs
  /// them (params_order_, recorded from model::params_pass), one ahead of the compute
  /// thread; params_at_ is the compute thread's place in that order.
  std::unique_ptr<block_prefetch> prefetch_;
  std::vector<std::size_t> params_order_;
  std::size_t params_at_ = 0;
  /// Elements [BEGIN, END) of the parameters from their shards' owners over C, in place (one
  /// broadcast per owner whose shard the range crosses); gather_block: block BLOCK's.
  void gather_range(comm::communicator& c, int64_t begin, int64_t end);
  void gather_block(comm::communicator& c, std::size_t block);
  /// Expert parallelism: block BLOCK's values that each member reads (its dense values and
  /// the experts its EP rank computes; block_needs), each piece a member lacks from its
  /// shard's owner, in one all-to-all. False: the block has no experts, or no EP group is lent.
  bool gather_block_experts(comm::communicator& c, std::size_t block);
  bool values_whole_ = true;
  int64_t params_peak_ = 0;
  /// The model's params hook under train.zero: 3: gathers block BLOCK's values from their
  /// owners on need, gives back what this member does not hold on done.
  void on_params(std::size_t block, bool need);
  /// The pages of elements [BEGIN, END) of the parameters outside this member's held ranges
  /// go back to the kernel.
  void release_params_in(int64_t begin, int64_t end);
  bool zero_fresh_ = true;  ///< no step applied and nothing loaded: the state is zeros
  std::string zero_source_;
  /// The first re-cut in one process (cohort train, a group of one): hold everything.
  void zero_hold_alone();
  /// Fills the held ranges from zero_source_ (or leaves the zeros).
  void zero_fill_from_source();
  /// Loads a checkpoint in sharded mode: the parameters now, the state at the next re-cut.
  int64_t zero_load(const std::string& step_dir);
  cohort::batch batch_;
};

}  // namespace cohort::train
