// p2p_channel: stages as threads in one process exchanging tensors out of order (the stash),
// an 8 MiB payload, crafted frames that lie (generation, magic, version, truncated header,
// size, shape) dropped and counted, timeouts, abort from another thread, dead peers; and
// `bench p2p` through its CLI (forked ranks, tiny sizes, no speed asserted).
#include <doctest/doctest.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "runtime/comm/p2p.hpp"
#include "runtime/core/error.hpp"
#include "tests/comm/p2p_test_util.hpp"

namespace cohort::cli {
void add_bench_p2p(CLI::App& bench, int* rc);  // tools/cmd_bench_p2p.cpp
}

using namespace cohort::comm;
using cohort::comm::test::header_bytes;
using cohort::comm::test::raw_pusher;
using clock_type = std::chrono::steady_clock;

namespace {

// Bytes that differ by sender, tag and position, computable on both sides.
std::vector<unsigned char> pattern(std::size_t n, int sender, std::uint64_t tag) {
  std::vector<unsigned char> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<unsigned char>((i * 2654435761u >> 7) + sender * 31 + tag * 7);
  return v;
}

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// The failure kind of what `fn` throws; fails the test when it throws nothing else.
template <class Fn>
comm_failure failure_of(Fn&& fn) {
  try {
    fn();
  } catch (const comm_error& e) {
    return e.kind();
  }
  FAIL("no comm_error thrown");
  return comm_failure::unavailable;
}

// An endpoint nobody listens on: bound once by a channel that is gone.
std::string dead_endpoint() {
  p2p_channel gone("127.0.0.1", 9, 1, 100);
  return gone.endpoint();
}

}  // namespace

TEST_CASE("p2p header: fixed little-endian layout, decode inverts encode") {
  p2p_header h;
  h.generation = 0x0102030405060708ull;
  h.sender = -2;
  h.tag = 0x1122334455667788ull;
  h.bytes = 8u << 20;
  const std::string s = header_bytes(h);
  REQUIRE(s.size() == 40);
  CHECK(s.substr(0, 4) == "CP2P");  // the magic reads as text in a dump
  CHECK(s[4] == 1);                 // version 1, little-endian
  CHECK(static_cast<unsigned char>(s[8]) == 0x08);
  CHECK(static_cast<unsigned char>(s[15]) == 0x01);
  CHECK(static_cast<unsigned char>(s[16]) == 0xfe);  // -2 as two's complement
  CHECK(static_cast<unsigned char>(s[34]) == 0x80);  // 8 MiB = 0x800000: byte 2 of bytes
  const p2p_header d = decode_p2p_header(reinterpret_cast<const unsigned char*>(s.data()));
  CHECK(d.magic == p2p_header::magic_value);
  CHECK(d.version == 1);
  CHECK(d.generation == h.generation);
  CHECK(d.sender == -2);
  CHECK(d.tag == h.tag);
  CHECK(d.bytes == h.bytes);
}

