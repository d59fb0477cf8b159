#include "tools/host_agent.hpp"

#include <unistd.h>

#include <chrono>

#include "runtime/core/error.hpp"
#include "runtime/net/curve.hpp"

namespace cohort::cli {

std::string host_agent_name(const std::string& host) {
  std::string h = host;
  if (h.empty()) {
    char buf[256] = {};
    if (::gethostname(buf, sizeof buf - 1) == 0) h = buf;
    if (h.empty()) h = "localhost";
  }
  for (char& c : h) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) c = '-';
  }
  if (h.size() > 48) h.resize(48);
  return "agent-" + h;
}

std::unique_ptr<net::host_relay> start_host_relay(const std::string& endpoint,
                                                  const std::string& name,
                                                  const std::string& keys_dir, const config& cfg) {
  net::relay_options o;
  o.coordinator = endpoint;
  o.name = name;
  o.max_message_bytes = static_cast<size_t>(cfg.control.max_message_bytes);
  o.heartbeat_ms = cfg.fault_tolerance.heartbeat_ms;
  o.timeout_ms = cfg.fault_tolerance.timeout_ms;
  if (!keys_dir.empty()) {
    o.keys = std::make_shared<const net::client_keys>(
        net::load_client_keys(keys_dir, net::key_role::launcher));
    o.worker_public = net::load_client_keys(keys_dir, net::key_role::worker).self.public_key;
  }
  auto relay = std::make_unique<net::host_relay>(std::move(o));
  if (!relay->wait_registered(std::chrono::milliseconds(10000))) {
    const std::string why = relay->refusal();
    throw io_error("host agent '" + name + "': the coordinator at " + endpoint +
                   (why.empty() ? " did not answer within 10 s (is it running? with keys, "
                                  "are these its keys?)"
                                : " refused it: " + why));
  }
  return relay;
}

std::vector<std::string> host_worker_args(const net::host_relay& relay,
                                          const std::string& keys_dir) {
  // The data plane routes towards the coordinator, not the agent's loopback socket.
  std::vector<std::string> args{"worker", "--join", relay.endpoint(), "--route-to",
                                relay.coordinator()};
  if (!keys_dir.empty())
    args.insert(args.end(), {"--keys", keys_dir, "--agent-key", relay.public_key()});
  return args;
}

}  // namespace cohort::cli
