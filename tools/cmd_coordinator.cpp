// `cohort coordinator [--config CFG] [--set k=v ...] [--bind EP] [--summary PATH]`: runs the
// coordinator (actor + ROUTER bridge) and the config's training job: once cluster.workers
// workers have joined it runs train.steps steps on them, shows progress, prints the final
// evaluation, writes the summary and stops the cluster. With --control-only it runs the
// control plane alone until `cohort ctl stop`, SIGINT or SIGTERM. The first stdout line is
// the endpoint it bound; launchers and scripts read it. Logs and progress go to stderr.
#include <spdlog/spdlog.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "actors/coordinator.hpp"
#include "runtime/ckpt/checkpoint.hpp"
#include "runtime/core/atomic_file.hpp"
#include "runtime/core/config.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/faults.hpp"
#include "runtime/core/paths.hpp"
#include "runtime/core/process.hpp"
#include "runtime/core/trace.hpp"
#include "runtime/ha/ha_candidate.hpp"
#include "runtime/obs/metrics_server.hpp"
#include "runtime/step/job_telemetry.hpp"
#include "runtime/train/resume_plan.hpp"
#include "tools/commands.hpp"
#include "tools/coordinator_ha.hpp"
#include "tools/progress.hpp"

namespace cohort::cli {

namespace {

// The end of a run, on stdout: what `cohort train` prints, plus the time split per worker.
void print_job_result(const nlohmann::json& j, bool lm) {
  std::printf("final: train loss %.4f", j.value("final_loss", 0.0));
  if (j.contains("eval")) {
    std::printf(" | eval loss %.4f", j["eval"].value("loss", 0.0));
    if (!lm) std::printf(" | eval accuracy %.4f", j["eval"].value("accuracy", 0.0));
  }
  const auto& tp = j["throughput"];
  std::printf(" | %.0f %s | dp %d | %d aborted step(s)", tp.begin().value().get<double>(),
              lm ? "tokens/s" : "samples/s", j.value("dp", 0), j.value("aborted_steps", 0));
  if (j.contains("checkpoint"))
    std::printf(" | checkpoint %s", j["checkpoint"].get<std::string>().c_str());
  if (j.contains("ettr")) std::printf(" | ETTR %.3f", j["ettr"].get<double>());
  std::printf("\n");
  std::printf("%-12s %6s %10s %12s %10s %10s %8s %12s  %s\n", "worker", "steps", "compute_s",
              "comm_wait_s", "setup_s", "idle_s", "overlap", "MB_sent", "cpus");
  for (const auto& w : j["workers"]) {
    std::printf("%-12s %6lld %10.2f %12.2f %10.2f %10.2f %8.2f %12.1f  %s\n",
                w["name"].get<std::string>().c_str(), w["steps"].get<long long>(),
                w["compute_s"].get<double>(), w["comm_wait_s"].get<double>(),
                w["setup_s"].get<double>(), w["idle_s"].get<double>(), w["overlap"].get<double>(),
                w["bytes_sent"].get<double>() / 1e6, w.value("cpus", std::string()).c_str());
  }
  if (!j["events"].empty()) {
    std::printf("%-9s %-12s %6s %5s %10s %11s  %s\n", "event", "worker", "step", "gen", "detect_ms",
                "recover_ms", "spec / detail");
    // A field an event does not have (a failover's detection) shows as "-".
    auto ms = [](const nlohmann::json& e, const char* key) {
      const auto v = e.find(key);
      return v != e.end() && v->is_number() ? std::to_string(static_cast<long>(v->get<double>()))
                                            : std::string("-");
    };
    for (const auto& e : j["events"]) {
      // A joiner's line tells how fast its state came from the donor.
      std::string detail = e.value("spec", std::string());
      if (e.contains("transfer_mb_s")) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "state from a live peer at %.0f MB/s",
                      e["transfer_mb_s"].get<double>());
        detail = buf;
      }
      std::printf("%-9s %-12s %6lld %5llu %10s %11s  %s\n", e["kind"].get<std::string>().c_str(),
                  e["worker"].get<std::string>().c_str(), e["step"].get<long long>(),
                  e["generation"].get<unsigned long long>(), ms(e, "detect_ms").c_str(),
                  ms(e, "recover_ms").c_str(), detail.c_str());
      // A fault's cost, part by part, up to the first commit with its replacement.
      if (e.contains("cost") && e["cost"].is_object() && e["cost"]["whole_ms"].is_number()) {
        const auto& c = e["cost"];
        std::printf(
            "%-9s whole %s ms = detect %s + rerun %s + respawn %s + load %s + admit %s + "
            "enter %s (transfer %s); stalled %s, reduced %s, lost %s, aborted %d\n",
            "", ms(c, "whole_ms").c_str(), ms(c, "detect_ms").c_str(), ms(c, "rerun_ms").c_str(),
            ms(c, "respawn_ms").c_str(), ms(c, "load_ms").c_str(), ms(c, "admit_ms").c_str(),
            ms(c, "enter_ms").c_str(), ms(c, "transfer_ms").c_str(), ms(c, "stalled_ms").c_str(),
            ms(c, "reduced_ms").c_str(), ms(c, "lost_ms").c_str(), c.value("aborted_steps", 0));
      }
    }
  }
  if (j.contains("pipeline")) {
    const auto& pl = j["pipeline"];
    std::printf(
        "pipeline pp %d x tp %d, %s, %d micro-batches a replica: bubble %.3f measured, "
        "%.3f in theory (P-1)/(M+P-1)\n",
        pl["pp"].get<int>(), pl["tp"].get<int>(), pl["schedule"].get<std::string>().c_str(),
        pl["micro_batches"].get<int>(), pl["bubble_fraction"].get<double>(),
        pl["theoretical_bubble"].get<double>());
    if (pl.contains("simulated_bubble"))
      std::printf(
          "  simulated with the measured stage times (unequal stages, free transfers): "
          "%.3f\n",
          pl["simulated_bubble"].get<double>());
    std::printf("%-12s %7s %5s %3s %10s %9s %7s %11s %6s %10s\n", "worker", "replica", "stage",
                "tp", "compute_s", "bubble_s", "bubble", "act_MB", "held", "p2p_MB");
    for (const auto& s : pl["stages"])
      std::printf("%-12s %7d %5d %3d %10.2f %9.2f %7.3f %11.2f %6d %10.1f\n",
                  s["worker"].get<std::string>().c_str(), s["replica"].get<int>(),
                  s["stage"].get<int>(), s["tp_rank"].get<int>(), s["compute_s"].get<double>(),
                  s["bubble_s"].get<double>(), s["bubble_fraction"].get<double>(),
                  s["activation_bytes"].get<double>() / 1e6,
                  s["peak_held_micro_batches"].get<int>(), s["p2p_bytes"].get<double>() / 1e6);
  }
  std::printf("params_sha256 %s (%s across workers)\n",
              j["params_sha256"].get<std::string>().c_str(),
              j.value("params_consistent", false) ? "identical" : "DIFFERENT");
  std::fflush(stdout);
}

}  // namespace

