// build_abort: a communicator under construction ends at once when its generation is over.
// The case that matters is a peer that published its pair address and then died: Gloo's
// listening side waits 5x the rendezvous timeout for it to connect (300 s here). The dead
// peer is played by the test: it publishes, as Gloo's connectFullMesh would, an address
// that nobody listens on and that sorts above rank 0's, so rank 0 is the side that waits.
#include <doctest/doctest.h>
#include <gloo/transport/tcp/address.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>
#include <string>
#include <thread>

#include "runtime/comm/build_abort.hpp"
#include "runtime/comm/factory.hpp"
#include "tests/comm/comm_test_util.hpp"

using namespace cohort::comm;
using cohort::comm_backend;
using namespace cohort::comm::test;
using std::chrono::milliseconds;

namespace {

// A failure must come well before this on a loaded 2-core machine; the waits it cuts are
// 60 s (store) and 300 s (connect).
constexpr double kSlackSeconds = 15.0;

// What rank 1 of a 2-rank group publishes for rank 0 before it connects: one pair address.
// Port 65535 is 0xffff in network order, above any port rank 0 listens on, so Gloo makes
// rank 0 the listening side of the pair (tcp::Pair::connect compares the raw ports).
std::vector<char> dead_peer_addresses() {
  sockaddr_storage ss{};
  auto* in = reinterpret_cast<sockaddr_in*>(&ss);
  in->sin_family = AF_INET;
  in->sin_port = htons(65535);
  in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return gloo::transport::tcp::Address(ss, 0).bytes();
}

// Waits (bounded) until KEY is in KV.
bool await_key(memory_kv& kv, const std::string& key) {
  try {
    kv.get(key, milliseconds(30000));
    return true;
  } catch (const comm_error&) {
    return false;
  }
}

struct build_result {
  double took = -1;
  comm_failure kind = comm_failure::invalid;
  std::string what;
  bool built = false;
};

// Rank 0 of 2 builds generation 5 over KV with a 60 s rendezvous timeout and CANCEL.
build_result build_rank0(memory_kv& kv, const std::shared_ptr<build_abort>& cancel) {
  build_result r;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    transport_options t;
    t.group = "dp";
    t.cancel = cancel;
    t.rendezvous_timeout_ms = 60000;
    auto c = make_communicator(comm_backend::gloo, "cpu", kv, 0, 2, 5, 60000, t);
    r.built = c != nullptr;
  } catch (const comm_error& e) {
    r.kind = e.kind();
    r.what = e.what();
  }
  r.took = seconds_since(t0);
  return r;
}

}  // namespace

TEST_CASE("build_abort runs armed actions once, at abort or at once when armed after it") {
  build_abort b;
  int ran = 0, dropped = 0;
  b.arm([&] { ++ran; });
  const auto id = b.arm([&] { ++dropped; });
  b.disarm(id);
  CHECK_NOTHROW(b.check("op"));
  b.abort("generation 3 is over");
  b.abort("a second reason");
  CHECK(ran == 1);
  CHECK(dropped == 0);
  CHECK(b.why() == "generation 3 is over");
  b.arm([&] { ++ran; });
  CHECK(ran == 2);
  try {
    b.check("build of group 'dp'");
    FAIL("check passed after abort");
  } catch (const comm_error& e) {
    CHECK(e.kind() == comm_failure::aborted);
    CHECK(std::string(e.what()).find("generation 3 is over") != std::string::npos);
  }
}

TEST_CASE("a build whose generation is already over fails at once, before any rendezvous") {
  memory_kv kv;
  auto cancel = std::make_shared<build_abort>();
  cancel->abort("generation 5 is over (the roster is at 6)");
  const build_result r = build_rank0(kv, cancel);
  CHECK_FALSE(r.built);
  CHECK(r.kind == comm_failure::aborted);
  CHECK(r.took < kSlackSeconds);
  CHECK(kv.keys().empty());  // nothing was published for a generation that is over
}

TEST_CASE("abort ends a connect that waits for a peer which published its address and died") {
  memory_kv kv;
  kv.set(generation_key(5, "dp/gloo/1"), dead_peer_addresses());
  auto cancel = std::make_shared<build_abort>();
  build_result r;
  std::thread builder([&] { r = build_rank0(kv, cancel); });
  // Rank 0 publishes its own addresses after its pairs exist and right before it connects:
  // from then on only the abort can end the wait (the store has everything it asks for).
  const bool published = await_key(kv, generation_key(5, "dp/gloo/0"));
  const auto t_abort = std::chrono::steady_clock::now();
  cancel->abort("generation 5 is over (the roster is at 6)");
  builder.join();
  REQUIRE(published);
  CAPTURE(r.what);
  CHECK_FALSE(r.built);
  CHECK(r.kind == comm_failure::aborted);
  CHECK(seconds_since(t_abort) < kSlackSeconds);  // Gloo alone waits 300 s here
  CHECK(r.what.find("generation 5 is over") != std::string::npos);
}

TEST_CASE("a build aborted while it waits in the store fails on the store's answer") {
  // The store's own wait is cut by the store (the coordinator answers superseded); a local
  // store runs to its timeout. What the abort guarantees is that the build then reports
  // aborted, not a timeout, and publishes nothing more.
  memory_kv kv;
  auto cancel = std::make_shared<build_abort>();
  kv_gloo_store store(kv, 9, milliseconds(400));
  gloo_options o;
  o.timeout = milliseconds(400);
  o.cancel = cancel;
  std::thread aborter([&] {
    await_key(kv, generation_key(9, "gloo/0"));
    cancel->abort("generation 9 is over");
  });
  comm_failure kind = comm_failure::invalid;
  try {
    gloo_comm lonely(store, 0, 2, o);  // rank 1 never comes
  } catch (const comm_error& e) {
    kind = e.kind();
  }
  aborter.join();
  CHECK(kind == comm_failure::aborted);
}
