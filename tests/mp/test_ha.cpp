// Coordinator standbys across real processes (issue #21): `cohort launch` of
// configs/quickstart_ha.yaml (one etcd, a leader and two standbys) whose leader is killed,
// cut off, or dies in a run that also loses a worker and a standby; `cohort ctl status` names
// the leader, its term and its standbys wherever it is asked; a run without ha shows none of
// it. In bitwise mode every run ends on `cohort train`'s hash for the same overrides.
// Without etcd each ha case exits 77 (CTest: skipped). Nothing here asserts on speed.
#include <doctest/doctest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/ha/require_etcd.hpp"
#include "tests/mp/dp_util.hpp"
#include "tests/mp/mp_util.hpp"

using namespace cohort::mp;
using std::chrono::milliseconds;

namespace {

// Generous: two loaded cores, seven processes and an etcd per run.
const milliseconds step_timeout(90000 * time_scale());
const milliseconds run_timeout(240000 * time_scale());

using cohort::test::require_etcd;

std::string config(const std::string& name) {
  return std::string(COHORT_SOURCE_DIR) + "/configs/" + name;
}

// The overrides every run here shares (as `--set` pairs): STEPS steps, no scheduled faults,
// no evals, no periodic checkpoints, and the final one under DIR/TAG.
std::vector<std::string> overrides(const temp_dir& dir, const std::string& tag, int steps) {
  return {"--set", "train.steps=" + std::to_string(steps),
          "--set", "faults=[]",
          "--set", "train.eval_every=0",
          "--set", "fault_tolerance.checkpoint_every=0",
          "--set", "fault_tolerance.checkpoint_dir=" + dir.path() + "/" + tag};
}

// `cohort train CFG` with the same overrides: the fault-free reference hash.
std::string reference_hash(const temp_dir& dir, const std::string& cfg, int steps) {
  std::string args = "train " + cfg + " -q --summary " + dir.path() + "/train.json";
  for (const auto& a : overrides(dir, "train-ckpt", steps)) args += " '" + a + "'";
  int rc = -1;
  const std::string log = run_capture(args, &rc, true);
  REQUIRE_MESSAGE(rc == 0, log);
  const nlohmann::json s = read_json(dir.path() + "/train.json");
  REQUIRE_MESSAGE(s.contains("params_sha256"), log);
  return s["params_sha256"];
}

// `cohort launch CFG -q --summary OUT` with the shared overrides, then EXTRA.
std::vector<std::string> launch_args(const temp_dir& dir, const std::string& cfg, int steps,
                                     const std::string& out,
                                     const std::vector<std::string>& extra) {
  std::vector<std::string> args{"launch", cfg, "-q", "--summary", out};
  for (const auto& a : overrides(dir, "launch-ckpt", steps)) args.push_back(a);
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// Waits for `cohort launch` to end (exit 0 expected); its summary at OUT.
nlohmann::json finish(child_process& launch, const std::string& out) {
  return finish_launch(launch, out, run_timeout);
}

// One "launch: started NAME (pid P) at EP" line: a coordinator launch started beside the
// first one, or restarted.
struct started_coordinator {
  std::string name;
  pid_t pid = 0;
  std::string endpoint;
};

std::vector<started_coordinator> started_coordinators(const std::string& log) {
  std::vector<started_coordinator> out;
  std::istringstream in(log);
  std::string line;
  const std::string head = "launch: started ";
  while (std::getline(in, line)) {
    const auto pid_at = line.find(" (pid ");
    const auto at_at = line.find(") at ");
    if (line.rfind(head, 0) != 0 || pid_at == std::string::npos || at_at == std::string::npos)
      continue;
    out.push_back({line.substr(head.size(), pid_at - head.size()),
                   static_cast<pid_t>(std::stol(line.substr(pid_at + 6))), line.substr(at_at + 5)});
  }
  return out;
}

// The endpoints of every coordinator of the run: the first one's, then the standbys'.
std::vector<std::string> candidate_endpoints(const child_process& launch, const job_address& ep) {
  std::vector<std::string> all{ep.ep};
  for (const auto& c : started_coordinators(launch.out())) all.push_back(c.endpoint);
  return all;
}

// Where in LOG the first line starting with PREFIX at or after FROM begins (npos: none).
size_t line_at(const std::string& log, const std::string& prefix, size_t from = 0) {
  for (size_t at = log.find(prefix, from); at != std::string::npos; at = log.find(prefix, at + 1))
    if (at == 0 || log[at - 1] == '\n') return at;
  return std::string::npos;
}

// Waits until the job (asked at A) has committed at least STEP steps; the status then.
nlohmann::json wait_for_step(const job_address& a, int64_t step) {
  nlohmann::json status;
  const bool reached = eventually(step_timeout, [&] {
    status = ctl_status(a);
    return status.is_object() && status["step"].is_number() &&
           status["step"].get<int64_t>() >= step;
  });
  REQUIRE_MESSAGE(reached, "the job never reached step " << step);
  return status;
}

// Waits until the job (asked at A) holds at step STEP or later with three live workers:
// a rank killed there left it below elastic.min_workers 4. The status then.
nlohmann::json wait_held(const job_address& a, int64_t step) {
  nlohmann::json st;
  const bool held = eventually(step_timeout, [&] {
    st = ctl_status(a);
    return st.is_object() && st["step"].is_number() && st["step"].get<int64_t>() >= step &&
           alive_workers(st) == 3;
  });
  REQUIRE_MESSAGE(held, "the job never held at step " << step << " with 3 workers: " << st.dump());
  return st;
}

// `cohort ctl ARGS` at A, which must succeed.
void ctl_ok(const job_address& a, const std::string& args) {
  int rc = -1;
  const std::string said = run_capture("ctl " + a.ctl_args() + " " + args, &rc, true);
  REQUIRE_MESSAGE(rc == 0, said);
}

// The checks every failover scenario shares: the hash, N failover events recovered in a
// measurable time with rising terms, and the summary's coordinator block agreeing.
void check_failovers(const nlohmann::json& s, const std::string& hash, int steps,
                     size_t failovers) {
  check_fault_free(s, hash, steps);
  MESSAGE("aborted_steps " << s["aborted_steps"].dump());
  CHECK(s["aborted_steps"].is_number());
  const auto fo = events_of(s, "failover");
  REQUIRE_MESSAGE(fo.size() == failovers, s["events"].dump());
  int64_t term = 0;
  for (const auto& e : fo) {
    CAPTURE(e.dump());
    CHECK(e["worker"] == "coordinator");
    REQUIRE(e["recover_ms"].is_number());
    CHECK(e["recover_ms"].get<double>() > 0.0);
    REQUIRE(e["term"].is_number());
    CHECK(e["term"].get<int64_t>() > term);
    term = e["term"].get<int64_t>();
  }
  const nlohmann::json& co = s["coordinator"];
  REQUIRE_MESSAGE(co.is_object(), s.dump());
  CHECK(co["failovers"] == failovers);
  CHECK(co["failover_recover_ms"].size() == failovers);
  CHECK(co["term"] == term);  // the last failover's leader wrote the summary
}

}  // namespace

TEST_CASE("coordinator standbys: the leader killed twice, once by a fault ctl added, same hash") {
  // The second kill is added with `ctl inject` while the first leader leads: recorded in
  // etcd, it is the second leader that carries it out. It is added before the first kill
  // whatever the speed: rank 3 dies at step 5 and four workers are elastic.min_workers, so
  // training waits at step 5 until the test scales back to four, after the inject.
  require_etcd();
  temp_dir dir;
  const int steps = 240;
  const std::string cfg = config("quickstart_ha.yaml");
  const std::string hash = reference_hash(dir, cfg, steps);
  const std::string out = dir.path() + "/kill-twice.json";
  child_process launch(
      launch_args(dir, cfg, steps, out,
                  {"--set", "elastic.min_workers=4", "--inject", "kill rank=3 at step=5",
                   "--inject", "kill coordinator at step=80"}),
      dir.path(), "launch-kill-twice");
  const job_address ep = address_of(launch);
  wait_held(ep, 5);
  ctl_ok(ep, "inject 'kill coordinator at step=160'");
  ctl_ok(ep, "scale 4");
  const nlohmann::json s = finish(launch, out);
  check_failovers(s, hash, steps, 2);
  const auto fo = events_of(s, "failover");
  CHECK(fo[0]["step"].get<int64_t>() >= 80);
  CHECK(fo[1]["step"].get<int64_t>() >= 160);  // the kill ctl added, by the second leader
  const std::string log = launch.out();
  CAPTURE(log);
  // Each killed leader was restarted as a standby at its own endpoint.
  size_t killed = 0, restarted = 0;
  for (size_t at = 0; (at = log.find(") exited: killed by signal 9", at)) != std::string::npos;
       ++at)
    killed += log.compare(log.rfind('\n', at) + 1, 15, "launch: worker-") != 0;
  for (size_t at = 0; (at = line_at(log, "launch: restarting ", at)) != std::string::npos; ++at)
    restarted += log.find(" as a standby at ", at) < log.find('\n', at);
  CHECK(killed == 2);
  CHECK(restarted == 2);
  CHECK(log.find("launch: deposed the dead leader (term ") != std::string::npos);
  // The summary names the last leader and its standbys among the run's three endpoints.
  // How many standbys it lists is not fixed: the run does not wait for the leader killed
  // second to be back and registered before it ends (the ctl status case waits for both).
  const auto all = candidate_endpoints(launch, ep);
  const std::set<std::string> endpoints(all.begin(), all.end());
  REQUIRE(endpoints.size() == 3);
  const nlohmann::json& co = s["coordinator"];
  CHECK(endpoints.count(co["leader"].get<std::string>()) == 1);
  CHECK(co["pid"].get<int64_t>() > 0);
  std::set<std::string> standbys;
  for (const auto& e : co["standbys"]) standbys.insert(e.get<std::string>());
  CHECK_MESSAGE(standbys.size() == co["standbys"].size(), co.dump());
  CHECK_MESSAGE(standbys.size() <= 2, co.dump());
  CHECK_MESSAGE(standbys.count(co["leader"].get<std::string>()) == 0, co.dump());
  for (const auto& e : standbys) CHECK_MESSAGE(endpoints.count(e) == 1, co.dump());
}

TEST_CASE("coordinator standbys: the leader cut off for 2 s steps down, same hash") {
  require_etcd();
  temp_dir dir;
  const int steps = 240;
  const std::string cfg = config("quickstart_ha.yaml");
  const std::string hash = reference_hash(dir, cfg, steps);
  const std::string out = dir.path() + "/partition.json";
  child_process launch(
      launch_args(dir, cfg, steps, out, {"--inject", "partition coordinator at step=100 for=2s"}),
      dir.path(), "launch-partition");
  const nlohmann::json s = finish(launch, out);
  check_failovers(s, hash, steps, 1);
  const std::string log = launch.out();
  CAPTURE(log);
  // The cut-off leader noticed its lease was gone and exited 75 ("deposed"); launch brought
  // it back as a standby under the same name.
  size_t exited = std::string::npos;
  std::string name;
  for (size_t at = line_at(log, "launch: "); at != std::string::npos;
       at = line_at(log, "launch: ", at + 1)) {
    const std::string line = log.substr(at, log.find('\n', at) - at);
    if (line.find(") exited: exit code 75") == std::string::npos) continue;
    exited = at;
    name = line.substr(8, line.find(" (pid ") - 8);
    break;
  }
  REQUIRE_MESSAGE(exited != std::string::npos, "no coordinator exited with code 75");
  CHECK(line_at(log, "launch: restarting " + name + " as a standby at ", exited) !=
        std::string::npos);
}

TEST_CASE("coordinator standbys: a leader paused past its lease resumes deposed, same hash") {
  // SIGSTOP: unlike a cut, a paused leader cannot step down on time. It resumes with its
  // timers due and its lease long gone; it must not be obeyed, and must step down (exit 75)
  // when it sees etcd again. A worker sent SIGTERM while it is paused must still leave: the
  // drain it asked of the paused leader is asked again of the next one. The run must still
  // be going when the old leader resumes, whatever the speed: once worker-3 has left, three
  // workers are below elastic.min_workers and training waits. It goes on only when the test
  // scales back to four, after launch has restarted the old leader as a standby. The order
  // is the gate's, not a timing's.
  require_etcd();
  temp_dir dir;
  const int steps = 200;
  const std::string cfg = config("quickstart_ha.yaml");
  const std::string hash = reference_hash(dir, cfg, steps);
  const std::string out = dir.path() + "/paused.json";
  child_process launch(launch_args(dir, cfg, steps, out, {"--set", "elastic.min_workers=4"}),
                       dir.path(), "launch-paused");
  const job_address ep = address_of(launch);
  const nlohmann::json st = wait_for_step(ep, 10);
  REQUIRE_MESSAGE(st["coordinator"].is_object(), st.dump());
  const pid_t leader_pid = static_cast<pid_t>(st["coordinator"]["pid"].get<int64_t>());
  const int64_t old_term = st["coordinator"]["term"];
  const std::string old_leader = st["coordinator"]["leader"];
  job_address standby{"", ep.keys};
  for (const auto& e : candidate_endpoints(launch, ep))
    if (e != old_leader) standby.ep = e;
  // A short answer timeout: a question a standby forwards to the paused leader goes
  // unanswered, and must not hold up the next one.
  auto ctl = [&](const std::string& args, int* rc = nullptr) {
    return run_capture("ctl " + standby.ctl_args() + " --timeout-ms 1000 " + args, rc, true);
  };
  // The workers alive as a leader of a term above ABOVE_TERM lists them, asked at the
  // standby (-1: no such leader answered); the step it shows into shown_step.
  int64_t shown_step = -1;
  auto alive_above_term = [&](int64_t above_term) {
    int code = -1;
    const std::string said =
        run_capture("ctl " + standby.ctl_args() + " --timeout-ms 1000 status --json", &code);
    const auto j = nlohmann::json::parse(code == 0 ? said : "", nullptr, false);
    if (!j.is_object() || !j["coordinator"].is_object() ||
        j["coordinator"]["term"].get<int64_t>() <= above_term)
      return -1;
    shown_step = j["step"].get<int64_t>();
    return alive_workers(j);
  };
  const std::string started = "launch: started worker-3 (pid ";
  const size_t w3_at = launch.out().find(started);
  REQUIRE_MESSAGE(w3_at != std::string::npos, launch.out());
  const pid_t w3 = static_cast<pid_t>(std::stol(launch.out().substr(w3_at + started.size())));

  const auto paused_at = std::chrono::steady_clock::now();
  REQUIRE(::kill(leader_pid, SIGSTOP) == 0);
  // SIGTERM to worker-3 while its leader is paused: its drain request goes unanswered, so
  // it asks again once it has re-attached to the next leader, which drains it. Three
  // workers are below elastic.min_workers: training then waits for a fourth.
  REQUIRE(::kill(w3, SIGTERM) == 0);
  const std::string w3_left = "launch: worker-3 (pid " + std::to_string(w3) + ") exited: ";
  const bool took_over = eventually(step_timeout, [&] {
    return launch.out().find(w3_left) != std::string::npos && alive_above_term(old_term) == 3;
  });
  if (std::chrono::steady_clock::now() < paused_at + milliseconds(3000))
    std::this_thread::sleep_until(paused_at + milliseconds(3000));  // paused for 3 s at least
  const bool resumed = ::kill(leader_pid, SIGCONT) == 0;
  REQUIRE_MESSAGE(took_over,
                  "no standby took over, or worker-3 did not drain there: " << launch.out());
  REQUIRE(resumed);
  const std::string log = launch.out();
  const size_t left = log.find(w3_left);
  CHECK_MESSAGE(log.compare(left + w3_left.size(), 11, "exit code 0") == 0, log);
  // Waiting for a fourth worker, the new leader shows the step the workers hold, not 0.
  CHECK(shown_step >= 10);
  CHECK(shown_step < steps);

  // It resumes deposed: exit 75, restarted by launch as a standby.
  const std::string died = "(pid " + std::to_string(leader_pid) + ") exited: exit code 75";
  const bool back = eventually(step_timeout, [&] {
    const std::string log = launch.out();
    const size_t at = log.find(died);
    if (at == std::string::npos) return false;
    const size_t from = log.rfind('\n', at) + 1;
    const std::string name = log.substr(from + 8, log.find(" (pid ", from) - from - 8);
    return line_at(log, "launch: restarting " + name + " as a standby at ", at) !=
           std::string::npos;
  });
  REQUIRE_MESSAGE(back, "the resumed leader did not step down and stand by: " << launch.out());
  // A leader that took over refuses a scale until its workers have re-attached: ask again.
  std::string scaled;
  REQUIRE_MESSAGE(eventually(step_timeout,
                             [&] {
                               int rc = -1;
                               scaled = ctl("scale 4", &rc);
                               return rc == 0;
                             }),
                  scaled);

  const nlohmann::json s = finish(launch, out);
  check_failovers(s, hash, steps, 1);
  CHECK(s["dp"] == 4);
  const auto drains = events_of(s, "drained");  // by the new leader, when worker-3 asked again
  REQUIRE_MESSAGE(drains.size() == 1, s["events"].dump());
  CHECK(drains[0]["worker"] == "worker-3");
  CHECK(s["coordinator"]["leader"] != old_leader);
}

TEST_CASE("coordinator standbys: a worker, a standby and the leader die in one run") {
  // In this order, whatever the speed: rank 1 dies at step 5, and four workers are
  // elastic.min_workers, so training waits there. While it waits the test SIGKILLs a
  // standby and adds the leader's kill with ctl inject; only then does it scale back to
  // four, and training goes on to the leader's death.
  require_etcd();
  temp_dir dir;
  const int steps = 300;
  const std::string cfg = config("quickstart_ha.yaml");
  const std::string hash = reference_hash(dir, cfg, steps);
  const std::string out = dir.path() + "/three-deaths.json";
  child_process launch(
      launch_args(dir, cfg, steps, out,
                  {"--set", "elastic.min_workers=4", "--inject", "kill rank=1 at step=5"}),
      dir.path(), "launch-three-deaths");
  const job_address ep = address_of(launch);
  const nlohmann::json st = wait_held(ep, 5);
  // SIGKILL a standby that does not lead (the leader is the one ctl status names).
  REQUIRE_MESSAGE(st["coordinator"].is_object(), st.dump());
  const int64_t leader_pid = st["coordinator"]["pid"].get<int64_t>();
  started_coordinator victim;
  for (const auto& c : started_coordinators(launch.out()))
    if (c.pid != leader_pid) victim = c;
  REQUIRE_MESSAGE(victim.pid > 0, launch.out());
  MESSAGE("leader pid " << leader_pid << "; killing " << victim.name << " (pid " << victim.pid
                        << ") at step " << st["step"].get<int64_t>());
  REQUIRE(::kill(victim.pid, SIGKILL) == 0);
  ctl_ok(ep, "inject 'kill coordinator at step=200'");
  ctl_ok(ep, "scale 4");

  const nlohmann::json s = finish(launch, out);
  check_failovers(s, hash, steps, 1);
  CHECK(events_of(s, "failover")[0]["step"].get<int64_t>() >= 200);
  CHECK(s["dp"] == 4);
  // The kill at step 5 was an event of the first leader: kept in etcd, it is in the
  // final summary's events beside the failover.
  CHECK_MESSAGE(events_of(s, "kill").size() == 1, s["events"].dump());
  const std::string log = launch.out();
  CAPTURE(log);
  const std::string died =
      "launch: " + victim.name + " (pid " + std::to_string(victim.pid) + ") exited: ";
  const size_t at = line_at(log, died);
  REQUIRE(at != std::string::npos);
  CHECK(log.substr(at, log.find('\n', at) - at).find("killed by signal 9") != std::string::npos);
  CHECK(line_at(log, "launch: restarting " + victim.name + " as a standby at " + victim.endpoint,
                at) != std::string::npos);
}

TEST_CASE("ctl status names the leader, its term and its standbys, also when asked at a standby") {
  require_etcd();
  temp_dir dir;
  const std::string cfg = config("quickstart_ha.yaml");
  const std::string out = dir.path() + "/status.json";
  child_process launch(launch_args(dir, cfg, 100000, out, {"--set", "train.log_every=1000000"}),
                       dir.path(), "launch-status");
  const job_address ep = address_of(launch);
  // The standbys start beside the leader and register in etcd on their own time (a loaded
  // machine may elect the leader first): the status is read once all three are in.
  nlohmann::json st;
  const bool all_in = eventually(step_timeout, [&] {
    st = ctl_status(ep);
    return st.is_object() && st["coordinator"].is_object() &&
           st["coordinator"]["term"].get<int64_t>() > 0 &&
           st["coordinator"]["standbys"].size() == 2;
  });
  REQUIRE_MESSAGE(all_in, "the leader never listed two standbys: " << st.dump());
  const nlohmann::json co = st["coordinator"];
  CAPTURE(co.dump());
  const auto all = candidate_endpoints(launch, ep);
  const std::set<std::string> endpoints(all.begin(), all.end());
  REQUIRE(endpoints.size() == 3);
  const std::string leader = co["leader"];
  CHECK(endpoints.count(leader) == 1);
  CHECK(co["pid"].get<int64_t>() > 0);
  CHECK(co["standbys"].size() == 2);
  std::set<std::string> standbys;
  for (const auto& e : co["standbys"]) standbys.insert(e.get<std::string>());
  CHECK(standbys.size() == co["standbys"].size());
  CHECK(standbys.count(leader) == 0);
  for (const auto& e : standbys) CHECK(endpoints.count(e) == 1);

  // Asked at a standby, ctl follows it to the leader: the same leader and term.
  job_address standby{"", ep.keys};
  for (const auto& e : all)
    if (e != leader) standby.ep = e;
  const nlohmann::json at_standby = ctl_status(standby);
  REQUIRE_MESSAGE(at_standby.is_object(), "ctl at " << standby.ep << " failed");
  CHECK(at_standby["coordinator"]["leader"] == leader);
  CHECK(at_standby["coordinator"]["term"] == co["term"]);
  CHECK(at_standby["coordinator"]["pid"] == co["pid"]);

  const std::string etcd =
      launch.wait_line("launch: etcd for the run at ", milliseconds(1000)).value_or("");
  const auto data_at = etcd.find("(data in ");
  REQUIRE_MESSAGE(data_at != std::string::npos, launch.out());
  const auto dir_end = etcd.find(", removed at exit)", data_at);
  REQUIRE_MESSAGE(dir_end != std::string::npos, launch.out());
  const std::string etcd_dir = etcd.substr(data_at + 9, dir_end - data_at - 9);
  REQUIRE(std::filesystem::exists(etcd_dir));  // so that its absence below means something

  int rc = -1;
  const std::string said =
      run_capture("ctl --coordinator " + leader + " --keys " + ep.keys + " stop", &rc, true);
  CHECK_MESSAGE(rc == 0, said);
  const auto code = launch.wait_exit(step_timeout);
  REQUIRE_MESSAGE(code.has_value(), launch.out() << launch.err());
  CHECK_MESSAGE(*code == 0, launch.out() << launch.err());
  // Nothing left: coordinators, workers and the etcd shared launch's process group.
  std::vector<pid_t> left;
  eventually(milliseconds(3000), [&] {
    left = processes_in_group(launch.pid());
    return left.empty();
  });
  CHECK_MESSAGE(left.empty(), left.size() << " process(es) left in the launch group");
  CHECK_MESSAGE(!std::filesystem::exists(etcd_dir), etcd_dir << " is still there");
}

TEST_CASE("without ha nothing changes: no etcd, no coordinator block") {
  temp_dir dir;
  const int steps = 300;
  const std::string cfg = config("quickstart.yaml");
  const std::string out = dir.path() + "/plain.json";
  child_process launch(launch_args(dir, cfg, steps, out, {}), dir.path(), "launch-plain");
  const job_address ep = address_of(launch);
  const nlohmann::json st = wait_for_step(ep, 1);
  CHECK_MESSAGE(!st.contains("coordinator"), st.dump());
  const nlohmann::json s = finish(launch, out);
  CHECK(s["steps_completed"] == steps);
  CHECK_MESSAGE(!s.contains("coordinator"), s.dump());
  CHECK(events_of(s, "failover").empty());
  const std::string log = launch.out();
  CHECK_MESSAGE(log.find("etcd") == std::string::npos, log);
  CHECK_MESSAGE(log.find("standby") == std::string::npos, log);
}

TEST_CASE(
    "coordinator standbys: a leader restarted at its endpoint that leads again hears from launch") {
  // The leader is SIGKILLed while both standbys are SIGSTOPped, so the one to win next is the
  // leader's own restart, at the same endpoint. launch must register with that new process
  // (its old connection reconnects there silently and names no launcher): `ctl scale 4`
  // needs the launcher, and the run must end on `cohort train`'s hash.
  require_etcd();
  temp_dir dir;
  const int steps = 200;
  const std::string cfg = config("quickstart_ha.yaml");
  const std::string hash = reference_hash(dir, cfg, steps);
  const std::string out = dir.path() + "/same-endpoint.json";
  child_process launch(
      launch_args(dir, cfg, steps, out,
                  {"--set", "elastic.min_workers=4", "--inject", "kill rank=1 at step=5"}),
      dir.path(), "launch-same-endpoint");
  const job_address first = address_of(launch);
  nlohmann::json st;
  // Held at step 5 with three workers, and both standbys in (the leader lists them).
  REQUIRE_MESSAGE(eventually(step_timeout,
                             [&] {
                               st = ctl_status(first);
                               return st.is_object() && st["step"].is_number() &&
                                      st["step"].get<int64_t>() >= 5 && alive_workers(st) == 3 &&
                                      st["coordinator"].is_object() &&
                                      st["coordinator"]["standbys"].size() == 2;
                             }),
                  st.dump());
  const nlohmann::json co = st["coordinator"];
  const pid_t old_pid = static_cast<pid_t>(co["pid"].get<int64_t>());
  const int64_t old_term = co["term"].get<int64_t>();
  const job_address leader{co["leader"].get<std::string>(), first.keys};
  std::vector<pid_t> standbys;
  for (const auto& c : started_coordinators(launch.out()))
    if (c.pid != old_pid) standbys.push_back(c.pid);
  // The first coordinator has no "started" line: it is the leader, or one of the two.
  if (standbys.size() == 1) {
    for (const pid_t p : processes_in_group(launch.pid())) {
      std::ifstream in("/proc/" + std::to_string(p) + "/cmdline");
      std::string arg;
      bool coordinator = false;
      while (std::getline(in, arg, '\0')) coordinator = coordinator || arg == "coordinator";
      if (p != old_pid && p != standbys[0] && coordinator) standbys.push_back(p);
    }
  }
  REQUIRE_MESSAGE(standbys.size() == 2, launch.out());
  for (const pid_t p : standbys) REQUIRE(::kill(p, SIGSTOP) == 0);
  REQUIRE(::kill(old_pid, SIGKILL) == 0);

  // The restart at the old endpoint leads (a new pid and a newer term there).
  const bool again = eventually(step_timeout, [&] {
    st = ctl_status(leader);
    return st.is_object() && st["coordinator"].is_object() &&
           st["coordinator"]["pid"].get<int64_t>() != old_pid &&
           st["coordinator"]["term"].get<int64_t>() > old_term;
  });
  for (const pid_t p : standbys) ::kill(p, SIGCONT);
  REQUIRE_MESSAGE(again, "the restarted leader never led: " << st.dump() << launch.out());
  CHECK(st["coordinator"]["leader"] == leader.ep);

  std::string said;
  const bool scaled = eventually(step_timeout, [&] {
    int rc = -1;
    said = run_capture("ctl " + leader.ctl_args() + " scale 4", &rc, true);
    return rc == 0;
  });
  REQUIRE_MESSAGE(scaled, said);
  const nlohmann::json s = finish(launch, out);
  check_failovers(s, hash, steps, 1);
  CHECK(s["dp"] == 4);
}