void add_coordinator(CLI::App& app, int* rc) {
  struct options {
    std::string config_path;
    std::vector<std::string> overrides;
    std::string bind;
    std::string summary;
    std::string trace;
    std::string metrics;
    bool control_only = false;
    bool quiet = false;
    std::vector<std::string> inject;
    bool resume = false;
    std::string resume_from;  // --resume-from: a checkpoint of any run, named by the user
    std::string keys;
    bool insecure = false;
    std::vector<std::string> ha_etcd;  // etcd client URLs (launch passes its local etcd)
    std::string ha_name;               // the run's name in etcd
    std::string ha_tls;         // folder with etcd's CA and our client certificate (https etcd)
    std::string ha_record_key;  // the run's record key (runs without --keys)
  };
  auto opt = std::make_shared<options>();
  CLI::App* cmd = app.add_subcommand(
      "coordinator",
      "Run the coordinator: roster, heartbeat monitor, rendezvous store, admin API. Prints "
      "'coordinator listening on ENDPOINT' as its first stdout line, then runs until "
      "`cohort ctl --coordinator ENDPOINT stop`, SIGINT or SIGTERM (all stop every worker).");
  cmd->add_option("--config", opt->config_path,
                  "YAML config (fault_tolerance.*, parallel.*, cluster.workers, control.*); "
                  "defaults when omitted")
      ->type_name("CFG");
  add_set_option(*cmd, &opt->overrides);
  cmd->add_option("--bind", opt->bind,
                  "ZeroMQ endpoint to bind (default: control.bind, tcp://127.0.0.1:0 = any "
                  "free port)")
      ->type_name("EP");
  cmd->add_option("--summary", opt->summary,
                  "Write the run's JSON summary (cohort train's keys plus per-worker time split, "
                  "bytes and overlap) to PATH when training ends")
      ->type_name("PATH");
  add_observe_options(*cmd, &opt->trace, &opt->metrics);
  cmd->add_flag("--control-only", opt->control_only,
                "Run the control plane only: no training job is sent to workers");
  cmd->add_flag("-q,--quiet", opt->quiet, "no progress lines");
  cmd->add_flag("--resume", opt->resume,
                "Continue from the newest checkpoint in fault_tolerance.checkpoint_dir (with any "
                "worker count: every worker loads it); only one this run wrote (same model, data "
                "and seed; docs/checkpoints.md)");
  cmd->add_option("--resume-from", opt->resume_from,
                  "Continue from the checkpoint PATH (a step folder, or the newest of a "
                  "checkpoint folder), even one another run wrote; the folder must be yours")
      ->type_name("PATH")
      ->excludes("--resume");
  cmd->add_option("--inject", opt->inject,
                  "Inject a fault into the training job, e.g. 'kill rank=1 at step=30' "
                  "(repeatable; the language is in docs/faults.md)")
      ->type_name("SPEC");
  CLI::Option* keys =
      add_keys_option(*cmd, &opt->keys,
                      "the coordinator speaks CURVE with coordinator.key and admits only the keys "
                      "in DIR/authorized, each with its role (worker, launcher, admin)");
  cmd->add_flag("--insecure", opt->insecure,
                "Allow binding an address other hosts can reach without --keys: anyone who "
                "reaches it can then join, steer or read the run (docs/security.md)")
      ->excludes(keys);
  cmd->add_option("--ha-etcd", opt->ha_etcd,
                  "With ha.standbys >= 1: the etcd cluster's client URLs, comma-separated "
                  "(default: ha.etcd's list; `cohort launch` passes the etcd it starts)")
      ->type_name("URLS")
      ->delimiter(',');
  cmd->add_option("--ha-name", opt->ha_name,
                  "With ha.standbys >= 1: the run's name in etcd, the same for every "
                  "coordinator of the run (default: run-<config hash>)")
      ->type_name("NAME");
  cmd->add_option("--ha-tls", opt->ha_tls,
                  "With ha.standbys >= 1 and https etcd endpoints: the folder holding "
                  "etcd-ca.crt, etcd-client.crt and etcd-client.key (default: --keys DIR)")
      ->type_name("DIR");
  cmd->add_option("--ha-record-key", opt->ha_record_key,
                  "With ha.standbys >= 1: the file holding the key that seals the run's etcd "
                  "records (default: derived from --keys DIR's coordinator.key; needed "
                  "without --keys)")
      ->type_name("FILE");
  cmd->callback([opt, rc] {
    const config c = opt->config_path.empty() ? load_config_text("{}", "<defaults>", opt->overrides)
                                              : load_config(opt->config_path, opt->overrides);
    if (opt->control_only && (!opt->trace.empty() || !opt->metrics.empty()))
      throw usage_error(
          "--trace and --metrics watch a training job, and --control-only runs "
          "none: drop one or the other");
    // Before any thread exists, so only the watcher below ever sees SIGINT / SIGTERM.
    proc::block_termination_signals();
    proc::log_to_stderr();
    const std::string bind = opt->bind.empty() ? c.control.bind : opt->bind;
    std::shared_ptr<const net::server_keys> keys;
    if (!opt->keys.empty()) {
      keys = std::make_shared<const net::server_keys>(net::load_server_keys(opt->keys));
    } else if (!net::loopback_endpoint(bind)) {
      if (!opt->insecure)
        throw usage_error(
            "refusing to bind " + bind +
            " without keys: anyone who reaches that address could join the job, receive its "
            "parameters or stop it. Write keys with `cohort keygen DIR` and pass --keys DIR "
            "here and to every worker and ctl, or pass --insecure on a network you trust");
      std::fprintf(stderr,
                   "coordinator: warning: %s is bound without keys (--insecure): anyone who "
                   "reaches it can join, steer or read this run\n",
                   bind.c_str());
    }
    // The metrics endpoint is plain HTTP: say so before it serves beyond this machine.
    if (!opt->metrics.empty()) {
      const std::string host = obs::metrics_server::parse_host_port(opt->metrics).first;
      const std::string w = obs::metrics_server::exposure_warning(host, keys != nullptr);
      if (!w.empty()) std::fprintf(stderr, "coordinator: warning: %s\n", w.c_str());
    }
    // Coordinator standbys: stand by until this candidate leads (coordinator_ha.cpp).
    std::unique_ptr<ha::ha_candidate> cand;
    ha::ha_run_record run_record;
    std::string bind_at = bind;
    if (c.ha.standbys > 0 && !opt->control_only) {
      cand = stand_by(c, {opt->ha_etcd, opt->ha_name, opt->ha_tls, opt->ha_record_key, opt->keys},
                      bind, keys, &run_record);
      if (!cand) {
        *rc = exit_ok;  // the run is over, or a signal ended the wait
        return;
      }
      bind_at = cand->endpoint();
    }
    actors::coordinator_options co = actors::coordinator_options_from(c);
    std::atomic<actors::coordinator_node*> node_at{nullptr};
    std::optional<int64_t> failover_from_ns;  // set until the new leader's first commit
    if (cand) ha_wire(*cand, run_record, co, node_at, failover_from_ns);
    std::string failure;
    std::unique_ptr<progress_line> progress;
    std::shared_ptr<step::job_telemetry> telemetry;
    const auto t0 = std::chrono::steady_clock::now();
    if (!opt->control_only) {
      const train::resume_plan plan =
          train::plan_resume(c, opt->resume, train::resume_by::job, opt->resume_from);
      for (const auto& s : plan.skipped)
        std::fprintf(stderr, "coordinator: resume skipped %s\n", s.c_str());
      // A checkpoint that does not fit is refused here, before any worker starts and fails on it.
      plan.enforce();
      if (plan.resume)
        std::fprintf(stderr, "coordinator: resuming from %s at step %lld\n", plan.path.c_str(),
                     static_cast<long long>(plan.step));
      // The run's id tells its checkpoint shards from an earlier run's (job_spec.job_id).
      std::random_device rd;
      uint64_t job_id = rd() * 0x100000000ull + rd();
      if (cand) job_id = ha_job_id(*cand, run_record, job_id);
      co.job =
          std::make_shared<step::training_job>(c, dump_config(c), plan.step, plan.path, job_id);
      co.job->set_faults(job_faults(c, opt->inject));
      if (cand && run_record.job_id) {
        ha_added_faults(run_record, *co.job);
        std::vector<faults::fault_fired> fired = run_record.worker_faults;
        for (const std::size_t i : run_record.fired) fired.push_back({i, -1});
        co.job->take_over(fired);
        // A stop with a checkpoint an earlier leader was carrying out: this one finishes it.
        if (run_record.stop) {
          std::fprintf(stderr,
                       "coordinator: the run was stopping with a checkpoint (asked by %s): "
                       "the next step that opens is its last\n",
                       run_record.stop->c_str());
          co.job->stop_early(*run_record.stop,
                             std::chrono::duration<double>(
                                 std::chrono::steady_clock::now().time_since_epoch())
                                 .count());
        }
      }
      // Rollbacks (error feedback, bitwise; sharded state lost, train.zero) go to this run's
      // checkpoints, or to the one it resumed from when it is in this run's folder
      // (--resume-from may name another): complete, with every DP rank's error-feedback part
      // (any complete one with train.zero: every member re-cuts what it loads).
      const std::string ckdir = expand_user(c.fault_tolerance.checkpoint_dir);
      const int64_t resumed_step =
          plan.resume && plan.path == checkpoint_path(ckdir, plan.step) ? plan.step : -1;
      co.job->set_checkpoints(
          [dir = ckdir, job_id, resumed = resumed_step,
           sharded = c.train.zero > 0](int64_t at_most) -> std::optional<int64_t> {
            const auto all = list_checkpoints(dir);
            for (auto it = all.rbegin(); it != all.rend(); ++it) {
              if (it->first > at_most) continue;
              try {
                const training_metadata m = read_checkpoint_metadata(it->second);
                const auto job = m.extra.find("checkpoint.job");
                const bool ours = job != m.extra.end() && job->second == std::to_string(job_id);
                if ((ours || it->first == resumed) &&
                    (sharded || checkpoint_feedback_parts(it->second) > 0))
                  return it->first;
              } catch (const std::exception& e) {
                spdlog::warn("coordinator: checkpoint {} cannot be rolled back to: {}", it->second,
                             e.what());
              }
            }
            return std::nullopt;
          });
      // The trace and the metrics endpoint are opened now: a bad path or a taken port fails
      // the command before any worker is waited for.
      if (!opt->trace.empty() || !opt->metrics.empty()) {
        telemetry = std::make_shared<step::job_telemetry>(
            step::telemetry_options{opt->trace, opt->metrics}, trace::now_ns());
        co.job->set_watch(telemetry);
        co.job->set_trace(telemetry->wants_spans());
      }
      const bool lm = c.model.kind == "gpt";
      progress = std::make_unique<progress_line>(c.train.steps, lm ? "tok/s" : "samples/s",
                                                 opt->quiet, c.train.log_every);
      std::fprintf(stderr,
                   "coordinator: job %s, %lld steps of %d samples over %d worker(s), %s, "
                   "comm %s (buckets of %g MiB)\n",
                   c.model.kind.c_str(), static_cast<long long>(c.train.steps),
                   c.train.global_batch, c.cluster.workers, c.train.determinism.c_str(),
                   to_string(c.comm.backend), static_cast<double>(c.comm.bucket_mb));
      co.on_job = [&, lm](const step::job_actions& a, const step::training_job& job) {
        // Aborts, waits and state transfers are events, shown even without progress lines.
        for (const auto& n : a.notes) {
          if (opt->quiet)
            std::fprintf(stderr, "coordinator: %s\n", n.c_str());
          else
            progress->note("coordinator: " + n);
        }
        if (a.committed)
          progress->update(
              a.step, a.loss, a.rate,
              " | " + std::to_string(job.replicas() * c.parallel.pp * c.parallel.tp) + " workers" +
                  (job.report().aborted_steps() > 0
                       ? ", " + std::to_string(job.report().aborted_steps()) + " aborted"
                       : std::string()));
        if (a.committed && cand) ha_first_commit(*cand, a, failover_from_ns);
        // Events (faults, joins, their detection and recovery) outlive this leader.
        if (cand && (!a.notes.empty() || (a.committed && a.step % 100 == 0))) ha_events(*cand, job);
        if (!a.failed.empty()) failure = a.failed;
        if (!a.finished) return;
        progress->finish();
        const double wall =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        nlohmann::json j = job.report().summary(wall);
        j["balance"] = job.balance_json();
        if (cand) ha_summary(*cand, run_record, j);
        print_job_result(j, lm);
        if (telemetry) {
          try {
            const std::string path = telemetry->finish();
            if (!path.empty())
              std::fprintf(stderr, "coordinator: trace written to %s\n", path.c_str());
          } catch (const std::exception& e) {
            spdlog::error("coordinator: {}", e.what());
            failure = e.what();
          }
        }
        if (!opt->summary.empty()) {
          try {
            write_file_atomic(opt->summary, j.dump(2) + "\n");
          } catch (const std::exception& e) {
            spdlog::error("coordinator: cannot write the summary: {}", e.what());
            failure = e.what();
          }
        }
        // The run's end goes to etcd before the workers are told to stop (run_job's
        // do_stop follows): a leader deposed after they have gone would leave the next one
        // taking over a finished run that no worker comes back to. A run stopped early with
        // a checkpoint is not over: a resume under the same name goes on.
        if (cand && failure.empty() && !job.stopped_early()) cand->record_done();
      };
    }
    auto node_ptr = std::make_unique<actors::coordinator_node>(
        co, bind_at, static_cast<size_t>(c.control.max_message_bytes), keys);
    actors::coordinator_node& node = *node_ptr;
    node_at = &node;
    if (!cand) std::printf("coordinator listening on %s\n", node.endpoint().c_str());
    if (telemetry && !telemetry->metrics_url().empty())
      std::printf("coordinator metrics at %s\n", telemetry->metrics_url().c_str());
    std::fflush(stdout);
    // fault_tolerance.on_sigterm: checkpoint (a preemption, a time limit): the first SIGTERM
    // stops the run with a checkpoint; a second one, or SIGINT, stops it at once.
    // A SIGTERM within 2 s of the first is its echo (`cohort launch` passes its own on, and
    // Slurm signals every process of the batch step): the same stop.
    std::optional<std::chrono::steady_clock::time_point> asked_checkpoint;
    const bool sigterm_checkpoints = co.job && c.fault_tolerance.on_sigterm == "checkpoint";
    proc::signal_watcher signals([&node, &asked_checkpoint, sigterm_checkpoints](int sig) {
      const auto now = std::chrono::steady_clock::now();
      if (sig == SIGTERM && sigterm_checkpoints) {
        if (!asked_checkpoint) {
          asked_checkpoint = now;
          node.request_checkpoint_stop("SIGTERM");
          return;
        }
        if (now - *asked_checkpoint < std::chrono::seconds(2)) return;
      }
      node.request_stop(sig == SIGINT ? "SIGINT" : "SIGTERM");
    });
    node.wait();
    node_at = nullptr;
    if (!failure.empty()) {
      std::fprintf(stderr, "error: training failed: %s\n", failure.c_str());
      *rc = exit_runtime;
      return;
    }
    if (co.job && co.job->stopping_early() && !co.job->finished()) {
      // A second SIGTERM (or SIGINT) cut the stop short: no checkpoint of where it was.
      std::fprintf(stderr,
                   "error: stopped before the run's checkpoint was complete (a second signal); "
                   "--resume goes on from the newest complete one in %s\n",
                   c.fault_tolerance.checkpoint_dir.c_str());
      *rc = exit_runtime;
      return;
    }
    if (co.job && co.job->stopped_early()) {
      // Carried out: a resumed run under the same name must not stop again at once.
      if (cand && failure.empty()) cand->clear_stop();
      std::fprintf(stderr,
                   "coordinator: stopped early at step %lld of %lld with a checkpoint in %s: "
                   "run again with --resume to go on\n",
                   static_cast<long long>(co.job->steps()),
                   static_cast<long long>(c.train.steps),
                   c.fault_tolerance.checkpoint_dir.c_str());
      *rc = exit_stopped;
      return;
    }
    *rc = exit_ok;
  });
}

}  // namespace cohort::cli
