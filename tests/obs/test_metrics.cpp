// The metric registry (runtime/obs/metrics.hpp, on prometheus-cpp): exact Prometheus text
// for each kind, escaping, special numbers, rejected names and misuse, exact totals under
// concurrent adds; and its HTTP endpoint (runtime/obs/metrics_server.hpp) scraped with
// httplib's client: body, content type, 404, 500 then recovery, a taken port, address
// parsing; and attacked with raw sockets (docs/security.md, "metrics endpoint"): slow-loris
// clients at stop(), a trickled head, a 1 GiB POST, 200 idle connections, the warning for an
// address beyond loopback.
#include <doctest/doctest.h>
#include <httplib.h>
#include <poll.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <future>
#include <limits>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "runtime/core/error.hpp"
#include "runtime/obs/metrics.hpp"
#include "runtime/obs/metrics_connections.hpp"
#include "runtime/obs/metrics_server.hpp"
#include "tests/raw_client.hpp"

using namespace cohort;
using cohort::obs::metrics;
using cohort::obs::metrics_server;
using cohort::test::raw_client;

namespace {

// The message of the usage_error F throws, or a marker that says it threw none.
template <class F>
std::string usage_message(F&& f) {
  try {
    f();
  } catch (const usage_error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("<not a usage_error: ") + e.what() + ">";
  }
  return "<no exception>";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Checks TEXT against the exposition grammar: every line is "# HELP name text",
// "# TYPE name kind", or a sample `name{label="value",...} number` whose name is the
// current family's (plus _bucket/_sum/_count for a histogram). The first bad line, or "".
std::string grammar_error(const std::string& text) {
  static const std::regex help(R"(# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) (?:[^\\\n]|\\[\\n])*)");
  static const std::regex type(R"(# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram))");
  static const std::string label = R"([a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*")";
  static const std::regex sample(
      "([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\\{" + label + "(?:," + label +
      ")*\\})? (NaN|Nan|[+-]Inf|-?[0-9]+(?:\\.[0-9]+)?(?:e[+-][0-9]+)?)");
  if (!text.empty() && text.back() != '\n') return "<no final newline>";
  std::istringstream in(text);
  std::string line, family, kind;
  std::smatch m;
  while (std::getline(in, line)) {
    if (std::regex_match(line, m, help)) {
      family = m[1];
      kind.clear();
    } else if (std::regex_match(line, m, type)) {
      if (m[1] != family) return line;
      kind = m[2];
    } else if (std::regex_match(line, m, sample)) {
      const std::string name = m[1];
      const bool ok = kind == "histogram" ? (name == family + "_bucket" ||
                                             name == family + "_sum" || name == family + "_count")
                                          : (!kind.empty() && name == family);
      if (!ok) return line;
    } else {
      return line;
    }
  }
  return "";
}

// A server's whole answer to GET PATH.
struct scrape {
  int status = -1;
  std::string body;
  std::string content_type;
  std::string connection;
};

// The client asks for keep-alive, as Prometheus does.
scrape get(int port, const std::string& path) {
  httplib::Client client("127.0.0.1", port);
  client.set_keep_alive(true);
  client.set_connection_timeout(5, 0);
  client.set_read_timeout(5, 0);
  const auto res = client.Get(path.c_str());
  if (!res) throw std::runtime_error("GET " + path + " failed: " + httplib::to_string(res.error()));
  return {res->status, res->body, res->get_header_value("Content-Type"),
          res->get_header_value("Connection")};
}

// Polls STATE until it holds or LIMIT passes (a bound, not a pace).
template <class F>
bool eventually(std::chrono::milliseconds limit, F&& state) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!state()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

}  // namespace

