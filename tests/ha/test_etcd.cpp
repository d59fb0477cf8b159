// runtime/ha against a real etcd (Debian's etcd-server, started by local_etcd with the
// one-machine tuning): the client's calls, lease expiry, leader election with fencing terms,
// the errors a user sees, and TLS (only the run's client certificate gets in, only the
// run's etcd is trusted). Not tested here: several etcd members, etcd restarts.
// Cases in one process share one etcd (each under its own key prefix); CTest runs each case
// in its own process, so each then starts its own. Without etcd every case exits 77.
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "runtime/core/error.hpp"
#include "runtime/ha/election.hpp"
#include "runtime/ha/etcd_certs.hpp"
#include "runtime/ha/etcd_client.hpp"
#include "runtime/ha/local_etcd.hpp"
#include "tests/data/temp_dir.hpp"
#include "tests/eventually.hpp"
#include "tests/ha/require_etcd.hpp"

using namespace cohort::ha;
using cohort::test::eventually;
using std::chrono::milliseconds;
using std::chrono::steady_clock;

namespace {

using cohort::test::require_etcd;

local_etcd_options options_in(const cohort::test::temp_dir& dir) {
  local_etcd_options o;
  o.dir = dir.path().string();
  return o;
}

struct etcd_fixture {
  cohort::test::temp_dir dir;
  local_etcd server{options_in(dir)};
};

// The etcd this process's cases share; stopped and removed at exit.
etcd_fixture& shared_etcd() {
  require_etcd();
  static etcd_fixture f;
  return f;
}
const std::string& shared_endpoint() { return shared_etcd().server.endpoint(); }
// The client certificate it admits.
const etcd_tls& shared_tls() { return shared_etcd().server.client_tls(); }

// A TCP socket bound to a free loopback port (listening when LISTEN) and that port.
std::pair<int, int> loopback_socket(bool listen) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  if (listen) REQUIRE(::listen(fd, 8) == 0);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  return {fd, ntohs(a.sin_port)};
}

// A loopback port with nothing listening on it (bound, then closed).
int closed_port() {
  const auto [fd, port] = loopback_socket(false);
  ::close(fd);
  return port;
}

std::string what_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const cohort::error& e) {
    return e.what();
  }
  return "(no error)";
}

double seconds_since(steady_clock::time_point t) {
  return std::chrono::duration<double>(steady_clock::now() - t).count();
}

// Starts B.campaign on another thread; RESULT will hold its term.
void campaign_in_background(leader_election& b, std::atomic<bool>& stop,
                            std::future<std::optional<int64_t>>& result) {
  result = std::async(std::launch::async, [&b, &stop] { return b.campaign(stop, 10); });
}

// The term of a background campaign once it wins; nullopt if it did not win within 10 s.
std::optional<int64_t> wait_term(std::future<std::optional<int64_t>>& result,
                                 std::atomic<bool>& stop) {
  if (result.wait_for(std::chrono::seconds(10)) != std::future_status::ready) stop = true;
  return result.get();
}

}  // namespace

TEST_CASE("kv round trip: put, get, get_prefix, del, with binary keys and values") {
  etcd_client c({shared_endpoint()}, etcd_timeouts{}, shared_tls());
  std::string all_bytes;
  for (int i = 0; i < 256; ++i) all_bytes += static_cast<char>(i);
  const std::string nul_key("rt/\0k", 5);
  c.put("rt/a", all_bytes);
  c.put(nul_key, "");
  c.put("rt/b", "line\nbreak");
  c.put("rt0", "outside the prefix");
  c.put("rs/z", "outside the prefix");

  const auto a = c.get("rt/a");
  REQUIRE(a);
  CHECK(a->key == "rt/a");
  CHECK(a->value == all_bytes);
  CHECK(a->lease == 0);
  REQUIRE(c.get(nul_key));
  CHECK(c.get(nul_key)->value.empty());
  CHECK_FALSE(c.get("rt/absent"));

  const auto in = c.get_prefix("rt/");
  REQUIRE(in.size() == 3);
  CHECK(in[0].key == nul_key);  // key order: "\0" sorts first
  CHECK(in[1].key == "rt/a");
  CHECK(in[2].key == "rt/b");
  CHECK(in[2].value == "line\nbreak");

  // A prefix ending in 0xff: its range end carries into the byte before.
  c.put("px\xff", "1");
  c.put("px\xff\x01", "2");
  c.put("py", "3");
  CHECK(c.get_prefix("px\xff").size() == 2);

  c.del("rt/a");
  c.del("rt/a");  // absent: nothing happens
  CHECK_FALSE(c.get("rt/a"));
  CHECK(c.get_prefix("rt/").size() == 2);
  CHECK(base64_decode(base64_encode(all_bytes)) == all_bytes);
  CHECK(base64_encode("ab") == "YWI=");
}

