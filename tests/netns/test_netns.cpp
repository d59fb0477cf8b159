// Multi-host behaviour on emulated hosts (issue #14): every "host" is a network namespace
// with its own address on a private bridge (tools/netns.sh), the coordinator on host 1 and
// the workers on hosts 2 and 3. Nothing may bind or advertise 127.0.0.1 here: a Gloo pair
// or a pipeline channel that did would never be reached. In bitwise mode a DP sum does not
// depend on the replica count, so every run must end on `cohort train`'s hash; a compressed
// one (1-bit Adam) on the hash of a flat group of its size, whichever ranks share a host.
// Needs root and network namespaces: without them each case exits 77 (CTest: skipped).
#include <doctest/doctest.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "runtime/ckpt/checkpoint_dir.hpp"
#include "tests/mp/dp_util.hpp"
#include "tests/mp/mp_util.hpp"
#include "tests/netns/netns_util.hpp"

using namespace cohort;
using namespace cohort::mp;
using std::chrono::milliseconds;

namespace {

const milliseconds start_timeout(20000);
const milliseconds run_timeout(240000);

// The coordinator on host 1, bound to its bed address (port picked by the OS). An address
// other hosts reach needs keys: the job's are written into the test's folder, and every
// worker and ctl of the test uses them (CURVE across the emulated hosts).
struct coordinator {
  std::unique_ptr<child_process> proc;
  std::string endpoint;
  std::string summary;
  std::string keys;

  // TAG names this run's summary and keys, for cases that run several jobs in one folder.
  coordinator(const bed& b, const temp_dir& dir, const std::string& cfg,
              const std::vector<std::string>& extra, const std::string& tag = "") {
    summary = dir.path() + "/" + tag + "summary.json";
    keys = dir.path() + "/" + tag + "keys";
    std::string said;
    REQUIRE_MESSAGE(run_shell(cohort_binary() + " keygen " + keys, &said) == 0, said);
    std::vector<std::string> args{
        "coordinator", "--config", cfg,      "-q",
        "--summary",   summary,    "--bind", "tcp://" + bed::address(1) + ":0",
        "--keys",      keys};
    args.insert(args.end(), extra.begin(), extra.end());
    proc = std::make_unique<child_process>(args, dir.path(), tag + "coordinator",
                                           std::vector<std::string>{}, b.on(1));
    const auto ep = proc->wait_line("coordinator listening on ", start_timeout);
    REQUIRE_MESSAGE(ep.has_value(), proc->out() << proc->err());
    endpoint = *ep;
    REQUIRE(endpoint.find(bed::address(1)) != std::string::npos);
  }

