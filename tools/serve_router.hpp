// `cohort serve CKPT --replicas R` (R >= 2): R replicas of the model behind one address, so
// that a replica that dies does not take the service down (docs/serving.md, "Replicas").
// The router starts each replica as a child `cohort serve CKPT --bind 127.0.0.1:0` (this
// binary), learns its port from its first line, and forwards every request to the live
// replica with the fewest requests in flight. A request whose replica fails (connection
// refused or cut) is sent again to another one: a completion is a pure function of its body
// (greedy, or sampled with its seed, 0 when absent), so a retried stream gives the same
// events and the router skips the ones its client already has. A dead replica is started
// again at once (not after 5 deaths in a row within a second of their starts). No replica
// left: 503 with a JSON error. Single process; one thread per request in flight (httplib's),
// one per replica reading its output, one supervising.
#pragma once
#include <atomic>
#include <string>
#include <vector>

namespace httplib {
class Server;
}

namespace cohort::cli {

/// The HTTP policy `cohort serve` and its router share: one request a connection, a head
/// within 5 s and 16 KiB, a body of 1 MiB at most, REQUEST_TIMEOUT_S per connection,
/// MAX_CONNECTIONS at once; binds SVR to BIND (HOST:PORT) through obs::bind_http and returns
/// the port bound. Throws as bind_http does (a taken port: the fix in the message).
int bind_serve_http(httplib::Server& svr, const std::string& bind, int request_timeout_s,
                    int max_connections);

/// The port in the line `cohort serve` (or its router) prints once it listens, "serve: ...
/// at http://HOST:PORT/v1/completions"; 0 when LINE is not that line.
int serve_line_port(const std::string& line);

/// A bound server's listening loop with a stop that may come at any time, from any thread:
/// httplib's stop() does nothing before the loop runs (metrics_server::start says so too), so
/// stop() waits for the loop to start or for run() to return.
class serve_listener {
 public:
  /// Serves on SVR (bound) until stop(); false when the loop failed.
  bool run(httplib::Server& svr);
  void stop(httplib::Server& svr);
  /// Whether run() has returned.
  bool returned() const { return returned_; }

 private:
  std::atomic<bool> stop_asked_{false}, returned_{false};
};

struct router_options {
  std::string bind;                     ///< HOST:PORT the router listens on
  int replicas = 2;                     ///< >= 2
  std::vector<std::string> child_args;  ///< `serve CKPT ...` without --bind / --replicas
  int request_timeout_s = 300;
  int max_connections = 256;
};

/// Serves until SIGINT / SIGTERM; returns the exit code (0 after a stop).
int run_serve_router(const router_options& o);

}  // namespace cohort::cli
