// The well-behaved side of `cohort bench serve`: --bind-threads parsed and applied, the
// `cohort serve` child (its port read from the line it prints, /health awaited, SIGTERM then
// SIGKILL, always reaped) and the httplib calls the bench makes as an ordinary client.
#include "tools/bench_serve_client.hpp"

#include <fcntl.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>

#include "runtime/core/error.hpp"
#include "runtime/core/process.hpp"
#include "tools/bench_util.hpp"
#include "tools/serve_router.hpp"

namespace cohort::cli {
namespace {

using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr int request_timeout_s = 300;  // cohort serve's own --request-timeout-s default

// "0-1,3" as a cpu_set_t.
cpu_set_t parse_cpus(const std::string& text) {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::istringstream in(text);
  const auto bad = [&] {
    return usage_error("bench serve: --bind-threads: \"" + text +
                       "\" is not a CPU list (e.g. 0-1,3; SERVER[:CLIENT])");
  };
  for (std::string part; std::getline(in, part, ',');) {
    const std::size_t dash = part.find('-');
    try {
      std::size_t used = 0;
      const int lo = std::stoi(part.substr(0, dash), &used);
      if (used != part.substr(0, dash).size()) throw bad();
      int hi = lo;
      if (dash != std::string::npos) {
        hi = std::stoi(part.substr(dash + 1), &used);
        if (used != part.size() - dash - 1) throw bad();
      }
      if (lo < 0 || hi < lo || hi >= CPU_SETSIZE) throw bad();
      for (int c = lo; c <= hi; ++c) CPU_SET(c, &set);
    } catch (const std::logic_error&) {
      throw bad();
    }
  }
  if (CPU_COUNT(&set) == 0) throw bad();
  return set;
}

}  // namespace

const std::vector<std::string> kjv_prompts = {
    "And God said",   "In the beginning",    "And the LORD",   "Blessed are the",
    "Thou shalt not", "And it came to pass", "The LORD is my", "Let there be"};

cpu_binding parse_binding(const std::string& spec) {
  cpu_binding b;
  if (spec.empty()) return b;
  const std::size_t colon = spec.find(':');
  b.server_text = spec.substr(0, colon);
  if (colon != std::string::npos) b.client_text = spec.substr(colon + 1);
  if (!b.server_text.empty()) b.server = parse_cpus(b.server_text);
  if (!b.client_text.empty()) b.client = parse_cpus(b.client_text);
  return b;
}

void bind_this_thread(const cpu_set_t& set, const std::string& text) {
  if (::sched_setaffinity(0, sizeof set, &set) != 0)
    throw usage_error("bench serve: --bind-threads: cannot run on CPUs " + text + ": " +
                      std::strerror(errno) + " (`lscpu` lists the online ones)");
}

reaped_child::~reaped_child() { stop(std::chrono::seconds(5)); }

bool reaped_child::running() {
  if (pid <= 0 || reaped) return false;
  int status = 0;
  const pid_t r = ::waitpid(pid, &status, WNOHANG);
  if (r == pid) {
    reaped = true;
    code = proc::exit_code_of(status);
  }
  return !reaped;
}

int reaped_child::stop(std::chrono::milliseconds grace) {
  if (running()) {
    code = proc::stop_child(pid, grace, &killed);
    reaped = true;
  }
  return code;
}

served_child::served_child(const std::string& checkpoint, const std::string& dir,
                           const cpu_binding& cpus, const std::vector<std::string>& extra)
    : out_(dir + "/serve.out"), err_(dir + "/serve.err") {
  // The child inherits the affinity of the thread that forks: bind, fork, unbind.
  cpu_set_t mine;
  ::sched_getaffinity(0, sizeof mine, &mine);
  if (cpus.server) bind_this_thread(*cpus.server, cpus.server_text);
  const int out_fd = ::open(out_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  const int err_fd = ::open(err_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  std::string failed;
  if (out_fd < 0 || err_fd < 0) {
    failed = "bench serve: cannot write the server's logs in " + dir;
  } else {
    try {
      std::vector<std::string> args{"serve", checkpoint, "--bind", "127.0.0.1:0"};
      args.insert(args.end(), extra.begin(), extra.end());
      child_.pid = proc::spawn_self(args, out_fd, err_fd);
    } catch (const std::exception& e) {
      failed = e.what();
    }
  }
  if (out_fd >= 0) ::close(out_fd);
  if (err_fd >= 0) ::close(err_fd);
  if (cpus.server) ::sched_setaffinity(0, sizeof mine, &mine);
  if (!failed.empty()) throw error(failed);
  find_port();
  wait_healthy();
}

std::string served_child::tail() const { return log_tail(err_); }

long served_child::rss_kib() const {
  std::ifstream in("/proc/" + std::to_string(child_.pid) + "/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
  return 0;
}

// serve prints "serve: CKPT (step N) at http://HOST:PORT/v1/completions" once it is bound.
void served_child::find_port() {
  const auto deadline = clock_type::now() + std::chrono::seconds(120);
  while (clock_type::now() < deadline) {
    std::ifstream in(out_);
    for (std::string line; std::getline(in, line);) {
      port_ = serve_line_port(line);
      if (port_ == 0) continue;
      const std::size_t step = line.rfind("(step ");
      if (step != std::string::npos) step_ = std::atoll(line.c_str() + step + 6);
      return;
    }
    if (!child_.running())
      throw error("bench serve: cohort serve " + proc::describe_exit_code(child_.code) +
                  " before it listened; the end of its output:" + tail());
    std::this_thread::sleep_for(milliseconds(20));
  }
  throw error("bench serve: cohort serve printed no address within 120 s; its output:" + tail());
}

void served_child::wait_healthy() {
  const auto deadline = clock_type::now() + std::chrono::seconds(30);
  while (clock_type::now() < deadline) {
    httplib::Client c("127.0.0.1", port_);
    c.set_connection_timeout(1, 0);
    c.set_read_timeout(2, 0);
    auto r = c.Get("/health");
    if (r && r->status == 200) return;
    if (!child_.running())
      throw error("bench serve: cohort serve " + proc::describe_exit_code(child_.code) +
                  " before GET /health answered; the end of its output:" + tail());
    std::this_thread::sleep_for(milliseconds(50));
  }
  throw error(
      "bench serve: GET /health did not answer 200 within 30 s of the server "
      "listening on port " +
      std::to_string(port_) + ":" + tail());
}

reply complete(int port, const std::string& body, bool stream) {
  httplib::Client c("127.0.0.1", port);
  c.set_connection_timeout(10, 0);
  c.set_read_timeout(request_timeout_s, 0);
  c.set_write_timeout(10, 0);
  reply out;
  std::string got;
  const auto start = clock_type::now();
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body;
  req.set_header("Content-Type", "application/json");
  if (stream)
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      got.append(data, n);
      if (out.ttft_s < 0 && got.find("data: ") != std::string::npos)
        out.ttft_s = std::chrono::duration<double>(clock_type::now() - start).count();
      return true;
    };
  auto r = c.send(req);
  if (!r) {
    out.error = "no answer (" + httplib::to_string(r.error()) + ")";
    return out;
  }
  out.status = r->status;
  if (!stream) got = r->body;
  if (r->status != 200) {
    out.error = got.substr(0, 400);
    return out;
  }
  if (!stream) {
    const json j = json::parse(got, nullptr, false);
    if (!j.is_object() || !j.contains("usage")) {
      out.error = "not a completion: " + got.substr(0, 400);
      return out;
    }
    out.tokens = j["usage"]["completion_tokens"].get<int>();
    out.text = j["choices"][0]["text"].get<std::string>();
    return out;
  }
  std::istringstream in(got);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("data: ", 0) != 0 || line == "data: [DONE]") continue;
    const json e = json::parse(line.substr(6), nullptr, false);
    if (!e.is_object()) continue;
    out.text += e["choices"][0]["text"].get<std::string>();
    if (e.contains("usage")) out.tokens = e["usage"]["completion_tokens"].get<int>();
  }
  return out;
}

std::string get_text(int port, const std::string& path, int* status) {
  httplib::Client c("127.0.0.1", port);
  c.set_connection_timeout(5, 0);
  c.set_read_timeout(10, 0);
  auto r = c.Get(path);
  if (status != nullptr) *status = r ? r->status : 0;
  return r ? r->body : std::string();
}

// The value of the sample NAME (no labels) in Prometheus text; 0 when absent.
double sample(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(name, 0) != 0 || line.size() <= name.size()) continue;
    if (line[name.size()] != ' ' && line[name.size()] != '{') continue;
    return std::atof(line.c_str() + line.rfind(' ') + 1);
  }
  return 0;
}

// The server's time-to-first-token histogram: (sum, count).
std::pair<double, double> ttft_totals(int port) {
  const std::string m = get_text(port, "/metrics");
  return {sample(m, "cohort_serve_time_to_first_token_seconds_sum"),
          sample(m, "cohort_serve_time_to_first_token_seconds_count")};
}

}  // namespace cohort::cli