  nlohmann::json finish() {
    const auto code = proc->wait_exit(run_timeout);
    REQUIRE_MESSAGE(code.has_value(), "coordinator did not finish: " << proc->err());
    CHECK_MESSAGE(*code == 0, proc->err());
    const nlohmann::json s = read_json(summary);
    REQUIRE_MESSAGE(s.is_object(), "no summary: " << proc->err());
    return s;
  }
};

std::unique_ptr<child_process> worker(const bed& b, int host, const temp_dir& dir,
                                      const coordinator& c, const std::string& name) {
  return std::make_unique<child_process>(
      std::vector<std::string>{"worker", "--join", c.endpoint, "--name", name, "--keys", c.keys},
      dir.path(), name, std::vector<std::string>{}, b.on(host));
}

// Two hosts of two workers joined to C: b-0 and b-1 on host 2, c-0 and c-1 on host 3.
std::array<std::unique_ptr<child_process>, 4> two_hosts_of_two(const bed& b, const temp_dir& dir,
                                                               const coordinator& c) {
  return {worker(b, 2, dir, c, "b-0"), worker(b, 2, dir, c, "b-1"), worker(b, 3, dir, c, "c-0"),
          worker(b, 3, dir, c, "c-1")};
}

// `cohort ctl --coordinator EP ARGS` from host 1's namespace: its output parsed as JSON (a
// discarded value when it is not), its exit code into *RC when given.
nlohmann::json ctl(const bed& b, const coordinator& c, const std::string& args = "status --json",
                   int* rc = nullptr) {
  std::string prefix;
  for (const auto& a : b.on(1)) prefix += a + " ";
  std::string out;
  const int code = run_shell(prefix + cohort_binary() + " ctl --keys " + c.keys +
                                 " --coordinator " + c.endpoint + " " + args,
                             &out);
  if (rc != nullptr) *rc = code;
  return nlohmann::json::parse(code == 0 ? out : "", nullptr, false);
}

// True when `ctl status` lists worker NAME as a live member (joining, alive or leaving).
bool is_member(const nlohmann::json& status, const std::string& name) {
  for (const auto& w : status["workers"])
    if (w["name"] == name && w["state"] != "dead") return true;
  return false;
}

// Waits until the job of C (reached from host 1's namespace) has committed STEP steps.
void wait_for_step(const bed& b, const coordinator& c, int64_t step) {
  const bool reached = eventually(milliseconds(120000), [&] {
    const auto j = ctl(b, c, "status --json 2>/dev/null");
    return j.is_object() && j["step"].is_number() && j["step"].get<int64_t>() >= step;
  });
  REQUIRE_MESSAGE(reached, "the job never reached step " << step);
}

// Starts worker NAME on host HOST and waits until it has registered as RANK, so that the
// next worker registers after it.
std::unique_ptr<child_process> join_as(const bed& b, int host, const temp_dir& dir,
                                       const coordinator& c, const std::string& name, int rank) {
  auto w = worker(b, host, dir, c, name);
  const auto said = w->wait_line("worker " + name + " registered: ", start_timeout);
  REQUIRE_MESSAGE(said.has_value(), w->err());
  REQUIRE_MESSAGE(said->find(", rank " + std::to_string(rank) + ",") != std::string::npos, *said);
  return w;
}

// Worker W ended with exit code 0, having summed over a hierarchical group of 4.
void check_hierarchical_exit(child_process& w) {
  const auto code = w.wait_exit(start_timeout);
  REQUIRE_MESSAGE(code.has_value(), w.err());
  CHECK(*code == 0);
  CHECK_MESSAGE(w.err().find("group 'dp' of 4 over hierarchical") != std::string::npos, w.err());
}

// One job of CFG with four workers, rank i on host HOSTS[i] (each registered before the
// next starts); its summary.
// Workers TAG-<i>-h<host> joined to C one after the other, worker i on HOSTS[i] as rank i.
std::vector<std::unique_ptr<child_process>> join_on_hosts(const bed& b, const temp_dir& dir,
                                                          const coordinator& c,
                                                          const std::string& tag,
                                                          const std::vector<int>& hosts) {
  std::vector<std::unique_ptr<child_process>> ws;
  for (std::size_t i = 0; i < hosts.size(); ++i)
    ws.push_back(join_as(b, hosts[i], dir, c,
                         tag + "-" + std::to_string(i) + "-h" + std::to_string(hosts[i]),
                         static_cast<int>(i)));
  return ws;
}

nlohmann::json run_on_hosts(const bed& b, const temp_dir& dir, const std::string& cfg,
                            const std::vector<int>& hosts, std::vector<std::string> extra,
                            const std::string& tag) {
  extra.insert(extra.end(), {"--set", "cluster.workers=4"});
  coordinator c(b, dir, cfg, extra, tag + "-");
  std::vector<std::unique_ptr<child_process>> ws = join_on_hosts(b, dir, c, tag, hosts);
  const nlohmann::json s = c.finish();
  for (auto& w : ws) check_hierarchical_exit(*w);
  return s;
}

// Bitwise 1-bit Adam for STEPS steps (the variance frozen after step 4), a checkpoint every
// 8 steps, each holding every rank's error memory: the config's path.
const std::vector<std::string> kOnebit = {"--set", "train.optimizer=onebit_adam",
                                          "--set", "train.onebit.freeze_step=4",
                                          "--set", "fault_tolerance.keep=5"};
std::string onebit_config(const temp_dir& dir, int steps) {
  std::string yaml = small_yaml(dir.path(), "bitwise", steps);
  yaml.replace(yaml.find("checkpoint_every: 0"), 19, "checkpoint_every: 8");
  return dir.write("cfg.yaml", yaml);
}

// The params_sha256 of CFG's 1-bit Adam job on one flat Gloo group of 4 on one host. Its
// final checkpoint goes to a folder of its own, so that the jobs after it resume only from
// their own checkpoints.
std::string flat_onebit_hash(const temp_dir& dir, const std::string& cfg) {
  std::string launch = "launch " + cfg + " -q --summary " + dir.path() + "/flat.json" +
                       " --set cluster.workers=4 --set comm.transport=gloo" +
                       " --set fault_tolerance.checkpoint_every=0" +
                       " --set fault_tolerance.checkpoint_dir=" + dir.path() + "/ckpt-flat";
  for (const std::string& a : kOnebit) launch += " " + a;
  int rc = -1;
  run_capture(launch, &rc);
  REQUIRE(rc == 0);
  return read_json(dir.path() + "/flat.json")["params_sha256"];
}

}  // namespace

