#include "tools/serve_router.hpp"

#include <fcntl.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "runtime/core/error.hpp"
#include "runtime/core/process.hpp"
#include "runtime/obs/metrics.hpp"
#include "runtime/obs/metrics_connections.hpp"
#include "runtime/obs/metrics_server.hpp"

namespace cohort::cli {

namespace {

using clock_type = std::chrono::steady_clock;
using json = nlohmann::json;

std::string error_json(const std::string& message, const char* type) {
  return json{{"error", {{"message", message}, {"type", type}, {"param", nullptr}}}}.dump() + "\n";
}

// One upstream attempt of a streamed request, filled by the thread that runs it: the status
// once the replica's headers came, then its events (the first SKIP dropped: the client has
// them from an earlier attempt), or its error body; `failed` when the replica never answered
// or cut the stream.
struct relay {
  std::mutex mu;
  std::condition_variable cv;
  int status = 0;
  bool headers = false, done = false, failed = false;
  std::atomic<bool> consumer_gone{false};
  std::deque<std::string> events;
  std::string body, content_type;
};

class router {
 public:
  explicit router(const router_options& o) : o_(o), reps_(static_cast<std::size_t>(o.replicas)) {
    m_.counter("cohort_serve_router_requests_total", "Completion requests answered, by status");
    m_.counter("cohort_serve_router_retries_total",
               "Requests (or the rest of a stream) sent again to another replica");
    m_.counter("cohort_serve_router_restarts_total", "Replicas started again after they died");
    m_.gauge("cohort_serve_router_replicas_up", "Replicas taking requests");
  }

  int run() {
    routes();
    const int bound = bind_serve_http(svr_, o_.bind, o_.request_timeout_s, o_.max_connections);
    const std::string host = obs::metrics_server::parse_host_port(o_.bind).first;
    // Bound (a taken port is the user's error, before any child starts): now the replicas.
    for (int i = 0; i < o_.replicas; ++i) start(i);
    supervisor_ = std::thread([this] { supervise(); });
    std::printf("serve: %d replicas at http://%s:%d/v1/completions\n", o_.replicas, host.c_str(),
                bound);
    std::fflush(stdout);
    const bool ok = loop_.run(svr_);
    shutdown();
    return ok ? 0 : 1;
  }

  void stop() { loop_.stop(svr_); }

 private:
  struct replica {
    pid_t pid = -1;
    int port = 0;
    bool up = false;
    int in_flight = 0;
    int restarts = 0;
    int quick_deaths = 0;  ///< deaths in a row within a second of a start
    clock_type::time_point started{};
    std::thread reader;
  };

  // Starts replica I as a child; its reader thread takes the port from its first line.
  void start(int i) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw error("serve: cannot make a pipe for a replica");
    std::vector<std::string> args = o_.child_args;
    args.insert(args.end(), {"--bind", "127.0.0.1:0"});
    const pid_t pid = proc::spawn_self(args, fds[1]);
    ::close(fds[1]);
    replica& r = reps_[static_cast<std::size_t>(i)];
    if (r.reader.joinable()) r.reader.join();
    {
      std::lock_guard<std::mutex> lk(mu_);
      r.pid = pid;
      r.port = 0;
      r.up = false;
      r.started = clock_type::now();
    }
    std::printf("serve: replica %d started (pid %d)\n", i, static_cast<int>(pid));
    std::fflush(stdout);
    r.reader = std::thread([this, i, fd = fds[0]] { read_output(i, fd); });
  }

  void read_output(int i, int fd) {
    std::string buf;
    char chunk[4096];
    for (ssize_t n; (n = ::read(fd, chunk, sizeof chunk)) != 0;) {
      if (n < 0) {
        if (errno == EINTR) continue;
        break;
      }
      buf.append(chunk, static_cast<std::size_t>(n));
      for (std::size_t at; (at = buf.find('\n')) != std::string::npos; buf.erase(0, at + 1)) {
        const int port = serve_line_port(buf.substr(0, at));
        if (port == 0) continue;
        std::lock_guard<std::mutex> lk(mu_);
        replica& r = reps_[static_cast<std::size_t>(i)];
        r.port = port;
        r.up = port > 0;
        r.quick_deaths = 0;
        m_.set("cohort_serve_router_replicas_up", {}, up_count());
      }
    }
    ::close(fd);
  }

  int up_count() const {
    int n = 0;
    for (const replica& r : reps_) n += r.up;
    return n;
  }

