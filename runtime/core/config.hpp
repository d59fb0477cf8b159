// The run configuration: one YAML file plus --set overrides, checked against a schema.
// Owns parsing, validation (every error with FILE:LINE:COL, key path, fix), defaults and
// printing the resolved config. The schema is config.cpp, the loader config_loader.cpp and
// config_values.cpp; the rules across keys, which the layers that use the keys own, all
// live in config_rules.cpp. Drives nothing itself.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/core/comm_choices.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/faults.hpp"

namespace cohort {

struct cluster_config {
  int workers = 1;  ///< worker processes `cohort launch` starts; must equal dp*pp*tp
  /// none | cores | numa: each local worker on its own cores / NUMA node (proc::bind_self)
  std::string bind = "none";
};

struct parallel_config {
  int dp = 0;  ///< data-parallel replicas; 0 in YAML means "resolve to workers/(pp*tp)"
  int pp = 1;  ///< pipeline stages
  int tp = 1;  ///< tensor-parallel ranks
  /// Expert parallelism: the DP group's workers in groups of ep share out each MoE layer's
  /// experts, tokens travelling to them and back (runtime/nn/moe.hpp, docs/moe.md)
  int ep = 1;
  /// gpipe | 1f1b: the micro-batch schedule of pipeline stages (train/pipeline_schedule.hpp)
  std::string schedule = "1f1b";
  /// Keep only stage-boundary activations and recompute the rest in backward
  bool activation_checkpointing = false;
  /// Blocks per pipeline stage (pp counts summing to model.n_layer); empty: balanced
  std::vector<int> stage_layers;
};

struct model_config {
  std::string kind = "mlp";           ///< mlp | gpt
  std::vector<int> hidden{256, 128};  ///< mlp hidden sizes
  int n_layer = 4;                    ///< gpt
  int n_head = 4;                     ///< gpt
  int d_model = 128;                  ///< gpt
  int context = 128;                  ///< gpt context length (T)
  /// gpt: mixture of experts (runtime/nn/moe.hpp); 0 experts: dense.
  int moe_experts = 0;
  int moe_top_k = 1;
  float moe_capacity_factor = 1.25f;
  int moe_every = 1;
  float moe_aux_loss = 0.01f;
  int moe_hidden = 0;  ///< an expert's hidden width; 0: the dense MLP's, 4 * d_model
};

struct data_config {
  std::string dataset = "fashion_mnist";  ///< fashion_mnist | kjv (resolved from model.kind)
  std::string dir = "/usr/share/datasets/fashion-mnist";  ///< Fashion-MNIST IDX files
  std::string cache_dir = "~/.cache/cohort";              ///< where the KJV text is cached
};

struct train_config {
  int64_t steps = 1000;
  int global_batch = 128;
  int micro_batch = 128;
  float lr = 1e-3f;
  uint64_t seed = 1;
  std::string determinism = "fast";  ///< fast | bitwise
  std::string balance = "equal";     ///< equal | measured (runtime/step/balance.hpp)
  std::string optimizer = "adamw";   ///< adamw | sgd | onebit_adam
  float weight_decay = 0.0f;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float momentum = 0.9f;   ///< sgd only
  float grad_clip = 0.0f;  ///< max global grad norm; 0 disables
  int64_t warmup_steps = 0;
  std::string lr_schedule = "constant";  ///< constant | cosine
  float min_lr = 0.0f;                   ///< cosine floor
  int64_t eval_every = 0;                ///< 0: evaluate only at the end
  int64_t eval_tokens = 0;               ///< language models: held-out tokens evaluated; 0: all
  int64_t log_every = 50;
  int threads = 1;  ///< OpenBLAS / compute threads per process
  /// 0: every DP worker holds the whole optimizer state; 1: each holds its own shard and a
  /// replica of its neighbour's (ZeRO stage 1; runtime/train/zero_shards.hpp); 2: the
  /// gradients are summed to their shard's holders only (runtime/comm/holders_sum.hpp).
  int zero = 0;
  /// train.zero: 2: give the gradient pages outside the held ranges back to the kernel as
  /// each bucket is summed (false: keep them, trading the memory for the page faults).
  bool zero_release = true;
  /// zero 3: gather the next block on a thread of its own while the current one computes.
  bool zero_prefetch = true;
  /// Where the step computes: cpu | cuda | cuda:N | auto (runtime/nn/device.hpp).
  std::string device = "cpu";
  std::string precision = "fp32";  ///< fp32 | bf16: the precision of matrix products
  /// onebit_adam: optimizer steps of plain AdamW (uncompressed sums) before the variance
  /// freezes and the momentum travels as signs (train.onebit.freeze_step).
  int64_t onebit_freeze_step = 100;
  /// onebit_adam: glob patterns (fnmatch) of parameter names kept at full precision.
  std::vector<std::string> onebit_exclude{"*.bias", "*ln_*", "*.wte.*", "*.wpe.*"};
};

struct comm_config {
  /// auto | gloo | nccl (nccl refused: training is on the CPU)
  comm_backend backend = comm_backend::automatic;
  float bucket_mb = 4.0f;  ///< gradient bucket size in MiB, in (0, 1024]
  /// Communicators per DP group reducing buckets at once (1..8); shared memory alone: 1.
  int lanes = 2;
  /// Where each worker's data plane listens and what it advertises: "auto" (the local
  /// address that reaches the coordinator), an interface name, or an address of the host.
  std::string interface = "auto";
  /// CPU collectives of each group: auto (shared memory when every rank of the group is on
  /// one host, else Gloo over TCP) | gloo | shm.
  comm_transport transport = comm_transport::automatic;
  /// With transport auto and several hosts: auto | flat | hierarchical (comm::hier_comm).
  comm_hierarchy hierarchy = comm_hierarchy::automatic;
  /// What makes workers one host (shared memory, hierarchy); "auto": detected.
  std::string host_id = "auto";
  /// With job keys, how a pipeline's p2p channels admit senders: authenticate (once per
  /// connection, frames in clear) | encrypt (CurveZMQ on every frame). comm::p2p_security.
  std::string p2p_security = "authenticate";
  /// How the DP gradient sum travels: none | bf16 | fp16 | fp8 (comm::wire_format; summed
  /// in fp32 by each chunk's owner).
  comm_compression compression = comm_compression::none;
  /// Carry what compression loses into the next step's sum (comm::error_memory).
  bool error_feedback = false;
};

struct fault_tolerance_config {
  int heartbeat_ms = 100;
  int timeout_ms = 500;
  /// Registrations that arrive within this long of each other enter one generation (the
  /// window closes after this long without one, or 30x this long after it opened); 0: a
  /// generation per registration.
  int join_window_ms = 100;
  /// Steps a data-parallel job runs and commits among its workers (the vote travels with
  /// the gradients) before the coordinator opens the next; 0: it commits every step.
  int commit_window = 16;
  int64_t checkpoint_every = 0;  ///< 0: only the final checkpoint
  /// Every this many steps each DP member keeps a rollback point in memory: its state and
  /// error memory, and its predecessor's error memory (bitwise jobs with error feedback);
  /// 0: a lost member's memory comes back only from a checkpoint.
  int64_t memory_every = 0;
  std::string checkpoint_dir = "checkpoints";
  int keep = 3;
  /// SIGTERM: "drain" (a worker leaves, the coordinator stops) or "checkpoint" (the run
  /// stops at the next step boundary with a checkpoint: preemption, docs/slurm.md).
  std::string on_sigterm = "drain";
};

struct elastic_config {
  int min_workers = 0;  ///< below this, training pauses for joiners (0 in YAML: cluster.workers)
  int max_workers = 0;  ///< joiners above this wait as spares (0 in YAML: cluster.workers)
  bool respawn = true;  ///< the launcher restarts a local worker that dies
  /// Workers the launcher starts beyond cluster.workers: they wait as spares with the job
  /// loaded and take a dead member's seat in the departure's own roster.
  int spares = 0;
  int64_t pause_timeout_ms = 60000;  ///< how long a pause below min_workers lasts before failing
  /// > 1: a DP worker this many times slower than the others' median for 3 plans in a row
  /// is drained (runtime/step/balance.hpp); 0: never.
  float straggler_factor = 0;
};

struct control_config {
  std::string bind = "tcp://127.0.0.1:0";  ///< coordinator ROUTER endpoint
  int64_t max_message_bytes = 64 << 20;    ///< larger frames are counted and dropped
};

/// Coordinator standbys (runtime/ha): the coordinators elect a leader through etcd; when it
/// dies, a standby takes over the job and the workers reattach to it.
struct ha_config {
  /// Standby coordinators beside the leader; 0: one coordinator and no etcd.
  int standbys = 0;
  /// ha.etcd is the word `local` (`cohort launch` starts one etcd for the run: etcd_local)
  /// or a list of etcd client URLs "http://HOST:PORT" (etcd_endpoints, etcd_local false).
  bool etcd_local = true;
  std::vector<std::string> etcd_endpoints;  ///< empty when etcd_local
  int lease_ttl_s = 1;  ///< the leader's etcd lease: a dead leader's runs out after this long
  /// Raft timing of the etcd that `ha.etcd: local` starts; election >= 5 x heartbeat
  /// (rules::etcd_election_fits_heartbeat: etcd refuses to start otherwise).
  int etcd_heartbeat_ms = 10;
  int etcd_election_ms = 100;
  /// How long a worker that lost the leader looks for the next one before it exits 1.
  int reattach_ms = 30000;
};

/// A validated, fully resolved configuration.
struct config {
  std::string source;  ///< file it came from ("<set>" parts are reported as --set)
  cluster_config cluster;
  parallel_config parallel;
  model_config model;
  data_config data;
  train_config train;
  comm_config comm;
  fault_tolerance_config fault_tolerance;
  elastic_config elastic;
  control_config control;
  ha_config ha;
  /// The top-level `faults:` list, parsed (docs/faults.md); dumped in canonical text.
  std::vector<faults::fault_spec> faults;
};

/// One problem found in a config: where, which key, what is wrong and how to fix it.
struct config_issue {
  std::string file;     ///< config path, or "--set" for an override
  int line = 0;         ///< 1-based; 0 when unknown
  int col = 0;          ///< 1-based; 0 when unknown
  std::string key;      ///< dotted key path, e.g. "train.micro_batch"
  std::string message;  ///< "what is wrong (how to fix)"
  /// "FILE:LINE:COL: key.path: message"
  std::string format() const;
};

/// Thrown by load_config when any issue was found; carries all of them.
class config_error : public usage_error {
 public:
  explicit config_error(std::vector<config_issue> issues);
  const std::vector<config_issue>& issues() const { return issues_; }

