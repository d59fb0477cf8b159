// cohort under a real Slurm (issue 41, docs/slurm.md): Debian's slurmctld and three slurmd,
// each slurmd on an emulated host of its own (a network namespace of tools/netns.sh, node K
// at 10.77.0.K, `slurmd -N nodeK`; slurmctld beside node1), authenticated by a munged of the
// fixture's own (its own key and socket), all started here and stopped at the end. The job is
// tools/slurm/cohort.sbatch as a user submits it, from node1. Needs root, network namespaces
// and the slurm-wlm and munge packages (tools/setup.sh installs them), else each case exits
// 77 with the reason.
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <set>
#include <thread>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/mp/dp_util.hpp"
#include "tests/mp/mp_util.hpp"
#include "tests/netns/netns_util.hpp"

using namespace cohort;
using namespace cohort::mp;

namespace {

void skip(const std::string& why) {
  std::printf("skipped: %s\n", why.c_str());
  std::fflush(stdout);
  std::_Exit(77);
}

// A TCP port nothing listens on now (the OS picks it; released before Slurm binds it).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t n = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
  ::close(fd);
  return ntohs(a.sin_port);
}

std::string source_dir() { return std::string(COHORT_SOURCE_DIR); }

// Whether the job's output at LOG has a progress line with its three workers training.
bool all_training(const std::string& log) {
  return read_file(log).find("| 3 workers") != std::string::npos;
}

// munged, slurmctld and NODES slurmd, killed (process groups) when it goes out of scope; the
// emulated hosts go last, with anything still running on them.
struct slurm_cluster {
  temp_dir dir;
  std::string conf;
  std::unique_ptr<bed> hosts;  // node K on host K (10.77.0.K); slurmctld on host 1
  std::unique_ptr<child_process> munged, ctld;
  std::vector<std::unique_ptr<child_process>> slurmd;

  // A command on host I (`ip netns exec`), from a script file: no quoting to get right.
  int sh(const std::string& cmd, std::string* out = nullptr, int host = 1) const {
    static int n = 0;
    const std::string script = dir.path() + "/sh" + std::to_string(++n) + ".sh";
    {
      std::FILE* f = std::fopen(script.c_str(), "w");
      REQUIRE(f != nullptr);
      std::fprintf(f, "export SLURM_CONF=%s\n%s\n", conf.c_str(), cmd.c_str());
      std::fclose(f);
    }
    return run_shell(enter(host) + " bash " + script, out);
  }

  // `nsenter --net=...` into host I's network namespace. Not `ip netns exec`, which mounts a
  // sysfs of its own without the cgroup tree slurmd needs.
  std::string enter(int host) const {
    return "nsenter --net=/run/netns/" + hosts->on(host).back();
  }