TEST_CASE("p2p: a middle stage receives activations and gradients in any interleaving") {
  const std::uint64_t gen = 7;
  p2p_channel s0("127.0.0.1", 0, gen, 5000), s1("127.0.0.1", 1, gen, 5000),
      s2("127.0.0.1", 2, gen, 5000);
  s0.connect(1, s1.endpoint());
  s2.connect(1, s1.endpoint());
  s1.connect(0, s0.endpoint());
  s1.connect(2, s2.endpoint());
  auto size_of = [](std::uint64_t tag) { return std::size_t(1000 + 37 * tag); };

  // Stage 0 sends activations of micro-batches 2, 0, 1; stage 2 gradients of 1, 2, 0; both
  // use the same tags, so only the sender tells them apart.
  auto first = std::async(std::launch::async, [&] {
    for (std::uint64_t t : {2, 0, 1}) s0.send(1, t, pattern(size_of(t), 0, t).data(), size_of(t));
    for (std::uint64_t t : {1, 0, 2}) {
      std::vector<unsigned char> got(size_of(t));
      s0.recv(1, t, got.data(), got.size());
      CHECK(got == pattern(size_of(t), 1, t + 100));
    }
  });
  auto last = std::async(std::launch::async, [&] {
    for (std::uint64_t t : {1, 2, 0}) s2.send(1, t, pattern(size_of(t), 2, t).data(), size_of(t));
    std::vector<unsigned char> got(size_of(5));
    s2.recv(1, 5, got.data(), got.size());
    CHECK(got == pattern(size_of(5), 1, 5));
  });

  std::size_t received = 0;
  for (auto [peer, tag] :
       std::vector<std::pair<int, std::uint64_t>>{{0, 0}, {2, 0}, {2, 2}, {0, 2}, {0, 1}, {2, 1}}) {
    std::vector<unsigned char> got(size_of(tag));
    s1.recv(peer, tag, got.data(), got.size());
    CHECK(got == pattern(size_of(tag), peer, tag));
    received += got.size();
  }
  for (std::uint64_t t : {0, 1, 2})
    s1.send(0, t, pattern(size_of(t), 1, t + 100).data(), size_of(t));
  s1.send(2, 5, pattern(size_of(5), 1, 5).data(), size_of(5));
  first.get();
  last.get();

  CHECK(s1.stashed() == 0);
  CHECK(s1.dropped() == 0);
  CHECK(s1.bytes_received() == received);
  CHECK(s1.bytes_received() == 2 * (size_of(0) + size_of(1) + size_of(2)));
  CHECK(s0.bytes_sent() == size_of(0) + size_of(1) + size_of(2));
  CHECK(s1.bytes_sent() == size_of(0) + size_of(1) + size_of(2) + size_of(5));
  CHECK(s2.bytes_received() == size_of(5));
}

TEST_CASE("p2p: an 8 MiB tensor arrives byte for byte and repeated tags come in send order") {
  p2p_channel a("127.0.0.1", 0, 1, 10000), b("127.0.0.1", 1, 1, 10000);
  a.connect(1, b.endpoint());
  const std::size_t n = 8u << 20;
  const auto big = pattern(n, 0, 42);
  a.send(1, 42, big.data(), n);
  // Three frames with one tag: a stage sending micro-batch k twice in two steps.
  for (int i = 0; i < 3; ++i) {
    const std::uint32_t v = 1000 + i;
    a.send(1, 9, &v, sizeof v);
  }
  for (int i = 0; i < 3; ++i) {
    std::uint32_t v = 0;
    b.recv(0, 9, &v, sizeof v);
    CHECK(v == 1000u + i);
  }
  std::vector<unsigned char> got(n, 0);
  b.recv(0, 42, got.data(), n);
  CHECK(got == big);
  CHECK(b.bytes_received() == n + 12);
  CHECK(a.bytes_sent() == n + 12);
  // A zero-byte message is a valid frame too (a signal with no payload).
  a.send(1, 77, nullptr, 0);
  b.recv(0, 77, nullptr, 0);
  CHECK(b.dropped() == 0);
}

TEST_CASE("p2p: crafted frames that lie are counted and dropped, the good one still arrives") {
  p2p_channel b("127.0.0.1", 1, 5, 3000);
  raw_pusher raw(b.endpoint());
  p2p_header good;
  good.generation = 5;
  good.sender = 0;
  good.tag = 3;
  good.bytes = 8;
  const std::string payload = "abcdefgh";

  p2p_header h = good;
  h.generation = 4;  // a late frame of the previous generation
  raw.send({header_bytes(h), payload});
  h = good;
  h.magic = 0xdeadbeef;
  raw.send({header_bytes(h), payload});
  h = good;
  h.version = 2;
  raw.send({header_bytes(h), payload});
  raw.send({header_bytes(good).substr(0, 39), payload});  // truncated header
  h = good;
  h.bytes = 1u << 30;  // says 1 GiB, holds 8 bytes: must never size a copy
  raw.send({header_bytes(h), payload});
  h = good;
  h.bytes = 4;  // says fewer bytes than it holds
  raw.send({header_bytes(h), payload});
  raw.send({header_bytes(good)});                    // no payload part
  raw.send({header_bytes(good), payload, "extra"});  // a third part
  raw.send({std::string(), payload});                // empty header
  raw.send({header_bytes(good), payload});           // the only valid one

  std::string got(8, '\0');
  b.recv(0, 3, got.data(), got.size());
  CHECK(got == payload);
  // One PUSH socket delivers in order: every bad frame was looked at before the good one.
  CHECK(b.dropped() == 9);
  CHECK(b.bytes_received() == 8);
  CHECK(b.stashed() == 0);
}