TEST_CASE("revisions grow with every write: create revision stays, mod revision moves") {
  etcd_client c({shared_endpoint()}, etcd_timeouts{}, shared_tls());
  const int64_t r1 = c.put("rev/k", "a");
  const int64_t r2 = c.put("rev/k", "b");
  const int64_t r3 = c.put("rev/other", "c");
  CHECK(r1 > 0);
  CHECK(r2 == r1 + 1);
  CHECK(r3 == r2 + 1);
  const auto k = c.get("rev/k");
  REQUIRE(k);
  CHECK(k->create_revision == r1);
  CHECK(k->mod_revision == r2);
  CHECK(k->value == "b");
}

TEST_CASE("create_if_absent creates once and a second candidate sees the holder") {
  etcd_client c({shared_endpoint()}, etcd_timeouts{}, shared_tls());
  const int64_t l1 = c.grant(10), l2 = c.grant(10);
  const txn_result first = c.create_if_absent("cia/k", "one", l1);
  CHECK(first.created);
  REQUIRE(first.current);
  CHECK(first.current->value == "one");
  CHECK(first.current->lease == l1);
  CHECK(first.current->create_revision == first.revision);

  const txn_result second = c.create_if_absent("cia/k", "two", l2);
  CHECK_FALSE(second.created);
  CHECK(second.revision == first.revision);  // a failed compare writes nothing
  REQUIRE(second.current);
  CHECK(second.current->value == "one");
  CHECK(second.current->lease == l1);
  CHECK(second.current->create_revision == first.revision);
  c.revoke(l1);
  c.revoke(l2);
}

TEST_CASE("keepalive reports the TTL and revoke deletes the lease's keys, idempotently") {
  etcd_client c({shared_endpoint()}, etcd_timeouts{}, shared_tls());
  const int64_t lease = c.grant(5);
  CHECK(c.keepalive(lease) == 5);
  c.put("rv/k", "v", lease);
  REQUIRE(c.get("rv/k"));
  CHECK(c.get("rv/k")->lease == lease);
  c.revoke(lease);
  CHECK_FALSE(c.get("rv/k"));
  CHECK(c.keepalive(lease) == 0);
  c.revoke(lease);  // gone already: not an error
  const std::string msg = what_of([&] { c.put("rv/k", "v", lease); });
  CHECK(msg.find("lease not found") != std::string::npos);
  CHECK(msg.find("rv/k") != std::string::npos);
}

TEST_CASE("an expired lease takes its key with it") {
  etcd_client c({shared_endpoint()}, etcd_timeouts{}, shared_tls());
  const int64_t lease = c.grant(1);
  c.put("exp/k", "v", lease);
  REQUIRE(c.get("exp/k"));
  const auto t0 = steady_clock::now();
  CHECK(eventually(milliseconds(10000), [&] { return !c.get("exp/k"); }));
  MESSAGE("TTL 1 lease expired after " << seconds_since(t0) << " s");
  CHECK(c.keepalive(lease) == 0);
}