  explicit slurm_cluster(int nodes) {
    if (::geteuid() != 0) skip("needs root (slurmd runs jobs as their user)");
    for (const char* b : {"munged", "slurmctld", "slurmd", "sbatch", "srun", "sinfo"})
      if (run_shell(std::string("command -v ") + b + " >/dev/null") != 0)
        skip(std::string(b) + " is not installed (tools/setup.sh installs slurm-wlm and munge)");
    require_netns();
    hosts = std::make_unique<bed>(nodes);
    const std::string d = dir.path();
    REQUIRE(run_shell("mkdir -p " + d + "/state " + d + "/spool && dd if=/dev/urandom of=" + d +
                      "/munge.key bs=1 count=1024 2>/dev/null && chmod 400 " + d + "/munge.key") == 0);
    munged = std::make_unique<child_process>(
        program{"/usr/sbin/munged"},
        std::vector<std::string>{"-F", "-f", "--socket=" + d + "/munge.sock",
                                 "--key-file=" + d + "/munge.key", "--log-file=" + d + "/munged.log",
                                 "--pid-file=" + d + "/munged.pid", "--seed-file=" + d + "/munged.seed"},
        d, "munged");
    REQUIRE(eventually(milliseconds(10000), [&] { return ::access((d + "/munge.sock").c_str(), F_OK) == 0; }));
    std::string c = "ClusterName=cohorttest\nSlurmctldHost=localhost(" + bed::address(1) + ")\n";
    c += "SlurmctldPort=" + std::to_string(free_port()) + "\n";
    // cred_expire: a requeued job starts again once its old credential expires (120 s else).
    c += "AuthType=auth/munge\nAuthInfo=socket=" + d +
         "/munge.sock,cred_expire=5\nCredType=cred/munge\n";
    c += "SlurmUser=root\nSlurmdUser=root\n";
    c += "StateSaveLocation=" + d + "/state\nSlurmdSpoolDir=" + d + "/spool/%n\n";
    c += "SlurmctldPidFile=" + d + "/slurmctld.pid\nSlurmdPidFile=" + d + "/slurmd-%n.pid\n";
    c += "SlurmctldLogFile=" + d + "/slurmctld.log\nSlurmdLogFile=" + d + "/slurmd-%n.log\n";
    c += "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nMpiDefault=none\n";
    c += "JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n";
    c += "JobCompType=jobcomp/none\nSchedulerType=sched/builtin\nSelectType=select/cons_tres\n";
    c += "SelectTypeParameters=CR_CPU\nReturnToService=2\nSlurmdTimeout=5\nSlurmctldTimeout=5\n";
    c += "InactiveLimit=0\nKillWait=5\nMinJobAge=5\n";
    // A scheduling pass every 2 s (60 s by default): a requeued job starts once its begin
    // time has come, not up to a minute later.
    c += "SchedulerParameters=sched_interval=2\n";
    // Each node on this machine, on a port of its own (slurmd -N picks its line).
    for (int i = 1; i <= nodes; ++i)
      c += "NodeName=node" + std::to_string(i) + " NodeHostname=localhost NodeAddr=" +
           bed::address(i) + " Port=" +
           std::to_string(free_port()) + " CPUs=2 State=UNKNOWN\n";
    // Preemption as a cluster sets it up: a job of `urgent` takes the nodes of a `debug` job,
    // which gets SIGTERM on its tasks, GraceTime to finish, then SIGKILL, and is requeued.
    c += "PreemptType=preempt/partition_prio\nPreemptMode=REQUEUE\n";
    c += "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1 "
         "PreemptMode=REQUEUE GraceTime=15\n";
    c += "PartitionName=urgent Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=2 "
         "PreemptMode=OFF\n";
    conf = dir.write("slurm.conf", c);
    ::setenv("SLURM_CONF", conf.c_str(), 1);
    // Each daemon on its host: `nsenter --net=HOST DAEMON ...`.
    auto on = [&](int host, std::vector<std::string> cmd) {
      std::vector<std::string> args{"--net=/run/netns/" + hosts->on(host).back()};
      args.insert(args.end(), cmd.begin(), cmd.end());
      return std::make_pair(program{"/usr/bin/nsenter"}, args);
    };
    const auto [ctld_ip, ctld_args] = on(1, {"/usr/sbin/slurmctld", "-D", "-c"});
    ctld = std::make_unique<child_process>(ctld_ip, ctld_args, d, "slurmctld");
    for (int i = 1; i <= nodes; ++i) {
      const auto [ip, args] = on(i, {"/usr/sbin/slurmd", "-D", "-N", "node" + std::to_string(i)});
      slurmd.push_back(std::make_unique<child_process>(ip, args, d, "slurmd" + std::to_string(i)));
    }
    std::string out;
    const bool up = eventually(milliseconds(30000), [&] {
      out.clear();
      return sh("sinfo -h -o '%t %D' 2>&1", &out) == 0 &&
             out.find("idle " + std::to_string(nodes)) != std::string::npos;
    });
    REQUIRE_MESSAGE(up, "sinfo: " << out << "\nslurmctld log: " << read_file(d + "/slurmctld.log"));
  }

