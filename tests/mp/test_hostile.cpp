// Hostile peers against a real job (issue 15): processes without the job's keys, with a key
// of their own, and with the worker key trying what only the launcher or an admin may do.
// None of them may change anything: the run ends on `cohort train`'s params_sha256 with no
// aborted step, and the coordinator counts what it dropped. Also the refusals a user sees:
// a non-loopback bind without keys, ctl without keys or with the wrong one. And `bench
// control` with keys: its CURVE round trips, and its simulated agents (issue 20).
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime/net/curve.hpp"
#include "runtime/net/protocol.hpp"
#include "runtime/net/zmq_bridge.hpp"
#include "tests/mp/dp_util.hpp"
#include "tests/mp/mp_util.hpp"

using namespace cohort;
using namespace cohort::mp;
using std::chrono::milliseconds;

namespace {

const milliseconds run_timeout(240000);

// What a hostile peer sends, again and again: everything that would stop, steer or join the
// run, plus frames too large and frames that are not cohort's at all. A holder of the worker
// key may join as a worker (that key is the job's trust), so it does not try that.
std::vector<net::message> attack_frames(bool worker_key) {
  std::vector<net::message> out{net::register_request{net::peer_role::client, "ctl", 1}};
  if (!worker_key) out.push_back(net::register_request{net::peer_role::worker, "intruder", 1});
  for (net::message m : std::vector<net::message>{
           net::stop{"hostile stop"}, net::admin_request{1, "scale", "1"},
           net::admin_request{2, "inject", "kill rank=0 at step=100"},
           net::exit_notice{"worker-0", 0, 137}, net::heartbeat{1, 1u << 30, 1},
           net::kv_set{1, 1, "addr/0", "10.6.6.6:1"}, net::status_request{3}})
    out.push_back(std::move(m));
  return out;
}

// Sends the attack frames (and junk) through CLIENT until STOP; counts frames queued.
void flood(net::sync_client& client, bool worker_key, const std::atomic<bool>& stop,
           std::atomic<uint64_t>& sent) {
  const std::string junk(3 << 20, 'x');  // 3 MiB of nothing cohort speaks
  while (!stop.load()) {
    for (const auto& m : attack_frames(worker_key))
      if (client.send(m)) sent.fetch_add(1);
    if (client.send_frame(junk)) sent.fetch_add(1);
    if (client.send_frame("\x01\x02")) sent.fetch_add(1);
  }
}

}  // namespace

TEST_CASE("hostile peers during a run: nothing they send changes it, it ends on the same hash") {
  temp_dir dir;
  const int steps = 300;
  const std::string cfg = dir.write("cfg.yaml", small_yaml(dir.path(), "bitwise", steps));
  const std::string hash = train_summary(dir, cfg)["params_sha256"];
  const std::string keys = dir.path() + "/keys";
  const std::string out = dir.path() + "/hostile.json";
  child_process launch(
      {"launch", cfg, "-q", "--summary", out, "--keys", keys, "--set", "cluster.workers=3"},
      dir.path(), "launch-hostile");
  const job_address job = address_of(launch);
  CHECK(job.keys == keys);

  // Three attackers: no keys (the CURVE handshake fails), a key of its own (refused by the
  // authenticator), and the job's worker key itself trying the launcher's and an admin's
  // messages (its registration as a client is refused, the rest dropped unread).
  const net::client_keys worker = net::load_client_keys(keys, net::key_role::worker);
  net::client_keys stranger = worker;
  stranger.self = net::make_keypair();
  std::vector<std::unique_ptr<net::sync_client>> attackers;
  attackers.push_back(std::make_unique<net::sync_client>(job.ep, 64u << 20, "plain"));
  attackers.push_back(std::make_unique<net::sync_client>(job.ep, 64u << 20, "stranger", &stranger));
  attackers.push_back(std::make_unique<net::sync_client>(job.ep, 64u << 20, "worker-key", &worker));
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> sent{0};
  std::vector<std::thread> threads;
  for (size_t i = 0; i < attackers.size(); ++i)
    threads.emplace_back([&, i] { flood(*attackers[i], i == 2, stop, sent); });

  // While they flood, the job goes on; the coordinator says what it dropped from them.
  nlohmann::json status;
  const bool dropped = eventually(milliseconds(60000), [&] {
    status = ctl_status(job);
    return status.is_object() && status["dropped"].value("wrong_role", 0) > 0;
  });
  const auto code = launch.wait_exit(run_timeout);
  stop = true;
  for (auto& t : threads) t.join();
  CHECK_MESSAGE(dropped, status.dump());
  REQUIRE_MESSAGE(code.has_value(), "launch did not finish: " << launch.out() << launch.err());
  CHECK_MESSAGE(*code == 0, launch.out() << launch.err());
  const nlohmann::json s = read_json(out);
  REQUIRE_MESSAGE(s.is_object(), launch.err());
  check_fault_free(s, hash, steps);
  CHECK(s["aborted_steps"] == 0);
  CHECK(s["dp"] == 3);
  CHECK_MESSAGE(s["events"].empty(), s["events"].dump());  // no departure, join or fault
  MESSAGE("hostile frames queued: " << sent.load()
                                    << "; coordinator drops: " << status["dropped"].dump());
  CHECK(sent.load() > 0);
  // Nobody but the three workers ever became a member.
  for (const auto& w : status["workers"])
    CHECK(w["name"].get<std::string>().rfind("worker-", 0) == 0);
}

