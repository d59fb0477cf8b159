// The control plane's type ids and the small value types every message shares (roles,
// states, grid coordinates). Split from protocol.hpp so that messages kept in their own
// headers (runtime/net/telemetry.hpp) can name their type id.
#pragma once
#include <cstdint>
#include <tuple>

namespace cohort::net {

/// Wire type ids. Values are part of the protocol: never renumber, only append.
enum class msg_type : uint16_t {
  register_request = 1,
  register_ok = 2,
  register_reject = 3,
  heartbeat = 4,
  heartbeat_ack = 5,
  roster_update = 6,
  kv_set = 7,
  kv_get = 8,
  kv_wait = 9,
  kv_reply = 10,
  status_request = 11,
  status_reply = 12,
  stop = 13,
  leave = 14,
  exit_notice = 15,
  ping = 16,
  pong = 17,
  job_spec = 18,
  worker_ready = 19,
  step_open = 20,
  step_vote = 21,
  step_result = 22,
  train_report = 23,
  fault_order = 24,
  admin_request = 25,
  admin_reply = 26,
  scale_order = 27,
  telemetry = 28,
  host_beat = 29,
  host_beat_ack = 30,
};

/// Who is registering: a worker joins the roster; a client (ctl, launch, bench driver)
/// only gets to talk to the coordinator and never becomes a member.
enum class peer_role : uint8_t { worker = 0, client = 1 };

/// A member's state as the coordinator sees it.
enum class member_state : uint8_t { joining = 0, alive = 1, leaving = 2, dead = 3 };

/// Outcome of a key-value request (kv::status's values but `pending`, which never travels).
enum class kv_status : uint8_t {
  ok = 0,
  not_found = 2,   ///< kv_get (timeout 0) of a key that is not set
  timeout = 3,     ///< deadline passed before every key was set
  superseded = 4,  ///< the generation was dropped: rebuild for the current generation
  invalid = 5,     ///< over a limit or malformed; kv_reply.reason says which
};

/// Grid coordinates (d, p, t) of a worker in the dp x pp x tp world.
struct coords {
  int32_t d = 0;
  int32_t p = 0;
  int32_t t = 0;
  template <class S>
  static auto fields(S& s) {
    return std::tie(s.d, s.p, s.t);
  }
};

}  // namespace cohort::net
