// What `cohort launch` and `cohort agent` share of a host agent (docs/agent.md): its name,
// its relay started and registered, and the command line of a worker under it.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "runtime/core/config.hpp"
#include "runtime/net/host_relay.hpp"

namespace cohort::cli {

/// "agent-HOST": HOST, or this machine's host name when empty (characters a member name may
/// not hold become '-').
std::string host_agent_name(const std::string& host);

/// The relay of agent NAME towards the coordinator at ENDPOINT, with the launcher key of
/// KEYS_DIR (empty: no keys), the heartbeat timing and frame limit of CFG, registered with the
/// coordinator before it returns. Throws io_error (no answer within 10 s, or refused: the
/// coordinator's reason) or usage_error (keys).
std::unique_ptr<net::host_relay> start_host_relay(const std::string& endpoint,
                                                  const std::string& name,
                                                  const std::string& keys_dir, const config& cfg);

/// `cohort worker` under RELAY, less its name and local rank.
std::vector<std::string> host_worker_args(const net::host_relay& relay, const std::string& keys_dir);

}  // namespace cohort::cli