TEST_CASE("metrics: the test's grammar check refuses malformed exposition lines") {
  const std::string head = "# HELP g x\n# TYPE g gauge\n";
  CHECK(grammar_error(head + "g 1\n") == "");
  CHECK(grammar_error(head + "g{a=\"x\"\"} 1\n") == "g{a=\"x\"\"} 1");  // unescaped quote
  CHECK(grammar_error(head + "g{a=\"x\",} 1\n") == "g{a=\"x\",} 1");
  CHECK(grammar_error(head + "g 1.5.2\n") == "g 1.5.2");
  CHECK(grammar_error(head + "other 1\n") == "other 1");  // not the TYPE'd family
  CHECK(grammar_error(head + "g_sum 1\n") == "g_sum 1");  // suffixes are for histograms
  CHECK(grammar_error("# TYPE g gauge\ng 1\n") == "# TYPE g gauge");
  CHECK(grammar_error(head + "g 1") == "<no final newline>");
}

TEST_CASE("metrics: counter exposition text is exact") {
  metrics m;
  m.counter("cohort_steps_total", "Optimizer steps committed.");
  m.add("cohort_steps_total", {}, 3);
  m.add("cohort_steps_total", {}, 4);
  m.counter("cohort_bytes_total", "Bytes sent per rank.");
  m.add("cohort_bytes_total", {{"rank", "1"}}, 1024);
  m.add("cohort_bytes_total", {{"rank", "0"}}, 0.5);
  CHECK(m.exposition() ==
        "# HELP cohort_bytes_total Bytes sent per rank.\n"
        "# TYPE cohort_bytes_total counter\n"
        "cohort_bytes_total{rank=\"0\"} 0.5\n"
        "cohort_bytes_total{rank=\"1\"} 1024\n"
        "# HELP cohort_steps_total Optimizer steps committed.\n"
        "# TYPE cohort_steps_total counter\n"
        "cohort_steps_total 7\n");
  CHECK(m.value("cohort_steps_total", {}) == 7.0);
  CHECK(grammar_error(m.exposition()) == "");
}

TEST_CASE("metrics: a gauge with two series prints them in label order") {
  metrics m;
  m.gauge("cohort_worker_step_seconds", "Last step time of each worker.");
  m.set("cohort_worker_step_seconds", {{"worker", "w2"}, {"host", "b"}}, 0.25);
  m.set("cohort_worker_step_seconds", {{"worker", "w1"}, {"host", "a"}}, 1.5);
  m.add("cohort_worker_step_seconds", {{"worker", "w1"}, {"host", "a"}}, -2);
  // Labels print by name, series by their labels, whatever order they were given in.
  CHECK(m.exposition() ==
        "# HELP cohort_worker_step_seconds Last step time of each worker.\n"
        "# TYPE cohort_worker_step_seconds gauge\n"
        "cohort_worker_step_seconds{host=\"a\",worker=\"w1\"} -0.5\n"
        "cohort_worker_step_seconds{host=\"b\",worker=\"w2\"} 0.25\n");
  // A series is its label set: the same labels in another order name the same series.
  CHECK(m.value("cohort_worker_step_seconds", {{"host", "a"}, {"worker", "w1"}}) == -0.5);
  CHECK(m.remove("cohort_worker_step_seconds", {{"worker", "w1"}, {"host", "a"}}));
  CHECK_FALSE(m.remove("cohort_worker_step_seconds", {{"host", "a"}, {"worker", "w1"}}));
  CHECK(m.value("cohort_worker_step_seconds", {{"worker", "w1"}, {"host", "a"}}) == std::nullopt);
  CHECK(m.exposition() ==
        "# HELP cohort_worker_step_seconds Last step time of each worker.\n"
        "# TYPE cohort_worker_step_seconds gauge\n"
        "cohort_worker_step_seconds{host=\"b\",worker=\"w2\"} 0.25\n");
}

