// The rules across config keys, checked for a config file. Each group below belongs to the
// layer that needs the rule, named in its heading; checking it here, with the position of
// the key, beats failing minutes into a launch. A rule that the owning layer also guards at
// its own entry point (a config built in code never passes through here) is one predicate
// in runtime/core/rules.hpp that both call. The schema's one-key checks (type, range,
// choices) are config.cpp's.
#include "runtime/core/config_rules.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "runtime/core/config_schema.hpp"
#include "runtime/core/rules.hpp"

namespace cohort::config_rules {
namespace {

std::string nearby_divisors(int n, int d) {
  int below = 1, above = n;
  for (int i = std::min(d, n); i >= 1; --i) {
    if (n % i == 0) {
      below = i;
      break;
    }
  }
  for (int i = d; i <= n; ++i) {
    if (n % i == 0) {
      above = i;
      break;
    }
  }
  return below == above || above <= d ? std::to_string(below)
                                      : std::to_string(below) + " or " + std::to_string(above);
}

class rules {
 public:
  rules(config& c, loaded_keys& keys) : c_(c), keys_(keys) {}

  // Issues at one position (a YAML alias, one --set) come out in the order they were
  // found, so this order is part of the messages: keep it.
  void run() {
    check_split();
    check_moe();
    check_stage_layers();
    resolve_grid();
    resolve_dataset();
    check_heads();
    check_batch();
    check_schedule();
    check_backend();
    check_liveness();
    check_elastic();
    check_faults();
    check_transport();
    check_compression();
    check_zero();
    check_memory_points();
    check_control();
    check_ha();
  }

 private:
  bool fine(std::initializer_list<const char*> paths) const { return keys_.fine(paths); }
  bool present(const std::string& path) const { return keys_.present(path); }
  void complain(std::initializer_list<const char*> paths, const std::string& msg) {
    keys_.complain(paths, msg);
  }

  // ---- parallel: the dp x pp x tp grid and how it cuts the model (runtime/nn/gpt_stage,
  // runtime/train/stage_trainer; the launcher and the membership count the workers) ----

  // ---- model.moe: a mixture of experts in a whole GPT on the CPU (runtime/nn/moe.hpp) ----
  void check_moe() {
    config& c = c_;
    if (c.model.moe_experts == 0) {
      if (fine({"parallel.ep", "model.moe.experts"}) && c.parallel.ep > 1)
        complain({"parallel.ep", "model.moe.experts"},
                 "parallel.ep shares out a mixture of experts' experts, but the model has none "
                 "(set model.moe.experts, or parallel.ep: 1)");
      return;
    }
    if (fine({"model.moe.experts", "model.kind"}) && c.model.kind != "gpt")
      complain({"model.moe.experts", "model.kind"},
               "a mixture of experts replaces a GPT block's MLP, but model.kind is " +
                   c.model.kind + " (set model.kind: gpt, or model.moe.experts: 0)");
    if (fine({"model.moe.experts", "model.moe.top_k"}) && c.model.moe_top_k > c.model.moe_experts)
      complain({"model.moe.experts", "model.moe.top_k"},
               "model.moe.top_k = " + std::to_string(c.model.moe_top_k) + " experts a token, of " +
                   std::to_string(c.model.moe_experts) + " (top_k must be at most experts)");
    if (fine({"model.moe.experts", "parallel.pp", "parallel.tp"}) &&
        (c.parallel.pp > 1 || c.parallel.tp > 1))
      complain({"model.moe.experts", "parallel.pp", "parallel.tp"},
               "model.moe with pipeline or tensor parallelism is not built yet (set parallel.pp: "
               "1 and parallel.tp: 1; data parallelism replicates the experts)");
    if (fine({"parallel.ep", "model.moe.experts"}) && c.parallel.ep > c.model.moe_experts)
      complain({"parallel.ep", "model.moe.experts"},
               "parallel.ep = " + std::to_string(c.parallel.ep) + " shares out " +
                   std::to_string(c.model.moe_experts) +
                   " experts: a rank would compute none (set parallel.ep at most model.moe.experts)");
    if (fine({"model.moe.experts", "train.device"}) && c.train.device != "cpu" &&
        c.train.device != "auto")
      complain({"model.moe.experts", "train.device"},
               "model.moe runs on the CPU only for now (train.device: cpu)");
  }