TEST_CASE("p2p: frames between channels of different generations never meet") {
  p2p_channel old_gen("127.0.0.1", 0, 3, 2000), b("127.0.0.1", 1, 4, 300);
  old_gen.connect(1, b.endpoint());
  const std::uint64_t v = 5;
  old_gen.send(1, 0, &v, sizeof v);
  std::uint64_t got = 0;
  CHECK(failure_of([&] { b.recv(0, 0, &got, sizeof got); }) == comm_failure::timeout);
  CHECK(got == 0);
  CHECK(b.dropped() == 1);
}

TEST_CASE("p2p: a frame of another size than recv expects is invalid, dropped and counted") {
  p2p_channel a("127.0.0.1", 0, 1, 2000), b("127.0.0.1", 1, 1, 2000);
  a.connect(1, b.endpoint());
  const std::vector<float> v(16, 1.5f);
  a.send(1, 0, v.data(), v.size() * sizeof(float));
  std::vector<float> got(8, 0.0f);
  CHECK(failure_of([&] { b.recv(0, 0, got.data(), got.size() * sizeof(float)); }) ==
        comm_failure::invalid);
  CHECK(got == std::vector<float>(8, 0.0f));  // nothing written into the short buffer
  CHECK(b.dropped() == 1);
  CHECK(b.dead());
  // Dead after a failure, as a communicator is: every later call fails at once.
  CHECK(failure_of([&] { b.recv(0, 1, got.data(), 4); }) == comm_failure::invalid);
}

TEST_CASE("p2p: recv and send time out within the timeout plus slack") {
  p2p_channel a("127.0.0.1", 0, 1, 200);
  std::uint32_t x = 0;
  auto t0 = clock_type::now();
  CHECK(failure_of([&] { a.recv(1, 0, &x, sizeof x); }) == comm_failure::timeout);
  double dt = seconds_since(t0);
  CHECK(dt >= 0.19);
  CHECK(dt < 3.0);
  CHECK(a.dead());

  // Nobody listens at the peer's address: the socket never becomes writable.
  p2p_channel s("127.0.0.1", 0, 1, 200);
  s.connect(1, dead_endpoint());
  t0 = clock_type::now();
  CHECK(failure_of([&] { s.send(1, 0, &x, sizeof x); }) == comm_failure::timeout);
  dt = seconds_since(t0);
  CHECK(dt >= 0.19);
  CHECK(dt < 3.0);
}

namespace {

// Arms a channel's before_wait seam: wait() returns once a send or recv of it is blocked, and
// waits() says how often one was (so a case proves the blocked path ran, not the one where
// abort() came first and the call failed at its entry).
class blocked_call {
 public:
  /// Only waits for which WHEN holds count (default: all).
  explicit blocked_call(
      p2p_channel& c, std::function<bool()> when = [] { return true; })
      : when_(std::move(when)) {
    c.set_before_wait([this] {
      if (when_() && waits_.fetch_add(1) == 0) blocked_.set_value();
    });
  }
  void wait() { blocked_.get_future().wait(); }
  int waits() const { return waits_.load(); }

 private:
  std::function<bool()> when_;
  std::promise<void> blocked_;
  std::atomic<int> waits_{0};
};

}  // namespace

