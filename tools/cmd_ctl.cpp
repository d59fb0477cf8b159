// `cohort ctl --coordinator EP status [--json]`, `top`, `drain NAME`, `scale N`, `inject SPEC` and
// `stop`: the admin client. Talks to
// the coordinator through a blocking DEALER (net::sync_client); no actor system needed.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "runtime/core/error.hpp"
#include "runtime/net/zmq_bridge.hpp"
#include "tools/commands.hpp"

namespace cohort::cli {
namespace {

const char* state_name(net::member_state s) {
  switch (s) {
    case net::member_state::joining:
      return "joining";
    case net::member_state::alive:
      return "alive";
    case net::member_state::leaving:
      return "leaving";
    case net::member_state::dead:
      return "dead";
  }
  return "unknown";
}

nlohmann::json to_json(const net::status_reply& s) {
  nlohmann::json workers = nlohmann::json::array();
  for (const auto& w : s.workers) {
    const auto& m = w.member;
    workers.push_back({{"name", m.name},
                       {"rank", m.rank},
                       {"seat", m.at.d < 0 ? nlohmann::json(nullptr)
                                           : nlohmann::json::array({m.at.d, m.at.p, m.at.t})},
                       {"state", state_name(m.state)},
                       {"heartbeat_age_ms", w.heartbeat_age_ms},
                       {"silent_ms", w.silent_ms},
                       {"id", m.member_id},
                       {"pid", m.pid}});
  }
  nlohmann::json dropped = nlohmann::json::object();
  for (const auto& c : s.dropped) dropped[c.name] = c.value;
  nlohmann::json j = {
      {"generation", s.generation}, {"step", s.step}, {"workers", workers}, {"dropped", dropped}};
  if (!s.job.empty()) {
    const nlohmann::json job = nlohmann::json::parse(s.job, nullptr, false);
    if (job.is_object()) j["job"] = job;  // a coordinator's garbage is left out, not printed
  }
  if (!s.coordinator.empty()) {  // ha: {"leader", "term", "pid", "standbys"}
    const nlohmann::json c = nlohmann::json::parse(s.coordinator, nullptr, false);
    if (c.is_object()) j["coordinator"] = c;
  }
  return j;
}

// The job's line: step rate, the step's split and the last events (run_report::live).
void print_job_figures(const nlohmann::json& j);

void print_job(const net::status_reply& s) {
  if (s.job.empty()) return;
  const nlohmann::json j = nlohmann::json::parse(s.job, nullptr, false);
  if (!j.is_object()) return;
  try {
    print_job_figures(j);
  } catch (const nlohmann::json::exception&) {
    // A field of another type (a NaN loss arrives as null): the rest of status still shows.
    std::printf("\n(the job's figures could not be read)\n");
  }
}

void print_job_figures(const nlohmann::json& j) {
  if (j.contains("steps_per_s"))
    std::printf("rate: %.2f steps/s, %.0f samples/s (last 20 steps)", j.value("steps_per_s", 0.0),
                j.value("samples_per_s", 0.0));
  if (j.contains("loss")) std::printf(" | loss %.4f", j.value("loss", 0.0));
  // Committed steps' time over the time since the first step opened (run_report::ettr).
  if (j.contains("ettr")) std::printf(" | ETTR %.3f", j.value("ettr", 0.0));
  if (j.contains("steps_per_s") || j.contains("loss") || j.contains("ettr")) std::printf("\n");
  if (j.contains("loading") && j["loading"].is_array() && !j["loading"].empty()) {
    std::string names;
    for (const auto& n : j["loading"])
      if (n.is_string()) names += (names.empty() ? "" : ", ") + n.get<std::string>();
    std::printf("loading the job: %s (each enters at the first step boundary once ready)\n",
                names.c_str());
  }
  // train.balance: each worker's micro-batches a step and its measured rate.
  if (j.contains("balance") && j["balance"].is_object() && j["balance"]["shares"].is_object() &&
      !j["balance"]["shares"].empty()) {
    const auto& b = j["balance"];
    std::string line;
    for (const auto& [name, n] : b["shares"].items()) {
      line += (line.empty() ? "" : ", ") + name + " " + std::to_string(n.get<int>());
      if (b["samples_per_s"].contains(name))
        line += " (" + std::to_string(b["samples_per_s"][name].get<long>()) + "/s)";
    }
    std::printf("balance %s: micro-batches a step %s; %d re-plan(s)\n",
                b.value("mode", std::string()).c_str(), line.c_str(), b.value("replans", 0));
  }
  if (j.contains("split_ms") && j["split_ms"].is_object()) {
    const auto& x = j["split_ms"];
    std::printf(
        "a worker's step: compute %.1f ms, comm wait %.1f ms, idle %.1f ms (mean of the "
        "last %d votes)\n",
        x.value("compute", 0.0), x.value("comm_wait", 0.0), x.value("idle", 0.0),
        x.value("votes", 0));
  }
  if (!j.contains("events") || !j["events"].is_array()) return;
  for (const auto& e : j["events"]) {
    if (!e.is_object()) continue;
    std::printf("event: %s %s at step %lld", e.value("kind", std::string("?")).c_str(),
                e.value("worker", std::string()).c_str(), e.value("step", 0LL));
    if (e.contains("detect_ms")) std::printf(", detected in %.0f ms", e.value("detect_ms", 0.0));
    if (e.contains("recover_ms")) std::printf(", recovered in %.0f ms", e.value("recover_ms", 0.0));
    std::printf("\n");
  }
}

void print_table(const net::status_reply& s) {
  int alive = 0;
  for (const auto& w : s.workers) alive += w.member.state == net::member_state::alive;
  std::printf("generation %llu, step %lld, %zu worker(s) known, %d alive\n",
              static_cast<unsigned long long>(s.generation), static_cast<long long>(s.step),
              s.workers.size(), alive);
  if (!s.workers.empty()) {
    std::printf("%-16s %5s %-10s %-8s %10s %8s %8s\n", "NAME", "RANK", "SEAT d,p,t", "STATE",
                "HB AGE ms", "ID", "PID");
  }
  for (const auto& w : s.workers) {
    const auto& m = w.member;
    // The seat (dp, pp, tp) the worker runs; "-" before the job has seated it.
    const std::string coords = m.at.d < 0
                                   ? "-"
                                   : "(" + std::to_string(m.at.d) + "," + std::to_string(m.at.p) +
                                         "," + std::to_string(m.at.t) + ")";
    std::printf("%-16s %5d %-10s %-8s %10lld %8llu %8lld\n", m.name.c_str(), m.rank, coords.c_str(),
                state_name(m.state), static_cast<long long>(w.heartbeat_age_ms),
                static_cast<unsigned long long>(m.member_id), static_cast<long long>(m.pid));
  }
  for (const auto& c : s.dropped) {
    std::printf("dropped frames (%s): %llu\n", c.name.c_str(),
                static_cast<unsigned long long>(c.value));
  }
  const nlohmann::json co = nlohmann::json::parse(s.coordinator, nullptr, false);
  if (co.is_object()) {
    std::string standbys;
    if (co.contains("standbys") && co["standbys"].is_array())
      for (const auto& e : co["standbys"])
        if (e.is_string()) standbys += (standbys.empty() ? "" : ", ") + e.get<std::string>();
    std::printf("coordinator: leader %s, term %lld, pid %lld; standbys: %s\n",
                co.value("leader", std::string("?")).c_str(), co.value("term", 0LL),
                co["pid"].is_number() ? co["pid"].get<long long>() : -1LL,
                standbys.empty() ? "none" : standbys.c_str());
  }
  print_job(s);
}

}  // namespace

void add_ctl(CLI::App& app, int* rc) {
  struct options {
    std::string coordinator;
    int timeout_ms = 5000;
    bool json = false;
    std::string keys;
    // The client, with the admin key when --keys names one.
    std::unique_ptr<net::sync_client> client() const {
      std::unique_ptr<net::client_keys> k;
      if (!keys.empty())
        k = std::make_unique<net::client_keys>(net::load_client_keys(keys, net::key_role::admin));
      return std::make_unique<net::sync_client>(coordinator, size_t{64} << 20,
                                                net::make_identity("client"), k.get());
    }
  };
  auto opt = std::make_shared<options>();
  CLI::App* cmd = app.add_subcommand("ctl", "Administer a running coordinator");
  cmd->add_option("--coordinator", opt->coordinator,
                  "Coordinator endpoint, as printed by `cohort coordinator` or `cohort launch`")
      ->type_name("EP")
      ->required();
  cmd->add_option("--timeout-ms", opt->timeout_ms, "How long to wait for an answer")
      ->check(CLI::Range(1, 3600 * 1000))
      ->capture_default_str();
  add_keys_option(*cmd, &opt->keys,
                  "ctl speaks CURVE with admin.key (needed when the coordinator was started "
                  "with keys; `cohort launch` prints the folder of the keys it made)");
  cmd->require_subcommand(1);

  CLI::App* status = cmd->add_subcommand(
      "status",
      "Show generation, step and every worker (name, rank, seat (dp,pp,tp), state, heartbeat age)");
  status->add_flag("--json", opt->json,
                   "Print one JSON object: {\"generation\", \"step\", \"workers\": [{\"name\", "
                   "\"rank\", \"seat\": [d,p,t] or null, \"state\", ...}], \"dropped\": {...}}");
  status->callback([opt, rc] {
    const auto client = opt->client();
    const net::message reply = client->request(net::status_request{1}, net::msg_type::status_reply,
                                               std::chrono::milliseconds(opt->timeout_ms));
    const auto& s = std::get<net::status_reply>(reply);
    if (opt->json) {
      std::cout << to_json(s).dump() << std::endl;
    } else {
      print_table(s);
    }
    *rc = exit_ok;
  });

  // top: status again and again, in place, until Ctrl-C or the coordinator is gone.
  auto top_interval = std::make_shared<double>(1.0);
  auto top_count = std::make_shared<int>(0);
  CLI::App* top = cmd->add_subcommand(
      "top", "Show `status` refreshed in place (step rate, the step's split, recent events)");
  top->add_option("--interval", *top_interval, "Seconds between refreshes")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  top->add_option("--count", *top_count, "Stop after N refreshes (0: until Ctrl-C)")
      ->check(CLI::NonNegativeNumber);
  top->callback([opt, rc, top_interval, top_count] {
    const auto client = opt->client();
    for (int i = 0; *top_count == 0 || i < *top_count; ++i) {
      if (i > 0) std::this_thread::sleep_for(std::chrono::duration<double>(*top_interval));
      net::message reply;
      try {
        reply = client->request(net::status_request{static_cast<uint64_t>(i + 1)},
                                net::msg_type::status_reply,
                                std::chrono::milliseconds(opt->timeout_ms));
      } catch (const cohort::error& e) {
        if (i == 0) throw;  // nothing to show at all: the usual error and exit code
        std::printf("coordinator gone: %s\n", e.what());  // the run ended: a normal end
        break;
      }
      if (isatty(STDOUT_FILENO)) std::printf("\x1b[H\x1b[2J");  // clear, cursor home
      print_table(std::get<net::status_reply>(reply));
      std::fflush(stdout);
    }
    *rc = exit_ok;
  });

  // drain / scale / inject: one admin_request each; a refusal is the user's to fix (exit 2).
  auto admin = [opt, rc](const std::string& command, const std::string& argument) {
    const auto client = opt->client();
    const net::message reply =
        client->request(net::admin_request{1, command, argument}, net::msg_type::admin_reply,
                        std::chrono::milliseconds(opt->timeout_ms));
    const auto& r = std::get<net::admin_reply>(reply);
    if (!r.ok) {
      std::fprintf(stderr, "error: %s\n", r.text.c_str());
      *rc = exit_usage;
      return;
    }
    std::printf("%s\n", r.text.c_str());
    *rc = exit_ok;
  };
  auto arg = std::make_shared<std::string>();
  CLI::App* drain = cmd->add_subcommand(
      "drain",
      "Make worker NAME leave at the next step boundary (no step is aborted); it exits 0 and "
      "the launcher does not restart it. Same as SIGTERM to the worker");
  drain->add_option("name", *arg, "Worker name, as `status` lists it")->required();
  drain->callback([admin, arg] { admin("drain", *arg); });
  CLI::App* scale = cmd->add_subcommand(
      "scale",
      "Reach N workers: the launcher starts more local workers (they join at the next step "
      "boundary and take their state from a live peer) or the highest ranks are drained. N "
      "must lie within elastic.min_workers..elastic.max_workers");
  scale->add_option("n", *arg, "Worker count to reach")->required();
  scale->callback([admin, arg] { admin("scale", *arg); });
  CLI::App* inject = cmd->add_subcommand(
      "inject", "Add a fault to the running job, e.g. 'kill rank=1 at step=300' (docs/faults.md)");
  inject->add_option("spec", *arg, "Fault spec")->required();
  inject->callback([admin, arg] { admin("inject", *arg); });

  CLI::App* stop =
      cmd->add_subcommand("stop",
                          "Stop the coordinator and every worker (workers exit 0); waits for the "
                          "coordinator's acknowledgement");
  auto with_checkpoint = std::make_shared<bool>(false);
  stop->add_flag("--checkpoint", *with_checkpoint,
                 "Stop the training run at the next step boundary it can reach with a complete "
                 "checkpoint of that step instead (a preemption: the coordinator exits 3, "
                 "`--resume` goes on from it)");
  stop->callback([opt, rc, admin, with_checkpoint] {
    if (*with_checkpoint) return admin("preempt", "");
    opt->client()->request(net::stop{"cohort ctl stop"}, net::msg_type::stop,
                           std::chrono::milliseconds(opt->timeout_ms));
    std::printf("coordinator at %s is stopping the cluster\n", opt->coordinator.c_str());
    *rc = exit_ok;
  });
}

}  // namespace cohort::cli
