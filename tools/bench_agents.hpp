// `cohort bench control --agents N`: the control plane at scale. N simulated workers in this
// process, each its own ZeroMQ DEALER connection speaking the real wire protocol
// (docs/protocol.md: register, heartbeat, roster updates; CURVE with the job's worker key
// unless --insecure), against a `cohort coordinator --control-only` child process. Measures
// how the job forms, what a steady state costs the coordinator, and how a stop of a few
// agents is seen. Owns the measurement; the command line is tools/cmd_bench_control.cpp.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace cohort::cli {

struct agents_options {
  int agents = 0;  ///< 0: not this benchmark
  /// 0: each agent is one worker with its own connection. K > 0: each agent is a host agent
  /// (docs/agent.md) relaying K workers over its one connection, with host beats.
  int per_host = 0;
  /// With per_host: host beats on a common grid of the period, as `cohort agent` sends
  /// them (hosts' clocks agreeing within skew_ms: each host's beat lands uniformly in
  /// [0, skew_ms) after the grid's tick); false: spread evenly over the period, as
  /// unsynchronised processes would.
  bool aligned = true;
  double skew_ms = 2.0;
  int heartbeat_ms = 100;
  int timeout_ms = 500;
  int join_window_ms = -1;  ///< fault_tolerance.join_window_ms; -1: the config's default
  /// Agents ask for an answer on one beat in this many (heartbeat.want_ack); 0: as a worker
  /// with the default coordinator timeout does (actors::max_beats_per_ack); 1: every beat.
  int ack_every = 0;
  /// Seconds of steady state measured (coordinator CPU and RSS, false positives).
  double steady_s = 10;
  /// Share of the agents (in percent, at least one agent) that stop heartbeating at once.
  double stop_percent = 1;
  /// Forming gives up (and is reported as not formed) after this many seconds.
  double form_limit_s = 120;
  bool secure = true;  ///< the job's keys, as `cohort launch` runs by default
  /// Non-empty: the coordinator logs at info level (each generation, who joined together)
  /// and its log is copied here at the end, to see where a formation spent its time.
  std::string coordinator_log;
};

/// Runs the benchmark and returns its result: what it measured, under "form", "steady" and
/// "stop" (docs/benchmarks.md, "The control plane at scale", lists every field). Throws
/// cohort::error when the coordinator cannot be started.
nlohmann::json run_agents_bench(const agents_options& o);

/// The result as a table on stdout.
void print_agents_table(const nlohmann::json& result);

/// `cohort bench control --kills N --per-host K`: real processes. A control-only
/// coordinator, K workers under one `cohort agent`, and K workers joined directly (no
/// supervisor, as `cohort worker --join` from a shell), one setup after the other: N times a
/// worker is SIGKILLed and the time until the coordinator's roster no longer lists it alive
/// is measured (status asked in a tight loop), then the worker is back before the next kill.
nlohmann::json run_kills_bench(const agents_options& o, int kills);
void print_kills_table(const nlohmann::json& result);

}  // namespace cohort::cli