TEST_CASE("metrics: histogram buckets are cumulative with sum and count") {
  metrics m;
  m.histogram("cohort_step_seconds", "Step time.", {0.5, 1, 2.5, 10});
  for (double v : {0.25, 0.5, 0.5, 2.0, 3.0, 100.0}) m.observe("cohort_step_seconds", {}, v);
  m.histogram("cohort_empty", "Declared, never observed.", {1});
  // A family without series prints nothing (prometheus-cpp leaves it out).
  CHECK(m.exposition() ==
        "# HELP cohort_step_seconds Step time.\n"
        "# TYPE cohort_step_seconds histogram\n"
        "cohort_step_seconds_count 6\n"
        "cohort_step_seconds_sum 106.25\n"
        "cohort_step_seconds_bucket{le=\"0.5\"} 3\n"
        "cohort_step_seconds_bucket{le=\"1\"} 3\n"
        "cohort_step_seconds_bucket{le=\"2.5\"} 4\n"
        "cohort_step_seconds_bucket{le=\"10\"} 5\n"
        "cohort_step_seconds_bucket{le=\"+Inf\"} 6\n");

  // Closed form: observing 1..100 puts exactly b values at or below bound b.
  metrics big;
  big.histogram("h", "1..100", {10, 25, 50, 75});
  for (int i = 1; i <= 100; ++i) big.observe("h", {{"rank", "3"}}, i);
  CHECK(big.exposition() ==
        "# HELP h 1..100\n"
        "# TYPE h histogram\n"
        "h_count{rank=\"3\"} 100\n"
        "h_sum{rank=\"3\"} 5050\n"
        "h_bucket{rank=\"3\",le=\"10\"} 10\n"
        "h_bucket{rank=\"3\",le=\"25\"} 25\n"
        "h_bucket{rank=\"3\",le=\"50\"} 50\n"
        "h_bucket{rank=\"3\",le=\"75\"} 75\n"
        "h_bucket{rank=\"3\",le=\"+Inf\"} 100\n");
  // A NaN observation counts, in +Inf only.
  big.observe("h", {{"rank", "3"}}, std::nan(""));
  CHECK(contains(big.exposition(), "h_count{rank=\"3\"} 101\nh_sum{rank=\"3\"} Nan\n"));
  CHECK(contains(big.exposition(), "h_bucket{rank=\"3\",le=\"10\"} 10\n"));
  CHECK(contains(big.exposition(), "h_bucket{rank=\"3\",le=\"+Inf\"} 101\n"));
  CHECK(grammar_error(m.exposition() + big.exposition()) == "");
}

TEST_CASE("metrics: numbers print as Prometheus reads them") {
  metrics m;
  m.gauge("g", "numbers");
  m.set("g", {{"v", "a_int"}}, 42);
  m.set("g", {{"v", "b_neg"}}, -7);
  m.set("g", {{"v", "c_tenth"}}, 0.1);
  m.set("g", {{"v", "d_small"}}, 2.5e-7);
  m.set("g", {{"v", "e_big"}}, 1e300);
  m.set("g", {{"v", "f_nan"}}, std::numeric_limits<double>::quiet_NaN());
  m.set("g", {{"v", "g_ninf"}}, -std::numeric_limits<double>::infinity());
  m.set("g", {{"v", "h_inf"}}, std::numeric_limits<double>::infinity());
  CHECK(m.exposition() ==
        "# HELP g numbers\n# TYPE g gauge\n"
        "g{v=\"a_int\"} 42\n"
        "g{v=\"b_neg\"} -7\n"
        "g{v=\"c_tenth\"} 0.1\n"
        "g{v=\"d_small\"} 2.5e-07\n"
        "g{v=\"e_big\"} 1e+300\n"
        "g{v=\"f_nan\"} Nan\n"  // prometheus-cpp's spelling; Prometheus parses any case
        "g{v=\"g_ninf\"} -Inf\n"
        "g{v=\"h_inf\"} +Inf\n");
  CHECK(grammar_error(m.exposition()) == "");
}

TEST_CASE("metrics: help text and label values are escaped") {
  metrics m;
  m.gauge("g", "line one\nback\\slash \"quotes stay\"");
  m.set("g", {{"path", "C:\\tmp\\\"x\"\nend"}}, 1);
  CHECK(m.exposition() ==
        "# HELP g line one\\nback\\\\slash \"quotes stay\"\n"
        "# TYPE g gauge\n"
        "g{path=\"C:\\\\tmp\\\\\\\"x\\\"\\nend\"} 1\n");
  CHECK(grammar_error(m.exposition()) == "");
}

