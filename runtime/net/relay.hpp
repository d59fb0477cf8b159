// Host agents on the wire (docs/agent.md): how the coordinator names a worker that reaches it
// through its host's agent, and the agent's own table of its workers' heartbeats. Pure: no
// sockets, no clock of its own (tests/net/test_relay.cpp drives it as tables).
//
// A worker under an agent connects to the agent's ROUTER, the agent to the coordinator's.
// Frames travel with the usual ZeroMQ envelope of a proxy: the coordinator reads
// [agent id, worker id, frame] and answers the same way, so each relayed worker is a peer of
// its own there, named relay_peer(agent id, worker id). Heartbeats stop at the agent: once a
// heartbeat period it sends one host_beat listing the workers it heard within the timeout.
#pragma once
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "runtime/net/protocol.hpp"

namespace cohort::net {

/// A client registering with this name prefix is a host agent ("agent-HOST"): with keys, it
/// holds the launcher key, and its connection may relay its workers' frames.
bool is_agent_name(std::string_view name);

/// The peer name of worker WORKER behind agent AGENT: a byte no ZeroMQ routing id set by a
/// peer starts with here (the coordinator refuses direct peers that start with it), the
/// agent id's length, the agent id, the worker id. Both ids are 1..255 bytes.
std::string relay_peer(std::string_view agent, std::string_view worker);
/// Whether PEER names a relayed worker (relay_peer's first byte).
bool is_relay_peer(std::string_view peer);
/// (agent id, worker id) of a relay_peer name; nullopt when PEER is not one.
std::optional<std::pair<std::string_view, std::string_view>> split_relay_peer(std::string_view peer);
/// Whether PEER is a worker relayed by AGENT.
bool relayed_by(std::string_view peer, std::string_view agent);
/// Whether PEER == relay_peer(AGENT, WORKER), without building it.
bool is_relay_peer_of(std::string_view peer, std::string_view agent, std::string_view worker);

/// The exit code an agent reports for a worker it found silent past its timeout (hung):
/// below every real exit status.
inline constexpr int32_t exit_code_hung = -1;

/// The agent's table of its local workers' heartbeats: which it vouches for in a host_beat
/// (heard within the timeout), which fell silent past it (reported once as hung).
class relay_beats {
 public:
  using mono = std::chrono::steady_clock::time_point;
  /// HUNG_AFTER: silence that makes a worker past its first heartbeat hung (the job's
  /// fault_tolerance.timeout_ms); MAX_WORKERS: the most routing ids remembered.
  explicit relay_beats(std::chrono::milliseconds hung_after, std::size_t max_workers = 4096);

  /// WORKER's register_request passed through: its name and pid (for its exit notice).
  void on_register(const std::string& worker, const register_request& r, mono now);
  /// WORKER's heartbeat arrived at NOW.
  void on_beat(const std::string& worker, const heartbeat& hb, mono now);
  /// The next host_beat's entries at NOW: each worker heard within HUNG_AFTER (and not
  /// reported hung), with its newest beat, in routing-id order. A worker's beat that came
  /// just after the previous host beat is vouched for all the same, so all of a host's
  /// workers carry the same time at the coordinator, and a lost host's workers fall silent
  /// together: one roster change.
  std::vector<relayed_beat> take(mono now);

  struct silent {
    std::string worker;
    std::string name;
    int64_t pid = 0;
    std::chrono::milliseconds for_ms{0};
  };
  /// Workers past their first heartbeat and silent for longer than HUNG_AFTER at NOW, each
  /// once (until it beats again); only those whose name and pid are known.
  std::vector<silent> hung(mono now);
  /// The worker named NAME exited: forgotten (its successor registers anew).
  void forget_name(const std::string& name);
  /// Workers remembered.
  std::size_t size() const { return workers_.size(); }

 private:
  struct worker {
    std::string name;
    int64_t pid = 0;
    bool beaten = false;    ///< a heartbeat arrived at least once
    bool reported = false;  ///< reported hung since its last heartbeat
    heartbeat last;
    mono last_at{};
    mono seen{};  ///< last frame of any kind (eviction order)
  };
  worker& slot(const std::string& id, mono now);

  std::chrono::milliseconds hung_after_;
  std::size_t max_;
  std::unordered_map<std::string, worker> workers_;
};

}  // namespace cohort::net
