#include "runtime/obs/metrics_server.hpp"

#include <arpa/inet.h>
#include <httplib.h>
#include <netdb.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "runtime/core/error.hpp"
#include "runtime/obs/metrics_connections.hpp"

namespace cohort::obs {
namespace {

constexpr const char* kExample = "--metrics 127.0.0.1:9400";

bool all_digits(const std::string& s) {
  return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
}

// RFC 1123 host name: dot-separated labels of letters, digits and '-', 1-63 characters,
// not starting or ending with '-'.
bool valid_host_name(const std::string& h) {
  if (h.size() > 253) return false;
  std::size_t start = 0;
  while (true) {
    const std::size_t dot = h.find('.', start);
    const std::string label = h.substr(start, dot == std::string::npos ? dot : dot - start);
    if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-') {
      return false;
    }
    for (char c : label) {
      const bool ok =
          (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
      if (!ok) return false;
    }
    if (dot == std::string::npos) return true;
    start = dot + 1;
  }
}

// Digits and dots only: it is meant as an address, so it must be a whole dotted quad
// ("10.0.0" would otherwise pass as a host name and fail later, less clearly).
bool valid_ipv4_or_name(const std::string& h) {
  if (h.find_first_not_of("0123456789.") == std::string::npos) {
    in_addr a{};
    return inet_pton(AF_INET, h.c_str(), &a) == 1;
  }
  return valid_host_name(h);
}

// Why HOST cannot be bound, when the reason is that it does not resolve (else empty).
std::string resolve_failure(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (found != nullptr) freeaddrinfo(found);
  if (rc == 0) return {};
  return std::string("host does not resolve to an IPv4 address (") + gai_strerror(rc) + ")";
}

std::string bind_failure_hint(int err) {
  if (err == EADDRINUSE) {
    return "; another process (or another cohort) is listening there: pick a free port, or "
           "port 0 for any";
  }
  if (err == EADDRNOTAVAIL) {
    return "; the address is not one of this machine's: use one of its addresses, or 0.0.0.0";
  }
  if (err == EACCES) return "; ports below 1024 need privileges: use a port above 1023";
  return {};
}

void route(httplib::Server& s, const std::function<std::string()>& render) {
  // Before routing, so before httplib reads a body: nothing here takes one, and reading it
  // would let a client make the process hold as much as it sends.
  s.set_pre_routing_handler([](const httplib::Request& req, httplib::Response& res) {
    if (req.method == "GET" || req.method == "HEAD")
      return httplib::Server::HandlerResponse::Unhandled;
    res.status = 405;
    res.set_header("Allow", "GET, HEAD");
    res.set_content(
        "method " + req.method + " not allowed: the metrics endpoint answers GET and HEAD\n",
        "text/plain; charset=utf-8");
    return httplib::Server::HandlerResponse::Handled;
  });
  s.Get("/metrics", [render](const httplib::Request&, httplib::Response& res) {
    // Caught here rather than by httplib's exception handler so the 500 carries the
    // message and the worker thread goes on serving.
    try {
      res.set_content(render(), exposition_content_type);
    } catch (const std::exception& e) {
      res.status = 500;
      res.set_content(std::string("metrics: rendering failed: ") + e.what() + "\n",
                      "text/plain; charset=utf-8");
    } catch (...) {
      res.status = 500;
      res.set_content("metrics: rendering failed: unknown exception\n",
                      "text/plain; charset=utf-8");
    }
  });
  s.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("cohort: Prometheus metrics are at /metrics\n", "text/plain; charset=utf-8");
  });
  // httplib answers an unrouted path 404 with an empty body; say where the metrics are.
  // Other error statuses (our 500) keep the body they have.
  const httplib::Server::HandlerWithResponse not_found = [](const httplib::Request& req,
                                                            httplib::Response& res) {
    if (res.status != 404) return httplib::Server::HandlerResponse::Unhandled;
    res.set_content("not found: " + req.path + " (metrics are at /metrics)\n",
                    "text/plain; charset=utf-8");
    return httplib::Server::HandlerResponse::Handled;
  };
  s.set_error_handler(not_found);
}

// A server with the metrics routes and request policy, not yet bound (bind_http).
std::unique_ptr<httplib::Server> make_server(const std::function<std::string()>& render) {
  // The httplib::Server constructor also sets SIGPIPE to ignored: a scraper that hangs up
  // mid-answer must not kill the process (Debian's build sends without MSG_NOSIGNAL).
  auto server = std::make_unique<httplib::Server>();
  // One request per connection, so a connection's life is one request and its deadlines
  // (metrics_server_limits) are the request's. Prometheus scrapes every few seconds at most;
  // reconnecting costs it nothing that matters.
  server->set_keep_alive_max_count(1);
  server->set_keep_alive_timeout(1);
  // Per read and write; the whole request is bounded by the connection's deadlines.
  server->set_read_timeout(2);
  server->set_write_timeout(5);
  // No route takes a body (the pre-routing handler answers 405 before one is read); this
  // bound stands behind it.
  server->set_payload_max_length(0);
  // How often the listening loop, when no connection arrives, lets the queue cut what is past
  // its deadline and reap what has closed.
  server->set_idle_interval(0, 100000);
  route(*server, render);
  return server;
}

}  // namespace