TEST_CASE("p2p: abort from another thread wakes a blocked recv and a blocked send") {
  SUBCASE("recv") {
    p2p_channel a("127.0.0.1", 0, 1, 30000);
    blocked_call blocked_in(a);
    auto blocked = std::async(std::launch::async, [&] {
      std::uint32_t x = 0;
      return failure_of([&] { a.recv(1, 0, &x, sizeof x); });
    });
    blocked_in.wait();
    const auto t0 = clock_type::now();
    a.abort();
    CHECK(blocked.get() == comm_failure::aborted);
    CHECK(seconds_since(t0) < 2.0);
    CHECK(blocked_in.waits() >= 1);
  }
  SUBCASE("send to a peer that is not there") {
    p2p_channel a("127.0.0.1", 0, 1, 30000);
    a.connect(1, dead_endpoint());
    blocked_call blocked_in(a);
    auto blocked = std::async(std::launch::async, [&] {
      std::uint32_t x = 0;
      return failure_of([&] { a.send(1, 0, &x, sizeof x); });
    });
    blocked_in.wait();
    const auto t0 = clock_type::now();
    a.abort();
    CHECK(blocked.get() == comm_failure::aborted);
    CHECK(seconds_since(t0) < 2.0);
    CHECK(blocked_in.waits() >= 1);
    CHECK(a.bytes_sent() == 0);
  }
  SUBCASE("send to a live peer that stopped reading (queues full)") {
    p2p_channel a("127.0.0.1", 0, 1, 30000), b("127.0.0.1", 1, 1, 30000);
    a.connect(1, b.endpoint());
    const std::vector<unsigned char> mib(1u << 20, 7);
    // A wait after frames went out: the queues are full, not the connection still being made.
    blocked_call blocked_in(a, [&] { return a.bytes_sent() > 0; });
    auto blocked = std::async(std::launch::async, [&] {
      return failure_of([&] {
        for (std::uint64_t t = 0; t < 100000; ++t) a.send(1, t, mib.data(), mib.size());
      });
    });
    blocked_in.wait();
    const auto t0 = clock_type::now();
    a.abort();
    CHECK(blocked.get() == comm_failure::aborted);
    CHECK(seconds_since(t0) < 2.0);
    CHECK(blocked_in.waits() >= 1);
    CHECK(a.bytes_sent() > 0);
  }
}

TEST_CASE("p2p: after abort every call fails at once with aborted and abort is idempotent") {
  p2p_channel a("127.0.0.1", 0, 1, 30000), b("127.0.0.1", 1, 1, 30000);
  a.connect(1, b.endpoint());
  a.abort();
  a.abort();
  std::uint32_t x = 1;
  const auto t0 = clock_type::now();
  CHECK(failure_of([&] { a.send(1, 0, &x, sizeof x); }) == comm_failure::aborted);
  CHECK(failure_of([&] { a.recv(1, 0, &x, sizeof x); }) == comm_failure::aborted);
  CHECK(failure_of([&] { a.connect(2, b.endpoint()); }) == comm_failure::aborted);
  CHECK(seconds_since(t0) < 1.0);
  CHECK(a.dead());
  CHECK_FALSE(b.dead());  // abort is local; the peer learns through its own timeout
}

