#include "runtime/net/host_address.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "runtime/core/error.hpp"

namespace cohort::net {

namespace {

std::string numeric(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (sa->sa_family == AF_INET)
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof buf);
  else if (sa->sa_family == AF_INET6)
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, buf, sizeof buf);
  return buf;
}

// A socket closed on every path out.
struct fd_guard {
  int fd;
  ~fd_guard() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

std::string local_address_toward(const std::string& endpoint) {
  if (endpoint.rfind("ipc://", 0) == 0 || endpoint.rfind("inproc://", 0) == 0)
    return "127.0.0.1";
  const std::string prefix = "tcp://";
  if (endpoint.rfind(prefix, 0) != 0)
    throw io_error("endpoint '" + endpoint + "' is not tcp://HOST:PORT, ipc:// or inproc://");
  const std::string rest = endpoint.substr(prefix.size());
  std::string host, port;
  if (!rest.empty() && rest[0] == '[') {
    const auto close = rest.find(']');
    if (close == std::string::npos || close + 1 >= rest.size() || rest[close + 1] != ':')
      throw io_error("endpoint '" + endpoint + "': an IPv6 host is written [ADDR]:PORT");
    host = rest.substr(1, close - 1);
    port = rest.substr(close + 2);
  } else {
    const auto colon = rest.rfind(':');
    if (colon == std::string::npos)
      throw io_error("endpoint '" + endpoint + "' has no port (tcp://HOST:PORT)");
    host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found);
  if (rc != 0 || found == nullptr)
    throw io_error("cannot resolve the host of '" + endpoint + "': " + ::gai_strerror(rc));
  std::string why = "no address";
  // IPv4 first: a name like localhost may list ::1 before 127.0.0.1.
  std::vector<addrinfo*> order;
  for (int family : {AF_INET, AF_INET6})
    for (addrinfo* a = found; a != nullptr; a = a->ai_next)
      if (a->ai_family == family) order.push_back(a);
  for (addrinfo* a : order) {
    fd_guard s{::socket(a->ai_family, SOCK_DGRAM, 0)};
    if (s.fd < 0 || ::connect(s.fd, a->ai_addr, a->ai_addrlen) != 0) {
      why = std::strerror(errno);
      continue;
    }
    sockaddr_storage self{};
    socklen_t len = sizeof self;
    if (::getsockname(s.fd, reinterpret_cast<sockaddr*>(&self), &len) != 0) {
      why = std::strerror(errno);
      continue;
    }
    ::freeaddrinfo(found);
    return numeric(reinterpret_cast<const sockaddr*>(&self));
  }
  ::freeaddrinfo(found);
  throw io_error("no route from this host to '" + endpoint + "': " + why);
}

std::vector<interface_address> host_addresses() {
  std::vector<interface_address> v4, v6;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) throw io_error(std::string("getifaddrs: ") + std::strerror(errno));
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || (i->ifa_flags & IFF_UP) == 0) continue;
    const int family = i->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    interface_address a{i->ifa_name, numeric(i->ifa_addr), family == AF_INET6};
    (a.ipv6 ? v6 : v4).push_back(std::move(a));
  }
  ::freeifaddrs(list);
  v4.insert(v4.end(), v6.begin(), v6.end());
  return v4;
}

std::string resolve_interface(const std::string& spec) {
  const auto all = host_addresses();
  for (const auto& a : all)
    if (a.name == spec) return a.address;  // IPv4 first: host_addresses() orders them so
  for (const auto& a : all)
    if (a.address == spec) return a.address;
  std::string have;
  for (const auto& a : all) have += (have.empty() ? "" : ", ") + a.name + " " + a.address;
  throw usage_error("comm.interface '" + spec +
                    "' is neither an interface nor an address of this host (it has: " +
                    (have.empty() ? std::string("no address") : have) +
                    "); name one of them, or leave comm.interface empty to use the address "
                    "that reaches the coordinator");
}

}  // namespace cohort::net