  // Reaps and restarts dead replicas; a replica that failed a request but still runs is
  // asked /health every half second and takes requests again once it answers.
  void supervise() {
    auto probe_at = clock_type::now();
    while (!stopping_) {
      int status = 0;
      for (pid_t pid; (pid = ::waitpid(-1, &status, WNOHANG)) > 0;) {
        int i = -1;
        bool again = false;
        {
          std::lock_guard<std::mutex> lk(mu_);
          for (std::size_t k = 0; k < reps_.size(); ++k)
            if (reps_[k].pid == pid) i = static_cast<int>(k);
          if (i < 0 || stopping_) continue;
          replica& r = reps_[static_cast<std::size_t>(i)];
          r.up = false;
          r.pid = -1;
          const bool quick = clock_type::now() - r.started < std::chrono::seconds(1);
          r.quick_deaths = quick ? r.quick_deaths + 1 : 0;
          again = r.quick_deaths < 5;
          r.restarts += again;
          m_.set("cohort_serve_router_replicas_up", {}, up_count());
        }
        std::printf("serve: replica %d (pid %d) exited: %s%s\n", i, static_cast<int>(pid),
                    proc::describe_exit_code(proc::exit_code_of(status)).c_str(),
                    again ? "; starting it again" : "; it died 5 times right after its start: "
                                                    "not started again");
        std::fflush(stdout);
        if (!again) continue;
        m_.add("cohort_serve_router_restarts_total", {}, 1);
        start(i);
      }
      if (clock_type::now() >= probe_at) {
        probe_at = clock_type::now() + std::chrono::milliseconds(500);
        for (std::size_t k = 0; k < reps_.size(); ++k) {
          int port = 0;
          {
            std::lock_guard<std::mutex> lk(mu_);
            if (!reps_[k].up && reps_[k].pid > 0) port = reps_[k].port;
          }
          if (port == 0) continue;
          httplib::Client c("127.0.0.1", port);
          c.set_connection_timeout(0, 200000);
          c.set_read_timeout(0, 500000);
          const auto res = c.Get("/health");
          std::lock_guard<std::mutex> lk(mu_);
          if (res && res->status == 200 && reps_[k].port == port) reps_[k].up = true;
          m_.set("cohort_serve_router_replicas_up", {}, up_count());
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  // The live replica with the fewest requests in flight, not in TRIED; its port, or nullopt.
  std::optional<std::pair<int, int>> pick(const std::set<int>& tried) {
    std::lock_guard<std::mutex> lk(mu_);
    int best = -1;
    for (int i = 0; i < static_cast<int>(reps_.size()); ++i) {
      const replica& r = reps_[static_cast<std::size_t>(i)];
      if (!r.up || tried.count(i) != 0) continue;
      if (best < 0 || r.in_flight < reps_[static_cast<std::size_t>(best)].in_flight) best = i;
    }
    if (best < 0) return std::nullopt;
    reps_[static_cast<std::size_t>(best)].in_flight++;
    return std::make_pair(best, reps_[static_cast<std::size_t>(best)].port);
  }
  // Replica I finished a request; FAILED: it did not answer, so it takes none until its
  // /health does (or it is started again).
  void release(int i, bool failed) {
    std::lock_guard<std::mutex> lk(mu_);
    replica& r = reps_[static_cast<std::size_t>(i)];
    r.in_flight--;
    if (failed) {
      r.up = false;
      m_.set("cohort_serve_router_replicas_up", {}, up_count());
    }
  }

  void no_replica(httplib::Response& res) {
    res.status = 503;
    res.set_content(error_json("no replica is serving (all died or are starting again): retry "
                               "in a few seconds; GET /health lists them",
                               "service_unavailable"),
                    "application/json");
  }

  void count(int status) {
    m_.add("cohort_serve_router_requests_total", {{"status", std::to_string(status)}}, 1);
  }

  void routes() {
    svr_.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      json reps = json::array();
      int up = 0;
      {
        std::lock_guard<std::mutex> lk(mu_);
        for (std::size_t i = 0; i < reps_.size(); ++i) {
          const replica& r = reps_[i];
          up += r.up;
          reps.push_back({{"index", i}, {"pid", r.pid}, {"port", r.port}, {"up", r.up},
                          {"in_flight", r.in_flight}, {"restarts", r.restarts}});
        }
      }
      res.status = up > 0 ? 200 : 503;
      res.set_content(json{{"status", up > 0 ? "ok" : "no replica"}, {"replicas", reps}}.dump() +
                          "\n",
                      "application/json");
    });
    svr_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(m_.exposition(), obs::exposition_content_type);
    });
    svr_.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      forward_plain("GET", "/v1/models", "", res);
    });
    svr_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      obs::metrics_connections::request_read();  // the body is in: no longer evictable
      const json j = json::parse(req.body, nullptr, false);
      const bool stream =
          j.is_object() && j.contains("stream") && j["stream"].is_boolean() && j["stream"].get<bool>();
      if (stream)
        forward_stream(req.body, res);
      else
        forward_plain("POST", "/v1/completions", req.body, res);
      count(res.status);
    });
  }

  void forward_plain(const std::string& method, const std::string& path, const std::string& body,
                     httplib::Response& res) {
    std::set<int> tried;
    for (;;) {
      const auto at = pick(tried);
      if (!at) return no_replica(res);
      httplib::Client c("127.0.0.1", at->second);
      c.set_connection_timeout(2);
      c.set_read_timeout(o_.request_timeout_s);
      const auto r = method == "GET" ? c.Get(path.c_str())
                                     : c.Post(path.c_str(), body, "application/json");
      release(at->first, !r);
      if (r) {
        res.status = r->status;
        res.set_content(r->body, r->get_header_value("Content-Type"));
        return;
      }
      tried.insert(at->first);
      m_.add("cohort_serve_router_retries_total", {}, 1);
    }
  }

  // One attempt of a stream on replica PORT, in its own thread; the first SKIP events dropped.
  static void attempt(std::shared_ptr<relay> rl, int port, std::string body, std::size_t skip,
                      int timeout_s) {
    httplib::Client c("127.0.0.1", port);
    c.set_connection_timeout(2);
    c.set_read_timeout(timeout_s);
    httplib::Request rq;
    rq.method = "POST";
    rq.path = "/v1/completions";
    rq.body = std::move(body);
    rq.set_header("Content-Type", "application/json");
    std::string buf;
    std::size_t seen = 0;
    rq.response_handler = [&](const httplib::Response& r) {
      std::lock_guard<std::mutex> lk(rl->mu);
      rl->status = r.status;
      rl->content_type = r.get_header_value("Content-Type");
      rl->headers = true;
      rl->cv.notify_all();
      return true;
    };
    rq.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
      std::lock_guard<std::mutex> lk(rl->mu);
      if (rl->status != 200) {
        rl->body.append(d, n);
        return true;
      }
      buf.append(d, n);
      for (std::size_t at; (at = buf.find("\n\n")) != std::string::npos; buf.erase(0, at + 2))
        if (seen++ >= skip) rl->events.push_back(buf.substr(0, at + 2));
      rl->cv.notify_all();
      return !rl->consumer_gone;
    };
    const auto r = c.send(rq);
    std::lock_guard<std::mutex> lk(rl->mu);
    rl->done = true;
    rl->failed = !r;  // refused, or cut before the stream's end (chunked framing unfinished)
    rl->cv.notify_all();
  }

  // Starts an attempt on a live replica not yet tried and waits for its headers; nullptr
  // when no replica is left. *IDX: the replica taken (released by the caller).
  std::shared_ptr<relay> begin_attempt(const std::string& body, std::size_t skip,
                                       std::set<int>& tried, int* idx) {
    for (;;) {
      const auto at = pick(tried);
      if (!at) return nullptr;
      auto rl = std::make_shared<relay>();
      std::thread(attempt, rl, at->second, body, skip, o_.request_timeout_s).detach();
      std::unique_lock<std::mutex> lk(rl->mu);
      rl->cv.wait(lk, [&] { return rl->headers || rl->done; });
      if (rl->headers) {
        *idx = at->first;
        return rl;
      }
      lk.unlock();
      release(at->first, true);
      tried.insert(at->first);
      m_.add("cohort_serve_router_retries_total", {}, 1);
    }
  }

  void forward_stream(const std::string& body, httplib::Response& res) {
    auto tried = std::make_shared<std::set<int>>();
    int idx = -1;
    auto rl = begin_attempt(body, 0, *tried, &idx);
    if (!rl) return no_replica(res);
    {
      std::unique_lock<std::mutex> lk(rl->mu);
      if (rl->status != 200) {  // the replica's 4xx: its JSON as it is
        rl->cv.wait(lk, [&] { return rl->done; });
        res.status = rl->status;
        res.set_content(rl->body, rl->content_type);
        lk.unlock();
        release(idx, false);
        return;
      }
    }
    res.status = 200;  // counted as answered; the events follow
    res.set_chunked_content_provider(
        "text/event-stream", [this, rl, idx, tried, body](size_t, httplib::DataSink& sink) mutable {
          std::size_t forwarded = 0;
          for (;;) {
            std::unique_lock<std::mutex> lk(rl->mu);
            rl->cv.wait(lk, [&] { return !rl->events.empty() || rl->done; });
            while (!rl->events.empty()) {
              const std::string ev = std::move(rl->events.front());
              rl->events.pop_front();
              if (!sink.write(ev.data(), ev.size())) {
                rl->consumer_gone = true;
                lk.unlock();
                release(idx, false);
                return false;
              }
              ++forwarded;
            }
            if (!rl->done) continue;
            const bool failed = rl->failed;
            lk.unlock();
            release(idx, failed);
            if (!failed) {
              sink.done();
              return true;
            }
            // The replica died mid-stream: the rest from another, its first events skipped.
            tried->insert(idx);
            m_.add("cohort_serve_router_retries_total", {}, 1);
            rl = begin_attempt(body, forwarded, *tried, &idx);
            if (!rl) {
              const std::string ev =
                  "data: " + error_json("the replica serving this stream died and no other is "
                                        "left: retry in a few seconds",
                                        "service_unavailable") +
                  "\n";
              sink.write(ev.data(), ev.size());
              sink.done();
              return true;
            }
          }
        });
  }

  void shutdown() {
    stopping_ = true;
    if (supervisor_.joinable()) supervisor_.join();
    std::vector<pid_t> pids;
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (const replica& r : reps_)
        if (r.pid > 0) pids.push_back(r.pid);
    }
    for (const pid_t p : pids) ::kill(p, SIGTERM);  // all at once; each then gets its grace
    for (const pid_t p : pids) proc::stop_child(p, std::chrono::seconds(5));
    for (replica& r : reps_)
      if (r.reader.joinable()) r.reader.join();
  }

  router_options o_;
  std::vector<replica> reps_;
  std::mutex mu_;
  obs::metrics m_;
  httplib::Server svr_;
  std::thread supervisor_;
  serve_listener loop_;
  std::atomic<bool> stopping_{false};
};

}  // namespace

