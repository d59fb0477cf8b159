// Multi-process tests of the control plane: real `cohort coordinator`, `worker`, `ctl` and
// `launch` processes on 127.0.0.1 with OS-picked ports. Every child runs in its own process
// group that a RAII guard kills, so a failed check never leaves processes behind.
#include <doctest/doctest.h>
#include <signal.h>

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "runtime/net/codec.hpp"
#include "runtime/net/zmq_bridge.hpp"
#include "tests/mp/mp_util.hpp"

using namespace cohort;
using namespace cohort::mp;

namespace {

// Small timings so failures are seen fast; detection bounds below are derived from them.
// The timeout leaves room for a worker starved for a few hundred ms on a loaded 2-core CI
// machine, which would otherwise be (correctly) declared dead and spoil exact counts.
// Scaled by time_scale() under a sanitizer (mp_util.hpp); 1 in the plain build.
const int heartbeat_ms = 50 * time_scale();
const int timeout_ms = 600 * time_scale();
// The design's promise (docs/membership.md): a member silent since its last heartbeat is
// declared dead within timeout + 2 heartbeats of it. The slack is for a loaded 2-core
// machine, where the coordinator's own tick can run late by a few scheduler quanta.
const int promise_ms = timeout_ms + 2 * heartbeat_ms;
const int load_slack_ms = 300 * time_scale();

// A world of three data-parallel workers (micro_batch 32 gives 4 micro-batches for 3).
const char* three_workers_yaml = "cluster:\n  workers: 3\ntrain:\n  micro_batch: 32\n";

std::vector<std::string> timing_sets(int hb = heartbeat_ms, int to = timeout_ms) {
  return {"--set", "fault_tolerance.heartbeat_ms=" + std::to_string(hb), "--set",
          "fault_tolerance.timeout_ms=" + std::to_string(to)};
}

// `cohort ctl status --json`, parsed; null json when ctl failed.
nlohmann::json ctl_status(const std::string& ep) {
  int rc = -1;
  const std::string out = run_capture("ctl --coordinator " + ep + " status --json", &rc);
  if (rc != 0) return nlohmann::json();
  return nlohmann::json::parse(out, nullptr, false);
}

int count_state(const nlohmann::json& s, const std::string& state) {
  int n = 0;
  if (!s.is_object()) return 0;
  for (const auto& w : s["workers"]) n += w["state"] == state;
  return n;
}

// The live (non-dead) entry of NAME, or null.
nlohmann::json live_entry(const nlohmann::json& s, const std::string& name) {
  if (!s.is_object()) return nlohmann::json();
  for (const auto& w : s["workers"]) {
    if (w["name"] == name && w["state"] != "dead") return w;
  }
  return nlohmann::json();
}

// A coordinator plus named workers, all killed (process groups) when it goes out of scope.
struct cluster {
  temp_dir dir;
  std::unique_ptr<child_process> coordinator;
  std::map<std::string, std::unique_ptr<child_process>> workers;
  std::string endpoint;

  explicit cluster(std::vector<std::string> extra_sets = {}) {
    const std::string cfg = dir.write("cfg.yaml", three_workers_yaml);
    std::vector<std::string> args{"coordinator", "--control-only", "--config", cfg};
    for (const auto& s : timing_sets()) args.push_back(s);
    for (const auto& s : extra_sets) args.push_back(s);
    coordinator = std::make_unique<child_process>(args, dir.path(), "coordinator");
    auto ep = coordinator->wait_line("coordinator listening on ", milliseconds(15000));
    REQUIRE_MESSAGE(ep.has_value(), "coordinator stderr: " << coordinator->err());
    endpoint = *ep;
  }

  void start_worker(const std::string& name) {
    workers[name] = std::make_unique<child_process>(
        std::vector<std::string>{"worker", "--join", endpoint, "--name", name}, dir.path(), name);
  }

