// Which address of this host the data plane uses. A worker's Gloo pairs and pipeline
// channels must listen on, and advertise, an address its peers on other hosts can reach:
// by default the local address of the route to the coordinator (the control connection's
// own source address), else what `comm.interface` names (an interface or an address of
// this host). Owns only the lookup; who binds what is runtime/comm's business.
#pragma once
#include <string>
#include <vector>

namespace cohort::net {

/// The local address the kernel would use to reach ENDPOINT ("tcp://HOST:PORT"; HOST a
/// name, an IPv4 address or a bracketed IPv6 one), as a numeric string. ipc:// and
/// inproc:// endpoints (one machine) give "127.0.0.1". Nothing is sent: a UDP socket is
/// connected and asked for its name. Throws io_error naming the endpoint when HOST does
/// not resolve or no route reaches it.
std::string local_address_toward(const std::string& endpoint);

/// One address of one interface of this host.
struct interface_address {
  std::string name;     ///< "eth0"
  std::string address;  ///< "10.77.0.2" or "fe80::1"
  bool ipv6 = false;
};

/// Every up interface address of this host (this network namespace), IPv4 first.
std::vector<interface_address> host_addresses();

/// The address SPEC names on this host: an interface name (its first IPv4 address, else
/// its first IPv6 one) or one of the host's own addresses. Throws usage_error saying what
/// this host has when SPEC is neither (the message is for `comm.interface`).
std::string resolve_interface(const std::string& spec);

}  // namespace cohort::net