int bind_http(httplib::Server& s, const std::string& host, int port,
              const metrics_server_limits& limits, const std::string& what,
              std::function<void(metrics_connections*)> on_queue) {
  const std::string where = host + ":" + std::to_string(port);
  const std::string unresolved = resolve_failure(host);
  if (!unresolved.empty()) {
    throw error(what + ": cannot listen on " + where + ": " + unresolved +
                "; use an IPv4 address such as 127.0.0.1 or 0.0.0.0");
  }
  // Only SO_REUSEADDR (a restart may bind while old connections sit in TIME_WAIT); the
  // listening socket is kept for its backlog below.
  auto listener = std::make_shared<int>(-1);
  s.set_address_family(AF_INET);
  s.set_socket_options([listener](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    *listener = sock;
  });
  errno = 0;
  const int bound =
      port == 0 ? s.bind_to_any_port(host) : (s.bind_to_port(host, port) ? port : -1);
  if (bound < 0) {
    const int err = errno;  // the failed bind(2) or listen(2): httplib only closes after it
    throw error(what + ": cannot listen on " + where + ": " +
                (err != 0 ? std::strerror(err) : "bind failed") + bind_failure_hint(err));
  }
  // httplib 0.11 listens with a backlog of 5: a burst of connections (200 idle ones, say)
  // would overflow it, and the kernel would drop a SYN (a 1 s retransmission each time,
  // measured). Connections are taken off the queue at once; a deep one costs nothing.
  if (*listener >= 0) ::listen(*listener, SOMAXCONN);
  s.new_task_queue = [limits, bound, on_queue = std::move(on_queue)]() -> httplib::TaskQueue* {
    auto* queue = new metrics_connections(limits, bound);
    if (on_queue) on_queue(queue);
    return queue;
  };
  return bound;
}

metrics_server::metrics_server(std::function<std::string()> render)
    : metrics_server(std::move(render), metrics_server_limits{}) {}

metrics_server::metrics_server(std::function<std::string()> render,
                               const metrics_server_limits& limits)
    : render_(std::move(render)), limits_(std::make_unique<metrics_server_limits>(limits)) {}

metrics_server::~metrics_server() { stop(); }

std::pair<std::string, int> metrics_server::parse_host_port(const std::string& spec) {
  const auto bad = [&](const std::string& why) {
    return usage_error("metrics address \"" + spec + "\": " + why +
                       "; expected HOST:PORT with an IPv4 address or host name and a port "
                       "0-65535 (0: any free port), e.g. " +
                       kExample);
  };
  // A bare port is this machine only: serving beyond it is a choice the address states.
  if (all_digits(spec) && spec.size() <= 5 && std::stoi(spec) <= 65535) {
    return {"127.0.0.1", std::stoi(spec)};
  }
  const std::size_t colon = spec.rfind(':');
  if (colon == std::string::npos) throw bad("no ':' between host and port");
  const std::string host = spec.substr(0, colon);
  const std::string port = spec.substr(colon + 1);
  if (host.empty()) {
    throw bad("the host is missing (127.0.0.1 serves this machine only, 0.0.0.0 every interface)");
  }
  if (host.find(':') != std::string::npos || host.front() == '[') {
    throw bad("IPv6 addresses are not supported");
  }
  if (!valid_ipv4_or_name(host)) throw bad("\"" + host + "\" is not an IPv4 address or host name");
  if (!all_digits(port) || port.size() > 5 || std::stoi(port) > 65535) {
    throw bad("the port \"" + port + "\" is not a number from 0 to 65535");
  }
  return {host, std::stoi(port)};
}

int metrics_server::start(const std::string& host, int port) {
  if (server_) {
    throw usage_error("metrics server: already serving " + url() +
                      "; stop() it before starting it again");
  }
  const std::string where = host + ":" + std::to_string(port);
  if (port < 0 || port > 65535) {
    throw usage_error("metrics server: cannot listen on " + where +
                      ": the port must be 0-65535 (0: any free port), e.g. " + kExample);
  }
  auto server = make_server(render_);
  const int bound =
      bind_http(*server, host, port, *limits_, "metrics server",
                [this](metrics_connections* q) { queue_ = q; });

  server_ = std::move(server);
  host_ = host;
  port_ = bound;
  auto returned = std::make_shared<std::atomic<bool>>(false);
  httplib::Server* s = server_.get();
  thread_ = std::thread([s, returned] {
    s->listen_after_bind();
    returned->store(true);
  });
  // httplib 0.11's stop() does nothing until the listening loop has marked itself running
  // (and 0.11 has no wait_until_ready): wait for that, so that a stop() right after start()
  // cannot miss it and leave the join hanging. The loop sets it on its first line.
  while (!s->is_running() && !returned->load()) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return bound;
}

void metrics_server::stop() {
  if (!server_) return;
  // Closes the listening socket; the loop then shuts the queue down, which cuts every
  // connection before joining its thread, so this waits on no client.
  server_->stop();
  if (thread_.joinable()) thread_.join();
  queue_ = nullptr;
  server_.reset();
  host_.clear();
  port_ = 0;
}

std::size_t metrics_server::connections() const {
  const metrics_connections* q = queue_.load();
  return q != nullptr ? q->open() : 0;
}

bool metrics_server::loopback_host(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || found == nullptr) return false;
  bool loopback = true;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(a->ai_addr);
    loopback = loopback && (ntohl(in->sin_addr.s_addr) >> 24) == 127;
  }
  freeaddrinfo(found);
  return loopback;
}

std::string metrics_server::exposure_warning(const std::string& host, bool keyed) {
  if (loopback_host(host)) return {};
  std::string w = "metrics: serving on " + host +
                  ", beyond this machine: the endpoint is plain HTTP without "
                  "authentication, and anyone who reaches it reads the run's loss, step, worker "
                  "names and traffic";
  if (keyed) w += " (the job's keys protect its control plane, not this endpoint)";
  return w +
         ". Serve on loopback (--metrics 127.0.0.1:PORT, or just PORT) and let a local "
         "Prometheus or an authenticating proxy reach it (docs/security.md)";
}

std::string metrics_server::url() const {
  if (!server_) return {};
  return "http://" + host_ + ":" + std::to_string(port_) + "/metrics";
}

}  // namespace cohort::obs