  // Waits until N workers are alive (via ctl status --json); returns the last status.
  nlohmann::json wait_alive(int n, milliseconds timeout = milliseconds(15000)) {
    nlohmann::json s;
    eventually(timeout, [&] {
      s = ctl_status(endpoint);
      return count_state(s, "alive") == n;
    });
    return s;
  }
};

uint64_t generation_of(const nlohmann::json& s) {
  return s.is_object() ? s["generation"].get<uint64_t>() : 0;
}

// How long one `cohort ctl status` takes here (a process start and a round trip): the part
// of a wall-clock detection time that polling adds.
milliseconds ctl_cost(const std::string& ep) {
  const auto t0 = clock_type::now();
  for (int i = 0; i < 3; ++i) ctl_status(ep);
  return std::chrono::duration_cast<milliseconds>(clock_type::now() - t0) / 3;
}

// The coordinator's own measure of the detection of member ID in STATUS: how long it had
// been silent when it was removed. Not before the timeout; within the promise plus slack.
void check_detection(const nlohmann::json& status, uint64_t id) {
  for (const auto& w : status["workers"]) {
    if (w["id"] != id) continue;
    const int64_t silent = w["silent_ms"];
    MESSAGE("declared dead after " << silent << " ms of silence (promise " << promise_ms << " ms)");
    CHECK(silent >= timeout_ms);
    CHECK(silent <= promise_ms + load_slack_ms);
    return;
  }
  FAIL("member " << id << " is not listed: " << status.dump());
}

}  // namespace

TEST_CASE("coordinator and three workers register and report through ctl and stop cleanly") {
  cluster c;
  for (const char* n : {"w0", "w1", "w2"}) c.start_worker(n);
  const nlohmann::json s = c.wait_alive(3);
  REQUIRE_MESSAGE(count_state(s, "alive") == 3, s.dump());
  // Joins that arrive within the join window share a generation: one to three of them;
  // no training yet, so step 0.
  CHECK(s["generation"].get<int>() >= 1);
  CHECK(s["generation"].get<int>() <= 3);
  CHECK(s["step"] == 0);
  std::set<int> ranks;
  std::set<std::string> names;
  for (const auto& w : s["workers"]) {
    const int rank = w["rank"];
    ranks.insert(rank);
    names.insert(w["name"].get<std::string>());
    // dp = 3, pp = tp = 1: the rank is the data-parallel coordinate.
    CHECK(w["seat"] == nlohmann::json::array({rank, 0, 0}));
    // Listed alive: heard from within the time that would have declared it dead.
    CHECK(w["heartbeat_age_ms"].get<int64_t>() >= 0);
    CHECK(w["heartbeat_age_ms"].get<int64_t>() <= promise_ms + load_slack_ms);
  }
  CHECK(ranks == std::set<int>{0, 1, 2});
  CHECK(names == std::set<std::string>{"w0", "w1", "w2"});

  // The text form names every worker too.
  const std::string table = run_capture("ctl --coordinator " + c.endpoint + " status");
  for (const char* n : {"w0", "w1", "w2"}) CHECK(table.find(n) != std::string::npos);

  int rc = -1;
  run_capture("ctl --coordinator " + c.endpoint + " stop", &rc);
  CHECK(rc == 0);
  for (auto& [name, w] : c.workers) {
    CAPTURE(name);
    const auto code = w->wait_exit(milliseconds(10000));
    REQUIRE(code.has_value());
    CHECK(*code == 0);
  }
  const auto code = c.coordinator->wait_exit(milliseconds(10000));
  REQUIRE(code.has_value());
  CHECK(*code == 0);
}

TEST_CASE("a worker killed with SIGKILL is declared dead and the generation grows") {
  cluster c;
  for (const char* n : {"w0", "w1", "w2"}) c.start_worker(n);
  const nlohmann::json before = c.wait_alive(3);
  REQUIRE(count_state(before, "alive") == 3);
  const uint64_t g0 = generation_of(before);
  const uint64_t victim_id = live_entry(before, "w1")["id"];

  const auto poll = ctl_cost(c.endpoint);
  const auto t0 = clock_type::now();
  c.workers["w1"]->signal(SIGKILL);
  nlohmann::json after;
  // Seen dead within the promise, plus slack, plus what polling with ctl adds.
  const auto bound = milliseconds(promise_ms + load_slack_ms) + 2 * poll;
  const bool seen = eventually(bound + milliseconds(5000), [&] {
    after = ctl_status(c.endpoint);
    return live_entry(after, "w1").is_null() && generation_of(after) > g0;
  });
  const auto took = std::chrono::duration_cast<milliseconds>(clock_type::now() - t0);
  REQUIRE_MESSAGE(seen, after.dump());
  MESSAGE("SIGKILL seen dead after " << took.count() << " ms");
  CHECK(took <= bound);
  CHECK(generation_of(after) == g0 + 1);
  bool dead_listed = false;
  for (const auto& w : after["workers"]) {
    if (w["id"] == victim_id) dead_listed = w["state"] == "dead";
  }
  CHECK(dead_listed);
  check_detection(after, victim_id);
  CHECK(count_state(after, "alive") == 2);
  // Survivors hold ranks 0 and 1 of the new generation.
  std::set<int> ranks;
  for (const auto& w : after["workers"]) {
    if (w["state"] == "alive") ranks.insert(w["rank"].get<int>());
  }
  CHECK(ranks == std::set<int>{0, 1});
}

