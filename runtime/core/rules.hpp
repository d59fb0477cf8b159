// The rules that tie settings of two layers together, each stated once. A config file meets
// them in config_rules.cpp, which reports a broken one at the key's FILE:LINE:COL with advice;
// the layer that owns a rule guards its own entry point with the same predicate (a config
// built in code, a test or a bench never passes through the file's checks). Each rule names
// the layer that owns it and why it holds; the messages stay with their callers, since a
// file's reader and a library's caller need different advice.
#pragma once
#include <cstdint>
#include <string_view>

#include "runtime/core/comm_choices.hpp"

namespace cohort::rules {

/// runtime/net/membership: a worker is declared dead after timeout_ms without a heartbeat,
/// so the timeout must outlast one beat or every worker looks dead between two.
constexpr bool timeout_outlasts_heartbeat(int64_t heartbeat_ms, int64_t timeout_ms) {
  return timeout_ms > heartbeat_ms;
}

/// runtime/nn/gpt: attention cuts d_model into n_head heads of one width.
constexpr bool heads_divide_width(int64_t d_model, int64_t n_head) {
  return n_head >= 1 && d_model % n_head == 0;
}

/// runtime/nn/gpt_stage: tensor parallelism gives each of tp ranks whole heads (and, with
/// heads_divide_width, an equal slice of the 4 * d_model MLP width).
constexpr bool tp_divides_heads(int64_t n_head, int64_t tp) { return tp >= 1 && n_head % tp == 0; }

/// runtime/nn/device: train.device is cpu, auto, cuda or cuda:N (N a device number).
inline bool device_spec_valid(std::string_view spec) {
  if (spec == "cpu" || spec == "auto" || spec == "cuda") return true;
  if (spec.substr(0, 5) != "cuda:" || spec.size() == 5 || spec.size() > 9) return false;
  for (char ch : spec.substr(5))
    if (ch < '0' || ch > '9') return false;
  return true;
}
/// runtime/nn/device: a spec that names a GPU whatever the machine has (auto may not).
inline bool device_spec_names_gpu(std::string_view spec) {
  return spec != "cpu" && spec != "auto" && device_spec_valid(spec);
}

/// runtime/nn/gpt_partition: every pipeline stage holds at least one transformer block.
constexpr bool stages_fit_blocks(int64_t pp, int64_t n_layer) { return pp >= 1 && pp <= n_layer; }

/// runtime/train/stage_trainer: pipeline and tensor parallelism cut a GPT; others run whole.
inline bool model_splits(std::string_view kind) { return kind == "gpt"; }

/// runtime/comm/factory: hierarchical combines shared memory inside a host with Gloo among
/// hosts, which is what transport auto picks per pair; a forced transport leaves no room.
constexpr bool hierarchy_fits_transport(comm_hierarchy hierarchy, comm_transport transport) {
  return hierarchy != comm_hierarchy::hierarchical || transport == comm_transport::automatic;
}

/// runtime/ha: a new leader rebuilds a data-parallel job's roster from the workers that
/// reattach; the seats of a pipeline or tensor-parallel job are not rebuilt by it yet.
constexpr bool standbys_fit_grid(int64_t standbys, int64_t pp, int64_t tp) {
  return standbys == 0 || pp * tp == 1;
}

/// runtime/ha (the etcd `ha.etcd: local` starts): etcd refuses to start unless its election
/// timeout is at least 5 heartbeat intervals (etcd's embed.Config.Validate: "--election-timeout
/// should be at least as 5 times as --heartbeat-interval").
constexpr bool etcd_election_fits_heartbeat(int64_t heartbeat_ms, int64_t election_ms) {
  return election_ms >= 5 * heartbeat_ms;
}

}  // namespace cohort::rules