int bind_serve_http(httplib::Server& svr, const std::string& bind, int request_timeout_s,
                    int max_connections) {
  const auto [host, port] = obs::metrics_server::parse_host_port(bind);
  // A body without a usable Content-Length is refused before httplib reads it: httplib 0.11
  // reads such a body until the client closes, so the answer came only after its 5 s timeout.
  svr.set_pre_routing_handler([](const httplib::Request& req, httplib::Response& res) {
    using H = httplib::Server::HandlerResponse;
    if ((req.method != "POST" && req.method != "PUT" && req.method != "PATCH") ||
        req.has_header("Transfer-Encoding"))
      return H::Unhandled;
    const std::string cl = req.get_header_value("Content-Length");
    const bool digits = !cl.empty() && cl.size() <= 18 &&
                        cl.find_first_not_of("0123456789") == std::string::npos;
    if (digits) return H::Unhandled;  // over the payload limit: httplib's own 413
    res.status = cl.empty() ? 411 : 400;
    res.set_content(error_json(cl.empty() ? "a request body needs a Content-Length header"
                                          : "Content-Length '" + cl.substr(0, 32) +
                                                "' is not a number of bytes",
                               "invalid_request_error"),
                    "application/json");
    return H::Handled;
  });
  svr.set_keep_alive_max_count(1);  // a connection is one request, bounded as one
  svr.set_read_timeout(5);
  svr.set_write_timeout(10);
  svr.set_payload_max_length(1 << 20);
  svr.set_idle_interval(0, 100000);
  obs::metrics_server_limits lim;
  lim.connection_deadline = std::chrono::seconds(request_timeout_s);
  lim.head_max_bytes = 16384;
  lim.max_connections = static_cast<std::size_t>(max_connections);
  return obs::bind_http(svr, host, port, lim, "serve");
}

int serve_line_port(const std::string& line) {
  const std::size_t at = line.rfind(" at http://");
  if (line.rfind("serve: ", 0) != 0 || at == std::string::npos) return 0;
  const std::size_t colon = line.find(':', at + 11);
  return colon == std::string::npos ? 0 : std::max(0, std::atoi(line.c_str() + colon + 1));
}

bool serve_listener::run(httplib::Server& svr) {
  const bool ok = stop_asked_ || svr.listen_after_bind();
  returned_ = true;
  return ok;
}

void serve_listener::stop(httplib::Server& svr) {
  stop_asked_ = true;
  while (!svr.is_running() && !returned_)
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  svr.stop();
}

int run_serve_router(const router_options& o) {
  proc::block_termination_signals();
  router r(o);
  proc::signal_watcher signals([&r](int) { r.stop(); });
  return r.run();
}

}  // namespace cohort::cli