TEST_CASE("two workers on each of two hosts train bitwise-equal to `cohort train`") {
  require_netns();
  temp_dir dir;
  const int steps = 40;
  const std::string cfg = dir.write("cfg.yaml", small_yaml(dir.path(), "bitwise", steps));
  const std::string hash = train_summary(dir, cfg)["params_sha256"];
  bed b(3);
  coordinator c(b, dir, cfg, {"--set", "cluster.workers=4"});
  auto [w1, w2, w3, w4] = two_hosts_of_two(b, dir, c);
  const nlohmann::json s = c.finish();
  check_fault_free(s, hash, steps);
  CHECK(s["dp"] == 4);
  // Each worker's data plane is on its own host's address, found from its route to the
  // coordinator (comm.interface: auto).
  CHECK_MESSAGE(w1->err().find("data plane on " + bed::address(2)) != std::string::npos, w1->err());
  CHECK_MESSAGE(w3->err().find("data plane on " + bed::address(3)) != std::string::npos, w3->err());
  // Two workers a host: the DP group is hierarchical (comm.hierarchy: auto), and its
  // int64 sums keep the hash of `cohort train`.
  for (auto* w : {w1.get(), w4.get()})
    CHECK_MESSAGE(w->err().find("group 'dp' of 4 over hierarchical") != std::string::npos,
                  w->err());
  for (auto* w : {w1.get(), w2.get(), w3.get(), w4.get()}) {
    const auto code = w->wait_exit(start_timeout);
    REQUIRE_MESSAGE(code.has_value(), w->err());
    CHECK(*code == 0);
  }
}

TEST_CASE("a worker killed on another host: the survivors go on and end on the same hash") {
  require_netns();
  temp_dir dir;
  const int steps = 200;
  std::string yaml = small_yaml(dir.path(), "bitwise", steps);
  yaml.replace(yaml.find("timeout_ms: 2000"), 16, "timeout_ms: 500");
  const std::string cfg = dir.write("cfg.yaml", yaml);
  const std::string hash = train_summary(dir, cfg)["params_sha256"];
  bed b(3);
  coordinator c(b, dir, cfg,
                {"--set", "cluster.workers=4", "--set", "elastic.min_workers=3", "--inject",
                 "kill worker=c-1 at step=30"});
  auto [w1, w2, w3, w4] = two_hosts_of_two(b, dir, c);
  const nlohmann::json s = c.finish();
  check_fault_free(s, hash, steps);
  CHECK(s["dp"] == 3);
  const auto kills = events_of(s, "kill");
  REQUIRE_MESSAGE(kills.size() == 1, s["events"].dump());
  CHECK(kills[0]["worker"] == "c-1");
  REQUIRE(kills[0]["recover_ms"].is_number());
  MESSAGE("kill on another host: detect " << kills[0]["detect_ms"] << " ms, recover "
                                          << kills[0]["recover_ms"] << " ms");
  // Survivors that were waiting in the dead member's rendezvous are answered superseded by
  // the new roster, not left to their 10 s rendezvous timeout (about 0.5 s here; the bound
  // is slack for a loaded machine, well below that timeout).
  CHECK(kills[0]["recover_ms"].get<double>() < 5000.0);
  const auto code = w4->wait_exit(start_timeout);
  REQUIRE(code.has_value());
  CHECK(*code != 0);  // it was killed
}

