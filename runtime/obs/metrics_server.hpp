// The HTTP endpoint Prometheus scrapes (`--metrics HOST:PORT`): GET /metrics answers with
// whatever the render callback returns (normally metrics::exposition()). It owns the
// listening socket and the thread that serves it; it does not own the metrics, and it knows
// nothing of the job. cpp-httplib stays out of this header.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>

namespace httplib {
class Server;
}

namespace cohort::obs {

/// Content-Type of a Prometheus text exposition 0.0.4 answer.
inline constexpr const char* exposition_content_type = "text/plain; version=0.0.4; charset=utf-8";

/// Serves a render callback over HTTP on its own thread.
///   GET /metrics  200, exposition_content_type, body = render()
///   GET /         200, one line pointing to /metrics
///   anything else 404
/// An exception from render answers 500 with its message; the server keeps serving.
/// start(), stop() and url() belong to the owner's thread; only render runs elsewhere.
class metrics_server {
 public:
  /// RENDER runs on the server's worker threads, possibly several at once: it must be
  /// thread-safe (metrics::exposition() is).
  explicit metrics_server(std::function<std::string()> render);
  ~metrics_server();
  metrics_server(const metrics_server&) = delete;
  metrics_server& operator=(const metrics_server&) = delete;

  /// Splits "HOST:PORT" (an IPv4 address or host name; PORT 0-65535, 0 = any free port).
  /// usage_error quoting SPEC and showing an example otherwise.
  static std::pair<std::string, int> parse_host_port(const std::string& spec);

  /// Binds HOST:PORT (PORT 0: the OS picks a free one), starts serving and returns the bound
  /// port. cohort::error naming HOST:PORT and why on failure (address in use, unknown host);
  /// usage_error when already started.
  int start(const std::string& host, int port);

  /// Stops listening and joins the serving thread. Idempotent; the destructor calls it.
  void stop();

  /// "http://HOST:PORT/metrics" of the running server (PORT as bound); empty when stopped.
  std::string url() const;

 private:
  std::function<std::string()> render_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  std::string host_;
  int port_ = 0;
};

}  // namespace cohort::obs