TEST_CASE("a SIGSTOPped worker is declared dead and rejoins as a new member after SIGCONT") {
  cluster c;
  for (const char* n : {"w0", "w1", "w2"}) c.start_worker(n);
  const nlohmann::json before = c.wait_alive(3);
  REQUIRE(count_state(before, "alive") == 3);
  const uint64_t g0 = generation_of(before);
  const uint64_t old_id = live_entry(before, "w2")["id"];

  const auto poll = ctl_cost(c.endpoint);
  c.workers["w2"]->signal(SIGSTOP);
  nlohmann::json s;
  const auto bound = milliseconds(promise_ms + load_slack_ms) + 2 * poll;
  const auto t0 = clock_type::now();
  REQUIRE(eventually(bound + milliseconds(5000), [&] {
    s = ctl_status(c.endpoint);
    return live_entry(s, "w2").is_null() && generation_of(s) > g0;
  }));
  CHECK(clock_type::now() - t0 <= bound);
  check_detection(s, old_id);
  const uint64_t g1 = generation_of(s);

  c.workers["w2"]->signal(SIGCONT);
  // Its next heartbeat is answered "rejoin required"; it registers again.
  REQUIRE_MESSAGE(eventually(milliseconds(10000),
                             [&] {
                               s = ctl_status(c.endpoint);
                               const auto w = live_entry(s, "w2");
                               return !w.is_null() && w["state"] == "alive";
                             }),
                  s.dump());
  const auto again = live_entry(s, "w2");
  CHECK(again["id"].get<uint64_t>() != old_id);  // a new member, not the old one revived
  CHECK(generation_of(s) > g1);
  CHECK(count_state(s, "alive") == 3);
  // The old incarnation stays listed as dead.
  bool old_dead = false;
  for (const auto& w : s["workers"]) {
    if (w["id"] == old_id) old_dead = w["state"] == "dead";
  }
  CHECK(old_dead);
  // The resumed process did not exit along the way, and its log says why it re-registered.
  CHECK_FALSE(c.workers["w2"]->wait_exit(milliseconds(0)).has_value());
  CHECK(c.workers["w2"]->err().find("registering again") != std::string::npos);
}