// Sharded state (train.zero: 3) on two hosts of two workers: the ring puts each shard's
// replica on the other host (ring_of_hosts), so when one host is lost whole, both its
// workers at once, every shard still has a copy on the survivors: they re-cut from memory,
// with no checkpoint to roll back to (checkpoint_every: 0), and end on `cohort train`'s bits.
// With the replica on the next rank of the same host this loses two shards.
TEST_CASE("zero 3: a whole host lost at once, its shards come back from the other host") {
  require_netns();
  temp_dir dir;
  const int steps = 60;
  std::string yaml = gpt_yaml(dir.path(), steps);
  yaml.replace(yaml.find("timeout_ms: 2000"), 16, "timeout_ms: 500");
  const std::string cfg = dir.write("cfg.yaml", yaml);
  const std::string hash = train_summary(dir, cfg)["params_sha256"];
  bed b(3);
  coordinator c(b, dir, cfg,
                {"--set", "cluster.workers=4", "--set", "elastic.min_workers=2", "--set",
                 "train.zero=3", "--inject", "kill worker=c-0 at step=20", "--inject",
                 "kill worker=c-1 at step=20"});
  auto [w1, w2, w3, w4] = two_hosts_of_two(b, dir, c);
  const nlohmann::json s = c.finish();
  check_fault_free(s, hash, steps);
  CHECK(s["dp"] == 2);
  CHECK(events_of(s, "kill").size() == 2);
  const auto cuts = events_of(s, "reshard");
  REQUIRE_MESSAGE(!cuts.empty(), s["events"].dump());
  CHECK(cuts.back()["members"] == 2);
  // Two workers a host: the group sums hierarchically (its holders' sums and the blocks'
  // gathers too).
  CHECK_MESSAGE(w1->err().find("group 'dp' of 4 over hierarchical") != std::string::npos,
                w1->err());
  for (auto* w : {w3.get(), w4.get()}) {
    const auto code = w->wait_exit(start_timeout);
    REQUIRE(code.has_value());
    CHECK(*code != 0);  // killed
  }
}

TEST_CASE("a host's link down for 2 s: the others go on, its worker rejoins once it is back") {
  // c-0 (host 3) is declared dead during the cut and b-0, b-1 go on without it. Once the
  // cable is back its next heartbeat is answered rejoin_required: it registers again and
  // takes the state from a live peer, as a restarted worker does (docs/membership.md).
  // Its return must find the job running: b-0 and b-1 sum over shared memory and finish
  // hundreds of steps a second, and TCP resends to host 3 only at its next retransmission
  // timeout (up to ~2 s after the cable is back). So once the test has seen steps commit
  // without c-0 it drains b-1: b-0 alone is below elastic.min_workers, training pauses,
  // and no further step can commit until c-0 is back. The order is the gate's, not a
  // timing's: the drain is accepted before the end or the case fails saying so.
  require_netns();
  temp_dir dir;
  const int steps = 1200;
  std::string yaml = small_yaml(dir.path(), "bitwise", steps);
  yaml.replace(yaml.find("timeout_ms: 2000"), 16, "timeout_ms: 500");
  const std::string cfg = dir.write("cfg.yaml", yaml);
  const std::string hash = train_summary(dir, cfg)["params_sha256"];
  bed b(3);
  coordinator c(b, dir, cfg,
                {"--set", "cluster.workers=3", "--set", "elastic.min_workers=2", "--set",
                 "elastic.max_workers=3"});
  auto w1 = worker(b, 2, dir, c, "b-0");
  auto w2 = worker(b, 2, dir, c, "b-1");
  auto w3 = worker(b, 3, dir, c, "c-0");
  wait_for_step(b, c, 20);
  const auto cut = std::chrono::steady_clock::now();
  b.link(3, false);
  // The others go on: a step commits after c-0 has left the roster, its cable still out.
  int64_t left_at = -1;
  const bool went_on = eventually(milliseconds(60000), [&] {
    const auto j = ctl(b, c, "status --json 2>/dev/null");
    if (!j.is_object() || !j["step"].is_number() || is_member(j, "c-0")) return false;
    if (left_at < 0) left_at = j["step"].get<int64_t>();
    return j["step"].get<int64_t>() > left_at;
  });
  REQUIRE_MESSAGE(went_on, "no step committed without c-0 while its cable was out");
  int rc = -1;
  ctl(b, c, "drain b-1 2>&1", &rc);
  REQUIRE_MESSAGE(rc == 0, "the job ended before b-1 was drained: raise `steps`");
  std::this_thread::sleep_until(cut + milliseconds(2000));  // the cut lasts 2 s
  b.link(3, true);
  const nlohmann::json s = c.finish();
  check_fault_free(s, hash, steps);
  CHECK(s["dp"] == 2);  // b-0 and the returned c-0
  // A worker that registered after the first step opened (min_workers is 2 of 3) joined
  // late, before the cut: not part of this story, and not the order under test.
  std::vector<std::string> order = event_order(s);
  while (!order.empty() && order.front().rfind("joined ", 0) == 0) order.erase(order.begin());
  const std::vector<std::string> expected{"departed c-0", "drained b-1", "joined c-0"};
  CHECK_MESSAGE(order == expected, s["events"].dump());
  const auto joined = events_of(s, "joined");
  REQUIRE(!joined.empty());
  REQUIRE_MESSAGE(joined.back()["transfer_mb_s"].is_number(), joined.back().dump());
  CHECK(joined.back()["transfer_mb_s"].get<double>() > 0.0);  // b-0's state, over the bridge
  for (auto* w : {w1.get(), w2.get(), w3.get()}) {
    const auto code = w->wait_exit(start_timeout);
    REQUIRE_MESSAGE(code.has_value(), w->err());
    CHECK_MESSAGE(*code == 0, w->err());
  }
  // c-0 was told it had been declared dead and registered a second time.
  CHECK_MESSAGE(w3->err().find("registering again") != std::string::npos, w3->err());
  const std::string out = w3->out();
  const std::string registered = "worker c-0 registered: member ";
  const auto first = out.find(registered);
  const bool twice = first != std::string::npos && out.find(registered, first + 1) != out.npos;
  CHECK_MESSAGE(twice, out);
}