TEST_CASE("a coordinator refuses an address others reach without keys, unless --insecure") {
  temp_dir dir;
  int rc = -1;
  std::string said = run_capture("coordinator --control-only --bind tcp://0.0.0.0:0", &rc, true);
  CHECK(rc == 2);
  CHECK_MESSAGE(said.find("refusing to bind tcp://0.0.0.0:0 without keys") != std::string::npos,
                said);
  CHECK(said.find("cohort keygen") != std::string::npos);
  // --insecure: it binds, and warns.
  child_process c({"coordinator", "--control-only", "--bind", "tcp://0.0.0.0:0", "--insecure"},
                  dir.path(), "insecure");
  const auto ep = c.wait_line("coordinator listening on ", milliseconds(15000));
  REQUIRE_MESSAGE(ep.has_value(), c.err());
  const std::string port = ep->substr(ep->rfind(':') + 1);
  run_capture("ctl --coordinator tcp://127.0.0.1:" + port + " stop", &rc);
  CHECK(rc == 0);
  REQUIRE(c.wait_exit(milliseconds(15000)).has_value());
  CHECK(c.err().find("without keys (--insecure)") != std::string::npos);
}

TEST_CASE("ctl against a coordinator with keys: none, or a worker's, is refused with the fix") {
  temp_dir dir;
  const std::string keys = dir.path() + "/keys";
  int rc = -1;
  run_capture("keygen " + keys, &rc);
  REQUIRE(rc == 0);
  child_process c({"coordinator", "--control-only", "--keys", keys}, dir.path(), "keyed");
  const auto ep = c.wait_line("coordinator listening on ", milliseconds(15000));
  REQUIRE_MESSAGE(ep.has_value(), c.err());
  std::string said =
      run_capture("ctl --coordinator " + *ep + " --timeout-ms 1500 status", &rc, true);
  CHECK(rc == 1);
  CHECK_MESSAGE(said.find("pass the same --keys DIR") != std::string::npos, said);
  // The worker key is not an admin's: its registration as a client is refused.
  const std::string worker_only = dir.path() + "/worker-only";
  std::filesystem::create_directories(worker_only);
  std::filesystem::copy_file(keys + "/coordinator.pub", worker_only + "/coordinator.pub");
  std::filesystem::copy_file(keys + "/worker.key", worker_only + "/admin.key");
  said = run_capture("ctl --coordinator " + *ep + " --keys " + worker_only + " stop", &rc, true);
  CHECK(rc == 1);
  CHECK_MESSAGE(said.find("a worker key registers workers only") != std::string::npos, said);
  // The admin key works, and stops it.
  said = run_capture("ctl --coordinator " + *ep + " --keys " + keys + " stop", &rc, true);
  CHECK_MESSAGE(rc == 0, said);
  const auto code = c.wait_exit(milliseconds(15000));
  REQUIRE(code.has_value());
  CHECK(*code == 0);
}

TEST_CASE("bench control measures the CURVE path beside the plain one in the same run") {
  int rc = -1;
  const std::string out = run_capture("bench control --iters 40 --warmup 5 --blocks 4 --json", &rc);
  REQUIRE(rc == 0);
  const auto j = nlohmann::json::parse(out, nullptr, false);
  REQUIRE_MESSAGE(j.is_object(), out);
  for (const char* path : {"raw_zmq", "actors", "actors_curve"}) {
    CAPTURE(path);
    CHECK(j[path]["p50_us"].get<double>() > 0);
    CHECK(j[path]["p99_us"].get<double>() >= j[path]["p50_us"].get<double>());
  }
  CHECK(j["curve_ratio_p50"].get<double>() ==
        doctest::Approx(j["actors_curve"]["p50_us"].get<double>() /
                        j["actors"]["p50_us"].get<double>()));
}

TEST_CASE("bench control --agents forms a job of simulated workers and sees a stopped one") {
  // 16 agents with the job's keys against a control-only coordinator. The timeout is wide
  // enough that a loaded machine does not evict a beating agent, so the counts are exact.
  const int heartbeat = 100, timeout = 1500 * time_scale();
  int rc = -1;
  const std::string out = run_capture(
      "bench control --agents 16 --heartbeat-ms " + std::to_string(heartbeat) + " --timeout-ms " +
          std::to_string(timeout) + " --steady-s 1 --stop-percent 1 --json",
      &rc);
  REQUIRE_MESSAGE(rc == 0, out);
  const auto j = nlohmann::json::parse(out, nullptr, false);
  REQUIRE_MESSAGE(j.is_object(), out);
  INFO(j.dump());
  CHECK(j["security"] == "curve");
  const auto& f = j["form"];
  CHECK(f["formed"] == true);
  CHECK(f["alive"] == 16);
  CHECK(f["generations"].get<int>() >= 1);
  CHECK(f["generations"].get<int>() <= 16);  // at most one per join (joins share windows)
  CHECK(f["forced_rejoins"] == 0);
  CHECK(f["roster_updates"].get<int>() >= 16);  // every agent hears at least one roster
  const auto& s = j["steady"];
  // Every agent beats once a period: about 16 / 0.1 s over the second measured.
  CHECK(s["heartbeats"].get<double>() >= 0.5 * 16 * s["seconds"].get<double>() * 1000 / heartbeat);
  CHECK(s["false_positives"] == 0);
  CHECK(s["generations"] == 0);
  CHECK(s["coordinator_rss_mb"].get<double>() > 0);
  const auto& k = j["stop"];
  CHECK(k["stopped"] == 1);  // 1% of 16, and at least one
  CHECK(k["settled"] == true);
  CHECK(k["seen"] == 1);
  CHECK(k["survivor_generations"] == 1);
  CHECK(k["generations"].get<int>() >= 1);
  // It cannot be seen before its silence reached the timeout: its last beat was at most one
  // period before it stopped.
  CHECK(k["seen_ms_p50"].get<double>() >= timeout - heartbeat);
  CHECK(k["false_positives"] == 0);
}