TEST_CASE(
    "malformed frames from a raw DEALER are dropped and counted while the coordinator lives") {
  cluster c({"--set", "control.max_message_bytes=4096"});
  c.start_worker("w0");
  REQUIRE(count_state(c.wait_alive(1), "alive") == 1);

  zmq::context_t ctx(1);
  zmq::socket_t raw(ctx, zmq::socket_type::dealer);
  raw.set(zmq::sockopt::linger, 1000);
  raw.connect(c.endpoint);
  auto send = [&](const std::string& bytes) {
    raw.send(zmq::buffer(bytes), zmq::send_flags::none);
  };
  send("hello, coordinator, how are you?");  // wrong magic
  std::string truncated = net::encode(net::register_request{net::peer_role::worker, "x", 1});
  truncated.resize(truncated.size() - 3);
  send(truncated);  // length field disagrees with the frame
  std::string bad_version = net::encode(net::status_request{1});
  bad_version[4] = 99;
  send(bad_version);
  std::string unknown_type = net::encode(net::status_request{1});
  unknown_type[6] = 77;
  send(unknown_type);            // from a stranger: refused on its envelope as unknown_peer
  send(std::string(5000, 'x'));  // over control.max_message_bytes
  send(std::string(3, 'C'));     // shorter than the envelope
  send(net::encode(net::stop{"not registered"}));  // valid, but from an unknown peer
  send(net::encode(net::heartbeat{1, 1, 1}));      // ditto

  nlohmann::json s;
  REQUIRE_MESSAGE(eventually(milliseconds(10000),
                             [&] {
                               s = ctl_status(c.endpoint);
                               // Every frame counted, the last two unknown_peer too.
                               return s.is_object() && s["dropped"].size() >= 6 &&
                                      s["dropped"].value("unknown_peer", 0) >= 3;
                             }),
                  s.dump());
  const auto& d = s["dropped"];
  CHECK(d.value("bad_magic", 0) == 1);
  CHECK(d.value("length_mismatch", 0) == 1);
  CHECK(d.value("bad_version", 0) == 1);
  CHECK(d.value("unknown_type", 0) == 0);
  CHECK(d.value("too_large", 0) == 1);
  CHECK(d.value("too_short", 0) == 1);
  CHECK(d.value("unknown_peer", 0) == 3);
  // The unregistered `stop` did nothing: the worker and coordinator are still up.
  CHECK(count_state(s, "alive") == 1);
  CHECK_FALSE(c.coordinator->wait_exit(milliseconds(0)).has_value());
  // And the raw peer can still register properly and be answered.
  net::sync_client client(c.endpoint);
  auto reply =
      client.request(net::status_request{7}, net::msg_type::status_reply, milliseconds(5000));
  CHECK(std::get<net::status_reply>(reply).request_id == 7);
  // From a registered peer the same unknown type is decoded and counted as what it is.
  REQUIRE(client.send_frame(unknown_type));
  CHECK(eventually(milliseconds(10000), [&] {
    s = ctl_status(c.endpoint);
    return s.is_object() && s["dropped"].value("unknown_type", 0) == 1;
  }));
}

TEST_CASE("launch: a child's exit reaches the coordinator before any heartbeat timeout") {
  temp_dir dir;
  const std::string cfg = dir.write("cfg.yaml", three_workers_yaml);
  // A heartbeat timeout far longer than the bound below: only the exit notice can be fast.
  // launch writes the job's keys into the folder --keys names; ctl uses the same folder.
  std::vector<std::string> args{"launch", "--control-only", cfg, "--keys", dir.path() + "/keys"};
  for (const auto& s : timing_sets(50, 20000)) args.push_back(s);
  child_process launch(args, dir.path(), "launch");
  auto ep = launch.wait_line("coordinator listening on ", milliseconds(15000));
  REQUIRE_MESSAGE(ep.has_value(), launch.err());
  *ep += " --keys " + dir.path() + "/keys";
  nlohmann::json s;
  REQUIRE(eventually(milliseconds(15000), [&] {
    s = ctl_status(*ep);
    return count_state(s, "alive") == 3;
  }));
  const uint64_t g0 = generation_of(s);
  const int64_t victim = live_entry(s, "worker-1")["pid"];
  const auto t0 = clock_type::now();
  ::kill(static_cast<pid_t>(victim), SIGKILL);
  REQUIRE(eventually(milliseconds(15000), [&] {
    s = ctl_status(*ep);
    return live_entry(s, "worker-1").is_null() && generation_of(s) > g0;
  }));
  const auto took = std::chrono::duration_cast<milliseconds>(clock_type::now() - t0);
  MESSAGE("exit notice took " << took.count() << " ms (heartbeat timeout 20000 ms)");
  CHECK(took < milliseconds(5000));
  CHECK(launch.out().find("worker-1") != std::string::npos);
}

TEST_CASE("launch + SIGTERM stops everything and leaves no process in its group") {
  temp_dir dir;
  const std::string cfg = dir.write("cfg.yaml", three_workers_yaml);
  std::vector<std::string> args{"launch", "--control-only", cfg, "--keys", dir.path() + "/keys"};
  for (const auto& s : timing_sets()) args.push_back(s);
  child_process launch(args, dir.path(), "launch");
  auto ep = launch.wait_line("coordinator listening on ", milliseconds(15000));
  REQUIRE_MESSAGE(ep.has_value(), launch.err());
  *ep += " --keys " + dir.path() + "/keys";  // ctl's arguments: the endpoint and the keys
  REQUIRE(
      eventually(milliseconds(15000), [&] { return count_state(ctl_status(*ep), "alive") == 3; }));
  // Coordinator + 3 workers + launch itself share launch's process group.
  CHECK(processes_in_group(launch.pid()).size() == 5);

  launch.signal(SIGTERM);
  const auto code = launch.wait_exit(milliseconds(15000));
  REQUIRE(code.has_value());
  CHECK(*code == 0);
  std::vector<pid_t> left;
  eventually(milliseconds(3000), [&] {
    left = processes_in_group(launch.pid());
    return left.empty();
  });
  CHECK_MESSAGE(left.empty(), left.size() << " process(es) left in the launch group");
  const std::string out = launch.out();
  CHECK(out.find("SIGTERM") != std::string::npos);
  CHECK(out.find("worker-0 registered") != std::string::npos);
}