TEST_CASE("p2p: a peer that died makes send time out, and destruction does not wait for it") {
  auto a = std::make_unique<p2p_channel>("127.0.0.1", 0, 1, 300);
  auto b = std::make_unique<p2p_channel>("127.0.0.1", 1, 1, 300);
  a->connect(1, b->endpoint());
  std::uint32_t x = 11;
  a->send(1, 0, &x, sizeof x);
  std::uint32_t got = 0;
  b->recv(0, 0, &got, sizeof got);
  CHECK(got == 11);
  b.reset();  // the peer's process is gone: its socket is closed

  // Frames may still be queued for the short while until the connection's end is seen;
  // then the socket is no longer writable and send times out.
  const auto t0 = clock_type::now();
  comm_failure kind = failure_of([&] {
    for (std::uint64_t t = 1; t < 100000; ++t) a->send(1, t, &x, sizeof x);
  });
  CHECK(kind == comm_failure::timeout);
  CHECK(seconds_since(t0) < 5.0);

  // Destruction with frames queued for a peer that never reads them, and with a peer that
  // is gone: linger 0, nothing waits.
  auto c = std::make_unique<p2p_channel>("127.0.0.1", 0, 1, 2000);
  auto d = std::make_unique<p2p_channel>("127.0.0.1", 1, 1, 2000);
  c->connect(1, d->endpoint());
  c->connect(2, dead_endpoint());
  const std::vector<unsigned char> mib(1u << 20, 3);
  for (std::uint64_t t = 0; t < 8; ++t) c->send(1, t, mib.data(), mib.size());
  d.reset();
  const auto t1 = clock_type::now();
  c.reset();
  a.reset();
  CHECK(seconds_since(t1) < 1.0);
}

TEST_CASE("p2p: misuse is a comm_error that says what to fix") {
  CHECK(failure_of([] { p2p_channel c("127.0.0.1", 0, 1, 0); }) == comm_failure::invalid);
  CHECK_THROWS_AS(p2p_channel("no such host.invalid", 0, 1, 100), comm_error);
  p2p_channel a("127.0.0.1", 0, 1, 100);
  CHECK(a.endpoint().rfind("tcp://127.0.0.1:", 0) == 0);
  CHECK(a.endpoint() != "tcp://127.0.0.1:0");
  std::uint32_t x = 0;
  CHECK(failure_of([&] { a.send(3, 0, &x, sizeof x); }) == comm_failure::invalid);
  p2p_channel b("127.0.0.1", 0, 1, 100);
  CHECK(failure_of([&] { b.connect(1, "not an endpoint"); }) == comm_failure::invalid);
  p2p_channel c("127.0.0.1", 0, 1, 100);
  c.connect(1, a.endpoint());
  CHECK(failure_of([&] { c.connect(1, a.endpoint()); }) == comm_failure::invalid);
}

TEST_CASE("bench p2p through its CLI: one row per size, bandwidths consistent with times") {
  char tmpl[] = "/tmp/cohort-test-p2p-XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  const std::string json_path = std::string(tmpl) + "/out.json";
  CLI::App app{"bench p2p test"};
  int rc = -1;
  auto* bench = app.add_subcommand("bench", "benchmarks");
  cohort::cli::add_bench_p2p(*bench, &rc);
  app.parse(
      "bench p2p --sizes 4KiB,64k --iters 3 --rounds 2 --warmup 1 --timeout-ms 20000 "
      "--json " +
          json_path,
      false);
  CHECK(rc == 0);
  std::ifstream in(json_path);
  REQUIRE(in.good());
  const auto j = nlohmann::json::parse(in);
  std::remove(json_path.c_str());
  std::remove(tmpl);
  CHECK(j.at("bench") == "p2p");
  REQUIRE(j.at("rows").size() == 2);
  CHECK(j["rows"][0]["bytes"] == 4096);
  CHECK(j["rows"][1]["bytes"] == 65536);
  for (const auto& row : j["rows"]) {
    const double bytes = row["bytes"];
    CHECK(row["iters"] == 3);
    for (const char* path : {"pingpong", "stream"}) {
      const double t = row[path]["time_us"], gbps = row[path]["gbps"];
      CHECK(t > 0);
      CHECK(gbps == doctest::Approx(bytes / (t * 1e-6) / 1e9));
    }
    const double t = row["allreduce"]["time_us"], alg = row["allreduce"]["algbw_gbps"],
                 bus = row["allreduce"]["busbw_gbps"];
    CHECK(t > 0);
    CHECK(alg == doctest::Approx(bytes / (t * 1e-6) / 1e9));
    CHECK(bus == doctest::Approx(alg));  // 2(n-1)/n = 1 for n = 2
    CHECK(double(row["ratio_stream_busbw"]) ==
          doctest::Approx(double(row["stream"]["gbps"]) / bus));
    CHECK(double(row["ratio_pingpong_busbw"]) ==
          doctest::Approx(double(row["pingpong"]["gbps"]) / bus));
  }
}