TEST_CASE("two campaigners: one wins, the other only after it resigns, with a higher term") {
  etcd_client ca({shared_endpoint()}, etcd_timeouts{}, shared_tls()),
      cb({shared_endpoint()}, etcd_timeouts{}, shared_tls());
  leader_election a(ca, "el2/leader", "tcp://a:1 11", 5, 500);
  leader_election b(cb, "el2/leader", "tcp://b:2 22", 5, 500);
  std::atomic<bool> stop{false};
  const auto ta = a.campaign(stop, 10);
  REQUIRE(ta);
  CHECK(a.leading());
  std::future<std::optional<int64_t>> fb;
  campaign_in_background(b, stop, fb);
  // While A holds the key, B's create_if_absent cannot succeed.
  const auto seen = b.observe();
  REQUIRE(seen);
  CHECK(seen->value == "tcp://a:1 11");
  CHECK(seen->term == *ta);
  CHECK(seen->lease == a.lease());
  CHECK_FALSE(b.leading());

  a.resign();
  CHECK_FALSE(a.leading());
  const auto tb = wait_term(fb, stop);
  REQUIRE(tb);
  CHECK(*tb > *ta);
  CHECK(b.leading());
  CHECK_FALSE(a.lost());  // resigning is not losing
  const auto now = a.observe();
  REQUIRE(now);
  CHECK(now->value == "tcp://b:2 22");
  CHECK(now->term == *tb);

  // A third candidate waits while B leads, and gives up when told to.
  leader_election c(ca, "el2/leader", "tcp://c:3 33", 5, 500);
  std::atomic<bool> stop_c{false};
  std::future<std::optional<int64_t>> fc;
  campaign_in_background(c, stop_c, fc);
  stop_c = true;
  CHECK_FALSE(wait_term(fc, stop_c));
  CHECK_FALSE(c.leading());
  CHECK(a.observe()->term == *tb);
}

TEST_CASE("a revoked lease fires on_lost once") {
  etcd_client c({shared_endpoint()}, etcd_timeouts{}, shared_tls());
  leader_election a(c, "lost/leader", "a", 5, 50);
  std::atomic<int> fired{0};
  a.on_lost([&] { ++fired; });
  std::atomic<bool> stop{false};
  REQUIRE(a.campaign(stop, 10));
  c.revoke(a.lease());
  CHECK(eventually(milliseconds(5000), [&] { return a.lost(); }));
  CHECK_FALSE(a.leading());
  a.resign();  // joins the keepalive thread: nothing can fire after this
  CHECK(fired.load() == 1);
  CHECK_FALSE(a.observe());
}

TEST_CASE("depose of an old term ends it, and later leaves the new leader alone") {
  etcd_client ca({shared_endpoint()}, etcd_timeouts{}, shared_tls()),
      cb({shared_endpoint()}, etcd_timeouts{}, shared_tls()),
      cc({shared_endpoint()}, etcd_timeouts{}, shared_tls());
  leader_election a(ca, "dep/leader", "a", 5, 50);
  leader_election b(cb, "dep/leader", "b", 5, 50);
  leader_election standby(cc, "dep/leader", "c", 5, 50);
  std::atomic<bool> stop{false};
  const auto ta = a.campaign(stop, 10);
  REQUIRE(ta);
  std::future<std::optional<int64_t>> fb;
  campaign_in_background(b, stop, fb);

  CHECK(standby.depose(*ta));
  const auto tb = wait_term(fb, stop);
  REQUIRE(tb);
  CHECK(*tb > *ta);
  CHECK(eventually(milliseconds(5000), [&] { return a.lost(); }));

  CHECK_FALSE(standby.depose(*ta));  // the key now carries term tb
  CHECK(cc.keepalive(b.lease()) > 0);
  const auto now = standby.observe();
  REQUIRE(now);
  CHECK(now->term == *tb);
  CHECK(now->value == "b");
}