  // Jobs still there are cancelled and waited for (their slurmstepd live outside the
  // daemons' process groups); then the daemons go with their groups.
  ~slurm_cluster() {
    sh("scancel --quiet --user=root 2>/dev/null");
    eventually(milliseconds(20000), [&] {
      std::string q;
      return sh("squeue -h 2>/dev/null", &q) != 0 || q.empty();
    });
    ::unsetenv("SLURM_CONF");
  }

  // `sbatch --wait` of the recipe with ENV (KEY=VALUE ...); its exit code, the job's output.
  int submit(const std::string& env, std::string* out, const std::string& extra = "") {
    const std::string log = dir.path() + "/job.out";
    const int rc = sh("cd " + source_dir() + " && env " + env + " COHORT_BIN=" + cohort_binary() +
                      " timeout 300 sbatch --wait " + extra + " -o " + log +
                      " tools/slurm/cohort.sbatch >/dev/null 2>&1");
    *out = read_file(log);
    return rc;
  }
};

}  // namespace

TEST_CASE("slurm: sbatch of the recipe on three nodes trains to cohort train's hash, one agent "
          "a node, and leaves no keys behind") {
  slurm_cluster s(3);
  const std::string cfg =
      s.dir.write("job.yaml", small_yaml(s.dir.path(), "bitwise", 12) + "cluster:\n  workers: 3\n");
  const std::string hash = train_summary(s.dir, cfg)["params_sha256"];
  std::string out;
  const std::string summary = s.dir.path() + "/run.json";
  const int rc = s.submit("COHORT_CONFIG=" + cfg + " COHORT_SUMMARY=" + summary, &out);
  REQUIRE_MESSAGE(rc == 0, out);
  const nlohmann::json j = read_json(summary);
  REQUIRE_MESSAGE(j.is_object(), out);
  CHECK(j["params_sha256"] == hash);
  std::set<std::string> names;
  for (const auto& w : j["workers"]) names.insert(w["name"].get<std::string>());
  // Each node's agent named its worker after Slurm's node name.
  CHECK(names == std::set<std::string>{"node1-0", "node2-0", "node3-0"});
  for (const char* a : {"agent-node1", "agent-node2", "agent-node3"})
    CHECK_MESSAGE(out.find(std::string("agent: ") + a + " registered") != std::string::npos, out);
  std::string left;
  // The recipe's folders (cohort-keys-CLUSTER-JOB-...; a launch beside this test has its own).
  run_shell("ls -d /tmp/cohort-keys-cohorttest-* 2>/dev/null", &left);
  CHECK_MESSAGE(left.empty(), left);
}