  void check_split() {
    config& c = c_;
    // Pipeline and tensor parallelism split a GPT (runtime/nn/gpt_stage.hpp); say what
    // does not fit here instead of failing later in a worker.
    const bool split = c.parallel.pp > 1 || c.parallel.tp > 1;
    if (split && fine({"parallel.pp", "parallel.tp", "model.kind"}) &&
        !cohort::rules::model_splits(c.model.kind)) {
      complain({"parallel.pp", "parallel.tp", "model.kind"},
               "pipeline / tensor parallelism (pp = " + std::to_string(c.parallel.pp) + ", tp = " +
                   std::to_string(c.parallel.tp) + ") splits a GPT, but model.kind is " +
                   c.model.kind + " (set parallel.pp: 1 and parallel.tp: 1, or model.kind: gpt)");
    } else if (split && cohort::rules::model_splits(c.model.kind)) {
      if (fine({"parallel.pp", "model.n_layer"}) &&
          !cohort::rules::stages_fit_blocks(c.parallel.pp, c.model.n_layer))
        complain({"parallel.pp", "model.n_layer"},
                 "pp = " + std::to_string(c.parallel.pp) +
                     " stages need at least one block each, "
                     "but model.n_layer = " +
                     std::to_string(c.model.n_layer) +
                     " (use pp <= " + std::to_string(c.model.n_layer) + ")");
      if (fine({"parallel.tp", "model.n_head"}) &&
          !cohort::rules::tp_divides_heads(c.model.n_head, c.parallel.tp))
        complain({"parallel.tp", "model.n_head"},
                 "tp = " + std::to_string(c.parallel.tp) + " ranks split the " +
                     std::to_string(c.model.n_head) +
                     " attention heads evenly, so tp must divide model.n_head");
    }
  }

  void check_stage_layers() {
    const config& c = c_;
    if (fine({"parallel.stage_layers", "parallel.pp", "model.n_layer"}) &&
        !c.parallel.stage_layers.empty()) {
      int sum = 0;
      for (int x : c.parallel.stage_layers) sum += x;
      if (static_cast<int>(c.parallel.stage_layers.size()) != c.parallel.pp ||
          sum != c.model.n_layer)
        complain({"parallel.stage_layers"},
                 "stage_layers must list pp = " + std::to_string(c.parallel.pp) +
                     " block counts summing to model.n_layer = " + std::to_string(c.model.n_layer) +
                     " (got " + std::to_string(c.parallel.stage_layers.size()) +
                     " counts summing to " + std::to_string(sum) +
                     "; or remove it for a balanced cut)");
    }
  }

  // dp = 0 resolves to cluster.workers / (pp * tp); a given dp must make the product.
  void resolve_grid() {
    config& c = c_;
    // grid_ok: dp is resolved and dp * pp * tp == workers, so dp can be checked against
    // the batch; otherwise that check would only repeat the grid problem.
    bool grid_ok = fine({"cluster.workers", "parallel.dp", "parallel.pp", "parallel.tp"});
    if (grid_ok) {
      const int64_t pt = int64_t{c.parallel.pp} * c.parallel.tp;
      const int w = c.cluster.workers;
      if (c.parallel.dp == 0) {
        if (w % pt != 0) {
          grid_ok = false;
          complain({"cluster.workers", "parallel.pp", "parallel.tp"},
                   "cluster.workers = " + std::to_string(w) +
                       " is not divisible by pp * tp = " + std::to_string(pt) +
                       " (use a multiple of " + std::to_string(pt) + " workers)");
        } else {
          c.parallel.dp = static_cast<int>(w / pt);
        }
      } else if (c.parallel.dp * pt != w) {
        const std::string product =
            std::to_string(c.parallel.dp) + " * " + std::to_string(c.parallel.pp) + " * " +
            std::to_string(c.parallel.tp) + " = " + std::to_string(c.parallel.dp * pt);
        std::string fix = "set cluster.workers: " + std::to_string(c.parallel.dp * pt);
        if (w % pt == 0) fix = "set parallel.dp: " + std::to_string(w / pt) + ", or " + fix;
        grid_ok = false;
        complain({"parallel.dp", "cluster.workers"},
                 "dp * pp * tp = " + product +
                     " does not match cluster.workers = " + std::to_string(w) + " (" + fix + ")");
      }
    }
    grid_ok_ = grid_ok;
  }

