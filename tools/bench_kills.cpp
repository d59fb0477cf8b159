// `cohort bench control --kills N`: real processes, a worker SIGKILLed under `cohort agent`
// and joined directly, each timed until the coordinator's roster no longer lists it alive.
// Declared in tools/bench_agents.hpp; the coordinator child is tools/bench_coordinator.hpp.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/core/error.hpp"
#include "runtime/core/process.hpp"
#include "runtime/net/curve.hpp"
#include "runtime/net/zmq_bridge.hpp"
#include "tools/bench_coordinator.hpp"
#include "tools/bench_util.hpp"

namespace cohort::cli {

using std::chrono::milliseconds;
using clock_type = std::chrono::steady_clock;

namespace {

// Live members by name -> pid, from one status answer; nullopt when none came.
std::optional<std::map<std::string, int64_t>> alive_members(net::sync_client& c, uint64_t id) {
  try {
    const net::message m =
        c.request(net::status_request{id}, net::msg_type::status_reply, milliseconds(2000));
    std::map<std::string, int64_t> out;
    for (const auto& w : std::get<net::status_reply>(m).workers)
      if (w.member.state == net::member_state::alive) out[w.member.name] = w.member.pid;
    return out;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// One setup: K workers (under an agent, or direct), N kills. Returns the detection times (ns).
nlohmann::json kills_run(const agents_options& o, int kills, bool agent, const std::string& dir) {
  agents_options co = o;
  co.agents = 1;
  bench_coordinator coord(co, dir);
  const int k = std::max(1, o.per_host);
  const std::string keys = dir + "/keys";
  const int devnull = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  std::vector<pid_t> children;
  auto start_direct = [&](const std::string& name) {
    std::vector<std::string> args{"worker", "--join", coord.endpoint(), "--name", name};
    if (o.secure) args.insert(args.end(), {"--keys", keys});
    children.push_back(proc::spawn_self(args, devnull, devnull));
  };
  if (agent) {
    std::vector<std::string> args{"agent", "--join", coord.endpoint(), "--workers",
                                  std::to_string(k), "--host", "bench"};
    if (o.secure)
      args.insert(args.end(), {"--keys", keys});
    else
      args.push_back("--insecure");
    children.push_back(proc::spawn_self(args, devnull, devnull));
  } else {
    for (int i = 0; i < k; ++i) start_direct("direct-" + std::to_string(i));
  }
  std::unique_ptr<net::client_keys> admin;
  if (o.secure)
    admin = std::make_unique<net::client_keys>(net::load_client_keys(keys, net::key_role::admin));
  net::sync_client status(coord.endpoint(), 64u << 20, net::make_identity("bench-kills"),
                          admin.get());
  uint64_t id = 1;
  auto wait_all = [&](double seconds) {
    const auto end = clock_type::now() + std::chrono::duration_cast<clock_type::duration>(
                                             std::chrono::duration<double>(seconds));
    while (clock_type::now() < end) {
      const auto a = alive_members(status, id++);
      if (a && static_cast<int>(a->size()) == k) return *a;
      std::this_thread::sleep_for(milliseconds(20));
    }
    return std::map<std::string, int64_t>{};
  };
  std::vector<uint64_t> seen_ns;
  int missed = 0;
  for (int i = 0; i < kills; ++i) {
    auto alive = wait_all(30);
    if (alive.empty()) {
      ++missed;
      break;
    }
    // The victims go round the workers.
    auto it = alive.begin();
    std::advance(it, i % static_cast<int>(alive.size()));
    const std::string victim = it->first;
    const pid_t pid = static_cast<pid_t>(it->second);
    const auto t0 = clock_type::now();
    ::kill(pid, SIGKILL);
    bool gone = false;
    while (clock_type::now() - t0 < std::chrono::seconds(10)) {
      const auto a = alive_members(status, id++);
      if (a && a->count(victim) == 0) {
        gone = true;
        break;
      }
    }
    if (gone)
      seen_ns.push_back(static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(clock_type::now() - t0).count()));
    else
      ++missed;
    if (!agent) {
      ::waitpid(pid, nullptr, 0);
      children.erase(std::remove(children.begin(), children.end(), pid), children.end());
      start_direct(victim);
    }
  }
  for (pid_t c : children) ::kill(c, SIGKILL);
  for (pid_t c : children) ::waitpid(c, nullptr, 0);
  if (devnull >= 0) ::close(devnull);
  const summary sm = summarize(seen_ns);
  return {{"path", agent ? "agent" : "direct"},
          {"kills", seen_ns.size()},
          {"missed", missed},
          {"seen_ms_p50", sm.p50_us / 1e3},
          {"seen_ms_p99", sm.p99_us / 1e3},
          {"seen_ms_max", seen_ns.empty() ? 0.0
                                          : static_cast<double>(*std::max_element(
                                                seen_ns.begin(), seen_ns.end())) / 1e6}};
}

}  // namespace

nlohmann::json run_kills_bench(const agents_options& o, int kills) {
  if (kills < 1) throw usage_error("--kills: at least 1");
  const scratch_dir scratch("bench-kills");
  if (o.secure) net::write_job_keys(scratch.path() + "/keys");
  nlohmann::json r{{"bench", "control kills"},
                   {"kills", kills},
                   {"per_host", std::max(1, o.per_host)},
                   {"heartbeat_ms", o.heartbeat_ms},
                   {"timeout_ms", o.timeout_ms},
                   {"security", o.secure ? "curve" : "none"}};
  r["runs"] = {kills_run(o, kills, true, scratch.path()), kills_run(o, kills, false, scratch.path())};
  return r;
}

void print_kills_table(const nlohmann::json& r) {
  std::printf(
      "cohort bench control --kills %d --per-host %d: SIGKILL of a worker until the coordinator's "
      "roster no longer lists it (heartbeat %d ms, timeout %d ms, security %s)\n",
      r["kills"].get<int>(), r["per_host"].get<int>(), r["heartbeat_ms"].get<int>(),
      r["timeout_ms"].get<int>(), r["security"].get<std::string>().c_str());
  std::printf("%-8s %6s %7s %10s %10s %10s\n", "path", "kills", "missed", "p50 ms", "p99 ms",
              "max ms");
  for (const auto& x : r["runs"])
    std::printf("%-8s %6d %7d %10.1f %10.1f %10.1f\n", x["path"].get<std::string>().c_str(),
                x["kills"].get<int>(), x["missed"].get<int>(), x["seen_ms_p50"].get<double>(),
                x["seen_ms_p99"].get<double>(), x["seen_ms_max"].get<double>());
}


}  // namespace cohort::cli