TEST_CASE("metrics: bad names are usage errors that name them") {
  metrics m;
  CHECK(contains(usage_message([&] { m.counter("steps-total", "x"); }), "\"steps-total\""));
  CHECK(contains(usage_message([&] { m.gauge("9lives", "x"); }), "\"9lives\""));
  CHECK(contains(usage_message([&] { m.gauge("", "x"); }), "not a valid metric name"));
  m.gauge("ok:name_1", "colons and digits are fine");
  m.gauge("g", "x");
  CHECK(contains(usage_message([&] { m.set("g", {{"bad-label", "v"}}, 1); }), "\"bad-label\""));
  CHECK(contains(usage_message([&] { m.set("g", {{"a:b", "v"}}, 1); }), "\"a:b\""));
  CHECK(contains(usage_message([&] { m.set("g", {{"__name", "v"}}, 1); }), "reserved"));
  CHECK(contains(usage_message([&] { m.set("g", {{"a", "1"}, {"a", "2"}}, 1); }), "twice"));
  m.histogram("h", "x", {1});
  CHECK(contains(usage_message([&] { m.observe("h", {{"le", "1"}}, 1); }), "\"le\""));
  CHECK(contains(usage_message([&] { m.histogram("h2", "x", {1, 1}); }), "strictly increasing"));
  CHECK(contains(usage_message([&] { m.histogram("h3", "x", {2, 1}); }), "strictly increasing"));
  CHECK(contains(usage_message([&] {
                   m.histogram("h4", "x", {1, std::numeric_limits<double>::infinity()});
                 }),
                 "finite"));
  // Nothing half-made: a rejected series leaves no trace in the text.
  CHECK(m.exposition() == "");
  m.set("g", {{"good", "v"}}, 1);
  CHECK(m.exposition() == "# HELP g x\n# TYPE g gauge\ng{good=\"v\"} 1\n");
}

TEST_CASE("metrics: misuse of a family is a usage error") {
  metrics m;
  m.counter("c", "a counter");
  m.counter("c", "a counter");  // the same declaration again: a no-op
  m.gauge("g", "a gauge");
  m.histogram("h", "a histogram", {1, 2});
  m.histogram("h", "a histogram", {1, 2});
  CHECK(
      contains(usage_message([&] { m.gauge("c", "a counter"); }), "already declared as a counter"));
  CHECK(contains(usage_message([&] { m.counter("c", "other help"); }), "other help"));
  CHECK(contains(usage_message([&] { m.histogram("h", "a histogram", {1, 3}); }), "bounds"));
  CHECK(contains(usage_message([&] { m.add("nope", {}, 1); }), "no family \"nope\""));
  CHECK(contains(usage_message([&] { m.value("nope", {}); }), "no family \"nope\""));
  CHECK(contains(usage_message([&] { m.add("c", {}, -1); }), "only grows"));
  CHECK(contains(usage_message([&] { m.add("c", {}, std::nan("")); }), "only grows"));
  CHECK(contains(usage_message([&] { m.set("c", {}, 1); }), "needs a gauge"));
  CHECK(contains(usage_message([&] { m.observe("g", {}, 1); }), "needs a histogram"));
  CHECK(contains(usage_message([&] { m.add("h", {}, 1); }), "is a histogram"));
  CHECK(contains(usage_message([&] { m.value("h", {}); }), "is a histogram"));
  CHECK(m.value("c", {}) == std::nullopt);  // nothing was added
  m.add("g", {}, -3);                       // a gauge may fall
  CHECK(m.value("g", {}) == -3.0);
}