 private:
  std::vector<config_issue> issues_;
};

/// Loads FILE, applies each "dotted.key=value" override (value parsed as YAML), checks
/// everything against the schema and returns the resolved config. Throws config_error
/// with every issue found (not just the first).
config load_config(const std::string& path, const std::vector<std::string>& overrides = {});

/// Same, from YAML text (name is used in messages). For tests and embedded configs.
config load_config_text(const std::string& text, const std::string& name,
                        const std::vector<std::string>& overrides = {});

/// The resolved config as YAML, every default filled in; load_config_text of the output
/// gives back an equal config.
std::string dump_config(const config& c);

/// SHA-256 hex of dump_config(c): identifies a run's config in checkpoints.
std::string config_hash(const config& c);

/// True when each DP worker keeps error-feedback memory: train.optimizer onebit_adam (always),
/// or comm.compression other than none with comm.error_feedback (docs/compression.md).
bool keeps_error_feedback(const config& c);

/// Commented YAML with every key at its default, its allowed values and its meaning,
/// generated from the schema; configs/reference.yaml is this text (a test keeps it so).
std::string reference_config_yaml();

/// The candidate closest to `word` (edit distance with adjacent swaps, or a shared prefix
/// of 3+ letters), or "" when none is close enough to be a typo. Every did-you-mean of the
/// config and the fault specs uses it, so suggestions behave the same everywhere.
std::string closest_name(const std::string& word, const std::vector<std::string>& candidates);

/// YAML 1.2 core-schema float text, [-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?:
/// no inf, nan or hex (which strtod would accept). The config's and the fault specs' rule
/// for what a number looks like.
bool looks_real(const std::string& s);

/// Markdown table of every key (type, default, allowed values, meaning), generated from
/// the schema; docs/config.md embeds it (a test keeps it so).
std::string config_keys_markdown();

}  // namespace cohort