TEST_CASE("fenced_put with a stale term is refused") {
  etcd_client ca({shared_endpoint()}, etcd_timeouts{}, shared_tls()),
      cb({shared_endpoint()}, etcd_timeouts{}, shared_tls());
  leader_election a(ca, "fp/leader", "a", 5, 500);
  leader_election b(cb, "fp/leader", "b", 5, 500);
  std::atomic<bool> stop{false};
  CHECK_FALSE(a.fenced_put("fp/data", "never led"));
  REQUIRE(a.campaign(stop, 10));
  CHECK(a.fenced_put("fp/data", "from a"));
  a.resign();
  const auto tb = b.campaign(stop, 10);
  REQUIRE(tb);
  CHECK_FALSE(a.fenced_put("fp/data", "stale a"));
  REQUIRE(ca.get("fp/data"));
  CHECK(ca.get("fp/data")->value == "from a");
  CHECK(b.fenced_put("fp/data", "from b"));
  CHECK(ca.get("fp/data")->value == "from b");
  CHECK_THROWS_AS(ca.put_if_created_at("fp/data", "x", "fp/leader", 0), cohort::usage_error);
}

TEST_CASE("a leader that cannot reach etcd counts itself lost within the TTL") {
  require_etcd();
  cohort::test::temp_dir dir;
  local_etcd server(options_in(dir));
  CHECK(server.pid() > 0);
  etcd_client c({server.endpoint()}, etcd_timeouts{100, 300}, server.client_tls());
  leader_election a(c, "gone/leader", "a", 1, 200);
  std::atomic<bool> stop{false};
  REQUIRE(a.campaign(stop, 10));
  const auto t0 = steady_clock::now();
  server.stop();
  CHECK(server.pid() == 0);
  // At most TTL - period after the last renewal (itself at most one period before the stop).
  CHECK(eventually(milliseconds(5000), [&] { return a.lost(); }));
  const double s = seconds_since(t0);
  MESSAGE("lost " << s << " s after etcd stopped");
  CHECK(s < 1.5);
}

TEST_CASE("local_etcd with an unusable binary says what is missing") {
  cohort::test::temp_dir dir;
  local_etcd_options o = options_in(dir);
  o.binary = dir.file("no-such-etcd");
  const std::string missing = what_of([&] { local_etcd e(o); });
  CHECK(missing.find("etcd not found") != std::string::npos);
  CHECK(missing.find("etcd-server") != std::string::npos);
  CHECK(missing.find("no-such-etcd") != std::string::npos);

  o.binary = "/bin/false";
  const std::string died = what_of([&] { local_etcd e(o); });
  CHECK(died.find("stopped during start (exit 1)") != std::string::npos);
  CHECK(died.find("etcd.log") != std::string::npos);
}

TEST_CASE("a dead endpoint fails fast with a clear error and the next endpoint is used") {
  const std::string dead = "http://127.0.0.1:" + std::to_string(closed_port());
  etcd_client c({dead}, etcd_timeouts{200, 500});
  auto t0 = steady_clock::now();
  const std::string refused = what_of([&] { c.get("k"); });
  CHECK(seconds_since(t0) < 1.0);
  CHECK(refused.find("unreachable") != std::string::npos);
  CHECK(refused.find(dead) != std::string::npos);
  CHECK(refused.find("'k'") != std::string::npos);
  CHECK_FALSE(c.healthy());

  // Accepts connections (the backlog) but never answers: the read timeout ends the call.
  const auto [fd, port] = loopback_socket(true);
  const std::string silent = "http://127.0.0.1:" + std::to_string(port);
  etcd_client s({silent}, etcd_timeouts{200, 500});
  t0 = steady_clock::now();
  const std::string mute_put = what_of([&] { s.put("k", "v"); });
  CHECK(seconds_since(t0) < 2.0);
  CHECK(mute_put.find("may have been applied") != std::string::npos);
  ::close(fd);

  etcd_client both({dead, shared_endpoint()}, etcd_timeouts{200, 2000}, shared_tls());
  both.put("fo/k", "v");
  CHECK(both.get("fo/k")->value == "v");
  CHECK(both.healthy());

  CHECK_THROWS_AS(etcd_client({"127.0.0.1:2379"}), cohort::usage_error);
  CHECK_THROWS_AS(etcd_client({"https://127.0.0.1:2379"}), cohort::usage_error);
  CHECK_THROWS_AS(etcd_client({}), cohort::usage_error);
}