namespace {

// What a 3,000-step job of three workers under the recipe ended with, FAULT having run once
// all three trained (with min_workers 1 the job may start before the last has joined).
struct faulted_run {
  std::string hash;  ///< cohort train's, fault-free
  std::string out;   ///< the job's output
  std::string said;  ///< what FAULT's command printed
  nlohmann::json summary;
};

faulted_run run_with_fault(slurm_cluster& s, const std::string& elastic,
                           const std::function<std::string()>& fault, int steps = 3000) {
  const std::string cfg = s.dir.write(
      "job.yaml", small_yaml(s.dir.path(), "bitwise", steps) + "cluster:\n  workers: 3\n" + elastic);
  faulted_run r;
  r.hash = train_summary(s.dir, cfg)["params_sha256"];
  const std::string summary = s.dir.path() + "/run.json";
  int rc = -1;
  std::thread job([&] {
    rc = s.submit("COHORT_CONFIG=" + cfg + " COHORT_SUMMARY=" + summary + " COHORT_JOIN_FILE=" +
                      s.dir.path() + "/job.join",
                  &r.out);
  });
  const auto t0 = std::chrono::steady_clock::now();
  const bool running =
      eventually(milliseconds(60000), [&] { return all_training(s.dir.path() + "/job.out"); });
  if (running)
    MESSAGE("sbatch to a progress line of 3 workers: "
            << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s");
  if (running) r.said = fault();
  job.join();
  REQUIRE_MESSAGE(running, r.out);
  REQUIRE_MESSAGE(rc == 0, r.said << r.out);
  r.summary = read_json(summary);
  REQUIRE_MESSAGE(r.summary.is_object(), r.out);
  return r;
}

int departed(const nlohmann::json& summary, const std::string& worker = "") {
  int n = 0;
  for (const auto& e : summary["events"])
    n += e["kind"] == "departed" && (worker.empty() || e["worker"] == worker);
  return n;
}

}  // namespace

TEST_CASE("slurm: a task killed (its agent and workers gone) does not end the job, and a second "
          "job step (cohort-grow) brings the node back: the job ends on the fault-free hash") {
  slurm_cluster s(3);
  const std::string d = s.dir.path();
  // One agent is SIGKILLed: a task dying. Its worker dies with it (PR_SET_PDEATHSIG); the
  // job's step goes on (--kill-on-bad-exit=0). Then tools/slurm/cohort-grow starts an agent
  // on that node again as a second step of the job: its worker joins the running job.
  std::string node;
  const faulted_run r = run_with_fault(
      s, "elastic:\n  min_workers: 1\n  respawn: false\n",
      [&] {
        std::string pids;
        run_shell("pgrep -f '^[^ ]*/cohort agent --join'", &pids);
        const std::string pid = pids.substr(0, pids.find('\n'));
        run_shell("tr '\\0' '\\n' < /proc/" + pid +
                      "/environ | sed -n 's/^SLURMD_NODENAME=//p' | tr -d '\\n'",
                  &node);
        std::string said;
        run_shell("kill -KILL " + pid + " 2>&1", &said);
        // Out of the roster, then back through a second step on the same node.
        if (!eventually(milliseconds(30000), [&] {
              return read_file(d + "/job.out").find(node + "-0 left the roster") != std::string::npos;
            }))
          return said + "\n(no departure of " + node + "-0)";
        std::string job;
        s.sh("squeue -h -o %i | head -1 | tr -d '\\n'", &job);
        std::string grew;
        s.sh("cd " + source_dir() + " && COHORT_JOIN_FILE=" + d + "/job.join COHORT_BIN=" +
                      cohort_binary() + " tools/slurm/cohort-grow " + job + " " + node + " 1 2>&1",
                  &grew);
        return said + grew;
      },
      10000);
  CHECK(r.summary["params_sha256"] == r.hash);
  // The kill happened mid-run: the job went on with one worker less, then it came back.
  CHECK_MESSAGE(r.out.find("exited") != std::string::npos, r.out);
  CHECK_MESSAGE(departed(r.summary) == 1, r.summary["events"].dump());
  // Its worker came back once after it left. (min_workers 1: on a loaded machine training
  // may start before every first worker is in, and then its first entry is a join too.)
  uint64_t left_at = 0;
  for (const auto& e : r.summary["events"])
    if (e["kind"] == "departed" && e["worker"] == node + "-0") left_at = e["generation"].get<uint64_t>();
  int joined = 0;
  for (const auto& e : r.summary["events"])
    joined += e["kind"] == "joined" && e["worker"] == node + "-0" &&
              e["generation"].get<uint64_t>() > left_at;
  CHECK(left_at > 0);
  CHECK_MESSAGE(joined == 1, r.said << "\n" << r.summary["events"].dump());
  CHECK(r.summary["workers"].size() == 3);
  for (const auto& e : r.summary["events"])
    if (e["kind"] == "departed" || e["kind"] == "joined")
      MESSAGE(e["kind"].get<std::string>() << " " << e["worker"].get<std::string>()
                                           << ": recover_ms " << e["recover_ms"].dump());
  std::string left;
  run_shell("ls " + d + "/job.join 2>/dev/null", &left);
  CHECK_MESSAGE(left.empty(), "the join file outlived the job");
}

TEST_CASE("slurm: a node set DOWN mid-run takes its workers out, the rest go on to the "
          "fault-free hash") {
  slurm_cluster s(3);
  const faulted_run r = run_with_fault(s, "elastic:\n  min_workers: 1\n", [&s] {
    std::string said;
    s.sh("scontrol update NodeName=node3 State=DOWN Reason=cohort-test 2>&1", &said);
    return said;
  });
  CHECK(r.summary["params_sha256"] == r.hash);
  CHECK_MESSAGE(departed(r.summary, "node3-0") == 1, r.summary["events"].dump());
}

namespace {

// The state and exit code of job JOB as `scontrol show job` says (e.g. "COMPLETED 0:0").
std::string job_state(const slurm_cluster& s, const std::string& job) {
  std::string out;
  s.sh("scontrol show job " + job + " 2>/dev/null", &out);
  auto field = [&](const std::string& key) {
    const auto at = out.find(key + "=");
    if (at == std::string::npos) return std::string();
    const auto from = at + key.size() + 1;
    return out.substr(from, out.find_first_of(" \n", from) - from);
  };
  return field("JobState") + " " + field("ExitCode") + " " + field("Reason");
}

}  // namespace

TEST_CASE("slurm: a job preempted by a more urgent one stops within its grace time with a "
          "checkpoint, and requeued on fewer nodes resumes from it to the fault-free hash") {
  slurm_cluster s(3);
  const std::string d = s.dir.path();
  const int steps = 8000;
  const std::string body = small_yaml(d + "/job", "bitwise", steps) +
                           "cluster:\n  workers: 3\nelastic:\n  min_workers: 1\n";
  const std::string cfg = s.dir.write("job.yaml", body);
  // The same run (the checkpoint folder is not part of its identity) with its own folder.
  const std::string hash =
      train_summary(s.dir, s.dir.write("ref.yaml", small_yaml(d + "/ref", "bitwise", steps) +
                                                      "cluster:\n  workers: 3\n"))["params_sha256"];
  const std::string log = d + "/job.out", summary = d + "/run.json";
  std::string job;
  REQUIRE(s.sh("cd " + source_dir() + " && env COHORT_CONFIG=" + cfg + " COHORT_SUMMARY=" +
                   summary + " COHORT_WORKERS_PER_NODE=1 COHORT_BIN=" + cohort_binary() +
                   " sbatch --parsable --open-mode=append -o " + log +
                   " tools/slurm/cohort.sbatch",
               &job) == 0);
  job = job.substr(0, job.find_first_of(";\n"));
  REQUIRE_MESSAGE(eventually(milliseconds(60000), [&] { return all_training(log); }), read_file(log));
  // A job of the `urgent` partition wants every node: Slurm preempts ours (SIGTERM to its
  // tasks, GraceTime 15 s, then SIGKILL) and requeues it.
  std::string said;
  REQUIRE_MESSAGE(s.sh("sbatch -p urgent -N 3 --exclusive -o /dev/null --wrap 'sleep 4' 2>&1", &said) == 0,
                  said);
  // The first run's end: its summary says where it stopped.
  nlohmann::json first;
  REQUIRE_MESSAGE(eventually(milliseconds(60000), [&] {
                    first = read_json(summary);
                    return first.is_object() && first.contains("stopped_early");
                  }),
                  job_state(s, job) << "\n" << read_file(log));
  const int64_t end = first["stopped_early"]["end_step"];
  CHECK(end > 0);
  CHECK(end < steps);
  CHECK(first["steps_completed"] == end);
  const double ms = first["stopped_early"]["ms"];
  MESSAGE("preempted: stopped at step " << end << ", " << ms << " ms after "
                                        << first["stopped_early"]["asked_by"] << " asked");
  // Requeued while the urgent job runs: on two nodes when it starts again, two workers.
  std::string state;
  REQUIRE_MESSAGE(eventually(milliseconds(30000), [&] {
                    state = job_state(s, job);
                    return state.rfind("PENDING", 0) == 0;
                  }),
                  state);
  REQUIRE_MESSAGE(s.sh("scontrol update JobId=" + job + " NumNodes=2-2 NumTasks=2 2>&1",
                            &said) == 0,
                  said);
  REQUIRE_MESSAGE(eventually(milliseconds(180000), [&] {
                    state = job_state(s, job);
                    return state.rfind("FAILED", 0) == 0 || state.rfind("COMPLETED", 0) == 0;
                  }),
                  state << "\n" << read_file(log));
  const std::string out = read_file(log);
  CHECK_MESSAGE(state.rfind("COMPLETED 0:0", 0) == 0, state << "\n" << out);
  CHECK_MESSAGE(out.find("resuming from") != std::string::npos, out);
  const nlohmann::json second = read_json(summary);
  REQUIRE_MESSAGE(second.is_object(), out);
  CHECK(second["params_sha256"] == hash);
  CHECK(second["workers"].size() == 2);
  CHECK_FALSE(second.contains("stopped_early"));
}


namespace {

// Seconds from START until PRED holds (polled every 5 ms), or a negative value after LIMIT.
double seconds_until(std::chrono::steady_clock::time_point start, milliseconds limit,
                     const std::function<bool()>& pred) {
  while (std::chrono::steady_clock::now() - start < limit) {
    if (pred()) return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::this_thread::sleep_for(milliseconds(5));
  }
  return -1;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

// The start-up comparison, run only where torchrun is (COHORT_BENCH_DEPS=1 installs
// python3-torch). Each round submits the recipe (3 nodes, a worker each, a progress line per
// step) and then an `srun torchrun` job of the same shape (c10d rendezvous on node1, Gloo,
// one DDP step of the same MLP's shape), and times each from sbatch to its first committed
// step: cohort's first progress line with 3 workers, torchrun's rank 0 writing a file after
// its first optimizer step. Nothing is asserted on the times (docs/slurm.md has them).
TEST_CASE("slurm bench: sbatch to the first committed step of 3 nodes, the recipe against srun "
          "torchrun (c10d)") {
  if (run_shell("command -v torchrun >/dev/null && /usr/bin/python3 -c 'import torch' 2>/dev/null") != 0)
    skip("torchrun is not installed (COHORT_BENCH_DEPS=1 tools/setup.sh installs python3-torch)");
  slurm_cluster s(3);
  const std::string d = s.dir.path();
  std::string body = small_yaml(d, "bitwise", 20) + "cluster:\n  workers: 3\n";
  body.replace(body.find("  eval_every: 0\n"), 16, "  eval_every: 0\n  log_every: 1\n");
  const std::string cfg = s.dir.write("job.yaml", body);
  // One DDP step of an MLP of the same shape (784 -> 32 -> 10, 64 samples over 3 ranks).
  // The process group meets in a store on node1 (whichever rank the rendezvous put there):
  // the emulated hosts share one host name, so torchrun's MASTER_ADDR (rank 0's host name)
  // would point each rank at its own loopback; for the same reason Gloo is given the hosts'
  // interface (GLOO_SOCKET_IFNAME).
  s.dir.write("ddp_step.py",
              "import os, sys, torch, torch.distributed as dist\n"
              "rank, world = int(os.environ['RANK']), int(os.environ['WORLD_SIZE'])\n"
              "host, port = sys.argv[2].rsplit(':', 1)\n"
              "store = dist.TCPStore(host, int(port), world, os.environ['SLURM_NODEID'] == '0')\n"
              "dist.init_process_group('gloo', store=store, rank=rank, world_size=world)\n"
              "torch.manual_seed(1)\n"
              "m = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential("
              "torch.nn.Linear(784, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10)))\n"
              "opt = torch.optim.AdamW(m.parameters(), lr=0.01)\n"
              "x, y = torch.randn(64 // world, 784), torch.randint(0, 10, (64 // world,))\n"
              "torch.nn.functional.cross_entropy(m(x), y).backward()\n"
              "opt.step()\n"
              "if rank == 0: open(sys.argv[1], 'w').write('step 1\\n')\n"
              "dist.barrier()\n");
  // --redirects/--tee: torchrun 1.13 fails on Python 3.11 with its default of 0 (IntFlag no
  // longer iterates a zero member). is_host: the rendezvous store is node1's, not whichever
  // node matches the shared host name first.
  s.dir.write("torchrun.sbatch",
              "#!/bin/bash\n#SBATCH --nodes=3\n#SBATCH --ntasks-per-node=1\n"
              "srun --ntasks-per-node=1 bash -c 'GLOO_SOCKET_IFNAME=eth0 exec torchrun --nnodes=3 --nproc_per_node=1 "
              "--rdzv_backend=c10d --rdzv_id=$SLURM_JOB_ID --rdzv_endpoint=" + bed::address(1) +
                  ":$1 --rdzv_conf=is_host=$((SLURM_NODEID == 0)) --redirects=0:1 --tee=0:1 "
                  "--log_dir=" + d + "/torchrun-logs/$SLURM_JOB_ID-$SLURM_NODEID " + d +
                  "/ddp_step.py $2 " + bed::address(1) + ":$3' -- \"$@\"\n");
  std::vector<double> ours, theirs;
  for (int round = 0; round < 5; ++round) {
    const std::string log = d + "/job.out";
    ::unlink(log.c_str());
    int rc = -1;
    auto t0 = std::chrono::steady_clock::now();
    std::thread job([&] {
      rc = s.sh("cd " + source_dir() + " && env COHORT_CONFIG=" + cfg +
                " COHORT_BIN=" + cohort_binary() + " timeout 120 sbatch --wait -o " + log +
                " tools/slurm/cohort.sbatch >/dev/null 2>&1");
    });
    const double a = seconds_until(t0, milliseconds(60000), [&] { return all_training(log); });
    job.join();
    REQUIRE_MESSAGE(a > 0, read_file(log));
    REQUIRE_MESSAGE(rc == 0, read_file(log));
    ours.push_back(a);

    const std::string marker = d + "/first-step-" + std::to_string(round);
    const std::string tlog = d + "/torchrun-" + std::to_string(round) + ".out";
    t0 = std::chrono::steady_clock::now();
    std::thread tjob([&] {
      rc = s.sh("cd " + d + " && timeout 120 sbatch --wait -o " + tlog + " torchrun.sbatch " +
                std::to_string(free_port()) + " " + marker + " " + std::to_string(free_port()) +
                " >" + tlog + ".sbatch 2>&1");
    });
    const double b = seconds_until(t0, milliseconds(90000),
                                   [&] { return ::access(marker.c_str(), F_OK) == 0; });
    tjob.join();
    std::string logs;
    run_shell("cat " + tlog + ".sbatch " + tlog + "; find " + d + "/torchrun-logs -type f -exec tail -20 {} + 2>/dev/null", &logs);
    if (b < 0) {
      std::string q;
      s.sh("squeue -a -o '%i %T %r %N'; ps -eo pid,etime,args | grep -E 'torchrun|ddp_step' | grep -v grep", &q);
      logs += q;
    }
    REQUIRE_MESSAGE(b > 0, logs);
    REQUIRE_MESSAGE(rc == 0, logs);
    theirs.push_back(b);
    MESSAGE("round " << round << ": cohort " << a << " s, torchrun " << b << " s");
  }
  MESSAGE("sbatch to the first committed step of 3 nodes, median of 5: cohort "
          << median(ours) << " s, srun torchrun (c10d) " << median(theirs) << " s, ratio "
          << median(theirs) / median(ours));
}
