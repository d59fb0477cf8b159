// Simulated agents against a real coordinator. One thread drives every agent's socket
// (sends heartbeats as they fall due, spread evenly over the period, and reads what comes
// back); a second thread asks the coordinator for its status as an admin would, which is
// how "all alive" is seen (a member turns alive on its first heartbeat, which changes no
// generation and sends no roster). The coordinator's CPU and RSS come from /proc.
#include "tools/bench_agents.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "runtime/core/process.hpp"
#include "actors/worker.hpp"
#include "runtime/core/config.hpp"
#include "runtime/core/error.hpp"
#include "runtime/net/codec.hpp"
#include "runtime/net/curve.hpp"
#include "runtime/net/relay.hpp"
#include "runtime/net/zmq_bridge.hpp"
#include "tools/bench_agent_pool.hpp"
#include "tools/bench_coordinator.hpp"
#include "tools/bench_util.hpp"

namespace cohort::cli {
namespace {

using agents_bench::agent_pool;
using agents_bench::traffic;

using std::chrono::milliseconds;
using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// CPU seconds (user + system) and resident bytes of PID, from /proc.
struct proc_usage {
  double cpu_s = 0;
  double rss_mb = 0;
};
proc_usage usage_of(pid_t pid) {
  proc_usage u;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (std::getline(stat, line)) {
    // Fields after the command name (which may hold spaces) start after the last ')'.
    std::istringstream rest(line.substr(line.rfind(')') + 2));
    std::vector<std::string> f;
    std::string x;
    while (rest >> x) f.push_back(x);
    // utime and stime are fields 14 and 15 of stat, 12 and 13 after the name and state.
    if (f.size() > 12)
      u.cpu_s = (std::stod(f[11]) + std::stod(f[12])) / static_cast<double>(sysconf(_SC_CLK_TCK));
  }
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  while (std::getline(status, line))
    if (line.rfind("VmRSS:", 0) == 0) u.rss_mb = std::stod(line.substr(6)) / 1024.0;
  return u;
}


// What the status thread last saw.
struct status_view {
  uint64_t generation = 0;
  int alive = 0;
  int dead = 0;  ///< departed members still listed
};

// Asks for the coordinator's status every PERIOD until stopped; keeps the newest answer.
class status_poller {
 public:
  status_poller(const std::string& endpoint, const net::client_keys* keys, milliseconds period)
      : client_(endpoint, 64u << 20, net::make_identity("bench-status"), keys),
        thread_([this, period] { run(period); }) {}
  ~status_poller() {
    stop_ = true;
    thread_.join();
  }
  status_poller(const status_poller&) = delete;
  status_poller& operator=(const status_poller&) = delete;

  status_view view() const {
    std::lock_guard<std::mutex> lock(mu_);
    return view_;
  }
  uint64_t answers() const { return answers_.load(); }
  /// While paused it asks nothing (the steady state measures the coordinator's own cost).
  void pause(bool p) { paused_ = p; }

 private:
  void run(milliseconds period) {
    uint64_t id = 1;
    while (!stop_) {
      const auto next = clock_type::now() + period;
      if (paused_) {
        std::this_thread::sleep_until(next);
        continue;
      }
      try {
        const net::message m = client_.request(net::status_request{id++},
                                               net::msg_type::status_reply, milliseconds(5000));
        const auto& st = std::get<net::status_reply>(m);
        status_view v;
        v.generation = st.generation;
        for (const auto& w : st.workers) {
          if (w.member.state == net::member_state::alive) ++v.alive;
          if (w.member.state == net::member_state::dead) ++v.dead;
        }
        std::lock_guard<std::mutex> lock(mu_);
        view_ = std::move(v);
        answers_.fetch_add(1);
      } catch (const std::exception&) {
        // A coordinator too busy to answer within 5 s: try again; the view stays old.
      }
      std::this_thread::sleep_until(next);
    }
  }