TEST_CASE("the run's etcd admits only its own client certificate") {
  // What another user of the host holds: the address, and at best a certificate of its own
  // (here one from another CA, as good as any it could make). etcd ends the handshake.
  const std::string& ep = shared_endpoint();
  cohort::test::temp_dir other;
  make_etcd_certs(other.path().string());
  const etcd_tls mine = etcd_tls_in(other.path().string());
  etcd_tls stranger = shared_tls();  // trusts the run's etcd, presents its own certificate
  stranger.cert_file = mine.cert_file;
  stranger.key_file = mine.key_file;
  etcd_client s({ep}, etcd_timeouts{300, 1000}, stranger);
  // (With TLS 1.3 the refusal of a client certificate reaches the client after its request
  // is sent: the call fails as unanswered rather than at the handshake.)
  const std::string refused = what_of([&] { s.put("trust/k", "v"); });
  CHECK_MESSAGE(refused.find("etcd put key 'trust/k'") != std::string::npos, refused);
  CHECK_FALSE(s.healthy());

  // Plain HTTP to the same port gets nothing either.
  etcd_client plain({"http://" + ep.substr(std::string("https://").size())},
                    etcd_timeouts{300, 1000});
  CHECK_THROWS_AS(plain.put("trust/k", "v"), cohort::error);

  // An etcd that is not the run's (its certificate from another CA) is refused by the run.
  etcd_tls wrong_ca = shared_tls();
  wrong_ca.ca_file = mine.ca_file;
  etcd_client w({ep}, etcd_timeouts{300, 1000}, wrong_ca);
  const std::string unverified = what_of([&] { w.get("trust/k"); });
  CHECK_MESSAGE(unverified.find("unreachable") != std::string::npos, unverified);

  etcd_client c({ep}, etcd_timeouts{}, shared_tls());
  CHECK_FALSE(c.get("trust/k").has_value());  // nothing of the above got through
  c.put("trust/k", "v");
  CHECK(c.get("trust/k")->value == "v");

  // The files: private, and no CA key to mint more certificates with.
  for (const char* f : {etcd_client_key_name, etcd_server_key_name, etcd_ca_name}) {
    struct stat st {};
    REQUIRE(::stat((other.path().string() + "/" + f).c_str(), &st) == 0);
    CHECK((st.st_mode & 077) == 0);
  }
  CHECK_FALSE(std::filesystem::exists(other.path() / "etcd-ca.key"));
}

TEST_CASE("base64 of the gateway: RFC 4648 vectors, padding, and refusals") {
  // RFC 4648, section 10.
  const std::pair<const char*, const char*> vectors[] = {{"", ""},
                                                         {"f", "Zg=="},
                                                         {"fo", "Zm8="},
                                                         {"foo", "Zm9v"},
                                                         {"foob", "Zm9vYg=="},
                                                         {"fooba", "Zm9vYmE="},
                                                         {"foobar", "Zm9vYmFy"}};
  for (const auto& [plain, coded] : vectors) {
    CHECK(base64_encode(plain) == coded);
    CHECK(base64_decode(coded) == plain);
  }
  std::string all;
  for (int b = 0; b < 256; ++b) all += char(b);
  for (std::size_t n = 0; n <= all.size(); n += 37)
    CHECK(base64_decode(base64_encode(all.substr(0, n))) == all.substr(0, n));
  CHECK_THROWS_WITH(base64_decode("Zm9v!A=="), doctest::Contains("invalid base64"));
  CHECK_THROWS_WITH(base64_decode("Zm9vY"), doctest::Contains("invalid base64"));
  CHECK_THROWS_WITH(base64_decode("Zm9v Zg=="), doctest::Contains("invalid base64"));
}
