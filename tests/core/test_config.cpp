// Config loading: a table of broken configs (each with the line, column, key and message
// it must produce), the shipped configs, --set overrides, derived defaults, dump/load
// round trip, did-you-mean, and the reference file and docs staying true to the schema.
#include <doctest/doctest.h>
#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/core/config.hpp"
#include "runtime/core/sha256.hpp"

namespace {

using cohort::comm_backend;
using cohort::config;
using cohort::config_error;
using cohort::config_issue;

std::vector<config_issue> issues_of(const std::string& text,
                                    const std::vector<std::string>& sets = {}) {
  try {
    cohort::load_config_text(text, "cfg.yaml", sets);
  } catch (const config_error& e) {
    return e.issues();
  }
  return {};
}

std::string all_text(const std::vector<config_issue>& issues) {
  std::string out;
  for (const auto& i : issues) out += i.format() + "\n";
  return out;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "cannot open " << path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

const std::string source_dir = COHORT_SOURCE_DIR;

/// Every field, compared one by one: the round-trip tests need "equal config", and
/// comparing dumps alone would hide a field the dump forgot.
void check_equal(const config& a, const config& b) {
  CHECK(a.cluster.workers == b.cluster.workers);
  CHECK(a.parallel.dp == b.parallel.dp);
  CHECK(a.parallel.pp == b.parallel.pp);
  CHECK(a.parallel.tp == b.parallel.tp);
  CHECK(a.parallel.schedule == b.parallel.schedule);
  CHECK(a.parallel.activation_checkpointing == b.parallel.activation_checkpointing);
  CHECK(a.model.kind == b.model.kind);
  CHECK(a.model.hidden == b.model.hidden);
  CHECK(a.model.n_layer == b.model.n_layer);
  CHECK(a.model.n_head == b.model.n_head);
  CHECK(a.model.d_model == b.model.d_model);
  CHECK(a.model.context == b.model.context);
  CHECK(a.data.dataset == b.data.dataset);
  CHECK(a.data.dir == b.data.dir);
  CHECK(a.data.cache_dir == b.data.cache_dir);
  CHECK(a.train.steps == b.train.steps);
  CHECK(a.train.global_batch == b.train.global_batch);
  CHECK(a.train.micro_batch == b.train.micro_batch);
  CHECK(a.train.lr == b.train.lr);
  CHECK(a.train.seed == b.train.seed);
  CHECK(a.train.determinism == b.train.determinism);
  CHECK(a.train.optimizer == b.train.optimizer);
  CHECK(a.train.weight_decay == b.train.weight_decay);
  CHECK(a.train.beta1 == b.train.beta1);
  CHECK(a.train.beta2 == b.train.beta2);
  CHECK(a.train.eps == b.train.eps);
  CHECK(a.train.momentum == b.train.momentum);
  CHECK(a.train.grad_clip == b.train.grad_clip);
  CHECK(a.train.warmup_steps == b.train.warmup_steps);
  CHECK(a.train.lr_schedule == b.train.lr_schedule);
  CHECK(a.train.min_lr == b.train.min_lr);
  CHECK(a.train.eval_every == b.train.eval_every);
  CHECK(a.train.log_every == b.train.log_every);
  CHECK(a.train.threads == b.train.threads);
  CHECK(a.comm.backend == b.comm.backend);
  CHECK(a.comm.bucket_mb == b.comm.bucket_mb);
  CHECK(a.comm.transport == b.comm.transport);
  CHECK(a.comm.interface == b.comm.interface);
  CHECK(a.comm.hierarchy == b.comm.hierarchy);
  CHECK(a.comm.host_id == b.comm.host_id);
  CHECK(a.comm.lanes == b.comm.lanes);
  CHECK(a.fault_tolerance.heartbeat_ms == b.fault_tolerance.heartbeat_ms);
  CHECK(a.fault_tolerance.timeout_ms == b.fault_tolerance.timeout_ms);
  CHECK(a.fault_tolerance.checkpoint_every == b.fault_tolerance.checkpoint_every);
  CHECK(a.fault_tolerance.checkpoint_dir == b.fault_tolerance.checkpoint_dir);
  CHECK(a.fault_tolerance.keep == b.fault_tolerance.keep);
  CHECK(a.elastic.min_workers == b.elastic.min_workers);
  CHECK(a.elastic.max_workers == b.elastic.max_workers);
  CHECK(a.elastic.respawn == b.elastic.respawn);
  CHECK(a.elastic.pause_timeout_ms == b.elastic.pause_timeout_ms);
  CHECK(a.control.bind == b.control.bind);
  CHECK(a.control.max_message_bytes == b.control.max_message_bytes);
  CHECK(a.ha.standbys == b.ha.standbys);
  CHECK(a.ha.etcd_local == b.ha.etcd_local);
  CHECK(a.ha.etcd_endpoints == b.ha.etcd_endpoints);
  CHECK(a.ha.lease_ttl_s == b.ha.lease_ttl_s);
  CHECK(a.ha.etcd_heartbeat_ms == b.ha.etcd_heartbeat_ms);
  CHECK(a.ha.etcd_election_ms == b.ha.etcd_election_ms);
  CHECK(a.ha.reattach_ms == b.ha.reattach_ms);
  CHECK(a.faults == b.faults);
}

/// The defaults of a one-worker run: dp and the elastic bounds resolved from it.
config one_worker_defaults() {
  config d;
  d.parallel.dp = 1;
  d.elastic.min_workers = 1;
  d.elastic.max_workers = 1;
  return d;
}

/// Every dotted key path of a two-level YAML mapping; a top-level value that is not a
/// mapping (the faults list) is a key of its own.
std::set<std::string> key_paths(const std::string& yaml) {
  std::set<std::string> out;
  const YAML::Node root = YAML::Load(yaml);
  for (auto s = root.begin(); s != root.end(); ++s) {
    if (!s->second.IsMap()) {
      out.insert(s->first.Scalar());
      continue;
    }
    for (auto k = s->second.begin(); k != s->second.end(); ++k) {
      out.insert(s->first.Scalar() + "." + k->first.Scalar());
    }
  }
  return out;
}

struct broken_case {
  const char* name;
  const char* yaml;
  std::vector<std::string> sets;
  const char* file;  // "cfg.yaml" or "--set"
  int line;          // 0: not meaningful (--set)
  int col;
  const char* key;
  const char* message;  // substring of the issue's message
  size_t count;         // issues expected in all (0: do not check)
};

// Columns count from 1; a value's column is where its first character is.
const std::vector<broken_case> broken = {
    // --- YAML syntax and document shape
    {"unclosed flow list",
     "model:\n  hidden: [256, 128\n",
     {},
     "cfg.yaml",
     3,
     1,
     "",
     "close the list with ']'",
     1},
    {"tab indentation", "train:\n\tlr: 0.1\n", {}, "cfg.yaml", 2, 4, "", "tabs", 1},
    {"key out of line",
     "train:\n  lr: 0.1\n steps: 5\n",
     {},
     "cfg.yaml",
     3,
     2,
     "",
     "indentation",
     1},
    {"empty file", "", {}, "cfg.yaml", 1, 1, "", "the config is empty", 1},
    {"only comments", "# nothing here\n", {}, "cfg.yaml", 1, 1, "", "the config is empty", 1},
    {"root is a list",
     "- train\n- model\n",
     {},
     "cfg.yaml",
     1,
     1,
     "",
     "top level must be a mapping of sections",
     1},
    {"root is a scalar", "hello\n", {}, "cfg.yaml", 1, 1, "", "got hello", 1},
    {"section is a scalar",
     "model: mlp\n",
     {},
     "cfg.yaml",
     1,
     8,
     "model",
     "a section must be a mapping of keys, got mlp",
     1},
    {"two documents",
     "train:\n  lr: 0.1\n---\ntrain:\n  lr: 0.2\n",
     {},
     "cfg.yaml",
     4,
     1,
     "",
     "more than one YAML document",
     1},
    {"duplicate key",
     "train:\n  lr: 0.1\n  lr: 0.2\n",
     {},
     "cfg.yaml",
     3,
     3,
     "train.lr",
     "duplicate key (first set on line 2",
     1},
    {"duplicate section",
     "train:\n  lr: 0.1\ntrain:\n  steps: 3\n",
     {},
     "cfg.yaml",
     3,
     1,
     "train",
     "duplicate section (first on line 1",
     1},
    // --- unknown names, with suggestions
    {"section typo",
     "trian:\n  lr: 0.1\n",
     {},
     "cfg.yaml",
     1,
     1,
     "trian",
     "did you mean train?",
     1},
    {"key at top level",
     "model:\n  kind: mlp\nsteps: 10\n",
     {},
     "cfg.yaml",
     3,
     1,
     "steps",
     "did you mean train.steps?",
     1},
    {"key typo",
     "train:\n  warmup_step: 3\n",
     {},
     "cfg.yaml",
     2,
     3,
     "train.warmup_step",
     "did you mean train.warmup_steps?",
     1},
    {"key in wrong section",
     "model:\n  lr: 0.1\n",
     {},
     "cfg.yaml",
     2,
     3,
     "model.lr",
     "did you mean train.lr?",
     1},
    {"key unlike any",
     "data:\n  xyzzy: 1\n",
     {},
     "cfg.yaml",
     2,
     3,
     "data.xyzzy",
     "keys: dataset, dir, cache_dir",
     1},
    {"comm key typo",
     "comm:\n  bucket_mib: 8\n",
     {},
     "cfg.yaml",
     2,
     3,
     "comm.bucket_mib",
     "unknown key (did you mean comm.bucket_mb?)",
     1},
    {"comm key in another section",
     "train:\n  backend: gloo\n",
     {},
     "cfg.yaml",
     2,
     3,
     "train.backend",
     "did you mean comm.backend? it belongs in section comm",
     1},
    {"comm section typo",
     "comms:\n  backend: gloo\n",
     {},
     "cfg.yaml",
     1,
     1,
     "comms",
     "did you mean comm?",
     1},
    // --- types
    {"word where int",
     "cluster:\n  workers: four\n",
     {},
     "cfg.yaml",
     2,
     12,
     "cluster.workers",
     "expected an integer, got four",
     1},
    {"float where int",
     "train:\n  steps: 2.5\n",
     {},
     "cfg.yaml",
     2,
     10,
     "train.steps",
     "expected an integer, got 2.5",
     1},
    {"exponent where int",
     "train:\n  steps: 1e3\n",
     {},
     "cfg.yaml",
     2,
     10,
     "train.steps",
     "write it as the whole number 1000",
     1},
    {"quoted number",
     "train:\n  lr: \"0.01\"\n",
     {},
     "cfg.yaml",
     2,
     7,
     "train.lr",
     "remove the quotes",
     1},
    {"list where number",
     "train:\n  lr: [0.1]\n",
     {},
     "cfg.yaml",
     2,
     7,
     "train.lr",
     "expected a number, got a list",
     1},
    {"scalar where list",
     "model:\n  hidden: 64\n",
     {},
     "cfg.yaml",
     2,
     11,
     "model.hidden",
     "write [64] for a single layer",
     1},
    {"mapping where string",
     "data:\n  dir: {a: 1}\n",
     {},
     "cfg.yaml",
     2,
     8,
     "data.dir",
     "expected a string, got a mapping",
     1},
    {"missing value",
     "train:\n  lr:\n  steps: 3\n",
     {},
     "cfg.yaml",
     2,
     3,
     "train.lr",
     "has no value",
     1},
    {"empty string", "data:\n  dir: \"\"\n", {}, "cfg.yaml", 2, 8, "data.dir", "is empty", 1},
    {"int32 overflow",
     "train:\n  threads: 99999999999\n",
     {},
     "cfg.yaml",
     2,
     12,
     "train.threads",
     "too large for a 32-bit integer",
     1},
    {"infinite lr",
     "train:\n  lr: .inf\n",
     {},
     "cfg.yaml",
     2,
     7,
     "train.lr",
     "must be a finite number",
     1},
    // --- ranges and enums
    {"no workers",
     "cluster:\n  workers: 0\n",
     {},
     "cfg.yaml",
     2,
     12,
     "cluster.workers",
     "must be >= 1, got 0",
     1},
    {"zero lr", "train:\n  lr: 0\n", {}, "cfg.yaml", 2, 7, "train.lr", "must be > 0, got 0", 1},
    {"bad list element",
     "model:\n  hidden: [64, 0, 10]\n",
     {},
     "cfg.yaml",
     2,
     16,
     "model.hidden[1]",
     "must be >= 1, got 0",
     1},
    {"zero heartbeat",
     "fault_tolerance:\n  heartbeat_ms: 0\n",
     {},
     "cfg.yaml",
     2,
     17,
     "fault_tolerance.heartbeat_ms",
     "must be >= 1",
     1},
    {"keep nothing",
     "fault_tolerance:\n  keep: 0\n",
     {},
     "cfg.yaml",
     2,
     9,
     "fault_tolerance.keep",
     "must be >= 1",
     1},
    {"negative seed",
     "train:\n  seed: -1\n",
     {},
     "cfg.yaml",
     2,
     9,
     "train.seed",
     "must be >= 0, got -1",
     1},
    {"beta1 of one",
     "train:\n  beta1: 1.0\n",
     {},
     "cfg.yaml",
     2,
     10,
     "train.beta1",
     "must be in [0, 1)",
     1},
    {"unknown model kind",
     "model:\n  kind: transformer\n",
     {},
     "cfg.yaml",
     2,
     9,
     "model.kind",
     "use one of mlp, gpt",
     1},
    {"determinism typo",
     "train:\n  determinism: bitwize\n",
     {},
     "cfg.yaml",
     2,
     16,
     "train.determinism",
     "did you mean bitwise?",
     1},
    {"optimizer typo",
     "train:\n  optimizer: adam\n",
     {},
     "cfg.yaml",
     2,
     14,
     "train.optimizer",
     "did you mean adamw?",
     1},
    {"unknown schedule",
     "train:\n  lr_schedule: linear\n",
     {},
     "cfg.yaml",
     2,
     16,
     "train.lr_schedule",
     "use one of constant, cosine",
     1},
    {"unknown dataset",
     "data:\n  dataset: mnist\n",
     {},
     "cfg.yaml",
     2,
     12,
     "data.dataset",
     "use one of fashion_mnist, kjv",
     1},
    {"bind without transport",
     "control:\n  bind: localhost:5555\n",
     {},
     "cfg.yaml",
     2,
     9,
     "control.bind",
     "not a ZeroMQ endpoint",
     1},
    {"hierarchical over a forced transport",
     "comm:\n  transport: gloo\n  hierarchy: hierarchical\n",
     {},
     "cfg.yaml",
     3,
     14,
     "comm.hierarchy",
     "needs comm.transport: auto (it is gloo); set transport to auto or hierarchy to flat",
     1},
    {"hierarchy typo",
     "comm:\n  hierarchy: tree\n",
     {},
     "cfg.yaml",
     2,
     14,
     "comm.hierarchy",
     "'tree' is not allowed (use one of auto, flat, hierarchical",
     1},
    {"host id over two lines",
     "comm:\n  host_id: \"rack1\\nnode2\"\n",
     {},
     "cfg.yaml",
     2,
     12,
     "comm.host_id",
     "must be one line of at most 200 characters",
     1},
    {"comm backend typo",
     "comm:\n  backend: glo\n",
     {},
     "cfg.yaml",
     2,
     12,
     "comm.backend",
     "'glo' is not allowed (use one of auto, gloo, nccl; did you mean gloo?)",
     1},
    {"comm backend upper case",
     "comm:\n  backend: NCCL\n",
     {},
     "cfg.yaml",
     2,
     12,
     "comm.backend",
     "'NCCL' is not allowed (use one of auto, gloo, nccl; did you mean nccl?)",
     1},
    {"bucket_mb zero",
     "comm:\n  bucket_mb: 0\n",
     {},
     "cfg.yaml",
     2,
     14,
     "comm.bucket_mb",
     "must be in (0, 1024], got 0 (use a value in (0, 1024]",
     1},
    {"bucket_mb above 1024",
     "comm:\n  bucket_mb: 1024.5\n",
     {},
     "cfg.yaml",
     2,
     14,
     "comm.bucket_mb",
     "must be in (0, 1024], got 1024.5",
     1},
    {"bucket_mb negative",
     "comm:\n  bucket_mb: -4\n",
     {},
     "cfg.yaml",
     2,
     14,
     "comm.bucket_mb",
     "must be in (0, 1024], got -4",
     1},
    {"bucket_mb a word",
     "comm:\n  bucket_mb: four\n",
     {},
     "cfg.yaml",
     2,
     14,
     "comm.bucket_mb",
     "expected a number, got four (write a number such as 4.0)",
     1},
    // --- booleans: YAML 1.2 true / false only
    {"bool yes",
     "elastic:\n  respawn: yes\n",
     {},
     "cfg.yaml",
     2,
     12,
     "elastic.respawn",
     "expected true or false, got yes (write true; yes is not a boolean in YAML 1.2)",
     1},
    {"bool on",
     "elastic:\n  respawn: on\n",
     {},
     "cfg.yaml",
     2,
     12,
     "elastic.respawn",
     "(write true; on is not a boolean",
     1},
    {"bool zero",
     "elastic:\n  respawn: 0\n",
     {},
     "cfg.yaml",
     2,
     12,
     "elastic.respawn",
     "expected true or false, got 0 (write false; 0 is not a boolean in YAML 1.2)",
     1},
    {"bool no",
     "elastic:\n  respawn: No\n",
     {},
     "cfg.yaml",
     2,
     12,
     "elastic.respawn",
     "(write false; No is not a boolean",
     1},
    {"bool quoted",
     "elastic:\n  respawn: \"true\"\n",
     {},
     "cfg.yaml",
     2,
     12,
     "elastic.respawn",
     "got the quoted string \"true\" (remove the quotes)",
     1},
    {"bool a word",
     "elastic:\n  respawn: always\n",
     {},
     "cfg.yaml",
     2,
     12,
     "elastic.respawn",
     "expected true or false, got always (write true or false)",
     1},
    {"bool a list",
     "elastic:\n  respawn: [true]\n",
     {},
     "cfg.yaml",
     2,
     12,
     "elastic.respawn",
     "got a list",
     1},
    {"bool empty",
     "elastic:\n  respawn:\n",
     {},
     "cfg.yaml",
     2,
     3,
     "elastic.respawn",
     "has no value (write true or false, or delete the key to use the default true)",
     1},
    // --- elastic keys
    {"negative min_workers",
     "elastic:\n  min_workers: -1\n",
     {},
     "cfg.yaml",
     2,
     16,
     "elastic.min_workers",
     "must be >= 0, got -1",
     1},
    {"negative pause timeout",
     "elastic:\n  pause_timeout_ms: -5\n",
     {},
     "cfg.yaml",
     2,
     21,
     "elastic.pause_timeout_ms",
     "must be >= 0, got -5",
     1},
    {"elastic key typo",
     "elastic:\n  max_workrs: 4\n",
     {},
     "cfg.yaml",
     2,
     3,
     "elastic.max_workrs",
     "did you mean elastic.max_workers?",
     1},
    {"elastic section typo",
     "elasitc:\n  respawn: true\n",
     {},
     "cfg.yaml",
     1,
     1,
     "elasitc",
     "did you mean elastic?",
     1},
    {"elastic key in another section",
     "fault_tolerance:\n  respawn: true\n",
     {},
     "cfg.yaml",
     2,
     3,
     "fault_tolerance.respawn",
     "did you mean elastic.respawn? it belongs in section elastic",
     1},
    // --- the faults list
    {"faults not a list",
     "faults: kill rank=1 at step=1\n",
     {},
     "cfg.yaml",
     1,
     9,
     "faults",
     "expected a list of fault specs, got kill rank=1 at step=1 (write it as a list: "
     "[\"kill rank=1 at step=1\"])",
     1},
    {"faults empty",
     "faults:\n",
     {},
     "cfg.yaml",
     1,
     1,
     "faults",
     "has no value (write a list of fault specs",
     1},
    {"faults a mapping",
     "faults:\n  kill: 1\n",
     {},
     "cfg.yaml",
     2,
     3,
     "faults",
     "expected a list of fault specs, got a mapping",
     1},
    {"bad spec: column inside the entry",
     "faults:\n  - kill rank=2 at stp=30\n",
     {},
     "cfg.yaml",
     2,
     20,
     "faults[0]",
     "unknown word 'stp' (expected step=N)",
     1},
    {"bad quoted spec",
     "faults:\n  - \"kill rank=2 at stp=30\"\n",
     {},
     "cfg.yaml",
     2,
     21,
     "faults[0]",
     "unknown word 'stp' (expected step=N)",
     1},
    {"bad spec in a flow list",
     "faults: [\"kill rank=2 at step=3\", \"kil\"]\n",
     {},
     "cfg.yaml",
     1,
     36,
     "faults[1]",
     "unknown fault 'kil' (did you mean kill?)",
     1},
    {"each bad spec reported",
     "faults:\n  - kill rank=2\n  - scale to=3 at step=1\n  - drop control p=2\n",
     {},
     "cfg.yaml",
     4,
     20,
     "faults[2]",
     "p must be in (0, 1], got 2",
     2},
    {"spec that YAML reads as a mapping",
     "faults:\n  - kill worker: 2\n",
     {},
     "cfg.yaml",
     2,
     5,
     "faults[0]",
     "expected a fault spec string, got a mapping",
     1},
    {"faults twice",
     "faults: []\nfaults: []\n",
     {},
     "cfg.yaml",
     2,
     1,
     "faults",
     "duplicate key (first on line 1; merge the two lists into one)",
     1},
    {"faults inside a section",
     "train:\n  faults: []\n",
     {},
     "cfg.yaml",
     2,
     3,
     "train.faults",
     "faults is a top-level list (write 'faults:' without indentation)",
     1},
    {"faults typo",
     "fault:\n  - kill rank=1 at step=1\n",
     {},
     "cfg.yaml",
     1,
     1,
     "fault",
     "unknown section (did you mean faults?)",
     1},
    // --- contradictions
    {"min_workers above workers",
     "cluster:\n  workers: 4\ntrain:\n  micro_batch: 32\nelastic:\n  min_workers: 5\n",
     {},
     "cfg.yaml",
     6,
     16,
     "elastic.min_workers",
     "min_workers = 5 exceeds cluster.workers = 4 (the run would start below its minimum; use "
     "at most 4, or 0 for cluster.workers)",
     1},
    {"max_workers below workers",
     "cluster:\n  workers: 4\ntrain:\n  micro_batch: 32\nelastic:\n  max_workers: 3\n",
     {},
     "cfg.yaml",
     6,
     16,
     "elastic.max_workers",
     "max_workers = 3 is below cluster.workers = 4 (the launcher starts 4 workers; use at least "
     "4, or 0 for cluster.workers)",
     1},
    {"both elastic bounds wrong",
     "cluster:\n  workers: 4\ntrain:\n  micro_batch: 32\nelastic:\n  min_workers: 6\n  "
     "max_workers: 2\n",
     {},
     "cfg.yaml",
     7,
     16,
     "elastic.max_workers",
     "max_workers = 2 is below cluster.workers = 4",
     2},
    {"too few micro-batches at max_workers",
     "cluster:\n  workers: 2\ntrain:\n  micro_batch: 32\nelastic:\n  max_workers: 8\n",
     {},
     "cfg.yaml",
     6,
     16,
     "elastic.max_workers",
     "global_batch / micro_batch = 4 micro-batches per step cannot feed the dp = 8 replicas of "
     "max_workers = 8 (use micro_batch <= 16, or max_workers <= 4)",
     1},
    {"fault after the last step",
     "train:\n  steps: 10\nfaults:\n  - kill rank=0 at step=10\n",
     {},
     "cfg.yaml",
     4,
     5,
     "faults[0]",
     "'kill rank=0 at step=10' never acts: the run's steps are 0 to 9 (train.steps = 10; use "
     "a step below 10)",
     1},
    {"slow range after the last step",
     "train:\n  steps: 10\nfaults:\n  - slow rank=0 factor=2 from step=12 to step=20\n",
     {},
     "cfg.yaml",
     4,
     5,
     "faults[0]",
     "never acts",
     1},
    {"fault rank beyond the largest roster",
     "cluster:\n  workers: 2\ntrain:\n  micro_batch: 64\nfaults:\n  - kill rank=2 at "
     "step=1\n",
     {},
     "cfg.yaml",
     6,
     5,
     "faults[0]",
     "names rank 2, but the run has at most 2 workers (use a rank from 0 to 1, or raise "
     "elastic.max_workers)",
     1},
    {"scale above max_workers",
     "cluster:\n  workers: 2\ntrain:\n  micro_batch: 32\nelastic:\n  max_workers: 4\nfaults:\n"
     "  - scale to=5 at step=1\n",
     {},
     "cfg.yaml",
     8,
     5,
     "faults[0]",
     "'scale to=5 at step=1' goes above elastic.max_workers = 4 (raise elastic.max_workers to 5, "
     "or scale to at most 4)",
     1},
    {"scale below min_workers",
     "cluster:\n  workers: 2\ntrain:\n  micro_batch: 32\nelastic:\n  min_workers: 2\nfaults:\n"
     "  - scale to=1 at step=1\n",
     {},
     "cfg.yaml",
     8,
     5,
     "faults[0]",
     "goes below elastic.min_workers = 2 (training would pause there; lower "
     "elastic.min_workers to 1, or scale to at least 2)",
     1},
    {"grid does not match workers",
     "cluster:\n  workers: 4\nparallel:\n  dp: 2\n",
     {},
     "cfg.yaml",
     4,
     7,
     "parallel.dp",
     "2 * 1 * 1 = 2 does not match cluster.workers = 4",
     1},
    {"pipeline of an mlp",
     "cluster:\n  workers: 2\nparallel:\n  pp: 2\n",
     {},
     "cfg.yaml",
     4,
     7,
     "parallel.pp",
     "pipeline / tensor parallelism (pp = 2, tp = 1) splits a GPT, but model.kind is mlp",
     1},
    {"tensor parallelism of an mlp",
     "cluster:\n  workers: 2\nparallel:\n  tp: 2\n",
     {},
     "cfg.yaml",
     4,
     7,
     "parallel.tp",
     "pipeline / tensor parallelism (pp = 1, tp = 2) splits a GPT, but model.kind is mlp",
     1},
    {"moe of an mlp",
     "model:\n  moe:\n    experts: 4\n",
     {},
     "cfg.yaml",
     3,
     14,
     "model.moe.experts",
     "a mixture of experts replaces a GPT block's MLP, but model.kind is mlp",
     1},
    {"moe with a pipeline",
     "model:\n  kind: gpt\n  moe:\n    experts: 4\ncluster:\n  workers: 2\nparallel:\n  pp: 2\n",
     {},
     "cfg.yaml",
     4,
     14,
     "model.moe.experts",
     "model.moe with pipeline or tensor parallelism is not built yet",
     1},
    {"moe top_k above experts",
     "model:\n  kind: gpt\n  moe:\n    experts: 1\n    top_k: 2\n",
     {},
     "cfg.yaml",
     4,
     14,
     "model.moe.experts",
     "model.moe.top_k = 2 experts a token, of 1 (top_k must be at most experts)",
     1},
    {"ep without experts",
     "parallel:\n  ep: 2\n",
     {},
     "cfg.yaml",
     2,
     7,
     "parallel.ep",
     "parallel.ep shares out a mixture of experts' experts, but the model has none",
     1},
    {"ep above experts",
     "model:\n  kind: gpt\n  moe:\n    experts: 2\nparallel:\n  ep: 4\n",
     {},
     "cfg.yaml",
     6,
     7,
     "parallel.ep",
     "parallel.ep = 4 shares out 2 experts: a rank would compute none",
     1},
    {"workers not divisible by pp*tp",
     "cluster:\n  workers: 3\nparallel:\n  tp: 2\n",
     {},
     "cfg.yaml",
     2,
     12,
     "cluster.workers",
     "is not divisible by pp * tp = 2",
     2},
    {"micro does not divide global",
     "train:\n  global_batch: 100\n  micro_batch: 32\n",
     {},
     "cfg.yaml",
     3,
     16,
     "train.micro_batch",
     "use micro_batch 25 or 50",
     1},
    {"too few micro-batches for dp",
     "cluster:\n  workers: 4\ntrain:\n  global_batch: 64\n  micro_batch: 32\n",
     {},
     "cfg.yaml",
     5,
     16,
     "train.micro_batch",
     "cannot feed dp = 4 replicas (use micro_batch <= 16)",
     1},
    {"gpt on fashion_mnist",
     "model:\n  kind: gpt\ndata:\n  dataset: fashion_mnist\n",
     {},
     "cfg.yaml",
     4,
     12,
     "data.dataset",
     "model.kind gpt trains on kjv",
     1},
    {"mlp on kjv",
     "model:\n  kind: mlp\ndata:\n  dataset: kjv\n",
     {},
     "cfg.yaml",
     4,
     12,
     "data.dataset",
     "model.kind mlp trains on fashion_mnist",
     1},
    {"heads do not divide width",
     "model:\n  kind: gpt\n  n_head: 5\n",
     {},
     "cfg.yaml",
     3,
     11,
     "model.n_head",
     "d_model = 128 is not divisible by n_head = 5 (use n_head 4 or 8",
     1},
    {"warmup longer than run",
     "train:\n  steps: 100\n  warmup_steps: 200\n",
     {},
     "cfg.yaml",
     3,
     17,
     "train.warmup_steps",
     "warmup_steps = 200 exceeds steps = 100",
     1},
    {"timeout not above heartbeat",
     "fault_tolerance:\n  heartbeat_ms: 200\n  timeout_ms: 200\n",
     {},
     "cfg.yaml",
     3,
     15,
     "fault_tolerance.timeout_ms",
     "must exceed heartbeat_ms = 200",
     1},
    {"timeout past an hour",
     "fault_tolerance:\n  timeout_ms: 3600001\n",
     {},
     "cfg.yaml",
     2,
     15,
     "fault_tolerance.timeout_ms",
     "must be in [1, 3600000], got 3600001",
     1},
    {"cosine floor above peak",
     "train:\n  lr: 0.001\n  min_lr: 0.01\n",
     {},
     "cfg.yaml",
     3,
     11,
     "train.min_lr",
     "min_lr = 0.01 is above lr = 0.001",
     1},
    {"nccl while training runs on the CPU",
     "train:\n  lr: 0.1\ncomm:\n  bucket_mb: 8\n  backend: nccl\n",
     {},
     "cfg.yaml",
     5,
     12,
     "comm.backend",
     "nccl sums gradients between GPUs, but train.device is cpu (set train.device: cuda, or "
     "comm.backend: auto)",
     1},
    // --- the device rules (train.device, runtime/nn/device.hpp)
    {"device not a device",
     "train:\n  lr: 0.1\n  device: gpu\n",
     {},
     "cfg.yaml",
     3,
     11,
     "train.device",
     "'gpu' is not one of: cpu, cuda, cuda:N (N a device number), auto",
     1},
    {"device cuda: without a number",
     "train:\n  device: \"cuda:\"\n",
     {},
     "cfg.yaml",
     2,
     11,
     "train.device",
     "'cuda:' is not one of: cpu, cuda, cuda:N",
     1},
    {"nccl with compression",
     "train:\n  device: cuda\ncomm:\n  backend: nccl\n  compression: bf16\n",
     {},
     "cfg.yaml",
     4,
     12,
     "comm.backend",
     "comm.compression runs on host transports; use comm.backend: auto with compression",
     1},
    {"nccl with onebit_adam",
     "train:\n  device: auto\n  optimizer: onebit_adam\ncomm:\n  backend: nccl\n",
     {},
     "cfg.yaml",
     5,
     12,
     "comm.backend",
     "onebit_adam compresses its sums on host transports; use comm.backend: auto with "
     "onebit_adam",
     1},
    // --- sharded optimizer state (train.zero)
    {"zero with pipeline stages",
     "cluster:\n  workers: 2\nmodel:\n  kind: gpt\nparallel:\n  pp: 2\ntrain:\n  zero: 1\n",
     {},
     "cfg.yaml",
     8,
     9,
     "train.zero",
     "train.zero shards a whole model's optimizer state over its data-parallel group; this job "
     "has pp = 2 x tp = 1 (set train.zero: 0, or parallel.pp and parallel.tp to 1)",
     1},
    {"zero with onebit_adam",
     "train:\n  zero: 1\n  optimizer: onebit_adam\n",
     {},
     "cfg.yaml",
     2,
     9,
     "train.zero",
     "onebit_adam's compressed momentum needs all of it on every worker",
     1},
    {"zero with error feedback",
     "train:\n  zero: 1\ncomm:\n  compression: bf16\n  error_feedback: true\n",
     {},
     "cfg.yaml",
     2,
     9,
     "train.zero",
     "does not keep error-feedback memory in this version (remove comm.error_feedback",
     1},
    {"zero on a GPU",
     "train:\n  zero: 1\n  device: cuda\n",
     {},
     "cfg.yaml",
     2,
     9,
     "train.zero",
     "train.zero runs on the CPU in this version (set train.device: cpu, or train.zero: 0)",
     1},
    {"zero stage 4", "train:\n  zero: 4\n", {}, "cfg.yaml", 2, 9, "train.zero", "got 4", 1},
    // --- rollback points in memory (fault_tolerance.memory_every)
    {"rollback points without error memory",
     "train:\n  determinism: bitwise\nfault_tolerance:\n  memory_every: 8\n",
     {},
     "cfg.yaml",
     4,
     17,
     "fault_tolerance.memory_every",
     "rollback points keep error-feedback memory, and this job keeps none",
     1},
    {"rollback points in fast mode",
     "train:\n  optimizer: onebit_adam\nfault_tolerance:\n  memory_every: 8\n",
     {},
     "cfg.yaml",
     4,
     17,
     "fault_tolerance.memory_every",
     "rollback points serve bitwise jobs",
     1},
    {"zero 2 with compression",
     "train:\n  zero: 2\ncomm:\n  compression: bf16\n",
     {},
     "cfg.yaml",
     2,
     9,
     "train.zero",
     "train.zero: 2 and 3 sum each gradient shard to its holders as plain numbers",
     1},
    // --- overrides: reported with file --set and the override text
    {"override without =",
     "train:\n  lr: 0.1\n",
     {"train.lr"},
     "--set",
     0,
     0,
     "",
     "in 'train.lr': an override needs the form dotted.key=value",
     1},
    {"override unknown key",
     "train:\n  lr: 0.1\n",
     {"train.lrr=0.1"},
     "--set",
     0,
     0,
     "train.lrr",
     "in 'train.lrr=0.1': unknown key (did you mean train.lr?)",
     1},
    {"override of a section",
     "train:\n  lr: 0.1\n",
     {"train=1"},
     "--set",
     0,
     0,
     "train",
     "is a section; set one key at a time",
     1},
    {"override float where int",
     "train:\n  lr: 0.1\n",
     {"parallel.dp=2.5"},
     "--set",
     0,
     0,
     "parallel.dp",
     "in 'parallel.dp=2.5': expected an integer, got 2.5",
     1},
    {"override out of range",
     "train:\n  lr: 0.1\n",
     {"train.lr=-1"},
     "--set",
     0,
     0,
     "train.lr",
     "must be > 0, got -1",
     1},
    {"override bad YAML",
     "train:\n  lr: 0.1\n",
     {"model.hidden=[64,"},
     "--set",
     0,
     0,
     "model.hidden",
     "YAML syntax error in the value",
     1},
    {"override nccl",
     "comm:\n  backend: gloo\n",
     {"comm.backend=nccl"},
     "--set",
     0,
     0,
     "comm.backend",
     "in 'comm.backend=nccl': nccl sums gradients between GPUs, but train.device is cpu",
     1},
    {"override bucket_mb out of range",
     "comm:\n  bucket_mb: 8\n",
     {"comm.bucket_mb=2048"},
     "--set",
     0,
     0,
     "comm.bucket_mb",
     "in 'comm.bucket_mb=2048': must be in (0, 1024], got 2048",
     1},
    {"override bad fault spec",
     "train:\n  lr: 0.1\n",
     {"faults=[\"kill rank=0 at step=1\", \"kil\"]"},
     "--set",
     0,
     0,
     "faults[1]",
     "in 'faults=[\"kill rank=0 at step=1\", \"kil\"]': column 1 of 'kil': unknown fault "
     "'kil' (did you mean kill?)",
     1},
    {"override faults key typo",
     "train:\n  lr: 0.1\n",
     {"fault=[]"},
     "--set",
     0,
     0,
     "fault",
     "unknown key (did you mean faults?)",
     1},
    {"override bool",
     "train:\n  lr: 0.1\n",
     {"elastic.respawn=1"},
     "--set",
     0,
     0,
     "elastic.respawn",
     "in 'elastic.respawn=1': expected true or false, got 1",
     1},
    {"override min_workers above workers",
     "train:\n  lr: 0.1\n",
     {"elastic.min_workers=9"},
     "--set",
     0,
     0,
     "elastic.min_workers",
     "min_workers = 9 exceeds cluster.workers = 1",
     1},
    {"override contradicts file",
     "cluster:\n  workers: 4\n",
     {"parallel.dp=3"},
     "--set",
     0,
     0,
     "parallel.dp",
     "does not match cluster.workers = 4",
     1},
};

}  // namespace

TEST_CASE("every broken config yields its issue at its line and column") {
  CHECK(broken.size() >= 20);
  for (const broken_case& b : broken) {
    const std::string name = b.name;
    CAPTURE(name);
    const std::vector<config_issue> issues = issues_of(b.yaml, b.sets);
    CAPTURE(all_text(issues));
    REQUIRE_FALSE(issues.empty());
    if (b.count) CHECK(issues.size() == b.count);
    bool found = false;
    for (const config_issue& i : issues) {
      if (i.file == b.file && i.line == b.line && i.col == b.col && i.key == b.key &&
          i.message.find(b.message) != std::string::npos) {
        found = true;
      }
    }
    CHECK_MESSAGE(found, "no issue " << b.file << ":" << b.line << ":" << b.col << ": " << b.key
                                     << ": ..." << b.message << "...");
    // Every issue says how to fix it, in parentheses, as the format promises.
    for (const config_issue& i : issues) CHECK(i.message.find('(') != std::string::npos);
  }
}

TEST_CASE("all issues are reported at once, in file order, overrides last") {
  const std::string text =
      "train:\n"
      "  lr: -1\n"          // 2: range
      "  steps: ten\n"      // 3: type
      "  optimiser: sgd\n"  // 4: unknown key
      "model:\n"
      "  kind: gtp\n"  // 6: enum
      "bogus: 1\n";    // 7: unknown section
  const auto issues = issues_of(text, {"train.seed=x", "nope"});
  CAPTURE(all_text(issues));
  REQUIRE(issues.size() == 7);
  const int lines[] = {2, 3, 4, 6, 7};
  for (int i = 0; i < 5; ++i) {
    CHECK(issues[i].file == "cfg.yaml");
    CHECK(issues[i].line == lines[i]);
  }
  CHECK(issues[3].message.find("did you mean gpt?") != std::string::npos);
  CHECK(issues[5].file == "--set");
  CHECK(issues[5].key == "train.seed");
  CHECK(issues[6].message.find("in 'nope'") != std::string::npos);
}

TEST_CASE("config_issue::format and config_error") {
  config_issue i{"cfg.yaml", 3, 5, "train.lr", "must be > 0, got 0 (use a value > 0)"};
  CHECK(i.format() == "cfg.yaml:3:5: train.lr: must be > 0, got 0 (use a value > 0)");
  i.col = 0;
  CHECK(i.format() == "cfg.yaml:3: train.lr: must be > 0, got 0 (use a value > 0)");
  config_issue s{"--set", 0, 0, "", "in 'x': bad (fix)"};
  CHECK(s.format() == "--set: in 'x': bad (fix)");

  try {
    cohort::load_config_text("train:\n  lr: 0\n  steps: 0\n", "f.yaml");
    FAIL("expected a config_error");
  } catch (const config_error& e) {
    CHECK(e.exit_status() == cohort::exit_usage);
    CHECK(std::string(e.what()) ==
          "invalid config (2 problems)\n" + e.issues()[0].format() + "\n" + e.issues()[1].format());
    CHECK(e.issues()[0].format().rfind("f.yaml:2:7: train.lr: must be > 0", 0) == 0);
  }
}

TEST_CASE("load_config reads files and names them in issues") {
  const std::string path =
      (std::filesystem::temp_directory_path() / "cohort_test_config_bad.yaml").string();
  {
    std::ofstream out(path);
    out << "cluster:\n  workers: 0\n";
  }
  try {
    cohort::load_config(path);
    FAIL("expected a config_error");
  } catch (const config_error& e) {
    REQUIRE(e.issues().size() == 1);
    CHECK(e.issues()[0].format().rfind(path + ":2:12: cluster.workers: must be >= 1", 0) == 0);
  }
  std::remove(path.c_str());
  try {
    cohort::load_config(path);
    FAIL("expected a config_error");
  } catch (const config_error& e) {
    REQUIRE(e.issues().size() == 1);
    CHECK(e.issues()[0].file == path);
    CHECK(e.issues()[0].message.find("cannot read the config file") != std::string::npos);
  }
}

TEST_CASE("derived defaults: dp from the grid, dataset from the model") {
  config c = cohort::load_config_text("cluster:\n  workers: 6\ntrain:\n  micro_batch: 16\n", "t");
  CHECK(c.parallel.dp == 6);
  CHECK(c.source == "t");
  c = cohort::load_config_text("cluster:\n  workers: 3\nparallel:\n  dp: 0\n", "t",
                               {"train.micro_batch=32"});
  CHECK(c.parallel.dp == 3);
  c = cohort::load_config_text("model:\n  kind: gpt\n", "t");
  CHECK(c.data.dataset == "kjv");
  CHECK(c.model.n_layer == 4);
  c = cohort::load_config_text("model:\n  kind: mlp\ntrain:\n", "t");  // empty section
  CHECK(c.data.dataset == "fashion_mnist");
  CHECK(c.parallel.dp == 1);
  // Everything else is the struct's initialiser.
  check_equal(c, one_worker_defaults());
}

TEST_CASE("--set overrides are parsed as YAML and win over the file") {
  const std::string text =
      "cluster:\n  workers: 2\nmodel:\n  hidden: [10]\ntrain:\n  micro_batch: 64\n";
  config c = cohort::load_config_text(
      text, "t",
      {"parallel.dp=2", "model.hidden=[64,32]", "train.lr=0.5", "train.lr=3e-4",
       "data.dir=/tmp/with space", "control.bind=tcp://0.0.0.0:5555",
       "train.seed=18446744073709551615"});
  CHECK(c.parallel.dp == 2);
  CHECK(c.model.hidden == std::vector<int>{64, 32});
  CHECK(c.train.lr == 3e-4f);  // the later --set wins
  CHECK(c.data.dir == "/tmp/with space");
  CHECK(c.control.bind == "tcp://0.0.0.0:5555");
  CHECK(c.train.seed == 18446744073709551615ull);
  // An override can also repair a file value, and '=' inside the value is kept.
  c = cohort::load_config_text("train:\n  lr: 0\n", "t", {"train.lr=0.1", "data.dir=a=b"});
  CHECK(c.train.lr == 0.1f);
  CHECK(c.data.dir == "a=b");
  // An override with an empty value has no value.
  const auto issues = issues_of("train:\n  lr: 0.1\n", {"train.steps="});
  REQUIRE(issues.size() == 1);
  CHECK(issues[0].message.find("has no value") != std::string::npos);
}

TEST_CASE("dump_config round-trips to an equal config") {
  config c =
      cohort::load_config_text("cluster:\n  workers: 4\n", "t",
                               {"model.kind=gpt",
                                "model.hidden=[]",
                                "model.n_layer=6",
                                "model.n_head=8",
                                "model.d_model=256",
                                "model.context=64",
                                "data.dir='quote \" and back\\slash'",
                                "data.cache_dir=~/c",
                                "train.steps=123456789012",
                                "train.global_batch=96",
                                "train.micro_batch=24",
                                "train.lr=0.1",
                                "train.seed=18446744073709551615",
                                "train.determinism=bitwise",
                                "train.optimizer=sgd",
                                "train.weight_decay=1e-4",
                                "train.beta1=0.8",
                                "train.beta2=0.95",
                                "train.eps=1e-6",
                                "train.momentum=0.5",
                                "train.grad_clip=1",
                                "train.warmup_steps=7",
                                "train.lr_schedule=cosine",
                                "train.min_lr=1.17549435e-38",
                                "train.eval_every=11",
                                "train.log_every=3",
                                "train.threads=2",
                                "comm.backend=gloo",
                                "comm.bucket_mb=0.25",
                                "comm.transport=auto",
                                "comm.hierarchy=flat",
                                "comm.lanes=3",
                                "comm.interface=eth1",
                                "comm.host_id='rack 3: node b'",
                                "fault_tolerance.heartbeat_ms=7",
                                "fault_tolerance.timeout_ms=9",
                                "fault_tolerance.checkpoint_every=5",
                                "fault_tolerance.checkpoint_dir=ck pts",
                                "fault_tolerance.keep=2",
                                "elastic.min_workers=2",
                                "elastic.max_workers=4",
                                "elastic.respawn=false",
                                "elastic.pause_timeout_ms=1234",
                                "control.bind=ipc:///tmp/x",
                                "control.max_message_bytes=1000",
                                "ha.standbys=2",
                                "ha.etcd=[\"http://10.0.0.5:2379\", \"http://[::1]:2380\"]",
                                "ha.lease_ttl_s=3",
                                "ha.etcd_heartbeat_ms=20",
                                "ha.etcd_election_ms=200",
                                "ha.reattach_ms=5000",
                                "faults=[\"kill coordinator at step=31\", "
                                "\"kill rank=2 at step=30\", "
                                "\"hang worker=w-1 at step=10 for=1.5s\", "
                                "\"slow rank=0 factor=3.3 from step=5 to step=15\", "
                                "\"drop control p=0.05 seed=7\", "
                                "\"partition rank=3 at step=12 for=2s\", "
                                "\"scale to=3 at step=20\", "
                                "\"random kill mtbf=15.5steps seed=18446744073709551615\"]"});
  CHECK(c.elastic.respawn == false);
  REQUIRE(c.faults.size() == 8);
  CHECK(c.faults[0].coordinator);
  CHECK(c.faults[2].duration_ms == 1500);
  CHECK(c.ha.etcd_endpoints ==
        std::vector<std::string>{"http://10.0.0.5:2379", "http://[::1]:2380"});
  CHECK(c.data.dir == "quote \" and back\\slash");
  CHECK(c.model.hidden.empty());
  CHECK(c.data.dataset == "kjv");
  const std::string text = cohort::dump_config(c);
  CAPTURE(text);
  const config back = cohort::load_config_text(text, "dump");
  check_equal(c, back);
  CHECK(cohort::dump_config(back) == text);

  // Defaults too, and values whose shortest text needs all nine digits.
  config d = cohort::load_config_text("train:\n  lr: 0.1\n", "t",
                                      {"train.beta2=0.99999994", "train.eps=1.4e-45"});
  CHECK(d.train.beta2 == 0.99999994f);
  const config d2 = cohort::load_config_text(cohort::dump_config(d), "dump");
  check_equal(d, d2);
}

TEST_CASE("dump_config prints every key of the schema, sections in a fixed order") {
  const std::string text =
      cohort::dump_config(cohort::load_config_text("model:\n  kind: mlp\n", "t"));
  const char* order[] = {"cluster:",         "parallel:", "model:",   "data:", "train:", "comm:",
                         "fault_tolerance:", "elastic:",  "control:", "ha:",   "faults:"};
  size_t at = 0;
  for (const char* s : order) {
    const size_t pos = text.find(std::string("\n") + s);
    const size_t found = text.rfind(s, 0) == 0 ? 0 : pos;
    REQUIRE_MESSAGE(found != std::string::npos, s);
    CHECK(found >= at);
    at = found;
  }
  const std::set<std::string> keys = key_paths(text);
  CHECK(keys.size() == 86);
  for (const char* k : {"cluster.workers",
                        "parallel.dp",
                        "model.hidden",
                        "data.cache_dir",
                        "train.threads",
                        "comm.backend",
                        "comm.bucket_mb",
                        "comm.p2p_security",
                        "comm.compression",
                        "comm.error_feedback",
                        "fault_tolerance.keep",
                        "fault_tolerance.commit_window",
                        "elastic.min_workers",
                        "elastic.max_workers",
                        "elastic.respawn",
                        "elastic.pause_timeout_ms",
                        "control.max_message_bytes",
                        "ha.standbys",
                        "ha.etcd",
                        "ha.reattach_ms",
                        "faults"}) {
    CHECK(keys.count(k) == 1);
  }
}

TEST_CASE("comm keys: defaults, accepted values, --set, and nccl refused on a CPU device") {
  config c = cohort::load_config_text("train:\n  lr: 0.1\n", "t");
  CHECK(c.comm.backend == comm_backend::automatic);
  CHECK(c.comm.bucket_mb == 4.0f);

  c = cohort::load_config_text("comm:\n  backend: gloo\n  bucket_mb: 0.5\n", "t");
  CHECK(c.comm.backend == comm_backend::gloo);
  CHECK(c.comm.bucket_mb == 0.5f);
  // Both ends of (0, 1024]: the top is allowed, the smallest positive float too.
  c = cohort::load_config_text("comm:\n  backend: auto\n  bucket_mb: 1024\n", "t");
  CHECK(c.comm.backend == comm_backend::automatic);
  CHECK(c.comm.bucket_mb == 1024.0f);
  c = cohort::load_config_text("comm:\n  bucket_mb: 1e-6\n", "t");
  CHECK(c.comm.bucket_mb == 1e-6f);
  // An integer is a number.
  c = cohort::load_config_text("comm:\n  bucket_mb: 25\n", "t");
  CHECK(c.comm.bucket_mb == 25.0f);

  // --set wins over the file, and can repair a refused backend.
  c = cohort::load_config_text("comm:\n  backend: nccl\n  bucket_mb: 8\n", "t",
                               {"comm.backend=gloo", "comm.bucket_mb=16"});
  CHECK(c.comm.backend == comm_backend::gloo);
  CHECK(c.comm.bucket_mb == 16.0f);

  // nccl on a CPU device is a config error (usage, exit 2) at the key's own line and column,
  // and names what to write instead.
  try {
    cohort::load_config_text("model:\n  kind: mlp\ncomm:\n  backend: nccl\n", "run.yaml");
    FAIL("expected a config_error");
  } catch (const config_error& e) {
    CHECK(e.exit_status() == cohort::exit_usage);
    REQUIRE(e.issues().size() == 1);
    CHECK(e.issues()[0].format() ==
          "run.yaml:4:12: comm.backend: nccl sums gradients between GPUs, but train.device is cpu "
          "(set train.device: cuda, or comm.backend: auto)");
  }
  // On a GPU (or a device resolved per worker) nccl is accepted.
  c = cohort::load_config_text("train:\n  device: cuda\ncomm:\n  backend: nccl\n", "t");
  CHECK(c.comm.backend == comm_backend::nccl);
  c = cohort::load_config_text("train:\n  device: auto\ncomm:\n  backend: nccl\n", "t");
  CHECK(c.comm.backend == comm_backend::nccl);
  // A broken bucket_mb next to nccl: both are reported, each at its own line.
  const auto both = issues_of("comm:\n  backend: nccl\n  bucket_mb: 0\n");
  CAPTURE(all_text(both));
  REQUIRE(both.size() == 2);
  CHECK(both[0].line == 2);
  CHECK(both[0].key == "comm.backend");
  CHECK(both[1].line == 3);
  CHECK(both[1].key == "comm.bucket_mb");

  // The keys enter the dump and therefore the hash.
  const config a = cohort::load_config_text("comm:\n  bucket_mb: 4\n", "a");
  const config b = cohort::load_config_text("comm:\n  bucket_mb: 8\n", "a");
  const config g = cohort::load_config_text("comm:\n  backend: gloo\n", "a");
  CHECK(cohort::dump_config(a).find("comm:\n  backend: auto\n  bucket_mb: 4.0\n") !=
        std::string::npos);
  CHECK(cohort::config_hash(a) != cohort::config_hash(b));
  CHECK(cohort::config_hash(a) != cohort::config_hash(g));
}

TEST_CASE("elastic keys: defaults, resolution from cluster.workers, booleans") {
  config c = cohort::load_config_text("cluster:\n  workers: 3\ntrain:\n  micro_batch: 32\n", "t");
  CHECK(c.elastic.min_workers == 3);  // 0 / absent: cluster.workers
  CHECK(c.elastic.max_workers == 3);
  CHECK(c.elastic.respawn == true);
  CHECK(c.elastic.pause_timeout_ms == 60000);

  c = cohort::load_config_text(
      "cluster:\n  workers: 3\ntrain:\n  micro_batch: 16\nelastic:\n  min_workers: 1\n  "
      "max_workers: 8\n  respawn: false\n  pause_timeout_ms: 0\n",
      "t");
  CHECK(c.elastic.min_workers == 1);
  CHECK(c.elastic.max_workers == 8);
  CHECK(c.elastic.respawn == false);
  CHECK(c.elastic.pause_timeout_ms == 0);
  // The bounds may equal the starting size; an explicit 0 means cluster.workers.
  c = cohort::load_config_text(
      "cluster:\n  workers: 2\ntrain:\n  micro_batch: 64\nelastic:\n  min_workers: 2\n  "
      "max_workers: 0\n",
      "t");
  CHECK(c.elastic.min_workers == 2);
  CHECK(c.elastic.max_workers == 2);
  // YAML 1.2 spellings of true and false.
  for (const char* t : {"true", "True", "TRUE"}) {
    CHECK(cohort::load_config_text("elastic:\n  respawn: false\n", "t",
                                   {std::string("elastic.respawn=") + t})
              .elastic.respawn);
  }
  for (const char* f : {"false", "False", "FALSE"}) {
    CHECK_FALSE(cohort::load_config_text(std::string("elastic:\n  respawn: ") + f + "\n", "t")
                    .elastic.respawn);
  }
  // In the dump as true / false, and in the hash.
  const config a = cohort::load_config_text("elastic:\n  respawn: true\n", "a");
  const config b = cohort::load_config_text("elastic:\n  respawn: false\n", "a");
  CHECK(cohort::dump_config(b).find(
            "elastic:\n  min_workers: 1\n  max_workers: 1\n  "
            "respawn: false\n  spares: 0\n  pause_timeout_ms: 60000\n  straggler_factor: 0.0\n") !=
        std::string::npos);
  CHECK(cohort::config_hash(a) != cohort::config_hash(b));
}

TEST_CASE(
    "elastic.spares: a full world takes them, a world with room is refused, naming the line") {
  const std::string batch = "train:\n  global_batch: 64\n  micro_batch: 16\n";
  const config c =
      cohort::load_config_text(batch + "cluster:\n  workers: 2\nelastic:\n  spares: 1\n", "t");
  CHECK(c.elastic.spares == 1);
  CHECK(c.elastic.max_workers == 2);
  try {
    cohort::load_config_text(
        batch + "cluster:\n  workers: 2\nelastic:\n  max_workers: 3\n  spares: 1\n", "cfg.yaml");
    FAIL("a spare that would join as a member was accepted");
  } catch (const std::exception& e) {
    const std::string what = e.what();
    CHECK_MESSAGE(what.find("cfg.yaml:8") != std::string::npos, what);
    CHECK_MESSAGE(what.find("set max_workers to 2, or spares to 0") != std::string::npos, what);
  }
  CHECK_THROWS(cohort::load_config_text("elastic:\n  spares: -1\n", "t"));
  // A straggler bound of 1 or less would name a worker as fast as the others.
  CHECK(
      cohort::load_config_text("elastic:\n  straggler_factor: 2\n", "t").elastic.straggler_factor ==
      2.0f);
  CHECK_THROWS_WITH(cohort::load_config_text("elastic:\n  straggler_factor: 1\n", "t"),
                    doctest::Contains("use 0 for off, or a factor above 1"));
}

TEST_CASE("faults: parsed at load, dumped canonically, hashed, set from the command line") {
  const std::string text =
      "train:\n  steps: 100\nfaults:\n"
      "  - kill rank=0 at step=30\n"
      "  - \"hang  rank=0   at step=10 for=3000ms\"\n"
      "  - random kill mtbf=15steps seed=1\n";
  const config c = cohort::load_config_text(text, "t");
  REQUIRE(c.faults.size() == 3);
  CHECK(c.faults[0].kind == cohort::faults::fault_kind::kill);
  CHECK(c.faults[0].at_step == 30);
  CHECK(c.faults[1].kind == cohort::faults::fault_kind::hang);
  CHECK(c.faults[1].duration_ms == 3000);
  CHECK(c.faults[1].text == "hang  rank=0   at step=10 for=3000ms");  // as written
  CHECK(c.faults[2].mtbf_steps == 15.0);
  // The dump holds the canonical texts, a block list after the sections.
  const std::string dump = cohort::dump_config(c);
  CHECK(dump.size() > 0);
  const std::string tail =
      "faults:\n"
      "  - \"kill rank=0 at step=30\"\n"
      "  - \"hang rank=0 at step=10 for=3s\"\n"
      "  - \"random kill mtbf=15steps seed=1\"\n";
  CHECK(dump.size() >= tail.size());
  CHECK(dump.compare(dump.size() - tail.size(), tail.size(), tail) == 0);
  const config back = cohort::load_config_text(dump, "dump");
  check_equal(c, back);
  CHECK(cohort::dump_config(back) == dump);
  // No faults: an empty list, in the dump as [].
  const config none = cohort::load_config_text("train:\n  steps: 100\n", "t");
  CHECK(none.faults.empty());
  CHECK(cohort::dump_config(none).find("\nfaults: []\n") != std::string::npos);
  CHECK(cohort::load_config_text("faults: []\n", "t").faults.empty());

  // The hash follows the faults' meaning, not their spelling.
  const config respelled = cohort::load_config_text(
      "train:\n  steps: 100\nfaults:\n  - kill at step=30 rank=0\n  - hang rank=0 at "
      "step=10 for=3s\n  - random kill seed=1 mtbf=15steps\n",
      "t");
  CHECK(cohort::config_hash(respelled) == cohort::config_hash(c));
  CHECK(cohort::config_hash(none) != cohort::config_hash(c));
  const config other =
      cohort::load_config_text("train:\n  steps: 100\nfaults:\n  - kill rank=0 at step=31\n", "t");
  CHECK(cohort::config_hash(other) != cohort::config_hash(c));

  // --set replaces the whole list, like any other key; [] clears it.
  config s = cohort::load_config_text(text, "t", {"faults=[\"scale to=1 at step=3\"]"});
  REQUIRE(s.faults.size() == 1);
  CHECK(s.faults[0].kind == cohort::faults::fault_kind::scale);
  CHECK(s.faults[0].to_workers == 1);
  s = cohort::load_config_text(text, "t", {"faults=[]"});
  CHECK(s.faults.empty());

  // A bad entry is a config error (exit 2) at the entry's line and the mistake's column.
  try {
    cohort::load_config_text(
        "faults:\n  - kill rank=0 at step=1\n  - slow rank=0 factor=0.5 "
        "from step=1 to step=2\n",
        "run.yaml");
    FAIL("expected a config_error");
  } catch (const config_error& e) {
    CHECK(e.exit_status() == cohort::exit_usage);
    REQUIRE(e.issues().size() == 1);
    // Entry at column 5, "0.5" at column 20 of the spec: 5 + 20 - 1.
    CHECK(e.issues()[0].format() ==
          "run.yaml:3:24: faults[1]: factor must be >= 1, got 0.5 (compute takes factor times as "
          "long: factor=3 is three times slower)");
  }
}

TEST_CASE("config_hash is the SHA-256 of the dump") {
  const config a = cohort::load_config_text("train:\n  lr: 0.1\n", "a");
  const config b = cohort::load_config_text("train:\n  lr: 0.1\n", "elsewhere");
  const config c = cohort::load_config_text("train:\n  lr: 0.2\n", "a");
  const std::string h = cohort::config_hash(a);
  CHECK(h.size() == 64);
  CHECK(h.find_first_not_of("0123456789abcdef") == std::string::npos);
  CHECK(h == cohort::sha256_hex(cohort::dump_config(a)));
  CHECK(h == cohort::config_hash(b));  // where it was read from does not matter
  CHECK(h != cohort::config_hash(c));
}

TEST_CASE("did-you-mean suggestions") {
  auto first_message = [](const std::string& text) {
    const auto issues = issues_of(text);
    REQUIRE(issues.size() == 1);
    return issues[0].message;
  };
  CHECK(first_message("fault_tolerence:\n  keep: 2\n").find("did you mean fault_tolerance?") !=
        std::string::npos);
  CHECK(first_message("Train:\n  lr: 0.1\n").find("did you mean train?") != std::string::npos);
  // A swap of two letters is one edit.
  CHECK(first_message("train:\n  rl: 0.1\n").find("did you mean train.lr?") != std::string::npos);
  // A prefix of three or more letters.
  CHECK(first_message("train:\n  warmup: 10\n").find("did you mean train.warmup_steps?") !=
        std::string::npos);
  CHECK(first_message("model:\n  n_heads: 4\n").find("did you mean model.n_head?") !=
        std::string::npos);
  CHECK(first_message("train:\n  heartbeat_ms: 4\n")
            .find("did you mean fault_tolerance.heartbeat_ms? it belongs in section "
                  "fault_tolerance") != std::string::npos);
  // Two letters are never "close" to another two letters two edits away ("xy" vs "dp").
  CHECK(first_message("model:\n  xy: 1\n").find("did you mean") == std::string::npos);
  // Nothing close: the message lists what exists instead of guessing.
  const std::string none = first_message("control:\n  zzzzzz: 1\n");
  CHECK(none.find("did you mean") == std::string::npos);
  CHECK(none.find("keys: bind, max_message_bytes") != std::string::npos);
  const auto set = issues_of("train:\n  lr: 0.1\n", {"fault_tolerance.timeout=100"});
  REQUIRE(set.size() == 1);
  CHECK(set[0].message.find("did you mean fault_tolerance.timeout_ms?") != std::string::npos);
}

TEST_CASE("every config in configs/ is valid") {
  int seen = 0;
  for (const auto& f : std::filesystem::directory_iterator(source_dir + "/configs")) {
    if (f.path().extension() != ".yaml") continue;
    CAPTURE(f.path().string());
    ++seen;
    try {
      cohort::load_config(f.path().string());
    } catch (const config_error& e) {
      FAIL_CHECK(e.what());
    }
  }
  CHECK(seen >= 4);
}

TEST_CASE("the shipped configs say what they promise") {
  const config mlp = cohort::load_config(source_dir + "/configs/fashion_mlp.yaml");
  CHECK(mlp.model.kind == "mlp");
  CHECK(mlp.model.hidden == std::vector<int>{256, 128});
  CHECK(mlp.data.dataset == "fashion_mnist");
  CHECK(mlp.train.optimizer == "adamw");
  CHECK(mlp.cluster.workers == 1);
  CHECK(mlp.parallel.dp == 1);

  // The dp4 config is the same run on four workers: only the grid (and where its
  // checkpoints go, so the two runs do not overwrite each other) differs.
  config dp4 = cohort::load_config(source_dir + "/configs/fashion_mlp_dp4.yaml");
  CHECK(dp4.cluster.workers == 4);
  CHECK(dp4.parallel.dp == 4);
  CHECK(dp4.train.global_batch / dp4.train.micro_batch >= 4);
  CHECK(dp4.fault_tolerance.checkpoint_dir != mlp.fault_tolerance.checkpoint_dir);
  dp4.cluster.workers = 1;
  dp4.parallel.dp = 1;
  dp4.elastic = mlp.elastic;  // resolved from cluster.workers
  dp4.fault_tolerance.checkpoint_dir = mlp.fault_tolerance.checkpoint_dir;
  CHECK(cohort::dump_config(dp4) == cohort::dump_config(mlp));

  const config gpt = cohort::load_config(source_dir + "/configs/kjv_gpt.yaml");
  CHECK(gpt.model.kind == "gpt");
  CHECK(gpt.data.dataset == "kjv");
  CHECK(gpt.model.n_layer == 4);
  CHECK(gpt.model.n_head == 4);
  CHECK(gpt.model.d_model == 128);
  CHECK(gpt.model.context == 128);
  CHECK(gpt.train.global_batch == 16);
  CHECK(gpt.train.grad_clip == 1.0f);
  CHECK(gpt.train.warmup_steps > 0);
  CHECK(gpt.train.lr_schedule == "cosine");
  // Sized for under 10 minutes at ~12k tokens/s on one core (docs/config.md).
  const double tokens = double(gpt.train.steps) * gpt.train.global_batch * gpt.model.context;
  CHECK(tokens / 12000.0 < 600.0);

  // The DP GPT config is the same run on two workers with smaller gradient buckets.
  config gpt2 = cohort::load_config(source_dir + "/configs/kjv_gpt_dp2.yaml");
  CHECK(gpt2.cluster.workers == 2);
  CHECK(gpt2.parallel.dp == 2);
  CHECK(gpt2.train.global_batch / gpt2.train.micro_batch == 2);
  CHECK(gpt2.comm.bucket_mb < gpt.comm.bucket_mb);
  gpt2.cluster.workers = 1;
  gpt2.parallel.dp = 1;
  gpt2.elastic = gpt.elastic;
  gpt2.train.micro_batch = gpt.train.micro_batch;
  gpt2.comm = gpt.comm;
  gpt2.fault_tolerance.checkpoint_dir = gpt.fault_tolerance.checkpoint_dir;
  CHECK(cohort::dump_config(gpt2) == cohort::dump_config(gpt));

  // The HA quickstart is the quickstart with two standbys and a local etcd (and a
  // checkpoint folder of its own).
  const config quick = cohort::load_config(source_dir + "/configs/quickstart.yaml");
  config ha = cohort::load_config(source_dir + "/configs/quickstart_ha.yaml");
  CHECK(quick.ha.standbys == 0);
  CHECK(ha.ha.standbys == 2);
  CHECK(ha.ha.etcd_local);
  CHECK(ha.fault_tolerance.checkpoint_dir == "checkpoints/quickstart_ha");
  ha.ha = quick.ha;
  ha.fault_tolerance.checkpoint_dir = quick.fault_tolerance.checkpoint_dir;
  CHECK(cohort::dump_config(ha) == cohort::dump_config(quick));
}

TEST_CASE("configs/reference.yaml is the generated reference and holds every key") {
  const std::string path = source_dir + "/configs/reference.yaml";
  const std::string text = read_text(path);
  CHECK_MESSAGE(text == cohort::reference_config_yaml(),
                "regenerate: cohort validate --reference > configs/reference.yaml");
  // Loading it gives the defaults (dp and the elastic bounds resolved from one worker).
  const config c = cohort::load_config(path);
  check_equal(c, one_worker_defaults());
  // Every key, written out, with a comment above it.
  const std::string dumped = cohort::dump_config(c);
  CHECK(key_paths(text) == key_paths(dumped));
  std::istringstream lines(text);
  std::string line, previous;
  int keys = 0, top_level = 0;
  while (std::getline(lines, line)) {
    if (line.rfind("  ", 0) == 0 && line[2] != '#') {
      ++keys;
      CHECK_MESSAGE(previous.rfind("  # ", 0) == 0, line);
    }
    if (line == "faults: []") {
      ++top_level;
      CHECK_MESSAGE(previous.rfind("# ", 0) == 0, line);
    }
    previous = line;
  }
  CHECK(keys == 85);
  CHECK(top_level == 1);
  // The commented examples are the language's own examples, and each of them parses.
  size_t examples = 0;
  for (size_t at = text.find("#   - "); at != std::string::npos; at = text.find("#   - ", at + 1)) {
    const std::string spec = text.substr(at + 6, text.find('\n', at) - at - 6);
    CAPTURE(spec);
    CHECK_NOTHROW(cohort::faults::parse_fault(spec));
    ++examples;
  }
  CHECK(examples == 7);
}

TEST_CASE("docs/config.md holds the generated key table") {
  const std::string doc = read_text(source_dir + "/docs/config.md");
  CHECK_MESSAGE(doc.find(cohort::config_keys_markdown()) != std::string::npos,
                "regenerate the table: cohort validate --keys-markdown");
}

TEST_CASE("parallel.schedule and parallel.activation_checkpointing") {
  // Defaults: 1f1b (same bubble as gpipe, less activation memory), no recomputation.
  config c = cohort::load_config_text("train:\n  lr: 0.1\n", "t");
  CHECK(c.parallel.schedule == "1f1b");
  CHECK(c.parallel.activation_checkpointing == false);

  // Both values are accepted, from the file and from --set (which wins).
  c = cohort::load_config_text("parallel:\n  schedule: gpipe\n", "t");
  CHECK(c.parallel.schedule == "gpipe");
  c = cohort::load_config_text("parallel:\n  schedule: gpipe\n", "t", {"parallel.schedule=1f1b"});
  CHECK(c.parallel.schedule == "1f1b");
  c = cohort::load_config_text("parallel:\n  activation_checkpointing: false\n", "t");
  CHECK(c.parallel.activation_checkpointing == false);
  c = cohort::load_config_text("parallel:\n  activation_checkpointing: true\n", "t");
  CHECK(c.parallel.activation_checkpointing == true);
  // Explicit stage cuts, pp of a GPT, and pp * tp > 1 elastic bounds in whole replicas.
  c = cohort::load_config_text(
      "cluster:\n  workers: 4\nmodel:\n  kind: gpt\n  n_layer: 4\nparallel:\n  pp: 2\n"
      "  stage_layers: [1, 3]\ndata:\n  dataset: kjv\ntrain:\n  global_batch: 8\n  micro_batch: "
      "2\n",
      "t");
  CHECK(c.parallel.dp == 2);
  CHECK(c.parallel.stage_layers == std::vector<int>{1, 3});
  CHECK(c.elastic.min_workers == 4);

  // The resolved config round-trips, the schedule written as a plain word.
  c = cohort::load_config_text("parallel:\n  schedule: gpipe\n", "t");
  const std::string dumped = cohort::dump_config(c);
  CHECK(dumped.find("\n  schedule: gpipe\n") != std::string::npos);
  CHECK(dumped.find("\n  activation_checkpointing: false\n") != std::string::npos);
  check_equal(cohort::load_config_text(dumped, "dump"), c);
  // The schedule is part of the run's identity.
  CHECK(cohort::config_hash(c) !=
        cohort::config_hash(cohort::load_config_text("parallel:\n  schedule: 1f1b\n", "t")));

  struct bad {
    std::string yaml;
    std::vector<std::string> sets;
    std::string file;
    int line, col;
    std::string key, message;
  };
  const std::vector<bad> cases = {
      {"parallel:\n  schedule: gpip\n",
       {},
       "cfg.yaml",
       2,
       13,
       "parallel.schedule",
       "'gpip' is not allowed (use one of gpipe, 1f1b; did you mean gpipe?)"},
      {"parallel:\n  schedule: 1fb1\n",
       {},
       "cfg.yaml",
       2,
       13,
       "parallel.schedule",
       "did you mean 1f1b?"},
      {"parallel:\n  schedule: interleaved\n",
       {},
       "cfg.yaml",
       2,
       13,
       "parallel.schedule",
       "use one of gpipe, 1f1b"},
      {"parallel:\n  schedule: [gpipe]\n",
       {},
       "cfg.yaml",
       2,
       13,
       "parallel.schedule",
       "(write a single value)"},
      {"parallel:\n  schedule:\n", {}, "cfg.yaml", 2, 3, "parallel.schedule", "has no value"},
      {"train:\n  lr: 0.1\n",
       {"parallel.schedule=GPipe"},
       "--set",
       0,
       0,
       "parallel.schedule",
       "did you mean gpipe?"},
      {"parallel:\n  shedule: gpipe\n",
       {},
       "cfg.yaml",
       2,
       3,
       "parallel.shedule",
       "did you mean parallel.schedule?"},
      {"parallel:\n  activation_checkpointing: yes\n",
       {},
       "cfg.yaml",
       2,
       29,
       "parallel.activation_checkpointing",
       "expected true or false, got yes"},
  };
  for (const bad& b : cases) {
    CAPTURE(b.yaml);
    const std::vector<config_issue> issues = issues_of(b.yaml, b.sets);
    CAPTURE(all_text(issues));
    REQUIRE(issues.size() == 1);
    const config_issue& i = issues[0];
    CHECK(i.file == b.file);
    if (b.line) CHECK(i.line == b.line);
    if (b.col) CHECK(i.col == b.col);
    CHECK(i.key == b.key);
    CHECK_MESSAGE(i.message.find(b.message) != std::string::npos, i.message);
  }
}

TEST_CASE("train.onebit keys: nested or dotted in YAML, --set, lists of strings, and the rules") {
  config c = cohort::load_config_text(
      "train:\n  optimizer: onebit_adam\n  onebit:\n    freeze_step: 5\n    exclude: "
      "[\"*.bias\"]\n",
      "t");
  CHECK(c.train.onebit_freeze_step == 5);
  CHECK(c.train.onebit_exclude == std::vector<std::string>{"*.bias"});
  c = cohort::load_config_text("train:\n  onebit.freeze_step: 7\n", "t",
                               {"train.onebit.exclude=[\"a*\", \"b\"]"});
  CHECK(c.train.onebit_freeze_step == 7);
  CHECK(c.train.onebit_exclude == std::vector<std::string>{"a*", "b"});
  CHECK(
      cohort::load_config_text("train:\n  onebit.exclude: []\n", "t").train.onebit_exclude.empty());
  // Wrong shapes and names, with the position.
  std::string t = all_text(issues_of("train:\n  onebit:\n    freeze: 5\n"));
  CHECK(t.find("cfg.yaml:3") != std::string::npos);
  CHECK(t.find("train.onebit.freeze") != std::string::npos);
  t = all_text(issues_of("train:\n  onebit.exclude: \"*.bias\"\n"));
  CHECK(t.find("expected a list of strings") != std::string::npos);
  t = all_text(issues_of("train:\n  onebit.exclude: [\"\", x]\n"));
  CHECK(t.find("train.onebit.exclude[0]") != std::string::npos);
  t = all_text(issues_of("train:\n  onebit.freeze_step: 0\n"));
  CHECK(t.find("train.onebit.freeze_step") != std::string::npos);
  // Combinations that are not built are refused, naming every key involved.
  t = all_text(issues_of("train:\n  optimizer: onebit_adam\ncomm:\n  compression: fp8\n"));
  CHECK(t.find("onebit_adam compresses its own sums") != std::string::npos);
  t =
      all_text(issues_of("model:\n  kind: gpt\nparallel:\n  pp: 2\ncluster:\n  workers: 2\n"
                         "comm:\n  compression: bf16\n"));
  CHECK(t.find("built for whole-model jobs") != std::string::npos);
  t = all_text(issues_of("comm:\n  error_feedback: true\n"));
  CHECK(t.find("comm.compression is none") != std::string::npos);
}

TEST_CASE("ha keys: defaults, etcd local or a list of URLs, round trip, and the rules") {
  // Defaults: one coordinator, no etcd, as before standbys existed.
  config c = cohort::load_config_text("train:\n  lr: 0.1\n", "t");
  CHECK(c.ha.standbys == 0);
  CHECK(c.ha.etcd_local);
  CHECK(c.ha.etcd_endpoints.empty());
  CHECK(c.ha.lease_ttl_s == 1);
  CHECK(c.ha.etcd_heartbeat_ms == 10);
  CHECK(c.ha.etcd_election_ms == 100);
  CHECK(c.ha.reattach_ms == 30000);
  CHECK(cohort::dump_config(c).find("\nha:\n  standbys: 0\n  etcd: local\n  lease_ttl_s: 1\n"
                                    "  etcd_heartbeat_ms: 10\n  etcd_election_ms: 100\n"
                                    "  reattach_ms: 30000\nfaults: []\n") != std::string::npos);

  // A list of client URLs, flow or block, names the etcd; `local` (quoted or not) is the
  // word, and a later --set of either form wins.
  c = cohort::load_config_text(
      "ha:\n  standbys: 2\n  etcd: [http://10.0.0.5:2379, \"http://etcd-1.lan:2379\"]\n", "t");
  CHECK(c.ha.standbys == 2);
  CHECK_FALSE(c.ha.etcd_local);
  CHECK(c.ha.etcd_endpoints ==
        std::vector<std::string>{"http://10.0.0.5:2379", "http://etcd-1.lan:2379"});
  const std::string dumped = cohort::dump_config(c);
  CHECK(dumped.find("\n  etcd: [\"http://10.0.0.5:2379\", \"http://etcd-1.lan:2379\"]\n") !=
        std::string::npos);
  check_equal(cohort::load_config_text(dumped, "dump"), c);
  CHECK(cohort::dump_config(cohort::load_config_text(dumped, "dump")) == dumped);
  c = cohort::load_config_text("ha:\n  etcd:\n    - http://a:2379\n    - http://[::1]:2379\n", "t");
  CHECK(c.ha.etcd_endpoints == std::vector<std::string>{"http://a:2379", "http://[::1]:2379"});
  CHECK(cohort::load_config_text("ha:\n  etcd: local\n", "t").ha.etcd_local);
  CHECK(cohort::load_config_text("ha:\n  etcd: \"local\"\n", "t").ha.etcd_local);
  c = cohort::load_config_text("ha:\n  etcd: [\"http://a:1\"]\n", "t", {"ha.etcd=local"});
  CHECK(c.ha.etcd_local);
  CHECK(c.ha.etcd_endpoints.empty());
  c = cohort::load_config_text(
      "train:\n  lr: 0.1\n", "t",
      {"ha.etcd=[\"http://h:2379\"]", "ha.standbys=1", "ha.lease_ttl_s=60",
       "ha.etcd_heartbeat_ms=100", "ha.etcd_election_ms=500", "ha.reattach_ms=100"});
  CHECK(c.ha.etcd_endpoints == std::vector<std::string>{"http://h:2379"});
  CHECK(c.ha.lease_ttl_s == 60);
  CHECK(c.ha.etcd_election_ms == 500);  // exactly 5 x heartbeat is allowed
  CHECK(c.ha.reattach_ms == 100);
  check_equal(cohort::load_config_text(cohort::dump_config(c), "dump"), c);

  // The keys are part of the run's identity.
  const std::string h = cohort::config_hash(cohort::load_config_text("ha:\n  standbys: 0\n", "t"));
  CHECK(h != cohort::config_hash(cohort::load_config_text("ha:\n  standbys: 1\n", "t")));
  CHECK(h != cohort::config_hash(cohort::load_config_text("ha:\n  etcd: [\"http://a:1\"]\n", "t")));

  // Coordinator faults need a standby; with one they load.
  c = cohort::load_config_text(
      "ha:\n  standbys: 1\nfaults:\n  - kill coordinator at step=3\n  - partition "
      "coordinator at step=5 for=2s\n",
      "t");
  REQUIRE(c.faults.size() == 2);
  CHECK(c.faults[0].coordinator);
  CHECK(c.faults[1].kind == cohort::faults::fault_kind::partition);

  struct bad {
    std::string yaml;
    std::vector<std::string> sets;
    std::string file;
    int line, col;
    std::string key, message;
  };
  const std::string gpt_pp2 =
      "cluster:\n  workers: 4\nmodel:\n  kind: gpt\nparallel:\n  pp: 2\ndata:\n  dataset: "
      "kjv\ntrain:\n  global_batch: 8\n  micro_batch: 2\n";
  const std::vector<bad> cases = {
      {"ha:\n  standbys: -1\n", {}, "cfg.yaml", 2, 13, "ha.standbys", "must be >= 0, got -1"},
      {"ha:\n  etcd: remote\n",
       {},
       "cfg.yaml",
       2,
       9,
       "ha.etcd",
       "expected local or a list of etcd client URLs, got remote (write local, or a list of "
       "etcd client URLs such as [\"http://10.0.0.5:2379\"])"},
      {"ha:\n  etcd: locl\n", {}, "cfg.yaml", 2, 9, "ha.etcd", "(did you mean local?)"},
      {"ha:\n  etcd: http://h:2379\n",
       {},
       "cfg.yaml",
       2,
       9,
       "ha.etcd",
       "(write it as a list: [\"http://h:2379\"])"},
      {"ha:\n  etcd: {a: 1}\n", {}, "cfg.yaml", 2, 9, "ha.etcd", "got a mapping"},
      {"ha:\n  etcd:\n", {}, "cfg.yaml", 2, 3, "ha.etcd", "has no value"},
      {"ha:\n  etcd: []\n",
       {},
       "cfg.yaml",
       2,
       9,
       "ha.etcd",
       "an empty list names no etcd (write local for an etcd that cohort launch starts, or "
       "the client URLs of yours)"},
      {"ha:\n  etcd: [\"https://h\"]\n",
       {},
       "cfg.yaml",
       2,
       10,
       "ha.etcd[0]",
       "'https://h' has no port (write https://h:2379 for etcd's client port)"},
      {"ha:\n  etcd: [h:2379]\n",
       {},
       "cfg.yaml",
       2,
       10,
       "ha.etcd[0]",
       "'h:2379' has no scheme (write https://h:2379 or http://h:2379)"},
      {"ha:\n  etcd: [\"grpc://h:2379\"]\n",
       {},
       "cfg.yaml",
       2,
       10,
       "ha.etcd[0]",
       "'grpc://h:2379' is not an http(s) URL (write https://HOST:PORT or http://HOST:PORT, e.g. "
       "https://10.0.0.5:2379)"},
      {"ha:\n  etcd:\n    - http://a:2379\n    - http://b\n",
       {},
       "cfg.yaml",
       4,
       7,
       "ha.etcd[1]",
       "'http://b' has no port (write http://b:2379 for etcd's client port)"},
      {"ha:\n  etcd: [\"http://:2379\"]\n", {}, "cfg.yaml", 2, 10, "ha.etcd[0]", "has no host"},
      {"ha:\n  etcd: [\"http://a:99999\"]\n",
       {},
       "cfg.yaml",
       2,
       10,
       "ha.etcd[0]",
       "the port must be a number from 1 to 65535, got 99999"},
      {"ha:\n  etcd: [\"http://a:0\"]\n", {}, "cfg.yaml", 2, 10, "ha.etcd[0]", "got 0"},
      {"ha:\n  etcd: [\"http://a:2379/v3\"]\n",
       {},
       "cfg.yaml",
       2,
       10,
       "ha.etcd[0]",
       "has something after the port"},
      {"ha:\n  etcd: [\"http://::1:2379\"]\n",
       {},
       "cfg.yaml",
       2,
       10,
       "ha.etcd[0]",
       "write an IPv6 address in brackets (e.g. http://[::1]:2379)"},
      {"ha:\n  etcd: [\"http://a:1\", \"http://a:1\"]\n",
       {},
       "cfg.yaml",
       2,
       24,
       "ha.etcd[1]",
       "'http://a:1' is listed twice (first as ha.etcd[0]; keep one)"},
      {"ha:\n  etcd: [\"http://a:1\", [x]]\n",
       {},
       "cfg.yaml",
       2,
       24,
       "ha.etcd[1]",
       "expected an etcd client URL, got a list"},
      {"train:\n  lr: 0.1\n",
       {"ha.etcd=[\"http://h\"]"},
       "--set",
       0,
       0,
       "ha.etcd[0]",
       "in 'ha.etcd=[\"http://h\"]': 'http://h' has no port"},
      {"ha:\n  lease_ttl_s: 0\n",
       {},
       "cfg.yaml",
       2,
       16,
       "ha.lease_ttl_s",
       "must be in [1, 60], got 0"},
      {"ha:\n  lease_ttl_s: 61\n", {}, "cfg.yaml", 2, 16, "ha.lease_ttl_s", "got 61"},
      {"ha:\n  reattach_ms: 99\n",
       {},
       "cfg.yaml",
       2,
       16,
       "ha.reattach_ms",
       "must be >= 100, got 99"},
      {"ha:\n  etcd_heartbeat_ms: 0\n",
       {},
       "cfg.yaml",
       2,
       22,
       "ha.etcd_heartbeat_ms",
       "must be >= 1, got 0"},
      {"ha:\n  etcd_election_ms: 60000\n",
       {},
       "cfg.yaml",
       2,
       21,
       "ha.etcd_election_ms",
       "must be in [1, 50000], got 60000"},
      {"ha:\n  etcd_heartbeat_ms: 50\n  etcd_election_ms: 200\n",
       {},
       "cfg.yaml",
       3,
       21,
       "ha.etcd_election_ms",
       "etcd_election_ms = 200 is below 5 x etcd_heartbeat_ms = 250 (etcd refuses to start with "
       "an election timeout under 5 heartbeats; use etcd_election_ms >= 250, or a shorter "
       "etcd_heartbeat_ms)"},
      // The election timeout left at its default: the heartbeat that broke it is the place.
      {"ha:\n  etcd_heartbeat_ms: 30\n",
       {},
       "cfg.yaml",
       2,
       22,
       "ha.etcd_heartbeat_ms",
       "etcd_election_ms = 100 is below 5 x etcd_heartbeat_ms = 150"},
      {gpt_pp2 + "ha:\n  standbys: 1\n",
       {},
       "cfg.yaml",
       13,
       13,
       "ha.standbys",
       "coordinator standbys cover data-parallel jobs: a pipeline or tensor-parallel job's seats "
       "are not rebuilt by a new leader yet, and this one has pp = 2 x tp = 1 (set ha.standbys: "
       "0 or parallel.pp = parallel.tp = 1)"},
      {gpt_pp2,
       {"ha.standbys=1"},
       "--set",
       0,
       0,
       "ha.standbys",
       "in 'ha.standbys=1': coordinator standbys cover data-parallel jobs"},
      {"faults:\n  - kill coordinator at step=3\n",
       {},
       "cfg.yaml",
       2,
       5,
       "faults[0]",
       "'kill coordinator at step=3' needs ha.standbys >= 1: without a standby, losing the "
       "coordinator ends the run (set ha.standbys: 1 or more, or remove the fault)"},
      {"ha:\n  standbys: 0\nfaults:\n  - partition coordinator at step=3 for=1s\n",
       {},
       "cfg.yaml",
       4,
       5,
       "faults[0]",
       "'partition coordinator at step=3 for=1s' needs ha.standbys >= 1"},
      {"ha:\n  standbys: 1\nfaults:\n  - hang coordinator at step=3 for=1s\n",
       {},
       "cfg.yaml",
       4,
       10,
       "faults[0]",
       "'coordinator' does not apply to hang"},
      {"ha:\n  standby: 1\n", {}, "cfg.yaml", 2, 3, "ha.standby", "did you mean ha.standbys?"},
  };
  for (const bad& b : cases) {
    CAPTURE(b.yaml);
    const std::vector<config_issue> issues = issues_of(b.yaml, b.sets);
    CAPTURE(all_text(issues));
    REQUIRE(issues.size() == 1);
    const config_issue& i = issues[0];
    CHECK(i.file == b.file);
    CHECK(i.line == b.line);
    CHECK(i.col == b.col);
    CHECK(i.key == b.key);
    CHECK_MESSAGE(i.message.find(b.message) != std::string::npos, i.message);
    CHECK(i.message.find('(') != std::string::npos);
  }
}
