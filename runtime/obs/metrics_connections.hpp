// The connections of the metrics endpoint: which are open, how long each may take, how many
// there may be, and cutting them all when the server stops. It is the task queue cpp-httplib
// hands each accepted connection to; it does not parse HTTP or route (httplib does, in
// runtime/obs/metrics_server.cpp) and knows nothing of metrics.
//
// Why a queue of its own: httplib 0.11.4's pool serves N connections at a time in accept
// order, and each one waits per read, not per request, so an idle or trickling client holds a
// worker (and the pool's join at stop()) for as long as it likes. Here every connection gets
// its own thread, and its socket (found when httplib hands the connection over, see .cpp) can
// be shut down from outside: a request head must arrive whole within head_deadline, a
// connection lives at most connection_deadline, the oldest connection still sending its head
// makes room for a new one beyond max_connections, and shutdown() cuts every socket before it
// joins, so it never waits on a client.
//
// A request that carries a body (POST, or a Content-Length above 0) is still arriving after
// its head: it counts as serving only once its handler calls request_read() (httplib reads the
// body before it calls the handler), and until then it is cut at request_deadline and is
// evicted like one still sending its head, so clients trickling bodies cannot hold every slot.
//
//   accepted --head whole--> [body --request_read()-->] serving --answer written--> closed
//      |  head late / too long / evicted / stop  |  late / evicted  |  deadline / stop
//      +----------------------- cut (socket shut down) -----------------+------> closed
#pragma once
#include <httplib.h>
#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <thread>

namespace cohort::obs {

/// What a client may hold of the metrics endpoint (docs/security.md, "metrics endpoint").
struct metrics_server_limits {
  /// The whole request head (request line and headers) must arrive within this long after
  /// the connection is accepted, however slowly it trickles.
  std::chrono::milliseconds head_deadline{5000};
  /// Longest request head accepted; a longer one is cut before httplib reads it.
  std::size_t head_max_bytes = 8192;
  /// A connection is cut this long after it was accepted, whatever it is doing (a scrape
  /// takes milliseconds; Prometheus' default scrape timeout is 10 s).
  std::chrono::milliseconds connection_deadline{10000};
  /// Connections held at once; a new one beyond this cuts the oldest still sending its head
  /// or body.
  std::size_t max_connections = 32;
  /// A request with a body must be read whole (its handler called) within this long after
  /// the connection was accepted.
  std::chrono::milliseconds request_deadline{10000};
};

/// httplib's task queue for the metrics server: one thread per connection, bounded and cut
/// as drawn above. enqueue(), on_idle() and shutdown() run on httplib's listening thread.
class metrics_connections : public httplib::TaskQueue {
 public:
  /// PORT: the listening socket's port, which tells the server's connections from others.
  metrics_connections(metrics_server_limits limits, int port);
  ~metrics_connections() override;

  void enqueue(std::function<void()> fn) override;
  void on_idle() override;
  /// Cuts every connection, then joins their threads.
  void shutdown() override;

  /// Connections held now: accepted, and neither closed nor cut (the count max_connections
  /// bounds; a cut one's thread may take a moment more to end).
  std::size_t open() const;

  /// Called by a route handler: the request on this thread's connection has been read whole
  /// (its body too), so the connection is served from now on, bounded by connection_deadline
  /// only. Does nothing on a thread that is not one of a metrics_connections' connections.
  static void request_read();

 private:
  enum class phase { head, body, serving, done };
  struct connection {
    int fd = -1;  // our duplicate of httplib's socket: shutdown() reaches the same socket,
                  // and the number stays ours until we close it (no reuse race)
    ino_t inode = 0;
    std::chrono::steady_clock::time_point accepted;
    phase state = phase::head;
    bool cut = false;
    std::thread thread;
  };

  // The socket httplib accepted just now, duplicated; -1 if none is found.
  int find_new_socket(ino_t* inode) const;
  // Runs on the connection's thread: vets the head, then lets httplib serve.
  void serve(connection* c, std::function<void()> fn);
  // Joins finished threads and cuts what is past its deadline. Caller holds mutex_.
  void reap(std::chrono::steady_clock::time_point now);
  static void cut(connection& c);

  const metrics_server_limits limits_;
  const int port_;
  mutable std::mutex mutex_;
  std::list<connection> connections_;  // in accept order: the front is the oldest
};

}  // namespace cohort::obs