TEST_CASE("a joiner on a new host takes its state from a live peer across the bridge") {
  // A joiner loading the job does not hold training (the group steps on without it), so
  // that c-0 enters before the run can end, whatever the speed, the test SIGSTOPs b-1
  // (training waits in b-0's sum; timeout_ms is far longer than the hold) until c-0 has
  // built its job (the line it logs just before it tells the coordinator it is ready),
  // then SIGCONTs it: c-0 enters at the next step boundary. The run is long (steps take
  // about a millisecond) so that the hold lands well before its end, and the status read
  // after the hold proves that it did.
  require_netns();
  temp_dir dir;
  const int steps = 3000;
  std::string yaml = small_yaml(dir.path(), "bitwise", steps);
  yaml.replace(yaml.find("timeout_ms: 2000"), 16, "timeout_ms: 180000");
  const std::string cfg = dir.write("cfg.yaml", yaml);
  const std::string hash = train_summary(dir, cfg)["params_sha256"];
  bed b(3);
  coordinator c(b, dir, cfg, {"--set", "cluster.workers=2", "--set", "elastic.max_workers=3"});
  auto w1 = worker(b, 2, dir, c, "b-0");
  auto w2 = worker(b, 2, dir, c, "b-1");
  // One status read gives both the step and b-1's pid, so the hold follows at once.
  pid_t held = 0;
  nlohmann::json st;
  const bool stepping = eventually(milliseconds(120000), [&] {
    st = ctl(b, c, "status --json 2>/dev/null");
    if (!st.is_object() || !st["step"].is_number() || st["step"].get<int64_t>() < 20) return false;
    for (const auto& w : st["workers"])
      if (w["name"] == "b-1" && w["state"] == "alive") held = w["pid"].get<pid_t>();
    return held > 0;
  });
  REQUIRE_MESSAGE(stepping, "the job never reached step 20 with b-1 alive: " << st.dump());
  REQUIRE(::kill(held, SIGSTOP) == 0);
  // Held: the job stands at most a commit window past where it was, far from its end.
  st = ctl(b, c, "status --json 2>/dev/null");
  const bool read = st.is_object() && st["step"].is_number();
  REQUIRE_MESSAGE(read, st.dump());
  REQUIRE_MESSAGE(st["step"].get<int64_t>() < steps / 2,
                  "the run was near its end before b-1 was held: " << st.dump());
  auto w3 = worker(b, 3, dir, c, "c-0");
  const bool loaded_in_time = eventually(milliseconds(120000), [&] {
    return w3->err().find("dp group: model ") != std::string::npos;
  });
  ::kill(held, SIGCONT);
  REQUIRE_MESSAGE(loaded_in_time, "c-0 never built its job: " << w3->err());
  const nlohmann::json s = c.finish();
  check_fault_free(s, hash, steps);
  CHECK(s["dp"] == 3);
  bool transfer = false;
  for (const auto& e : events_of(s, "joined"))
    if (e["worker"] == "c-0" && e.contains("transfer_mb_s") && e["transfer_mb_s"].is_number())
      transfer = e["transfer_mb_s"].get<double>() > 0.0;
  CHECK_MESSAGE(transfer, s["events"].dump());
}