TEST_CASE("bench p2p refuses sizes it cannot run") {
  auto parse = [](const std::string& args) {
    CLI::App app{"bench p2p test"};
    int rc = -1;
    auto* bench = app.add_subcommand("bench", "benchmarks");
    cohort::cli::add_bench_p2p(*bench, &rc);
    app.parse(args, false);
  };
  CHECK_THROWS_AS(parse("bench p2p --sizes 3"), cohort::usage_error);
  CHECK_THROWS_AS(parse("bench p2p --sizes 1X"), CLI::ParseError);
  CHECK_THROWS_AS(parse("bench p2p --iters -1"), CLI::ParseError);
}

TEST_CASE("p2p: a frame over the size limit never arrives, the channel goes on for others") {
  p2p_limits lim;
  lim.max_message_bytes = 64;
  p2p_channel b("127.0.0.1", 1, 5, 1000, lim);
  p2p_header h;
  h.generation = 5;
  h.sender = 0;
  h.tag = 3;
  h.bytes = 65;
  {
    raw_pusher big(b.endpoint());
    big.send({header_bytes(h), std::string(65, 'x')});  // ZeroMQ drops this connection
    std::string got(65, '\0');
    CHECK_THROWS_AS(b.recv(0, 3, got.data(), got.size()), comm_error);  // timeout: never came
  }
  // A fresh channel with the same limit takes a frame of exactly the limit.
  p2p_channel c("127.0.0.1", 1, 5, 3000, lim);
  raw_pusher ok(c.endpoint());
  h.bytes = 64;
  ok.send({header_bytes(h), std::string(64, 'y')});
  std::string got(64, '\0');
  c.recv(0, 3, got.data(), got.size());
  CHECK(got == std::string(64, 'y'));
}

TEST_CASE("p2p: frames nobody asks for fill a bounded stash, then recv fails and says why") {
  p2p_limits lim;
  lim.max_stash_frames = 3;
  p2p_channel b("127.0.0.1", 1, 5, 3000, lim);
  raw_pusher raw(b.endpoint());
  p2p_header h;
  h.generation = 5;
  h.sender = 0;
  h.bytes = 4;
  for (uint64_t tag = 100; tag < 110; ++tag) {  // ten frames of tags nobody will ask for
    h.tag = tag;
    raw.send({header_bytes(h), "abcd"});
  }
  h.tag = 7;
  raw.send({header_bytes(h), "wxyz"});  // the one asked for comes last
  std::string got(4, '\0');
  try {
    b.recv(0, 7, got.data(), got.size());
    FAIL("recv should have failed on the fourth unasked frame");
  } catch (const comm_error& e) {
    CHECK(e.kind() == comm_failure::invalid);
    CHECK(std::string(e.what()).find("4 frames (16 bytes) arrived that nobody asked for; the "
                                     "limit is 3 frames") != std::string::npos);
  }
  CHECK(b.dead());
  CHECK(b.stashed() == 3);  // held no more than the limit
  CHECK(b.stashed_bytes() == 12);
  // The byte bound works the same way.
  p2p_limits by_bytes;
  by_bytes.max_stash_bytes = 10;
  p2p_channel c("127.0.0.1", 1, 5, 3000, by_bytes);
  raw_pusher r2(c.endpoint());
  for (uint64_t tag = 100; tag < 103; ++tag) {
    h.tag = tag;
    r2.send({header_bytes(h), "abcd"});
  }
  CHECK_THROWS_AS(c.recv(0, 7, got.data(), got.size()), comm_error);
  CHECK(c.stashed_bytes() == 8);
}
