// `cohort coordinator` with standbys: standing by, taking over, coordinator faults, failovers.
#include "tools/coordinator_ha.hpp"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>

#include "runtime/core/error.hpp"
#include "runtime/core/process.hpp"

namespace cohort::cli {

namespace {

// A leader deposed (its lease ran out or was revoked) must not say another word: a newer
// leader's workers would ignore it (fencing), but nothing it does can help. launch starts
// it again as a standby.
[[noreturn]] void deposed(const char* why) {
  std::fprintf(stderr, "coordinator: deposed: %s; exiting %d (a standby leads now)\n", why,
               ha::exit_deposed);
  std::fflush(stderr);
  std::_Exit(ha::exit_deposed);
}

}  // namespace

std::unique_ptr<ha::ha_candidate> stand_by(const config& c, const ha_flags& flags,
                                           const std::string& bind,
                                           std::shared_ptr<const net::server_keys> keys,
                                           ha::ha_run_record* record) {
  ha::ha_candidate_options o;
  o.etcd = flags.etcd.empty() ? c.ha.etcd_endpoints : flags.etcd;
  if (o.etcd.empty())
    throw usage_error(
        "ha.standbys is " + std::to_string(c.ha.standbys) +
        " and ha.etcd is local: the etcd of a run is started by `cohort launch`; started alone, "
        "a coordinator needs --ha-etcd URL[,URL...] or ha.etcd's list of URLs");
  o.name = flags.name.empty() ? "run-" + config_hash(c).substr(0, 16) : flags.name;
  if (std::any_of(o.etcd.begin(), o.etcd.end(),
                  [](const std::string& u) { return u.rfind("https://", 0) == 0; })) {
    const std::string dir = flags.tls_dir.empty() ? flags.keys_dir : flags.tls_dir;
    if (dir.empty())
      throw usage_error(
          "etcd over https needs a client certificate: pass --keys DIR (or "
          "--ha-tls DIR) with etcd-ca.crt, etcd-client.crt and etcd-client.key");
    o.tls = ha::etcd_tls_in(dir);
  }
  // The run's record key: every candidate of the run holds the same one.
  if (!flags.record_key_file.empty()) {
    o.record_key =
        std::make_shared<const ha::record_key>(ha::record_key::load(flags.record_key_file));
  } else if (keys) {
    o.record_key = std::make_shared<const ha::record_key>(
        ha::record_key::from_coordinator_secret(keys->self.secret_key));
  } else {
    throw usage_error("ha.standbys is " + std::to_string(c.ha.standbys) +
                      ": the run's etcd records are sealed with a key every coordinator of the "
                      "run holds; pass --keys DIR (it is derived from coordinator.key) or "
                      "--ha-record-key FILE");
  }
  o.ttl_s = c.ha.lease_ttl_s;
  o.bind = bind;
  o.max_message_bytes = static_cast<size_t>(c.control.max_message_bytes);
  o.keys = std::move(keys);
  auto cand = std::make_unique<ha::ha_candidate>(o);
  std::printf("coordinator listening on %s\n", cand->endpoint().c_str());
  std::fflush(stdout);
  std::fprintf(stderr, "coordinator: standing by (run %s, etcd %s)\n", o.name.c_str(),
               o.etcd.front().c_str());
  cand->election().on_lost([] { deposed("the leader's etcd lease is gone"); });
  bool led = false;
  {
    proc::signal_watcher signals([&cand](int) { cand->stop_waiting(); });
    led = cand->wait_for_leadership();
  }
  if (!led) {
    std::fprintf(stderr, "coordinator: %s; standby exits\n",
                 cand->run_over() ? "the run is over" : "stopped");
    return nullptr;
  }
  *record = cand->read_run();
  spdlog::info("coordinator: leading, term {} ({})", cand->term(),
               record->job_id ? "taking over a running job" : "a new run");
  return cand;
}

void ha_wire(ha::ha_candidate& cand, const ha::ha_run_record& record,
             actors::coordinator_options& co, std::atomic<actors::coordinator_node*>& node,
             std::optional<int64_t>& failover_from_ns) {
  co.term = static_cast<uint64_t>(cand.term());
  co.taking_over = record.job_id.has_value();
  co.coordinator_status = [&cand] { return cand.status_json(); };
  co.on_worker_faults = [&cand](const std::vector<faults::fault_fired>& fired) {
    // Fenced: a deposed leader orders nothing (its orders would be a second firing).
    if (!cand.record_worker_faults(fired)) deposed("a newer leader holds the run");
  };
  co.on_coordinator_fault = [&cand, &node](const faults::fault_spec& f, std::size_t index) {
    // Recorded first, fenced: the next leader must not carry it out again, and a deposed
    // leader carries out nothing.
    if (!cand.record_fault(index)) deposed("a newer leader holds the run");
    if (f.kind == faults::fault_kind::kill) {
      std::fprintf(stderr, "coordinator: injecting '%s': SIGKILL to itself\n", f.text.c_str());
      std::fflush(stderr);
      ::raise(SIGKILL);
    }
    // partition: cut off from the workers and from etcd alike.
    std::fprintf(stderr, "coordinator: injecting '%s': cut off from workers and etcd\n",
                 f.text.c_str());
    const auto ms = static_cast<uint32_t>(f.duration_ms);
    if (auto* n = node.load()) n->cut_off(ms);
    cand.election().cut_off(std::chrono::milliseconds(ms));
  };
  co.record_added_fault = [&cand](const std::string& spec) -> std::string {
    try {
      return cand.record_added_fault(spec) ? std::string()
                                           : "this coordinator no longer leads the run";
    } catch (const std::exception& e) {
      return std::string("it could not be recorded in etcd for the next leader: ") + e.what();
    }
  };
  co.confirm_scale = [&cand](const std::string& spec) -> std::string {
    try {
      return cand.record_scale(spec) ? std::string()
                                     : "this coordinator no longer leads the run; ask the new "
                                       "leader (`cohort ctl ... status` names it)";
    } catch (const std::exception& e) {
      return std::string("etcd could not confirm this coordinator leads the run: ") + e.what();
    }
  };
  co.record_stop = [&cand](const std::string& by) -> std::string {
    try {
      return cand.record_stop(by) ? std::string()
                                  : "this coordinator no longer leads the run; ask the new "
                                    "leader (`cohort ctl ... status` names it)";
    } catch (const std::exception& e) {
      return std::string("the stop could not be recorded in etcd for the next leader: ") +
             e.what();
    }
  };
  if (record.job_id)
    failover_from_ns = record.fault_at_ns ? *record.fault_at_ns : ha::ha_now_realtime_ns();
}

void ha_added_faults(const ha::ha_run_record& record, step::training_job& job) {
  // In the order the earlier leaders added them: each keeps its place in the job's fault
  // list, the place a coordinator fault's record names. Each was parsed and checked when
  // it was added; a record that no longer parses (another version wrote it) ends the run.
  for (const auto& text : record.added_faults) job.append_fault(faults::parse_fault(text));
}

uint64_t ha_job_id(ha::ha_candidate& cand, const ha::ha_run_record& record, uint64_t fresh) {
  if (record.job_id) return *record.job_id;
  if (!cand.record_job(fresh)) deposed("a newer leader holds the run");
  return fresh;
}

void ha_first_commit(ha::ha_candidate& cand, const step::job_actions& a,
                     std::optional<int64_t>& failover_from_ns) {
  if (!failover_from_ns) return;
  const double ms = static_cast<double>(ha::ha_now_realtime_ns() - *failover_from_ns) / 1e6;
  nlohmann::json ev = {{"kind", "failover"},
                       {"worker", "coordinator"},
                       {"step", a.step - 1},
                       {"generation", 0},
                       {"term", cand.term()},
                       {"detect_ms", nullptr},  // when a standby saw it: not measured
                       {"recover_ms", ms},
                       {"spec", "leader of term " + std::to_string(cand.term()) +
                                    ": from the old leader's end to this commit"}};
  std::fprintf(stderr,
               "coordinator: failover done: step %lld committed %.0f ms after the "
               "old leader's end\n",
               static_cast<long long>(a.step - 1), ms);
  cand.record_failover(ev);
  failover_from_ns.reset();
}

void ha_events(ha::ha_candidate& cand, const step::training_job& job) {
  if (!job.report().events().empty()) cand.record_events(job.report().events_json());
}

void ha_summary(ha::ha_candidate& cand, const ha::ha_run_record& record, nlohmann::json& summary) {
  // The run's events: the earlier leaders' (from etcd, their failovers among them), this
  // one's, its own failover; in step order (t_s counts from the first step each leader
  // opened).
  nlohmann::json events = nlohmann::json::array();
  for (const auto& e : record.events) events.push_back(e);
  for (const auto& e : summary["events"]) events.push_back(e);
  if (const auto f = cand.failover()) events.push_back(*f);
  std::stable_sort(events.begin(), events.end(), [](const auto& a, const auto& b) {
    return a.value("step", int64_t{0}) < b.value("step", int64_t{0});
  });
  summary["events"] = events;
  nlohmann::json all = nlohmann::json::array();
  for (const auto& e : events)
    if (e.value("kind", std::string()) == "failover") all.push_back(e);
  nlohmann::json block = nlohmann::json::parse(cand.status_json());
  block["failovers"] = all.size();
  std::vector<double> ms;
  for (const auto& f : all) ms.push_back(f.value("recover_ms", 0.0));
  block["failover_recover_ms"] = ms;
  summary["coordinator"] = block;
}

}  // namespace cohort::cli