TEST_CASE("workers that advertise an address their peers cannot reach fail the job, naming it") {
  require_netns();
  temp_dir dir;
  const std::string cfg = dir.write("cfg.yaml", small_yaml(dir.path(), "bitwise", 40));
  bed b(3);
  // 127.0.0.1 is every host's own loopback: what the data plane advertised before it knew
  // better. Each host reaches only itself there.
  coordinator c(b, dir, cfg, {"--set", "cluster.workers=2", "--set", "comm.interface=127.0.0.1"});
  auto w1 = worker(b, 2, dir, c, "b-0");
  auto w2 = worker(b, 3, dir, c, "c-0");
  const auto code = c.proc->wait_exit(run_timeout);
  REQUIRE_MESSAGE(code.has_value(), c.proc->err());
  CHECK(*code == 1);
  const std::string err = c.proc->err();
  CHECK_MESSAGE(err.find("could not connect 3 times in a row") != std::string::npos, err);
  CHECK_MESSAGE(err.find("which advertised [127.0.0.1]:") != std::string::npos, err);
  CHECK_MESSAGE(err.find("comm.interface") != std::string::npos, err);
}

TEST_CASE("a pipeline with one stage per host is bit-identical to `cohort train`") {
  require_netns();
  temp_dir dir;
  const int steps = 6;
  const std::string cfg = dir.write("cfg.yaml", gpt_yaml(dir.path(), steps));
  const std::string hash = train_summary(dir, cfg)["params_sha256"];
  bed b(3);
  // pp 2: stage 0 on one host, stage 1 on the other, so every activation and gradient
  // crosses the bridge through the p2p channel each worker advertised.
  coordinator c(b, dir, cfg,
                {"--set", "cluster.workers=2", "--set", "parallel.dp=1", "--set", "parallel.pp=2"});
  auto w1 = worker(b, 2, dir, c, "b-0");
  auto w2 = worker(b, 3, dir, c, "c-0");
  const nlohmann::json s = c.finish();
  CHECK(s["steps_completed"] == steps);
  CHECK(s["params_sha256"] == hash);
  CHECK_MESSAGE(w2->err().find("data plane on " + bed::address(3)) != std::string::npos, w2->err());
}

TEST_CASE(
    "1-bit Adam on two hosts x two workers: the flat group's bits in any rank layout, resumed "
    "too") {
  // Bitwise 1-bit Adam (variance frozen after step 4) with a checkpoint every 8 steps,
  // each holding every rank's error memory. The hierarchy routes the compressed sum's
  // alltoall and allgather through the host leaders, so chunk r is summed, and its server
  // memory kept, at rank r wherever that rank runs: with ranks blocked by host (0, 1 | 2, 3)
  // or interleaved (0, 2 | 1, 3), as two registration orders give, the run ends on the bits
  // of one flat Gloo group of 4; and cut after step 16 and resumed, on the other layout or
  // the same, it ends there again (rank R takes part R: its memory means the same chunks).
  require_netns();
  temp_dir dir;
  const int steps = 24;
  const std::string cfg = onebit_config(dir, steps);
  const std::string flat = flat_onebit_hash(dir, cfg);
  bed b(3);
  const std::vector<int> blocked = {2, 2, 3, 3}, interleaved = {2, 3, 2, 3};
  check_fault_free(run_on_hosts(b, dir, cfg, blocked, kOnebit, "blocked"), flat, steps);
  std::vector<std::string> apart = kOnebit;
  apart.insert(apart.end(),
               {"--set", "fault_tolerance.checkpoint_dir=" + dir.path() + "/ckpt-interleaved"});
  check_fault_free(run_on_hosts(b, dir, cfg, interleaved, apart, "interleaved"), flat, steps);

  const std::string ckpt = dir.path() + "/ckpt";
  std::string listing;
  for (const auto& e : std::filesystem::recursive_directory_iterator(ckpt))
    listing += e.path().string() + "\n";
  for (int r = 0; r < 4; ++r)
    REQUIRE_MESSAGE(
        std::filesystem::exists(checkpoint_path(ckpt, 16) + "/" + feedback_file_name(r)), listing);
  std::vector<std::string> resume = kOnebit;
  resume.push_back("--resume");
  for (const auto* layout : {&interleaved, &blocked}) {
    const std::string tag = layout == &blocked ? "resumed-blocked" : "resumed-interleaved";
    CAPTURE(tag);
    std::filesystem::remove_all(checkpoint_path(ckpt, 24));  // as a kill after step 16 leaves it
    check_fault_free(run_on_hosts(b, dir, cfg, *layout, resume, tag), flat, steps);
    CHECK(read_file(dir.path() + "/" + tag + "-coordinator.err").find("resuming from") !=
          std::string::npos);
  }
}

