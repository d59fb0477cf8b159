// The HTTP endpoint Prometheus scrapes (`--metrics [HOST:]PORT`): GET /metrics answers with
// whatever the render callback returns (normally metrics::exposition()). It owns the
// listening socket, the thread that serves it and the routes; the connections' limits and
// lifetimes are runtime/obs/metrics_connections'. It does not own the metrics, and it knows
// nothing of the job. cpp-httplib stays out of this header.
#pragma once
#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>

namespace httplib {
class Server;
}

namespace cohort::obs {

class metrics_connections;
struct metrics_server_limits;

/// Content-Type of a Prometheus text exposition 0.0.4 answer.
inline constexpr const char* exposition_content_type = "text/plain; version=0.0.4; charset=utf-8";

/// Binds S to HOST:PORT with the socket policy cohort's HTTP endpoints share (this metrics
/// endpoint and `cohort serve`): IPv4; SO_REUSEADDR only (httplib's default adds SO_REUSEPORT,
/// which would let a second server share the port instead of failing); a listen backlog of
/// SOMAXCONN (httplib's 5 drops the SYNs of a burst, a second each); every connection on its
/// own thread, bounded by LIMITS (metrics_connections), which ON_QUEUE is told of when
/// S.listen_after_bind() makes it. PORT 0: any free port. Returns the bound port; cohort::error
/// starting with WHAT ("metrics server") that names HOST:PORT, why, and the fix.
int bind_http(httplib::Server& s, const std::string& host, int port,
              const metrics_server_limits& limits, const std::string& what,
              std::function<void(metrics_connections*)> on_queue = {});

/// Serves a render callback over HTTP on its own thread.
///   GET /metrics  200, exposition_content_type, body = render()   (HEAD: the same, no body)
///   GET /         200, one line pointing to /metrics
///   other paths   404
///   other methods 405 with Allow: GET, HEAD, answered before any body is read
/// An exception from render answers 500 with its message; the server keeps serving. A client
/// holds it only within metrics_server_limits (runtime/obs/metrics_connections.hpp), and
/// stop() cuts every connection instead of waiting on it.
/// start(), stop(), url() and connections() belong to the owner's thread; only render runs
/// elsewhere.
class metrics_server {
 public:
  /// RENDER runs on the server's connection threads, possibly several at once: it must be
  /// thread-safe (metrics::exposition() is).
  explicit metrics_server(std::function<std::string()> render);
  /// The same with other limits (tests shorten the deadlines).
  metrics_server(std::function<std::string()> render, const metrics_server_limits& limits);
  ~metrics_server();
  metrics_server(const metrics_server&) = delete;
  metrics_server& operator=(const metrics_server&) = delete;

  /// Splits "HOST:PORT" (an IPv4 address or host name; PORT 0-65535, 0 = any free port); a
  /// bare "PORT" means 127.0.0.1:PORT. usage_error quoting SPEC and showing an example
  /// otherwise.
  static std::pair<std::string, int> parse_host_port(const std::string& spec);

  /// Whether HOST reaches this machine only: a 127.0.0.0/8 address, or a name that resolves
  /// to such addresses only. 0.0.0.0, other addresses and unknown names are not.
  static bool loopback_host(const std::string& host);

  /// What to tell the user before serving on HOST: empty on loopback; otherwise that the
  /// endpoint is plain, unauthenticated HTTP that anyone reaching HOST can read (loss, step,
  /// worker names, traffic), stressed when the job itself is KEYED (its control plane is
  /// CURVE-protected, this endpoint is not), with the loopback alternative.
  static std::string exposure_warning(const std::string& host, bool keyed);

  /// Binds HOST:PORT (PORT 0: the OS picks a free one), starts serving and returns the bound
  /// port. cohort::error naming HOST:PORT and why on failure (address in use, unknown host);
  /// usage_error when already started.
  int start(const std::string& host, int port);

  /// Stops listening and joins the serving thread. Idempotent; the destructor calls it.
  void stop();

  /// "http://HOST:PORT/metrics" of the running server (PORT as bound); empty when stopped.
  std::string url() const;

  /// Connections the running server holds now (accepted, neither closed nor cut); 0 when
  /// stopped.
  std::size_t connections() const;

 private:
  std::function<std::string()> render_;
  std::unique_ptr<metrics_server_limits> limits_;
  std::atomic<metrics_connections*> queue_{nullptr};  // owned by httplib's listening loop
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  std::string host_;
  int port_ = 0;
};

}  // namespace cohort::obs