  net::sync_client client_;
  mutable std::mutex mu_;
  status_view view_;
  std::atomic<uint64_t> answers_{0};
  std::atomic<bool> stop_{false};
  std::atomic<bool> paused_{false};
  std::thread thread_;
};

}  // namespace

nlohmann::json run_agents_bench(const agents_options& o) {
  if (o.agents < 1) throw usage_error("--agents: at least 1");
  const scratch_dir scratch("bench-agents");
  std::unique_ptr<net::client_keys> worker_keys, admin_keys;
  if (o.secure) {
    net::write_job_keys(scratch.path() + "/keys");
    // Host agents hold the launcher key; workers on their own, the worker key.
    worker_keys = std::make_unique<net::client_keys>(net::load_client_keys(
        scratch.path() + "/keys", o.per_host > 0 ? net::key_role::launcher : net::key_role::worker));
    admin_keys = std::make_unique<net::client_keys>(
        net::load_client_keys(scratch.path() + "/keys", net::key_role::admin));
  }
  bench_coordinator coord(o, scratch.path());
  agent_pool pool(o, coord.endpoint(), worker_keys.get());
  status_poller status(coord.endpoint(), admin_keys.get(), milliseconds(100));
  nlohmann::json r{
      {"bench", "control agents"},
      {"agents", o.agents},
      {"per_host", o.per_host},
      {"host_beats", o.per_host > 0 ? (o.aligned ? "aligned" : "spread") : "-"},
      {"skew_ms", o.skew_ms},
      {"workers", workers(o)},
      {"heartbeat_ms", o.heartbeat_ms},
      {"timeout_ms", o.timeout_ms},
      {"ack_every",
       o.ack_every > 0 ? static_cast<uint64_t>(o.ack_every) : actors::max_beats_per_ack},
      {"join_window_ms",
       o.join_window_ms >= 0 ? o.join_window_ms : config{}.fault_tolerance.join_window_ms},
      {"security", o.secure ? "curve" : "none"}};

  // 1. Forming: every agent registers at once; formed when the coordinator lists them all
  // alive.
  const uint64_t gen0 = status.view().generation;
  const auto t0 = clock_type::now();
  pool.register_all();
  const bool formed =
      pool.run_until(o.form_limit_s, [&] { return status.view().alive == workers(o); });
  const status_view at_form = status.view();
  const traffic form = pool.counts();
  r["form"] = {{"formed", formed},
               {"seconds", formed ? seconds_since(t0) : -1.0},
               {"alive", at_form.alive},
               {"generations", at_form.generation - gen0},
               // What the agents were told, when the coordinator is too busy to answer status.
               {"agent_generation_max", pool.max_generation()},
               {"status_answers", status.answers()},
               {"roster_updates", form.roster_frames},
               {"roster_bytes", form.roster_bytes},
               {"forced_rejoins", form.rejoins},
               {"rejects", form.rejects},
               {"send_failures", form.send_failures},
               {"dead_listed", at_form.dead}};
  if (!formed) return r;

  // 2. Steady state: nothing changes; the coordinator's CPU per heartbeat, its RSS, and any
  // agent declared dead although it kept beating.
  pool.run_until(1.0, [] { return false; });  // let the formation's last messages settle
  pool.reset_counts();
  const uint64_t gen_steady = status.view().generation;
  status.pause(true);
  const proc_usage u0 = usage_of(coord.pid());
  const auto s0 = clock_type::now();
  pool.run_until(o.steady_s, [] { return false; });
  const double steady_s = seconds_since(s0);
  const proc_usage u1 = usage_of(coord.pid());
  const traffic steady = pool.counts();
  status.pause(false);
  pool.run_until(0.3, [] { return false; });  // one fresh status answer
  const status_view at_steady = status.view();
  r["steady"] = {
      {"seconds", steady_s},
      {"heartbeats", steady.heartbeats},
      {"heartbeats_per_s", static_cast<double>(steady.heartbeats) / steady_s},
      {"relayed_beats_per_s", static_cast<double>(steady.relayed_beats) / steady_s},
      {"send_failures", steady.send_failures},
      {"coordinator_cpu_share", (u1.cpu_s - u0.cpu_s) / steady_s},
      {"coordinator_cpu_ms_per_1000_heartbeats",
       steady.heartbeats > 0 ? 1e6 * (u1.cpu_s - u0.cpu_s) / static_cast<double>(steady.heartbeats)
                             : 0.0},
      {"coordinator_rss_mb", u1.rss_mb},
      // An agent that kept beating but was declared dead learns it from a heartbeat_ack
      // that says rejoin_required.
      {"false_positives", steady.rejoins},
      {"alive_at_end", at_steady.alive},
      {"generations", at_steady.generation - gen_steady}};

  // 3. A few agents stop at once: when each is seen gone by the survivors, how many
  // generations and roster bytes the change costs.
  const int k = std::max(1, static_cast<int>(o.agents * o.stop_percent / 100.0));
  pool.reset_counts();
  const uint64_t gen_stop = status.view().generation;
  const std::vector<uint64_t> ids = pool.stop_some(k);
  pool.watch(ids);
  const auto k0 = clock_type::now();
  const double limit = 10.0 * o.timeout_ms / 1000.0 + 5.0;
  const bool seen = pool.run_until(limit, [&] {
    return pool.seen_gone().size() == ids.size() && pool.live_generations().size() == 1 &&
           status.view().alive == workers(o) - static_cast<int>(ids.size());
  });
  // The last roster of the change may still be on its way to some survivors.
  pool.run_until(2.0 * o.heartbeat_ms / 1000.0, [] { return false; });
  std::vector<uint64_t> seen_ns;
  for (const auto& [id, t] : pool.seen_gone())
    seen_ns.push_back(static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(t - k0).count()));
  const summary seen_at = summarize(seen_ns);
  const traffic stop = pool.counts();
  r["stop"] = {{"stopped", k},
               {"workers_stopped", ids.size()},
               {"settled", seen},
               {"seen_ms_p50", seen_at.p50_us / 1e3},
               {"seen_ms_p99", seen_at.p99_us / 1e3},
               {"seen", seen_ns.size()},
               {"generations", status.view().generation - gen_stop},
               {"survivor_generations", pool.live_generations().size()},
               {"roster_updates", stop.roster_frames},
               {"roster_bytes", stop.roster_bytes},
               {"false_positives", stop.rejoins}};
  r["status_answers"] = status.answers();
  return r;
}

