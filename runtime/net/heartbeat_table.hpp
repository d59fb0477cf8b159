// Liveness off the actor's mailbox: the coordinator's bridge thread records a live member's
// heartbeat here and answers it at once, so heartbeats never wait behind the actor's bulk
// work (rosters, the store, the job). The actor publishes who may beat here (each member
// with the peer that registered it, and whether it is past its first heartbeat) and the
// generation to acknowledge, and reads the beats back into its roster before it looks for
// the silent. Every other heartbeat (a member's first, an unknown or departed member, one
// from another peer, a generation ahead) still goes to the actor. Thread-safe; knows
// nothing of actors or sockets.
#pragma once
#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "runtime/net/membership.hpp"
#include "runtime/net/protocol.hpp"

namespace cohort::net {

class heartbeat_table {
 public:
  /// PERIOD: the heartbeat period members beat at; WINDOW: how long a late beat counts as
  /// evidence of lag (the timeout); MAX_LAG: the most lag() ever reports.
  explicit heartbeat_table(std::chrono::milliseconds period = std::chrono::milliseconds(100),
                           std::chrono::milliseconds window = std::chrono::milliseconds(500),
                           std::chrono::milliseconds max_lag = std::chrono::milliseconds(2000));

  /// One member as the actor publishes it.
  struct entry {
    membership::member_id id = 0;
    std::string peer;    ///< the connection that registered it: only it beats for the member
    bool alive = false;  ///< past its first heartbeat (that one goes to the actor)
  };

  /// Bridge thread: PEER's heartbeat for ID, which holds GENERATION, arrived at NOW. When ID
  /// is published alive with PEER and GENERATION is not ahead of the published generation,
  /// the beat is recorded and the generation to acknowledge returned; otherwise nullopt (the
  /// actor decides, nothing recorded).
  /// COUNTS_LAG false: a beat a host agent relayed (host_beat), whose lateness is its
  /// agent's, counted once per host by on_relay_beat.
  std::optional<std::uint64_t> on_beat(std::string_view peer, membership::member_id id,
                                       std::uint64_t generation, membership::mono_time now,
                                       bool counts_lag = true);

  /// Bridge thread: host agent AGENT's host_beat arrived at NOW. A late one is one piece of
  /// evidence of the coordinator's lag, however many workers it lists: one stalled host is
  /// its own stall, as one stalled worker is.
  void on_relay_beat(std::string_view agent, membership::mono_time now);

  /// Bridge thread: host agent AGENT's host_beat with BEATS arrived at NOW: its lateness as
  /// on_relay_beat, and each entry as on_beat of relay_peer(AGENT, entry.worker) under one
  /// lock and without building the peers' names. Per entry, in order: the generation to
  /// acknowledge, or nullopt (the actor decides).
  std::vector<std::optional<std::uint64_t>> on_host_beat(std::string_view agent,
                                                         const std::vector<relayed_beat>& beats,
                                                         membership::mono_time now);

  /// Actor: R's live members may beat here from now on, acknowledged with R's generation;
  /// anyone else goes to the actor. Beats recorded for members still live are kept.
  void publish(const membership::roster& r,
               const std::unordered_map<membership::member_id, std::string>& peer_of);

  /// Actor: ID's first heartbeat made it alive; its next ones are answered here.
  void mark_alive(membership::member_id id);

  /// Actor: R's members take the newest heartbeat recorded here (never an older one).
  void refresh(membership::roster& r) const;

  /// Heartbeats recorded and answered here so far.
  std::uint64_t answered() const;

  /// The coordinator's own lag at NOW, as the beats show it: how late (gap - period) at
  /// least late_quorum() beats of live members came, over the last one or two windows, at
  /// most max_lag. Members beat on their own clocks; many beats reaching the table late were
  /// held up on the coordinator's side, and then the silence of others may be the same
  /// delay. One late member is its own stall, not the coordinator's: it moves nothing. Zero
  /// when beats arrive on time, so a real death (of one member or of many while the rest
  /// beat on time) is seen at the timeout.
  std::chrono::milliseconds lag(membership::mono_time now) const;

  /// How many late beats make a lag: 2, or one member in 512 when there are more.
  std::size_t late_quorum() const;

 private:
  struct slot {
    std::string peer;
    bool alive = false;
    bool beaten = false;  ///< a beat was recorded here (its gaps are evidence of lag)
    membership::mono_time last{};
  };
  void note_delay(membership::mono_time now, membership::mono_time::duration delay);

  membership::mono_time::duration period_;
  membership::mono_time::duration window_;
  membership::mono_time::duration max_lag_;
  mutable std::mutex mu_;
  std::size_t quorum_locked() const;

  // The largest delays of the current window (a min-heap of at most the quorum), and the
  // lag the window before it agreed on.
  membership::mono_time window_start_{};
  std::vector<membership::mono_time::duration> late_now_;
  membership::mono_time::duration lag_before_{};
  std::uint64_t generation_ = 0;
  std::uint64_t answered_ = 0;
  std::unordered_map<membership::member_id, slot> slots_;
  /// Host agents' last host_beat (bounded: agents register with the launcher key only).
  std::unordered_map<std::string, membership::mono_time> relays_;
};

}  // namespace cohort::net
