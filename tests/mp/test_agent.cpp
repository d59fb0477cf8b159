// Host agents (issue 40, docs/agent.md) with real processes on 127.0.0.1: a control-only
// coordinator with the job's keys, `cohort agent` starting and relaying its workers. One case
// per way a worker or a host dies (a signal that kills, a crash (abort), a hang, the agent lost), and
// a training job whose workers are partly under an agent and partly joined directly, ending
// on `cohort train`'s hash.
#include <doctest/doctest.h>
#include <signal.h>

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "tests/mp/dp_util.hpp"
#include "tests/mp/mp_util.hpp"

using namespace cohort;
using namespace cohort::mp;

namespace {

const int heartbeat_ms = 50 * time_scale();
const int timeout_ms = 600 * time_scale();
// A silent member is removed within timeout + 2 heartbeats of its last beat
// (docs/membership.md); under an agent its beats reach the coordinator up to one period
// later, and a loaded 2-core machine may run a tick late.
const int promise_ms = timeout_ms + 3 * heartbeat_ms;
const int load_slack_ms = 400 * time_scale();

nlohmann::json status_of(const std::string& ep, const std::string& keys) {
  int rc = -1;
  const std::string out =
      run_capture("ctl --coordinator " + ep + " --keys " + keys + " status --json", &rc);
  if (rc != 0) return nlohmann::json();
  return nlohmann::json::parse(out, nullptr, false);
}

int alive(const nlohmann::json& s) {
  int n = 0;
  if (s.is_object())
    for (const auto& w : s["workers"]) n += w["state"] == "alive";
  return n;
}

nlohmann::json entry(const nlohmann::json& s, const std::string& name, bool live) {
  if (!s.is_object()) return nlohmann::json();
  for (const auto& w : s["workers"])
    if (w["name"] == name && (w["state"] != "dead") == live) return w;
  return nlohmann::json();
}

// A control-only coordinator with keys and one agent of N workers (named t-0, t-1, ...).
struct agent_cluster {
  temp_dir dir;
  std::string keys;
  std::unique_ptr<child_process> coordinator;
  std::unique_ptr<child_process> agent;
  std::string endpoint;

  explicit agent_cluster(int workers, const std::vector<std::string>& agent_extra = {}) {
    keys = dir.path() + "/keys";
    int rc = -1;
    run_capture("keygen " + keys, &rc);
    REQUIRE(rc == 0);
    const std::string cfg =
        dir.write("cfg.yaml", "cluster:\n  workers: " + std::to_string(workers) +
                                  "\ntrain:\n  global_batch: 64\n  micro_batch: 16\n");
    coordinator = std::make_unique<child_process>(
        std::vector<std::string>{"coordinator", "--control-only", "--config", cfg, "--keys", keys,
                                 "--set", "fault_tolerance.heartbeat_ms=" + std::to_string(heartbeat_ms),
                                 "--set", "fault_tolerance.timeout_ms=" + std::to_string(timeout_ms)},
        dir.path(), "coordinator");
    const auto ep = coordinator->wait_line("coordinator listening on ", milliseconds(15000));
    REQUIRE_MESSAGE(ep.has_value(), coordinator->err());
    endpoint = *ep;
    std::vector<std::string> args{"agent", "--join", endpoint, "--workers", std::to_string(workers),
                                  "--keys", keys, "--host", "t"};
    args.insert(args.end(), agent_extra.begin(), agent_extra.end());
    agent = std::make_unique<child_process>(args, dir.path(), "agent");
  }

  nlohmann::json status() const { return status_of(endpoint, keys); }

  nlohmann::json wait_alive(int n, milliseconds timeout = milliseconds(20000)) {
    nlohmann::json s;
    const bool ok = eventually(timeout, [&] {
      s = status();
      return alive(s) == n;
    });
    REQUIRE_MESSAGE(ok, s.dump() << "\nagent: " << agent->out() << agent->err());
    return s;
  }

  // Waits until NAME's member of id ID is listed dead; that entry.
  nlohmann::json wait_dead(uint64_t id, milliseconds timeout) {
    nlohmann::json s, dead;
    eventually(timeout, [&] {
      s = status();
      if (!s.is_object()) return false;
      for (const auto& w : s["workers"])
        if (w["id"] == id && w["state"] == "dead") dead = w;
      return !dead.is_null();
    });
    REQUIRE_MESSAGE(!dead.is_null(), s.dump() << "\nagent: " << agent->out() << agent->err());
    return dead;
  }
};

}  // namespace