  // ---- data: the data set a model trains on (runtime/data/dataset) ----

  void resolve_dataset() {
    config& c = c_;
    // Data set follows the model unless given, and must match it when given.
    if (fine({"model.kind", "data.dataset"})) {
      const std::string wanted = c.model.kind == "gpt" ? "kjv" : "fashion_mnist";
      if (!present("data.dataset")) {
        c.data.dataset = wanted;
      } else if (c.data.dataset != wanted) {
        complain({"data.dataset"}, "model.kind " + c.model.kind + " trains on " + wanted +
                                       ", not " + c.data.dataset + " (set data.dataset: " + wanted +
                                       ", or delete it to follow model.kind)");
      }
    }
  }

  // ---- model: the shape of a GPT (runtime/nn/gpt) ----

  void check_heads() {
    const config& c = c_;
    if (c.model.kind == "gpt" && fine({"model.kind", "model.d_model", "model.n_head"}) &&
        !cohort::rules::heads_divide_width(c.model.d_model, c.model.n_head)) {
      complain({"model.n_head", "model.d_model"},
               "d_model = " + std::to_string(c.model.d_model) +
                   " is not divisible by n_head = " + std::to_string(c.model.n_head) +
                   " (use n_head " + nearby_divisors(c.model.d_model, c.model.n_head) +
                   ", or a d_model that " + std::to_string(c.model.n_head) + " divides)");
    }
  }

  // ---- train: batches per replica and the learning-rate schedule (runtime/train) ----

  void check_batch() {
    const config& c = c_;
    if (fine({"train.global_batch", "train.micro_batch"})) {
      const int g = c.train.global_batch, m = c.train.micro_batch;
      if (g % m != 0) {
        complain({"train.micro_batch", "train.global_batch"},
                 "global_batch = " + std::to_string(g) + " is not divisible by micro_batch = " +
                     std::to_string(m) + " (use micro_batch " + nearby_divisors(g, m) + ")");
      } else if (grid_ok_ && c.parallel.dp > 0 && g / m < c.parallel.dp) {
        // Every replica computes whole micro-batches; fewer than dp leaves replicas idle.
        complain({"train.micro_batch", "train.global_batch", "parallel.dp"},
                 "global_batch / micro_batch = " + std::to_string(g / m) +
                     " micro-batches per step cannot feed dp = " + std::to_string(c.parallel.dp) +
                     " replicas (use micro_batch <= " +
                     std::to_string(std::max(1, g / c.parallel.dp)) + ")");
      }
    }
  }

  void check_schedule() {
    const config& c = c_;
    if (fine({"train.steps", "train.warmup_steps"}) && c.train.warmup_steps > c.train.steps) {
      complain({"train.warmup_steps", "train.steps"},
               "warmup_steps = " + std::to_string(c.train.warmup_steps) +
                   " exceeds steps = " + std::to_string(c.train.steps) + " (use at most " +
                   std::to_string(c.train.steps) + " warm-up steps)");
    }
    if (fine({"train.lr", "train.min_lr"}) && c.train.min_lr > c.train.lr) {
      complain({"train.min_lr", "train.lr"},
               "min_lr = " + config_schema::format_float(c.train.min_lr) +
                   " is above lr = " + config_schema::format_float(c.train.lr) +
                   " (the cosine floor must be at most the peak lr)");
    }
  }

  // ---- comm: collectives and the data plane (runtime/comm/factory, runtime/net/host_address) ----

  void check_backend() {
    const config& c = c_;
    const std::string& d = c.train.device;
    if (fine({"train.device"}) && !cohort::rules::device_spec_valid(d))
      complain({"train.device"}, "'" + d +
                                     "' is not one of: cpu, cuda, cuda:N (N a device number), "
                                     "auto");
    const bool gpu = cohort::rules::device_spec_names_gpu(d);
    // NCCL sums GPU memory only: say so here rather than at the first communicator build.
    if (fine({"comm.backend", "train.device"}) && c.comm.backend == comm_backend::nccl && !gpu &&
        d != "auto")
      complain({"comm.backend", "train.device"},
               "nccl sums gradients between GPUs, but train.device is " + d +
                   " (set train.device: cuda, or comm.backend: auto)");
    // NCCL sums the gradients where they are, on the device; the compressed sums and 1-bit
    // Adam's read and write them on the host, between the collectives.
    if (fine({"comm.backend", "comm.compression"}) && c.comm.backend == comm_backend::nccl &&
        c.comm.compression != comm_compression::none)
      complain({"comm.backend", "comm.compression"},
               "comm.compression runs on host transports; use comm.backend: auto with "
               "compression (or comm.compression: none with nccl)");
    if (fine({"comm.backend", "train.optimizer"}) && c.comm.backend == comm_backend::nccl &&
        c.train.optimizer == "onebit_adam")
      complain({"comm.backend", "train.optimizer"},
               "onebit_adam compresses its sums on host transports; use comm.backend: auto with "
               "onebit_adam (or train.optimizer: adamw with nccl)");
  }