TEST_CASE("SIGTERM to a worker is a graceful leave and SIGTERM to the coordinator stops all") {
  // A 20 s heartbeat timeout: the leave must be what removes the worker, not silence.
  cluster c({"--set", "fault_tolerance.timeout_ms=20000"});
  c.start_worker("w0");
  c.start_worker("w1");
  const nlohmann::json before = c.wait_alive(2);
  REQUIRE(count_state(before, "alive") == 2);
  const uint64_t g0 = generation_of(before);

  c.workers["w0"]->signal(SIGTERM);
  const auto code = c.workers["w0"]->wait_exit(milliseconds(10000));
  REQUIRE(code.has_value());
  CHECK(*code == 0);
  nlohmann::json s;
  REQUIRE(eventually(milliseconds(5000), [&] {
    s = ctl_status(c.endpoint);
    return live_entry(s, "w0").is_null() && generation_of(s) == g0 + 1;
  }));
  CHECK(count_state(s, "alive") == 1);

  c.coordinator->signal(SIGTERM);
  const auto coord_code = c.coordinator->wait_exit(milliseconds(10000));
  REQUIRE(coord_code.has_value());
  CHECK(*coord_code == 0);
  const auto w1_code = c.workers["w1"]->wait_exit(milliseconds(10000));
  REQUIRE(w1_code.has_value());
  CHECK(*w1_code == 0);  // it was told to stop, not left to find the coordinator gone
}

TEST_CASE("a worker that meets a coordinator of another protocol version exits 2 and says so") {
  // A stand-in coordinator of the next protocol version: a raw ROUTER that answers the
  // worker's registration with a frame whose envelope says v+1.
  temp_dir dir;
  zmq::context_t ctx(1);
  zmq::socket_t router(ctx, zmq::socket_type::router);
  router.set(zmq::sockopt::linger, 0);
  router.bind("tcp://127.0.0.1:0");
  const std::string ep = router.get(zmq::sockopt::last_endpoint);
  child_process w({"worker", "--join", ep, "--name", "w0"}, dir.path(), "w0");
  zmq::pollitem_t item{router.handle(), 0, ZMQ_POLLIN, 0};
  REQUIRE(zmq::poll(&item, 1, std::chrono::milliseconds(20000)) == 1);
  zmq::message_t id, frame;
  REQUIRE(router.recv(id));
  REQUIRE(router.recv(frame));
  CHECK(net::frame_version(frame.to_string_view()) == net::protocol_version);
  std::string newer = net::encode(net::register_ok{});
  newer[4] = static_cast<char>(net::protocol_version + 1);
  router.send(id, zmq::send_flags::sndmore);
  router.send(zmq::buffer(newer));
  const auto code = w.wait_exit(milliseconds(20000));  // well before its 10 s silence limit
  REQUIRE_MESSAGE(code.has_value(), w.err());
  CHECK(*code == 2);
  CHECK_MESSAGE(
      w.err().find("speaks cohort protocol v" + std::to_string(net::protocol_version + 1) +
                   ", this worker v" + std::to_string(net::protocol_version)) != std::string::npos,
      w.err());
}

TEST_CASE("a cohort process maps no cuBLAS at start: only a GPU step loads it") {
  // Linked, cuBLAS and cuBLASLt made every process (ctl, a CPU worker, the coordinator) take
  // 0.5 s and 235 MB before main; ctl then missed the short jobs of the elastic tests.
  std::string out;
  REQUIRE(run_shell("readelf -d " + cohort_binary() + " 2>&1", &out) == 0);
  CHECK_MESSAGE(out.find("(NEEDED)") != std::string::npos, out);
  CHECK_MESSAGE(out.find("libcublas") == std::string::npos, out);
}
