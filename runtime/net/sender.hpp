// Who sent an inbound control-plane frame, as the transport knows it: the connection and the
// role of the key that opened it. Owns no decision: the coordinator decides what that role
// may ask (actors/coordinator_admin.cpp), the bridge what it may send (curve.hpp).
#pragma once
#include <optional>
#include <string>

#include "runtime/net/curve.hpp"

namespace cohort::net {

/// The ROUTER identity of a frame's connection (empty on a DEALER bridge) and, with CURVE,
/// the role of the key that opened that connection (nullopt without CURVE: no key, no
/// role). Whoever decides a request's authority reads the role from here, never from what
/// the connection registered as or whether it holds a member.
struct sender {
  std::string peer;
  std::optional<key_role> role;
};

}  // namespace cohort::net
