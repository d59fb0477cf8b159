// `cohort ctl --coordinator EP status [--json]`, `drain NAME`, `scale N`, `inject SPEC` and
// `stop`: the admin client. Talks to
// the coordinator through a blocking DEALER (net::sync_client); no actor system needed.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

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
  return {
      {"generation", s.generation}, {"step", s.step}, {"workers", workers}, {"dropped", dropped}};
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
  stop->callback([opt, rc] {
    opt->client()->request(net::stop{"cohort ctl stop"}, net::msg_type::stop,
                           std::chrono::milliseconds(opt->timeout_ms));
    std::printf("coordinator at %s is stopping the cluster\n", opt->coordinator.c_str());
    *rc = exit_ok;
  });
}

}  // namespace cohort::cli