TEST_CASE("cohort agent: its workers form through one connection, a worker killed or crashed "
          "is out of the roster before any timeout, and the agent starts it again") {
  agent_cluster c(3);
  const nlohmann::json s = c.wait_alive(3);
  for (const char* n : {"t-0", "t-1", "t-2"}) CHECK_MESSAGE(!entry(s, n, true).is_null(), s.dump());
  // SIGABRT stands for a crash (an abort); not SIGSEGV, which the sanitizers' builds report
  // as a fault of their own.
  for (const int sig : {SIGKILL, SIGABRT}) {
    CAPTURE(sig);
    const nlohmann::json before = c.wait_alive(3);
    const nlohmann::json victim = entry(before, "t-1", true);
    REQUIRE(!victim.is_null());
    const uint64_t id = victim["id"];
    ::kill(static_cast<pid_t>(victim["pid"].get<int64_t>()), sig);
    const nlohmann::json dead = c.wait_dead(id, milliseconds(10000));
    // Removed on the agent's exit notice: the coordinator had not been without its beats for
    // anything near the timeout.
    const int64_t silent = dead["silent_ms"];
    MESSAGE("signal " << sig << ": removed after " << silent << " ms of silence (timeout "
                      << timeout_ms << " ms)");
    CHECK(silent < timeout_ms);
    // The agent restarts it under its name, as a new member.
    const nlohmann::json back = c.wait_alive(3);
    const nlohmann::json again = entry(back, "t-1", true);
    REQUIRE(!again.is_null());
    CHECK(again["id"].get<uint64_t>() != id);
  }
  CHECK(c.agent->out().find("agent: t-1") != std::string::npos);
}

TEST_CASE("cohort agent: a hung worker is reported by its agent at the timeout, and rejoins "
          "as a new member when it wakes") {
  agent_cluster c(2, {"--no-respawn"});
  const nlohmann::json before = c.wait_alive(2);
  const nlohmann::json victim = entry(before, "t-0", true);
  REQUIRE(!victim.is_null());
  const uint64_t id = victim["id"];
  const auto pid = static_cast<pid_t>(victim["pid"].get<int64_t>());
  ::kill(pid, SIGSTOP);
  const nlohmann::json dead = c.wait_dead(id, milliseconds(promise_ms + load_slack_ms + 10000));
  const int64_t silent = dead["silent_ms"];
  MESSAGE("hung worker removed after " << silent << " ms of silence");
  CHECK(silent <= promise_ms + load_slack_ms);
  CHECK(eventually(milliseconds(5000),
                   [&] { return c.agent->err().find("reported hung") != std::string::npos; }));
  ::kill(pid, SIGCONT);
  const nlohmann::json back = c.wait_alive(2);
  const nlohmann::json again = entry(back, "t-0", true);
  REQUIRE(!again.is_null());
  CHECK(again["id"].get<uint64_t>() != id);
}

TEST_CASE("cohort agent: a lost host (its agent stopped) takes all its workers out in one "
          "roster change, and they come back with it") {
  agent_cluster c(3, {"--coordinator-timeout-ms", "60000"});
  const nlohmann::json before = c.wait_alive(3);
  const uint64_t g0 = before["generation"];
  c.agent->signal(SIGSTOP);
  nlohmann::json s;
  const bool gone = eventually(milliseconds(promise_ms + load_slack_ms + 10000), [&] {
    s = c.status();
    return s.is_object() && alive(s) == 0;
  });
  REQUIRE_MESSAGE(gone, s.dump());
  // One change for the whole host: its workers' beats stopped in the same host beat.
  CHECK_MESSAGE(s["generation"].get<uint64_t>() == g0 + 1, s.dump());
  int dead = 0;
  for (const auto& w : s["workers"]) {
    if (w["state"] != "dead") continue;
    ++dead;
    CHECK(w["silent_ms"].get<int64_t>() <= promise_ms + load_slack_ms);
  }
  CHECK(dead == 3);
  c.agent->signal(SIGCONT);
  c.wait_alive(3);
}

TEST_CASE("a job of workers under an agent and workers joined directly trains to cohort "
          "train's hash") {
  temp_dir dir;
  const std::string cfg = dir.write(
      "mixed.yaml", small_yaml(dir.path(), "bitwise", 8) + "cluster:\n  workers: 4\n");
  const std::string hash = train_summary(dir, cfg)["params_sha256"];
  const std::string keys = dir.path() + "/keys";
  int rc = -1;
  run_capture("keygen " + keys, &rc);
  REQUIRE(rc == 0);
  const std::string summary = dir.path() + "/mixed.json";
  child_process coordinator({"coordinator", "--config", cfg, "--keys", keys, "--summary", summary,
                             "-q"},
                            dir.path(), "coordinator");
  const auto ep = coordinator.wait_line("coordinator listening on ", milliseconds(15000));
  REQUIRE_MESSAGE(ep.has_value(), coordinator.err());
  child_process agent({"agent", "--join", *ep, "--workers", "2", "--keys", keys, "--host", "a"},
                      dir.path(), "agent");
  child_process d0({"worker", "--join", *ep, "--keys", keys, "--name", "direct-0"}, dir.path(), "d0");
  child_process d1({"worker", "--join", *ep, "--keys", keys, "--name", "direct-1"}, dir.path(), "d1");
  const auto code = coordinator.wait_exit(milliseconds(120000));
  REQUIRE_MESSAGE(code.has_value(), coordinator.err());
  CHECK(*code == 0);
  const nlohmann::json s = read_json(summary);
  REQUIRE_MESSAGE(s.is_object(), coordinator.err());
  CHECK(s["params_sha256"] == hash);
  std::set<std::string> names;
  for (const auto& w : s["workers"]) names.insert(w["name"].get<std::string>());
  CHECK(names == std::set<std::string>{"a-0", "a-1", "direct-0", "direct-1"});
  // The agent exits once its workers did (after the coordinator's stop): 0.
  const auto agent_code = agent.wait_exit(milliseconds(20000));
  REQUIRE(agent_code.has_value());
  CHECK_MESSAGE(*agent_code == 0, agent.out() << agent.err());
}