TEST_CASE("metrics: 4 threads x 10000 add(1) give exactly 40000") {
  metrics m;
  m.counter("c", "concurrent adds");
  m.gauge("g", "concurrent adds");
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&m, t] {
      for (int i = 0; i < 10000; ++i) {
        m.add("c", {}, 1);
        m.add("g", {{"thread", std::to_string(t)}}, 1);
        if (i % 1000 == 0) m.exposition();  // readers run beside the writers
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(m.value("c", {}) == 40000.0);
  for (int t = 0; t < 4; ++t) CHECK(m.value("g", {{"thread", std::to_string(t)}}) == 10000.0);
}

TEST_CASE("metrics_server: a scrape returns exactly exposition() with the Prometheus type") {
  metrics m;
  m.counter("cohort_steps_total", "Steps.");
  m.add("cohort_steps_total", {{"job", "a\"b"}}, 12);
  m.histogram("cohort_step_seconds", "Step time.", {0.1, 1});
  m.observe("cohort_step_seconds", {}, 0.5);
  metrics_server server([&m] { return m.exposition(); });
  const int port = server.start("127.0.0.1", 0);
  REQUIRE(port > 0);
  CHECK(server.url() == "http://127.0.0.1:" + std::to_string(port) + "/metrics");

  const scrape s = get(port, "/metrics");
  CHECK(s.status == 200);
  CHECK(s.body == m.exposition());
  CHECK(s.content_type == "text/plain; version=0.0.4; charset=utf-8");
  CHECK(grammar_error(s.body) == "");
  // The server closes each connection after its answer, even to a keep-alive client, so that
  // no idle connection delays stop().
  CHECK(s.connection == "close");

  m.add("cohort_steps_total", {{"job", "a\"b"}}, 1);  // each scrape renders afresh
  CHECK(get(port, "/metrics").body == m.exposition());
  CHECK(contains(get(port, "/metrics").body, "cohort_steps_total{job=\"a\\\"b\"} 13\n"));

  const scrape root = get(port, "/");
  CHECK(root.status == 200);
  CHECK(contains(root.body, "/metrics"));
  server.stop();
  server.stop();  // idempotent
  CHECK(server.url() == "");
}

TEST_CASE("metrics_server: any other path is 404") {
  metrics_server server([] { return std::string("x 1\n"); });
  const int port = server.start("127.0.0.1", 0);
  const scrape s = get(port, "/metric");
  CHECK(s.status == 404);
  CHECK(contains(s.body, "/metrics"));
  CHECK(get(port, "/metrics/extra").status == 404);
}

TEST_CASE("metrics_server: a throwing render answers 500 and the server keeps serving") {
  std::atomic<bool> fail{true};  // read on the server's thread
  metrics_server server([&fail] {
    if (fail.load()) throw std::runtime_error("registry exploded");
    return std::string("up 1\n");
  });
  const int port = server.start("127.0.0.1", 0);
  const scrape bad = get(port, "/metrics");
  CHECK(bad.status == 500);
  CHECK(contains(bad.body, "registry exploded"));
  fail = false;  // the client waited for the answer: no scrape runs now
  const scrape good = get(port, "/metrics");
  CHECK(good.status == 200);
  CHECK(good.body == "up 1\n");
}

TEST_CASE("metrics_server: a second server on a taken port fails with cohort::error") {
  metrics_server first([] { return std::string(); });
  const int port = first.start("127.0.0.1", 0);
  metrics_server second([] { return std::string(); });
  const std::string where = "127.0.0.1:" + std::to_string(port);
  std::string message = "<no exception>";
  try {
    second.start("127.0.0.1", port);
  } catch (const usage_error& e) {
    message = std::string("<usage_error: ") + e.what() + ">";
  } catch (const error& e) {
    message = e.what();
  }
  CHECK(contains(message, where));
  CHECK(contains(message, "Address already in use"));
  CHECK(second.url() == "");
  CHECK(get(port, "/metrics").status == 200);  // the first one is unharmed

  // Once the first has stopped, the port is free for the second.
  first.stop();
  CHECK(second.start("127.0.0.1", port) == port);
  CHECK(get(port, "/").status == 200);
  CHECK(contains(usage_message([&] { second.start("127.0.0.1", 0); }), "already serving"));
}

TEST_CASE("metrics_server: parse_host_port splits HOST:PORT and explains what it refuses") {
  using P = std::pair<std::string, int>;
  CHECK(metrics_server::parse_host_port("127.0.0.1:9400") == P{"127.0.0.1", 9400});
  CHECK(metrics_server::parse_host_port("0.0.0.0:0") == P{"0.0.0.0", 0});
  CHECK(metrics_server::parse_host_port("node-7.cluster:65535") == P{"node-7.cluster", 65535});
  CHECK(metrics_server::parse_host_port("localhost:80") == P{"localhost", 80});
  // A bare port serves this machine only.
  CHECK(metrics_server::parse_host_port("9400") == P{"127.0.0.1", 9400});
  CHECK(metrics_server::parse_host_port("0") == P{"127.0.0.1", 0});
  for (const std::string spec :
       {"65536", ":9400", "127.0.0.1:", "127.0.0.1:65536", "127.0.0.1:-1", "127.0.0.1:94a0",
        "127.0.0.1:999999", "[::1]:9400", "::1:9400", "256.0.0.1:9400", "10.0.0:9400",
        "bad_host:9400", "-lead:9400", "a..b:9400", "127.0.0.1: 9400"}) {
    const std::string message = usage_message([&] { metrics_server::parse_host_port(spec); });
    INFO("spec: ", spec, " message: ", message);
    CHECK(contains(message, "\"" + spec + "\""));
    CHECK(contains(message, "--metrics 127.0.0.1:9400"));
  }
}

// The attacks of issue 33 (docs/security.md, "metrics endpoint"), each with raw sockets.

TEST_CASE("metrics_server: slow-loris clients attached do not delay stop()") {
  obs::metrics_server_limits limits;
  limits.head_deadline = std::chrono::minutes(10);  // only stop() may end them here
  limits.connection_deadline = std::chrono::minutes(10);
  metrics_server server([] { return std::string("up 1\n"); }, limits);
  const int port = server.start("127.0.0.1", 0);
  // Each has sent part of a head and will send the rest at its own pace, one byte at a time.
  std::vector<std::unique_ptr<raw_client>> loris;
  for (int i = 0; i < 4; ++i) {
    loris.push_back(std::make_unique<raw_client>(port));
    CHECK(loris.back()->send_all("GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: a"));
  }
  REQUIRE(eventually(std::chrono::seconds(10), [&] { return server.connections() == 4; }));
  auto stopped = std::async(std::launch::async, [&server] { server.stop(); });
  // The design promises stop() waits on no client; 10 s is slack, not a speed claim.
  const bool prompt = stopped.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  CHECK_MESSAGE(prompt, "stop() is waiting on the slow clients");
  if (!prompt) loris.clear();  // hang up, so that a waiting stop() returns and the test ends
  stopped.get();
  // Each was cut without an answer.
  for (auto& c : loris) {
    const auto got = c->read_until_closed(std::chrono::seconds(10));
    REQUIRE(got.has_value());
    CHECK(*got == "");
  }
}

TEST_CASE("metrics_server: a head trickled in byte by byte is cut at head_deadline") {
  obs::metrics_server_limits limits;
  limits.head_deadline = std::chrono::milliseconds(500);
  limits.connection_deadline = std::chrono::minutes(10);
  metrics_server server([] { return std::string("up 1\n"); }, limits);
  const int port = server.start("127.0.0.1", 0);
  raw_client c(port);
  const std::string head =
      "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: " + std::string(300, 'a') + "\r\n\r\n";
  // One byte, then up to 100 ms for the server to answer or close: a head that would take
  // 30 s. Each read of the server's sees a new byte, so a per-read timeout never fires.
  std::size_t sent = 0;
  bool closed = false;
  std::string got;
  while (sent < head.size() && !closed) {
    if (!c.send_all(head.substr(sent, 1))) break;
    ++sent;
    pollfd p{c.fd(), POLLIN, 0};
    if (poll(&p, 1, 100) > 0) {
      char buf[512];
      const ssize_t n = recv(c.fd(), buf, sizeof buf, 0);
      if (n <= 0) closed = true;
      if (n > 0) got.append(buf, static_cast<std::size_t>(n));
    }
  }
  INFO("bytes sent: ", sent, " of ", head.size(), "; answer: ", got);
  CHECK(sent < head.size());
  CHECK(got == "");
  CHECK(eventually(std::chrono::seconds(10), [&] { return server.connections() == 0; }));
}

TEST_CASE("metrics_server: a POST with a 1 GiB body is refused with 405 before the body is read") {
  std::atomic<int> renders{0};
  metrics_server server([&renders] {
    ++renders;
    return std::string("up 1\n");
  });
  const int port = server.start("127.0.0.1", 0);
  raw_client c(port);
  CHECK(c.send_all("POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1073741824\r\n\r\n"));
  CHECK(c.send_all(std::string(16384, 'x')));
  // Answered and closed with 1 GiB - 16 KiB of the body never sent: the server did not wait
  // for the body, so it did not read (nor hold) it.
  const auto answer = c.read_until_closed(std::chrono::seconds(10));
  REQUIRE_MESSAGE(answer.has_value(), "the server is waiting for the body");
  CHECK_MESSAGE(answer->rfind("HTTP/1.1 405 ", 0) == 0, *answer);
  CHECK(contains(*answer, "Allow: GET, HEAD\r\n"));
  CHECK(contains(*answer, "not allowed"));
  for (const char* method : {"PUT", "DELETE", "PATCH", "OPTIONS"}) {
    raw_client other(port);
    CHECK(other.send_all(std::string(method) + " /metrics HTTP/1.1\r\nHost: x\r\n\r\n"));
    const auto said = other.read_until_closed(std::chrono::seconds(10));
    REQUIRE(said.has_value());
    CHECK_MESSAGE(said->rfind("HTTP/1.1 405 ", 0) == 0, method, ": ", *said);
  }
  CHECK(renders == 0);
  // HEAD is GET without the body.
  raw_client head(port);
  CHECK(head.send_all("HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n"));
  const auto said = head.read_until_closed(std::chrono::seconds(10));
  REQUIRE(said.has_value());
  CHECK(said->rfind("HTTP/1.1 200 ", 0) == 0);
  CHECK(said->size() >= 4);
  CHECK(said->substr(said->size() - 4) == "\r\n\r\n");
}

TEST_CASE("metrics_server: with 200 idle connections open a scrape is still answered") {
  const obs::metrics_server_limits limits;
  metrics_server server([] { return std::string("up 1\n"); });
  const int port = server.start("127.0.0.1", 0);
  std::vector<std::unique_ptr<raw_client>> idle;
  for (int i = 0; i < 200; ++i) idle.push_back(std::make_unique<raw_client>(port));
  // The scrape's connection displaces the oldest idle one; get() gives up after 5 s.
  const scrape s = get(port, "/metrics");
  CHECK(s.status == 200);
  CHECK(s.body == "up 1\n");
  // The count is bounded: all but max_connections - 1 of the idle ones were cut for room.
  const std::size_t must_close = idle.size() - (limits.max_connections - 1);
  std::size_t closed = 0;
  CHECK(eventually(std::chrono::seconds(10), [&] {
    closed = 0;
    for (auto& c : idle) {
      pollfd p{c->fd(), POLLIN, 0};
      closed += poll(&p, 1, 0) > 0 ? 1 : 0;  // idle: readable means closed
    }
    return closed >= must_close;
  }));
  INFO("closed: ", closed, " of ", idle.size());
  CHECK(server.connections() <= limits.max_connections);
}

TEST_CASE("metrics_server: an address beyond loopback warns, louder for a keyed job") {
  CHECK(metrics_server::loopback_host("127.0.0.1"));
  CHECK(metrics_server::loopback_host("127.0.0.2"));
  CHECK(metrics_server::loopback_host("localhost"));
  CHECK_FALSE(metrics_server::loopback_host("0.0.0.0"));
  CHECK_FALSE(metrics_server::loopback_host("10.1.2.3"));
  CHECK(metrics_server::exposure_warning("127.0.0.1", true) == "");
  CHECK(metrics_server::exposure_warning("localhost", false) == "");
  const std::string keyed = metrics_server::exposure_warning("0.0.0.0", true);
  CHECK(contains(keyed, "serving on 0.0.0.0"));
  CHECK(contains(keyed, "without authentication"));
  CHECK(contains(keyed, "loss, step, worker names and traffic"));
  CHECK(contains(keyed, "keys protect its control plane, not this endpoint"));
  CHECK(contains(keyed, "--metrics 127.0.0.1:PORT"));
  const std::string plain = metrics_server::exposure_warning("10.1.2.3", false);
  CHECK(contains(plain, "without authentication"));
  CHECK_FALSE(contains(plain, "keys"));
}