  void check_compression() {
    const config& c = c_;
    if (fine({"comm.compression", "parallel.pp", "parallel.tp"}) &&
        c.comm.compression != comm_compression::none && (c.parallel.pp > 1 || c.parallel.tp > 1))
      complain({"comm.compression", "parallel.pp", "parallel.tp"},
               "compression of the gradient sum is built for whole-model jobs; this one has pp = " +
                   std::to_string(c.parallel.pp) + " x tp = " + std::to_string(c.parallel.tp) +
                   " (set comm.compression: none, or parallel.pp and parallel.tp to 1)");
    if (fine({"train.optimizer", "parallel.pp", "parallel.tp"}) &&
        c.train.optimizer == "onebit_adam" && (c.parallel.pp > 1 || c.parallel.tp > 1))
      complain({"train.optimizer", "parallel.pp", "parallel.tp"},
               "onebit_adam is built for whole-model jobs; this one has pp = " +
                   std::to_string(c.parallel.pp) + " x tp = " + std::to_string(c.parallel.tp) +
                   " (use adamw, or parallel.pp and parallel.tp = 1)");
    if (fine({"train.optimizer", "comm.compression"}) && c.train.optimizer == "onebit_adam" &&
        c.comm.compression != comm_compression::none)
      complain({"train.optimizer", "comm.compression"},
               "onebit_adam compresses its own sums (signs after train.onebit.freeze_step, "
               "floats before); set comm.compression: none");
    if (fine({"comm.error_feedback", "comm.compression"}) && c.comm.error_feedback &&
        c.comm.compression == comm_compression::none)
      complain({"comm.error_feedback", "comm.compression"},
               "error feedback keeps what compression loses, and comm.compression is none "
               "(choose bf16, fp16 or fp8, or remove error_feedback)");
  }

  // Rollback points in memory (trainer::take_point): only where a rollback keeps bits.
  void check_memory_points() {
    const config& c = c_;
    if (c.fault_tolerance.memory_every == 0) return;
    if (fine({"fault_tolerance.memory_every", "train.optimizer", "comm.error_feedback"}) &&
        !keeps_error_feedback(c))
      complain({"fault_tolerance.memory_every", "train.optimizer", "comm.error_feedback"},
               "rollback points keep error-feedback memory, and this job keeps none (use "
               "train.optimizer: onebit_adam, or comm.compression with comm.error_feedback; "
               "or set memory_every: 0)");
    if (fine({"fault_tolerance.memory_every", "train.determinism"}) &&
        c.train.determinism != "bitwise")
      complain({"fault_tolerance.memory_every", "train.determinism"},
               "rollback points serve bitwise jobs: in fast mode a lost worker's memory is "
               "dropped and training goes on (set train.determinism: bitwise, or memory_every: "
               "0)");
  }

