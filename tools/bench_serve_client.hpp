// The well-behaved side of `cohort bench serve`: the CPU lists each side is bound to,
// `cohort serve` started as a child (always stopped and reaped), and an HTTP client for one
// completion (streamed or not), a GET and a Prometheus sample. Owns no measuring and no
// hostile request (cmd_bench_serve.cpp, bench_serve_hostile.cpp).
#pragma once
#include <sched.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace cohort::cli {

/// The prompts of tools/bench_serve.py: every byte is in the KJV vocabulary.
extern const std::vector<std::string> kjv_prompts;

/// The two sides of --bind-threads SERVER[:CLIENT]: CPU sets, and their text as given.
struct cpu_binding {
  std::optional<cpu_set_t> server, client;
  std::string server_text, client_text;  // as given; empty: unbound
};

/// "SERVER[:CLIENT]" (each side a CPU list such as 0-1,3; empty: unbound); usage_error when
/// a side is not a CPU list.
cpu_binding parse_binding(const std::string& spec);
/// Runs the calling thread on SET (TEXT: the list as given, for the error).
void bind_this_thread(const cpu_set_t& set, const std::string& text);

/// A child pid that is SIGTERMed, then SIGKILLed after a grace, and reaped when this goes.
struct reaped_child {
  pid_t pid = -1;
  bool reaped = false;
  int code = -1;
  bool killed = false;  ///< stop() had to SIGKILL it

  reaped_child() = default;
  reaped_child(const reaped_child&) = delete;
  reaped_child& operator=(const reaped_child&) = delete;
  ~reaped_child();

  /// Whether it still runs (reaps it, keeping its exit code, when it has ended).
  bool running();
  /// SIGTERM, up to GRACE for it to end, then SIGKILL; its exit code (128 + signal).
  int stop(std::chrono::milliseconds grace);
};

/// `cohort serve CKPT --bind 127.0.0.1:0 [EXTRA...]` started by this binary: its port (from
/// the line it prints), answering GET /health before the constructor returns.
class served_child {
 public:
  served_child(const std::string& checkpoint, const std::string& dir, const cpu_binding& cpus,
               const std::vector<std::string>& extra = {});

  int port() const { return port_; }
  int64_t step() const { return step_; }
  pid_t pid() const { return child_.pid; }
  bool alive() { return child_.running(); }
  /// SIGTERM and reap: the exit code (0: it stopped as asked).
  int stop() { return child_.stop(std::chrono::seconds(15)); }
  bool killed() const { return child_.killed; }
  /// The end of its stderr, for an error message.
  std::string tail() const;

  /// VmRSS of the server in KiB (0 when it is gone).
  long rss_kib() const;

 private:
  void find_port();
  void wait_healthy();

  std::string out_, err_;
  reaped_child child_;  // a member: a constructor that throws past spawn still stops it
  int port_ = 0;
  int64_t step_ = -1;
};

/// What one completion got.
struct reply {
  int status = 0;  // 0: no HTTP answer
  int tokens = 0;
  std::string text;
  double ttft_s = -1;  // streamed: from the request to its first event
  std::string error;   // when status is not 200: the body, or httplib's error
};

/// POSTs BODY to /v1/completions (STREAM: read as server-sent events, timing the first).
reply complete(int port, const std::string& body, bool stream);
/// GET PATH: the body (empty when no answer); its status in *STATUS (0: no answer).
std::string get_text(int port, const std::string& path, int* status = nullptr);
/// The value of the sample NAME (no labels) in Prometheus text; 0 when absent.
double sample(const std::string& text, const std::string& name);
/// The server's time-to-first-token histogram: (sum, count).
std::pair<double, double> ttft_totals(int port);

}  // namespace cohort::cli