TEST_CASE(
    "1-bit Adam on two hosts: a worker killed and replaced on the other host rolls back to the "
    "flat group's bits") {
  // Ranks 0, 1 on host 2 and 2, 3 on host 3; rank 3 is killed at step 20 and its
  // replacement joins on host 2, so the group goes on as 0, 1, 3 | 2. Rank 3's error memory
  // died with it: the whole group rolls back to the checkpoint of step 16 (every rank loads
  // its part: the parts mean the same chunks on the new layout) and replays, ending on the
  // flat group's bits, as if nothing had happened.
  require_netns();
  temp_dir dir;
  const int steps = 28;
  const std::string cfg = onebit_config(dir, steps);
  const std::string flat = flat_onebit_hash(dir, cfg);
  bed b(3);
  std::vector<std::string> extra = kOnebit;
  extra.insert(extra.end(),
               {"--set", "cluster.workers=4", "--inject", "kill worker=k-3-h3 at step=20"});
  coordinator c(b, dir, cfg, extra, "k-");
  std::vector<std::unique_ptr<child_process>> ws = join_on_hosts(b, dir, c, "k", {2, 2, 3, 3});
  const auto killed = ws[3]->wait_exit(run_timeout);
  REQUIRE(killed.has_value());
  CHECK(*killed != 0);
  ws[3] = join_as(b, 2, dir, c, "k-4-h2", 3);
  const nlohmann::json s = c.finish();
  check_fault_free(s, flat, steps);
  CHECK_MESSAGE(events_of(s, "kill").size() == 1, s["events"].dump());
  CHECK_MESSAGE(c.proc->err().find("every member rolls back to it") != std::string::npos,
                c.proc->err());
  for (auto& w : ws) check_hierarchical_exit(*w);
}

TEST_CASE(
    "1-bit Adam with rollback points in memory: a whole host lost at once, its memory comes back "
    "from the other host") {
  // Ranks 0, 1 on host 2 and 2, 3 on host 3, no checkpoint but the last, a rollback point
  // every 8 steps. Both workers of host 3 are killed at step 20; two replacements join on
  // host 2. Each rank's error memory was copied to the next member on the ring of hosts (0,
  // 2, 1, 3), so ranks 2 and 3's parts live on at ranks 1 and 0: the group rolls back to the
  // point of step 16 in memory and ends on the flat group's bits. (With the copies on the
  // ranks' order, rank 2's copy died with rank 3 on the same host, and the run went on not
  // bit-identically: checked when this case was written.)
  require_netns();
  temp_dir dir;
  const int steps = 28;
  const std::string cfg = onebit_config(dir, steps);
  const std::string flat = flat_onebit_hash(dir, cfg);
  bed b(3);
  std::vector<std::string> extra = kOnebit;
  extra.insert(extra.end(), {"--set", "cluster.workers=4", "--set",
                             "fault_tolerance.checkpoint_every=0", "--set",
                             "fault_tolerance.memory_every=8", "--inject",
                             "kill worker=m-2-h3 at step=20", "--inject",
                             "kill worker=m-3-h3 at step=20"});
  coordinator c(b, dir, cfg, extra, "m-");
  std::vector<std::unique_ptr<child_process>> ws = join_on_hosts(b, dir, c, "m", {2, 2, 3, 3});
  for (int i = 2; i < 4; ++i) {
    const auto killed = ws[static_cast<std::size_t>(i)]->wait_exit(run_timeout);
    REQUIRE(killed.has_value());
    CHECK(*killed != 0);
  }
  // Their ranks are whatever the roster has free when each registers (the coordinator may
  // not have seen both deaths yet): the bits depend on the ranks, not on who holds them.
  ws[2] = worker(b, 2, dir, c, "m-4-h2");
  ws[3] = worker(b, 2, dir, c, "m-5-h2");
  const nlohmann::json s = c.finish();
  check_fault_free(s, flat, steps);
  CHECK_MESSAGE(events_of(s, "kill").size() == 2, s["events"].dump());
  CHECK_MESSAGE(c.proc->err().find("rollback point of step 16 in memory") != std::string::npos,
                c.proc->err());
}