  // Sharded optimizer state (runtime/train/zero_shards.hpp): whole-model DP on the host.
  void check_zero() {
    const config& c = c_;
    if (c.train.zero == 0) return;
    if (fine({"train.zero", "parallel.pp", "parallel.tp"}) &&
        (c.parallel.pp > 1 || c.parallel.tp > 1))
      complain({"train.zero", "parallel.pp", "parallel.tp"},
               "train.zero shards a whole model's optimizer state over its data-parallel group; "
               "this job has pp = " +
                   std::to_string(c.parallel.pp) + " x tp = " + std::to_string(c.parallel.tp) +
                   " (set train.zero: 0, or parallel.pp and parallel.tp to 1)");
    if (fine({"train.zero", "train.optimizer"}) && c.train.optimizer == "onebit_adam")
      complain({"train.zero", "train.optimizer"},
               "train.zero shards the state of adamw or sgd; onebit_adam's compressed momentum "
               "needs all of it on every worker (use train.optimizer: adamw, or train.zero: 0)");
    if (fine({"train.zero", "comm.error_feedback"}) && c.comm.error_feedback)
      complain({"train.zero", "comm.error_feedback"},
               "train.zero does not keep error-feedback memory in this version (remove "
               "comm.error_feedback, or set train.zero: 0)");
    if (fine({"train.zero", "comm.compression"}) && c.train.zero >= 2 &&
        c.comm.compression != comm_compression::none)
      complain({"train.zero", "comm.compression"},
               "train.zero: 2 and 3 sum each gradient shard to its holders as plain numbers; "
               "comm.compression needs every rank to take the whole sum (set comm.compression: "
               "none, or train.zero: 1)");
    if (fine({"train.zero", "train.device"}) && c.train.device != "cpu")
      complain({"train.zero", "train.device"},
               "train.zero runs on the CPU in this version (set train.device: cpu, or "
               "train.zero: 0)");
  }

  void check_transport() {
    const config& c = c_;
    if (fine({"comm.hierarchy", "comm.transport"}) &&
        !cohort::rules::hierarchy_fits_transport(c.comm.hierarchy, c.comm.transport))
      complain({"comm.hierarchy", "comm.transport"},
               "hierarchical combines shared memory inside a host with Gloo between hosts, so "
               "it needs comm.transport: auto (it is " +
                   std::string(to_string(c.comm.transport)) +
                   "); set transport to auto or hierarchy to flat");
    if (fine({"comm.host_id"}) &&
        (c.comm.host_id.size() > 200 || c.comm.host_id.find_first_of("\r\n") != std::string::npos))
      complain({"comm.host_id"}, "must be one line of at most 200 characters (or auto: detected)");
    if (fine({"comm.interface"}) && c.comm.interface.find_first_of(" \t\r\n/") != std::string::npos)
      complain({"comm.interface"},
               "'" + c.comm.interface +
                   "' is not an interface name or an address (write auto, a name such as "
                   "eth0, or an address such as 10.0.0.2)");
  }

  // ---- fault_tolerance: failure detection (runtime/net/membership) ----

  void check_liveness() {
    const config& c = c_;
    if (fine({"fault_tolerance.heartbeat_ms", "fault_tolerance.timeout_ms"}) &&
        !cohort::rules::timeout_outlasts_heartbeat(c.fault_tolerance.heartbeat_ms,
                                                   c.fault_tolerance.timeout_ms)) {
      complain({"fault_tolerance.timeout_ms", "fault_tolerance.heartbeat_ms"},
               "timeout_ms = " + std::to_string(c.fault_tolerance.timeout_ms) +
                   " must exceed heartbeat_ms = " + std::to_string(c.fault_tolerance.heartbeat_ms) +
                   " (a worker would be declared dead between two heartbeats; use several "
                   "heartbeats, e.g. " +
                   std::to_string(5 * int64_t{c.fault_tolerance.heartbeat_ms}) + ")");
    }
  }

  // ---- elastic: membership bounds (runtime/net/membership, runtime/step/training_job) ----

