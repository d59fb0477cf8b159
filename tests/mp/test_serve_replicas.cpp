// `cohort serve CKPT --replicas 2`: a replica killed while it streams to clients. Every
// stream still ends with the text the model gives that request (greedy, or sampled with its
// seed), the rest sent by the other replica, the killed one is started again and serves, and
// a stop leaves no replica behind. Order is proven, not slept: the kill comes once every
// stream has its first events.
#include <doctest/doctest.h>
#include <httplib.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/mp/dp_util.hpp"

using namespace cohort;
using namespace cohort::mp;
using std::chrono::milliseconds;

namespace {

nlohmann::json health(int port) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(5, 0);
  const auto r = c.Get("/health");
  return r ? nlohmann::json::parse(r->body, nullptr, false) : nlohmann::json();
}

// Polls /health until every replica is up (and, with RESTARTED, replica 0 was restarted).
bool all_up(int port, milliseconds timeout, bool restarted = false) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    const nlohmann::json h = health(port);
    bool ok = h.is_object() && h.contains("replicas");
    for (std::size_t i = 0; ok && i < h["replicas"].size(); ++i) ok = h["replicas"][i]["up"].get<bool>();
    if (ok && restarted) ok = h["replicas"][0]["restarts"].get<int>() >= 1;
    if (ok) return true;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return false;
}

// Six long streams through `serve --replicas 2` (with EXTRA options); once every stream has
// its first events, replica 0 is SIGKILLed, or with SHARD its first shard process (--tp): the
// replica's server exits 1 on that and the router starts it again.
void kill_mid_stream(const std::vector<std::string>& extra, bool shard) {
  temp_dir dir;
  const std::string ckpt = small_checkpoint(dir);

  std::vector<std::string> args{"serve", ckpt, "--bind", "127.0.0.1:0", "--replicas", "2"};
  args.insert(args.end(), extra.begin(), extra.end());
  child_process serve(args, dir.path(), "serve-replicas");
  const auto at = serve.wait_line("serve: 2 replicas at http://", milliseconds(30000));
  REQUIRE_MESSAGE(at, serve.out() << serve.err());
  const std::string tail = at->substr(at->find("127.0.0.1:") + 10);
  const int port = std::stoi(tail);
  REQUIRE_MESSAGE(all_up(port, milliseconds(30000)), serve.out() << serve.err());
  const int replica = health(port)["replicas"][0]["pid"].get<int>();
  int victim = replica;
  if (shard) {
    std::string pid;
    run_shell("pgrep -P " + std::to_string(replica) + " -f -- '--shard-rank 1$'", &pid);
    REQUIRE_MESSAGE(!pid.empty(), serve.err());
    victim = std::stoi(pid);
  }

  // Six long streams, half greedy, half sampled with seeds; each thread counts its events.
  const int n = 6, tokens = 1500;
  std::vector<std::string> body(n), streamed(n);
  std::vector<int> status(n, 0);
  std::atomic<int> started{0};
  std::vector<std::thread> ts;
  for (int i = 0; i < n; ++i) {
    body[i] = R"({"prompt": "In the", "max_tokens": )" + std::to_string(tokens) +
              (i % 2 ? R"(, "temperature": 0.9, "seed": )" + std::to_string(i) : R"(, "temperature": 0)") +
              R"(, "stream": true})";
    ts.emplace_back([&, i] {
      httplib::Client c("127.0.0.1", port);
      c.set_read_timeout(120, 0);
      std::string buf;
      int events = 0;
      httplib::Request rq;
      rq.method = "POST";
      rq.path = "/v1/completions";
      rq.body = body[i];
      rq.set_header("Content-Type", "application/json");
      rq.content_receiver = [&](const char* d, size_t len, uint64_t, uint64_t) {
        buf.append(d, len);
        for (std::size_t e; (e = buf.find("\n\n")) != std::string::npos; buf.erase(0, e + 2)) {
          const std::string line = buf.substr(0, e);
          if (line.rfind("data: ", 0) != 0 || line == "data: [DONE]") continue;
          const auto j = nlohmann::json::parse(line.substr(6), nullptr, false);
          if (j.contains("choices")) streamed[i] += j["choices"][0]["text"].get<std::string>();
          if (++events == 3) started++;
        }
        return true;
      };
      const auto r = c.send(rq);
      status[i] = r ? r->status : -1;
    });
  }
  // Every stream has its first events, none can have ended (1500 tokens each): the kill.
  const auto deadline = std::chrono::steady_clock::now() + milliseconds(60000);
  while (started < n && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(milliseconds(1));
  REQUIRE(started == n);
  REQUIRE(::kill(victim, SIGKILL) == 0);
  for (auto& t : ts) t.join();

  // The killed replica is started again and serves; the same requests, not streamed and
  // after the kill, give each stream's text.
  CHECK_MESSAGE(all_up(port, milliseconds(20000), true), serve.out());
  if (shard) {
    CHECK_MESSAGE(serve.err().find("shard 1 (pid " + std::to_string(victim) +
                                   ") exited: killed by signal 9; the server stops") !=
                      std::string::npos,
                  serve.err());
    CHECK(serve.out().find("exited: exit code 1; starting it again") != std::string::npos);
  } else {
    CHECK(serve.out().find("exited: killed by signal 9; starting it again") != std::string::npos);
  }
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(120, 0);
  for (int i = 0; i < n; ++i) {
    CHECK(status[i] == 200);
    std::string plain = body[i];
    plain.replace(plain.find(R"(, "stream": true)"), 16, "");
    const auto r = c.Post("/v1/completions", plain, "application/json");
    REQUIRE(r);
    REQUIRE(r->status == 200);
    const std::string want = nlohmann::json::parse(r->body)["choices"][0]["text"];
    CHECK_MESSAGE(streamed[i] == want, "stream " << i << " differs from its request's text");
  }
  // Some stream was on the killed replica and went on elsewhere.
  const auto m = c.Get("/metrics");
  REQUIRE(m);
  const auto k = m->body.find("\ncohort_serve_router_retries_total ");
  REQUIRE(k != std::string::npos);
  CHECK(std::stod(m->body.substr(k + 35)) >= 1);

  // A stop ends the router and its replicas.
  const int other = health(port)["replicas"][1]["pid"].get<int>();
  serve.signal(SIGTERM);
  const auto code = serve.wait_exit(milliseconds(20000));
  REQUIRE(code.has_value());
  CHECK(*code == 0);
  CHECK(::kill(other, 0) != 0);
}

}  // namespace

TEST_CASE("serve --replicas 2: a replica killed mid-stream, every stream ends on its own text") {
  kill_mid_stream({}, false);
}

TEST_CASE("serve --replicas 2 --tp 2: a shard killed mid-stream takes its replica out, every "
          "stream ends on its own text on the other, and the replica comes back") {
  kill_mid_stream({"--tp", "2"}, true);
}