void print_agents_table(const nlohmann::json& r) {
  if (r["per_host"].get<int>() > 0)
    std::printf("cohort bench control --agents %d --per-host %d (%d workers behind host agents, "
                "host beats %s, skew %.1f ms): heartbeat %d ms, timeout %d ms, security %s\n",
                r["agents"].get<int>(), r["per_host"].get<int>(), r["workers"].get<int>(),
                r["host_beats"].get<std::string>().c_str(), r["skew_ms"].get<double>(),
                r["heartbeat_ms"].get<int>(), r["timeout_ms"].get<int>(),
                r["security"].get<std::string>().c_str());
  else
    std::printf("cohort bench control --agents %d: heartbeat %d ms, timeout %d ms, security %s\n",
                r["agents"].get<int>(), r["heartbeat_ms"].get<int>(), r["timeout_ms"].get<int>(),
                r["security"].get<std::string>().c_str());
  const auto& f = r["form"];
  if (!f["formed"].get<bool>()) {
    std::printf(
        "form:   NOT formed: %d alive at the last of %llu status answers, agents told of "
        "generation %llu, %llu roster updates (%.1f MB), %llu forced rejoins\n",
        f["alive"].get<int>(), f["status_answers"].get<unsigned long long>(),
        f["agent_generation_max"].get<unsigned long long>(),
        f["roster_updates"].get<unsigned long long>(), f["roster_bytes"].get<double>() / 1e6,
        f["forced_rejoins"].get<unsigned long long>());
    return;
  }
  std::printf(
      "form:   all alive in %.2f s, %llu generations, %llu roster updates (%.1f MB), %llu forced "
      "rejoins, %d dead listed\n",
      f["seconds"].get<double>(), f["generations"].get<unsigned long long>(),
      f["roster_updates"].get<unsigned long long>(), f["roster_bytes"].get<double>() / 1e6,
      f["forced_rejoins"].get<unsigned long long>(), f["dead_listed"].get<int>());
  const auto& s = r["steady"];
  std::printf(
      "steady: %.0f heartbeats/s (%.0f workers' beats in host beats), coordinator %.1f%% of a "
      "core (%.1f ms per 1000 heartbeat frames), RSS %.1f MB, %llu false positives, %llu "
      "generations in %.1f s\n",
      s["heartbeats_per_s"].get<double>(), s["relayed_beats_per_s"].get<double>(),
      100.0 * s["coordinator_cpu_share"].get<double>(),
      s["coordinator_cpu_ms_per_1000_heartbeats"].get<double>(),
      s["coordinator_rss_mb"].get<double>(), s["false_positives"].get<unsigned long long>(),
      s["generations"].get<unsigned long long>(), s["seconds"].get<double>());
  const auto& k = r["stop"];
  std::printf(
      "stop:   %d stopped (%zu workers), seen gone p50 %.0f ms p99 %.0f ms (%zu of them), %s, %llu "
      "generations, %llu roster updates (%.1f MB), %llu false positives\n",
      k["stopped"].get<int>(), k["workers_stopped"].get<size_t>(), k["seen_ms_p50"].get<double>(),
      k["seen_ms_p99"].get<double>(),
      k["seen"].get<size_t>(), k["settled"].get<bool>() ? "settled" : "NOT settled",
      k["generations"].get<unsigned long long>(), k["roster_updates"].get<unsigned long long>(),
      k["roster_bytes"].get<double>() / 1e6, k["false_positives"].get<unsigned long long>());
}

}  // namespace cohort::cli