  // Elastic bounds: 0 resolves to cluster.workers; the bounds must hold the starting
  // size, and at the largest size every replica still needs a micro-batch.
  void check_elastic() {
    config& c = c_;
    elastic_ok_ = fine({"cluster.workers", "elastic.min_workers", "elastic.max_workers"});
    if (!elastic_ok_) return;
    const int w = c.cluster.workers;
    const std::string ws = std::to_string(w);
    if (c.elastic.min_workers > w) {
      elastic_ok_ = false;
      complain({"elastic.min_workers"},
               "min_workers = " + std::to_string(c.elastic.min_workers) +
                   " exceeds cluster.workers = " + ws +
                   " (the run would start below its minimum; use at most " + ws +
                   ", or 0 for cluster.workers)");
    }
    if (c.elastic.max_workers != 0 && c.elastic.max_workers < w) {
      elastic_ok_ = false;
      complain({"elastic.max_workers"},
               "max_workers = " + std::to_string(c.elastic.max_workers) +
                   " is below cluster.workers = " + ws + " (the launcher starts " + ws +
                   " workers; use at least " + ws + ", or 0 for cluster.workers)");
    }
    if (!elastic_ok_) return;
    if (c.elastic.min_workers == 0) c.elastic.min_workers = w;
    if (c.elastic.max_workers == 0) c.elastic.max_workers = w;
    if (fine({"elastic.straggler_factor"}) && c.elastic.straggler_factor > 0 &&
        c.elastic.straggler_factor <= 1)
      complain({"elastic.straggler_factor"},
               "straggler_factor = " + std::to_string(c.elastic.straggler_factor) +
                   " would call a worker as fast as the others a straggler (use 0 for off, or a "
                   "factor above 1, such as 2)");
    if (fine({"elastic.spares"}) && c.elastic.spares > 0 && c.elastic.max_workers > w)
      complain({"elastic.spares"}, "spares = " + std::to_string(c.elastic.spares) +
                                       " would join as members while elastic.max_workers = " +
                                       std::to_string(c.elastic.max_workers) +
                                       " leaves room above cluster.workers = " + ws +
                                       " (a spare waits only in a full world: set max_workers to " +
                                       ws + ", or spares to 0)");
    if (fine({"parallel.pp", "parallel.tp"})) {
      // With pp * tp > 1 a DP replica is pp * tp workers: it trains only when whole.
      const int pt = c.parallel.pp * c.parallel.tp;
      for (auto [key, v] :
           {std::pair<const char*, int>{"elastic.min_workers", c.elastic.min_workers},
            {"elastic.max_workers", c.elastic.max_workers}}) {
        if (pt > 1 && c.cluster.workers % pt == 0 && v % pt != 0)
          complain({key},
                   std::string(key) + " = " + std::to_string(v) +
                       " is not a whole number of replicas of pp * tp = " + std::to_string(pt) +
                       " workers (use a multiple of " + std::to_string(pt) + ")");
      }
    }
    if (grid_ok_ && c.elastic.max_workers > w &&
        fine({"train.global_batch", "train.micro_batch"}) &&
        c.train.global_batch % c.train.micro_batch == 0) {
      const int64_t pt = int64_t{c.parallel.pp} * c.parallel.tp;
      const int64_t max_dp = c.elastic.max_workers / pt;
      const int micro = c.train.global_batch / c.train.micro_batch;
      if (micro < max_dp) {
        complain({"elastic.max_workers"},
                 "global_batch / micro_batch = " + std::to_string(micro) +
                     " micro-batches per step cannot feed the dp = " + std::to_string(max_dp) +
                     " replicas of max_workers = " + std::to_string(c.elastic.max_workers) +
                     " (use micro_batch <= " +
                     std::to_string(std::max<int64_t>(1, c.train.global_batch / max_dp)) +
                     ", or max_workers <= " + std::to_string(micro * pt) + ")");
      }
    }
  }

  // ---- faults: the injected faults against the run they act on (runtime/step/step_faults,
  // runtime/step/training_job; the spec language is runtime/core/faults) ----

  // Faults that could never act are mistakes: a step past the run, a rank beyond the
  // largest roster, a scale outside the elastic bounds.
  void check_faults() {
    const config& c = c_;
    if (!fine({"faults"})) return;
    const bool steps_ok = fine({"train.steps"});
    for (size_t i = 0; i < c.faults.size(); ++i) {
      const faults::fault_spec& f = c.faults[i];
      const std::string key = "faults[" + std::to_string(i) + "]";
      const std::string what = "'" + faults::to_string(f) + "'";
      const int64_t first = f.kind == faults::fault_kind::slow ? f.from_step : f.at_step;
      if (steps_ok && first >= c.train.steps) {
        const std::string steps = std::to_string(c.train.steps);
        keys_.complain_fault(i, key,
                             what + " never acts: the run's steps are 0 to " +
                                 std::to_string(c.train.steps - 1) + " (train.steps = " + steps +
                                 "; use a step below " + steps + ")");
      }
      // Losing the only coordinator ends the run: a coordinator fault needs a standby.
      if (f.coordinator && fine({"ha.standbys"}) && c.ha.standbys < 1) {
        keys_.complain_fault(i, key,
                             what +
                                 " needs ha.standbys >= 1: without a standby, losing the "
                                 "coordinator ends the run (set ha.standbys: 1 or more, or "
                                 "remove the fault)");
      }
      if (!elastic_ok_) continue;
      const int lo = c.elastic.min_workers, hi = c.elastic.max_workers;
      if (f.worker.by_rank() && f.worker.rank >= hi) {
        keys_.complain_fault(i, key,
                             what + " names rank " + std::to_string(f.worker.rank) +
                                 ", but the run has at most " + std::to_string(hi) +
                                 " workers (use a rank from 0 to " + std::to_string(hi - 1) +
                                 ", or raise elastic.max_workers)");
      }
      if (f.kind == faults::fault_kind::scale && f.to_workers > hi) {
        keys_.complain_fault(i, key,
                             what + " goes above elastic.max_workers = " + std::to_string(hi) +
                                 " (raise elastic.max_workers to " + std::to_string(f.to_workers) +
                                 ", or scale to at most " + std::to_string(hi) + ")");
      }
      const int seat = c.parallel.pp * c.parallel.tp;
      if (f.kind == faults::fault_kind::scale && seat > 1 && f.to_workers % seat != 0) {
        keys_.complain_fault(i, key,
                             what + ": a replica is pp * tp = " + std::to_string(seat) +
                                 " workers, so scale to a multiple of " + std::to_string(seat));
      }
      if (f.kind == faults::fault_kind::scale && f.to_workers < lo) {
        keys_.complain_fault(i, key,
                             what + " goes below elastic.min_workers = " + std::to_string(lo) +
                                 " (training would pause there; lower elastic.min_workers to " +
                                 std::to_string(f.to_workers) + ", or scale to at least " +
                                 std::to_string(lo) + ")");
      }
    }
  }

  // ---- control: the coordinator's endpoint (runtime/net, tools/cmd_coordinator) ----

  void check_control() {
    const config& c = c_;
    if (fine({"control.bind"})) {
      const std::string& b = c.control.bind;
      const bool tcp = b.rfind("tcp://", 0) == 0 && b.size() > 6;
      const bool ipc = b.rfind("ipc://", 0) == 0 && b.size() > 6;
      if (!tcp && !ipc) {
        complain({"control.bind"}, "'" + b +
                                       "' is not a ZeroMQ endpoint (write tcp://HOST:PORT, e.g. "
                                       "tcp://127.0.0.1:0, or ipc://PATH)");
      } else if (tcp && b.find(':', 6) == std::string::npos) {
        complain({"control.bind"}, "'" + b +
                                       "' has no port (write tcp://HOST:PORT; port 0 "
                                       "picks a free one)");
      }
    }
  }

  // ---- ha: coordinator standbys and the etcd they elect through (runtime/ha, the
  // launcher that starts etcd) ----

  void check_ha() {
    const config& c = c_;
    if (fine({"ha.standbys", "parallel.pp", "parallel.tp"}) &&
        !cohort::rules::standbys_fit_grid(c.ha.standbys, c.parallel.pp, c.parallel.tp))
      complain({"ha.standbys", "parallel.pp", "parallel.tp"},
               "coordinator standbys cover data-parallel jobs: a pipeline or tensor-parallel "
               "job's seats are not rebuilt by a new leader yet, and this one has pp = " +
                   std::to_string(c.parallel.pp) + " x tp = " + std::to_string(c.parallel.tp) +
                   " (set ha.standbys: 0 or parallel.pp = parallel.tp = 1)");
    if (fine({"ha.etcd_heartbeat_ms", "ha.etcd_election_ms"}) &&
        !cohort::rules::etcd_election_fits_heartbeat(c.ha.etcd_heartbeat_ms, c.ha.etcd_election_ms))
      complain({"ha.etcd_election_ms", "ha.etcd_heartbeat_ms"},
               "etcd_election_ms = " + std::to_string(c.ha.etcd_election_ms) +
                   " is below 5 x etcd_heartbeat_ms = " +
                   std::to_string(5 * int64_t{c.ha.etcd_heartbeat_ms}) +
                   " (etcd refuses to start with an election timeout under 5 heartbeats; use "
                   "etcd_election_ms >= " +
                   std::to_string(5 * int64_t{c.ha.etcd_heartbeat_ms}) +
                   ", or a shorter etcd_heartbeat_ms)");
  }

  config& c_;
  loaded_keys& keys_;
  bool grid_ok_ = false;     // dp resolved and dp * pp * tp == cluster.workers
  bool elastic_ok_ = false;  // both bounds resolved and holding cluster.workers
};

}  // namespace

void resolve_and_check(config& c, loaded_keys& keys) { rules(c, keys).run(); }

}  // namespace cohort::config_rules
