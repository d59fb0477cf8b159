// `cohort launch CFG [--set k=v ...] [--summary PATH]`: supervises one local cluster: a
// coordinator (which runs the training job) and cluster.workers worker processes (this
// binary, re-executed). Tells the coordinator at once when a child exits, returns the
// coordinator's exit code once training ends, and on SIGINT / SIGTERM stops everything,
// leaving no child behind.
// Single-threaded: one poll() over a signal pipe and the coordinator's stdout.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/core/config.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/process.hpp"
#include "runtime/ha/ha_candidate.hpp"
#include "runtime/net/host_relay.hpp"
#include "runtime/net/zmq_bridge.hpp"
#include "tools/launch_cpu_limits.hpp"
#include "tools/launch_ha.hpp"
#include "tools/launch_keys.hpp"
#include "tools/launch_options.hpp"
#include "tools/launch_respawns.hpp"
#include "tools/launch_scale_orders.hpp"
#include "tools/launch_roster_lines.hpp"
#include "tools/launch_warm.hpp"
#include "tools/host_agent.hpp"

namespace cohort::cli {
namespace {

using clock_type = std::chrono::steady_clock;
using std::chrono::milliseconds;

struct child {
  std::string name;
  bool coordinator = false;
  std::chrono::steady_clock::time_point started{};
  std::string endpoint;  ///< ha: the coordinator's endpoint (restarted there)
  bool warm = false;     ///< started ahead of a respawn, waiting for its name (start_warm)
};

class launcher {
 public:
  launcher(const launch_options& opt, const config& cfg)
      : opt_(opt), cfg_(cfg), cpu_limits_(opt.cpu_limits) {}

  int run() {
    keys_ = std::make_unique<launch_keys>(opt_.keys, opt_.insecure,
                                          opt_.bind.empty() ? cfg_.control.bind : opt_.bind);
    // A handler-fed pipe, not signalfd: signalfd needs the signals blocked in every thread,
    // and a library may own threads that predate any mask we set.
    signals_ = std::make_unique<proc::signal_pipe>(std::vector<int>{SIGINT, SIGTERM, SIGCHLD});

    if (ha()) ha_ = std::make_unique<launch_ha>(cfg_, keys_->dir());
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) throw error("launch: pipe failed");
    out_fd_ = fds[0];
    std::vector<std::string> args = coordinator_args();
    args.insert(args.end(), {"--bind", opt_.bind.empty() ? cfg_.control.bind : opt_.bind});
    const pid_t cpid = proc::spawn_self(args, fds[1]);
    close(fds[1]);
    children_[cpid] = child{"coordinator", true, clock_type::now(), {}};

    if (!wait_for_endpoint()) return finish();
    candidates_ = {endpoint_};
    children_[cpid].endpoint = endpoint_;
    // Standbys: each on a port of its own, known before it starts (workers list them all).
    for (int i = 0; i < (ha() ? cfg_.ha.standbys : 0); ++i) {
      const std::string ep = launch_ha::free_endpoint();
      candidates_.push_back(ep);
      start_coordinator("standby-" + std::to_string(i + 1), ep);
    }
    std::printf("coordinator listening on %s\n", endpoint_.c_str());
    if (ha())
      std::printf("launch: %d standby coordinator(s) at %s (etcd %s, run %s)\n", cfg_.ha.standbys,
                  join(candidates_, 1).c_str(), ha_->etcd_urls().front().c_str(),
                  ha_->name().c_str());
    return after_start();
  }

  // The coordinator's command line, without --bind.
  std::vector<std::string> coordinator_args() const {
    std::vector<std::string> args{"coordinator", "--config", opt_.config_path};
    for (const auto& s : opt_.overrides) args.insert(args.end(), {"--set", s});
    if (!opt_.summary.empty()) args.insert(args.end(), {"--summary", opt_.summary});
    if (!opt_.trace.empty()) args.insert(args.end(), {"--trace", opt_.trace});
    if (!opt_.metrics.empty()) args.insert(args.end(), {"--metrics", opt_.metrics});
    if (opt_.control_only) args.push_back("--control-only");
    if (opt_.quiet) args.push_back("--quiet");
    for (const auto& f : opt_.inject) args.insert(args.end(), {"--inject", f});
    if (opt_.resume) args.push_back("--resume");
    if (!opt_.resume_from.empty()) args.insert(args.end(), {"--resume-from", opt_.resume_from});
    if (!keys_->dir().empty()) args.insert(args.end(), {"--keys", keys_->dir()});
    if (opt_.insecure) args.push_back("--insecure");
    if (ha_) {
      const auto more = ha_->coordinator_args();
      args.insert(args.end(), more.begin(), more.end());
    }
    return args;
  }

  int after_start() {
    std::fwrite(pipe_buf_.data(), 1, pipe_buf_.size(), stdout);
    pipe_buf_.clear();
    std::fflush(stdout);
    if (!(ha() ? follow_leader(milliseconds(15000)) : connect_client(endpoint_, 5000))) {
      spdlog::error("launch: coordinator at {} does not answer", endpoint_);
      begin_stop("coordinator does not answer");
      return finish();
    }
    if (opt_.agent && !ha()) {
      // The local host's agent (docs/agent.md): the workers' one connection to the
      // coordinator, relaying their heartbeats as one and their exits at once.
      try {
        relay_ = start_host_relay(endpoint_, host_agent_name(""), keys_->dir(), cfg_);
      } catch (const std::exception& e) {
        spdlog::error("launch: the host agent did not start: {}", e.what());
        begin_stop("host agent did not start");
        return finish();
      }
    }
    for (; next_index_ < cfg_.cluster.workers; ++next_index_)
      start_worker("worker-" + std::to_string(next_index_));
    warm_due_ = clock_type::now();  // at once: the workers' own start is under way anyway
    if (opt_.control_only) {
      std::printf(
          "launch: %d worker(s) started; the cluster runs until stopped (Ctrl-C, SIGTERM or "
          "`cohort ctl --coordinator %s stop`)\n",
          cfg_.cluster.workers, endpoint_.c_str());
    } else {
      std::printf(
          "launch: %d worker(s) started; training runs until train.steps, then everything "
          "exits (Ctrl-C, SIGTERM or `cohort ctl --coordinator %s stop` stop it early)\n",
          cfg_.cluster.workers, endpoint_.c_str());
    }
    std::fflush(stdout);
    return finish();
  }

  ~launcher() {
    if (out_fd_ >= 0) close(out_fd_);
    for (int fd : extra_fds_) close(fd);
    ha_.reset();  // before the keys' folder goes (keys_)
  }

 private:
  bool ha() const { return cfg_.ha.standbys > 0 && !opt_.control_only; }

  static std::string join(const std::vector<std::string>& v, size_t from) {
    std::string out;
    for (size_t i = from; i < v.size(); ++i) out += (out.empty() ? "" : ",") + v[i];
    return out;
  }

  // A coordinator (a standby, or one restarted) at EP; its stdout is passed through.
  void start_coordinator(const std::string& name, const std::string& ep) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) throw error("launch: pipe failed");
    std::vector<std::string> args = coordinator_args();
    args.insert(args.end(), {"--bind", ep});
    const pid_t pid = proc::spawn_self(args, fds[1]);
    close(fds[1]);
    children_[pid] = child{name, true, clock_type::now(), ep};
    extra_fds_.push_back(fds[0]);
    extra_first_line_[fds[0]].clear();
    std::printf("launch: started %s (pid %d) at %s\n", name.c_str(), static_cast<int>(pid),
                ep.c_str());
  }

  bool connect_client(const std::string& ep, int timeout_ms, int64_t term = 0) {
    auto c =
        std::make_unique<net::sync_client>(ep, static_cast<size_t>(cfg_.control.max_message_bytes),
                                           net::make_identity("launch"), keys_->client());
    net::register_request me{net::peer_role::client, "launch", static_cast<int64_t>(getpid())};
    const auto r = c->register_as(me, milliseconds(timeout_ms));
    if (!r || !std::holds_alternative<net::register_ok>(*r)) return false;
    // What the one we leave (a deposed leader) sent while we registered is read last.
    const std::unique_ptr<net::sync_client> left = std::exchange(client_, std::move(c));
    if (left) drain(*left);
    client_endpoint_ = ep;
    client_term_ = term;
    return true;
  }

  // ha: talk to whoever leads (etcd names it); waits up to WAIT for a leader that answers.
  // A leader is its term, not its endpoint: a deposed coordinator comes back as a standby at
  // the same endpoint and may win again, and that new process never saw our registration
  // (ZeroMQ reconnects to it silently), so a new term means registering again.
  bool follow_leader(milliseconds wait) {
    const auto deadline = clock_type::now() + wait;
    do {
      if (const auto l = ha_->leader_now(); l && !l->endpoint.empty()) {
        if (l->endpoint == client_endpoint_ && l->term == client_term_ && client_) return true;
        // What the deposed leader sent before it lost its term (a scale order it confirmed
        // with etcd) is read before its connection is dropped.
        drain_client();
        if (connect_client(l->endpoint, 1000, l->term)) return true;
      }
      if (clock_type::now() >= deadline) break;
      std::this_thread::sleep_for(milliseconds(50));
    } while (true);
    return client_ != nullptr && wait.count() == 0;
  }

  // `cohort worker` for this run, less its name and local rank.
  // Every worker of launch is on this host: cluster.bind splits it among cluster.workers.
  std::vector<std::string> worker_args() const {
    std::vector<std::string> args;
    if (relay_) {
      args = host_worker_args(*relay_, keys_->dir());
    } else {
      args = {"worker", "--join", ha() ? join(candidates_, 0) : endpoint_};
      if (ha()) args.insert(args.end(), {"--reattach-ms", std::to_string(cfg_.ha.reattach_ms)});
      if (!keys_->dir().empty()) args.insert(args.end(), {"--keys", keys_->dir()});
    }
    args.insert(args.end(), {"--local-size", std::to_string(cfg_.cluster.workers)});
    return args;
  }

  void start_worker(const std::string& name) {
    // A worker keeps its local rank (so its GPU) when it is started again.
    const int local_rank =
        local_ranks_.emplace(name, static_cast<int>(local_ranks_.size())).first->second;
    // The warm worker, when one waits, takes the name (start_warm).
    const pid_t warm = warm_.take(name, local_rank);
    if (warm > 0) warm_due_ = clock_type::now() + milliseconds(1000);
    if (auto it = children_.find(warm); warm > 0 && it != children_.end()) {
      it->second = child{name, false, clock_type::now(), {}};
      std::printf("launch: started %s (pid %d, warm)\n", name.c_str(), static_cast<int>(warm));
      std::fflush(stdout);
      return cpu_limits_.started(name, warm);
    }
    std::vector<std::string> args = worker_args();
    args.insert(args.end(), {"--name", name, "--local-rank", std::to_string(local_rank)});
    const pid_t pid = proc::spawn_self(args);
    children_[pid] = child{name, false, clock_type::now(), {}};
    std::printf("launch: started %s (pid %d)\n", name.c_str(), static_cast<int>(pid));
    std::fflush(stdout);
    cpu_limits_.started(name, pid);
  }

  // A worker started ahead of the next respawn or scale-up (launch_warm.hpp) when the job
  // may start one (respawn on, or room between elastic.min_workers and max_workers), with
  // the run's workers and again a second after each one it stood in for, so that its start
  // does not compete with the replacement's load.
  void start_warm() {
    warm_due_.reset();
    const bool may_start = opt_.respawn || cfg_.elastic.max_workers > cfg_.elastic.min_workers;
    if (!may_start || stopping_ || opt_.control_only || warm_.pid() > 0) return;
    if (const pid_t pid = warm_.start(worker_args()); pid > 0)
      children_[pid] = child{"(warm worker)", false, clock_type::now(), {}, true};
  }

  // elastic.spares, once a status reply lists cluster.workers live members: started after
  // the world formed, they find it full and wait as spares (the job loaded), whatever the
  // order the others registered in.
  void start_spares(const net::status_reply& s) {
    if (spares_started_ || stopping_ || opt_.control_only || cfg_.elastic.spares == 0) return;
    int live = 0;
    for (const auto& w : s.workers) live += w.member.state != net::member_state::dead;
    if (live < cfg_.cluster.workers) return;
    spares_started_ = true;
    for (int i = 0; i < cfg_.elastic.spares; ++i)
      start_worker("worker-" + std::to_string(next_index_++));
  }

  // A worker that died (killed, or failed) while the job runs is started again under the
  // same name; it joins as a new member and takes its state from a live peer (with
  // elastic.spares: a little later, launch_respawns.hpp).
  void maybe_respawn(const child& c, int code) {
    if (!opt_.respawn || stopping_ || opt_.control_only || code == 0) return;
    if (!respawns_.worth(c.name, c.started)) return;
    if (cfg_.elastic.spares > 0) {
      std::printf("launch: restarting %s in %d ms (a spare takes its seat)\n", c.name.c_str(),
                  spare_respawn_delay_ms);
      respawns_.put_off(c.name, milliseconds(spare_respawn_delay_ms));
      return;
    }
    std::printf("launch: restarting %s\n", c.name.c_str());
    start_worker(c.name);
  }

  // The coordinator asks for more workers (ctl scale, a scale fault): new names, so that
  // they never collide with a restarted one.
  void scale_up(const net::scale_order& o) {
    if (stopping_ || opt_.control_only) return;
    if (!scale_orders_.take(o)) return;  // sent again, carried out already
    std::printf("launch: %s: starting %d more worker(s)\n", o.reason.c_str(), o.start_workers);
    for (int i = 0; i < o.start_workers; ++i)
      start_worker("worker-" + std::to_string(next_index_++));
  }

  // Reads the coordinator's stdout until its endpoint line; false if it died first.
  bool wait_for_endpoint() {
    const auto deadline = clock_type::now() + milliseconds(15000);
    const std::string marker = "coordinator listening on ";
    while (clock_type::now() < deadline) {
      if (!step(milliseconds(100))) return false;
      const auto at = pipe_buf_.find(marker);
      if (at != std::string::npos) {
        const auto eol = pipe_buf_.find('\n', at);
        if (eol == std::string::npos) continue;
        endpoint_ = pipe_buf_.substr(at + marker.size(), eol - at - marker.size());
        // Whatever came with the endpoint line (the metrics address) is passed through once
        // launch has printed the endpoint (run()).
        pipe_buf_.erase(at, eol + 1 - at);
        return true;
      }
      if (stopping_) return false;
    }
    spdlog::error("launch: the coordinator printed no endpoint within 15 s");
    begin_stop("coordinator did not start");
    return false;
  }

  // The main loop: until every child is reaped.
  int finish() {
    auto next_status = clock_type::now();
    while (!children_.empty()) {
      step(milliseconds(100));
      if (term_at_ && clock_type::now() >= *term_at_) {
        for (const auto& [pid, c] : children_) kill(pid, SIGTERM);
        term_at_.reset();
      }
      if (stopping_ && clock_type::now() >= kill_at_) {
        // The backstop: whoever ignored stop and SIGTERM gets SIGKILL.
        for (const auto& [pid, c] : children_) kill(pid, SIGKILL);
        kill_at_ = clock_type::now() + milliseconds(1000);
      }
      if (warm_due_ && clock_type::now() >= *warm_due_) start_warm();
      for (const std::string& name : respawns_.due(clock_type::now())) {
        std::printf("launch: restarting %s\n", name.c_str());
        start_worker(name);
      }
      if (!stopping_ && client_ && clock_type::now() >= next_status) {
        if (ha()) follow_leader(milliseconds(0));
        client_->send(net::status_request{++status_seq_});
        next_status = clock_type::now() + milliseconds(250);
      }
      drain_client();
    }
    return rc_;
  }

  // Waits up to TIMEOUT for a signal or coordinator output; handles what came. False once
  // the coordinator has exited.
  bool step(milliseconds timeout) {
    std::vector<pollfd> fds{{signals_->fd(), POLLIN, 0}};
    if (out_fd_ >= 0) fds.push_back({out_fd_, POLLIN, 0});
    for (int fd : extra_fds_) fds.push_back({fd, POLLIN, 0});
    const int n = poll(fds.data(), fds.size(), static_cast<int>(timeout.count()));
    if (n > 0 && (fds[0].revents & POLLIN)) {
      for (int sig : signals_->take()) {
        if (sig == SIGCHLD) {
          reap();
        } else if (sig == SIGTERM && !stopping_ && !asked_checkpoint_ && !ha() &&
                   cfg_.fault_tolerance.on_sigterm == "checkpoint" && coordinator_running()) {
          // fault_tolerance.on_sigterm: checkpoint: the coordinator stops the run with a
          // checkpoint (its own SIGTERM does that) and then its workers; a second SIGTERM
          // stops everything at once.
          asked_checkpoint_ = true;
          std::printf("launch: SIGTERM: the run stops with a checkpoint (a second SIGTERM stops "
                      "it at once)\n");
          std::fflush(stdout);
          respawns_.clear();
          for (const auto& [pid, c] : children_)
            if (c.coordinator) kill(pid, SIGTERM);
        } else {
          std::printf("launch: %s: stopping the cluster\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
          std::fflush(stdout);
          begin_stop(sig == SIGINT ? "launch: SIGINT" : "launch: SIGTERM");
        }
      }
    }
    // A SIGCHLD that raced with the previous reap leaves a child to collect; cheap to check.
    reap();
    for (size_t i = 1; n > 0 && i < fds.size(); ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP))) continue;
      char buf[4096];
      const ssize_t got = read(fds[i].fd, buf, sizeof buf);
      if (fds[i].fd == out_fd_) {
        if (got > 0) {
          pipe_buf_.append(buf, static_cast<size_t>(got));
          // Until the endpoint is known the buffer is parsed; afterwards it is passed through.
          if (!endpoint_.empty()) {
            std::fwrite(pipe_buf_.data(), 1, pipe_buf_.size(), stdout);
            std::fflush(stdout);
            pipe_buf_.clear();
          }
        } else {
          close(out_fd_);
          out_fd_ = -1;
        }
      } else if (got > 0) {
        pass_through(fds[i].fd, std::string(buf, static_cast<size_t>(got)));
      } else {
        close(fds[i].fd);
        extra_first_line_.erase(fds[i].fd);
        extra_fds_.erase(std::find(extra_fds_.begin(), extra_fds_.end(), fds[i].fd));
      }
    }
    return coordinator_running();
  }

  // A standby's stdout, as it comes (progress lines end in '\r'), except its first line:
  // the endpoint, which launch has said already.
  void pass_through(int fd, const std::string& more) {
    auto held = extra_first_line_.find(fd);
    std::string out = more;
    if (held != extra_first_line_.end()) {
      held->second += more;
      const size_t eol = held->second.find('\n');
      if (eol == std::string::npos) return;
      out = held->second.substr(eol + 1);
      extra_first_line_.erase(held);
    }
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fflush(stdout);
  }

  bool coordinator_running() const {
    for (const auto& [pid, c] : children_) {
      if (c.coordinator) return true;
    }
    return false;
  }

  void reap() {
    int status = 0;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
      auto it = children_.find(pid);
      if (it == children_.end()) continue;
      const child c = it->second;
      children_.erase(it);
      cpu_limits_.reaped(pid);
      const int code = proc::exit_code_of(status);
      if (c.warm) {  // it had no name yet: no member died; the next respawn starts cold
        warm_.exited(pid);
        if (!stopping_ && code != 0)
          std::printf("launch: the warm worker (pid %d) exited: %s\n", static_cast<int>(pid),
                      proc::describe_exit_code(code).c_str());
        continue;
      }
      std::printf("launch: %s (pid %d) exited: %s\n", c.name.c_str(), static_cast<int>(pid),
                  proc::describe_exit_code(code).c_str());
      std::fflush(stdout);
      // (A coordinator with no endpoint yet died starting: that is launch's failure below.)
      if (c.coordinator && ha() && !stopping_ && !c.endpoint.empty() &&
          (code == ha::exit_deposed || code > 128)) {
        // ha: a coordinator killed or deposed: the next leader carries on. Its lease goes
        // now rather than when it runs out (the launcher saw it die), and it comes back as
        // a standby at the same endpoint.
        if (const auto term = ha_->depose_if_leader(pid))
          std::printf("launch: deposed the dead leader (term %lld) in etcd\n",
                      static_cast<long long>(*term));
        if (respawns_.worth(c.name, c.started)) {
          std::printf("launch: restarting %s as a standby at %s\n", c.name.c_str(),
                      c.endpoint.c_str());
          start_coordinator(c.name, c.endpoint);
        }
        std::fflush(stdout);
        continue;
      }
      if (c.coordinator) {
        // A usage error of the coordinator (bad --resume, bad fault) is the user's: exit 2.
        // Stopped early with a checkpoint (fault_tolerance.on_sigterm): exit 3 as it did.
        if (code != 0)
          rc_ = code == exit_usage || code == exit_stopped ? code : exit_runtime;
        // Without a coordinator the workers cannot do anything useful. After a clean end
        // they already got `stop` and exit on their own; otherwise they are told now.
        begin_stop("coordinator exited");
        if (code != 0 && code != exit_stopped) {
          for (const auto& [wpid, w] : children_) kill(wpid, SIGTERM);
        } else {
          term_at_ = clock_type::now() + milliseconds(2000);
        }
      } else {
        // Faster than any heartbeat timeout: the coordinator hears it now.
        if (relay_ && coordinator_running()) {
          relay_->report_exit(c.name, static_cast<int64_t>(pid), code);
        } else if (client_ && coordinator_running()) {
          client_->send(net::exit_notice{c.name, static_cast<int64_t>(pid), code});
        }
        maybe_respawn(c, code);
      }
    }
  }

  void begin_stop(const std::string& reason) {
    if (stopping_) return;
    stopping_ = true;
    respawns_.clear();
    warm_.close();  // the end of its input: the warm worker exits 0
    kill_at_ = clock_type::now() + milliseconds(opt_.stop_timeout_ms);
    if (client_ && coordinator_running()) client_->send(net::stop{reason});
    if (!client_) {
      // No admin channel (coordinator never came up): signal directly.
      for (const auto& [pid, c] : children_) kill(pid, SIGTERM);
    }
  }

  void drain_client() {
    if (client_) drain(*client_);
  }

  // What C has received: status replies (the roster lines, spares) and scale orders.
  void drain(net::sync_client& c) {
    while (auto m = c.recv(milliseconds(0))) {
      if (const auto* s = std::get_if<net::status_reply>(&*m)) {
        roster_lines_.show(*s, cfg_.cluster.workers);
        start_spares(*s);
      }
      if (const auto* o = std::get_if<net::scale_order>(&*m)) scale_up(*o);
    }
  }

  launch_options opt_;
  config cfg_;
  std::unique_ptr<launch_keys> keys_;
  std::unique_ptr<proc::signal_pipe> signals_;
  int out_fd_ = -1;
  std::string pipe_buf_;
  std::string endpoint_;
  std::map<pid_t, child> children_;
  warm_worker warm_;                                ///< start_warm's process, if any
  std::optional<clock_type::time_point> warm_due_;  ///< when start_warm runs next
  std::map<std::string, int> local_ranks_;          // worker name -> its local rank (its GPU)
  std::unique_ptr<net::sync_client> client_;
  scale_orders scale_orders_;  ///< each scale order once
  std::unique_ptr<net::host_relay> relay_;  ///< the local host's agent (opt_.agent, no ha)
  bool stopping_ = false;
  bool spares_started_ = false;  ///< elastic.spares started (start_spares)
  respawns respawns_;            ///< whom to restart, and when
  launch_cpu_limits cpu_limits_;  ///< --cpu-limit
  static constexpr int spare_respawn_delay_ms = 500;
  clock_type::time_point kill_at_{};
  std::optional<clock_type::time_point> term_at_;  // SIGTERM to workers that outlive it
  int rc_ = exit_ok;
  bool asked_checkpoint_ = false;  ///< SIGTERM under on_sigterm: checkpoint passed on
  uint64_t status_seq_ = 0;
  roster_lines roster_lines_;  // what launch has printed of the membership
  int next_index_ = 0;         // worker-<index> of the next new worker
  // ha (ha.standbys >= 1): the etcd, the run's name in it, every coordinator's endpoint,
  // and the leader as etcd names it (launch's client follows it).
  std::unique_ptr<launch_ha> ha_;
  std::vector<std::string> candidates_;
  std::vector<int> extra_fds_;
  std::map<int, std::string> extra_first_line_;  // fd -> its first line while incomplete
  std::string client_endpoint_;
  int64_t client_term_ = 0;  ///< ha: the term of the leader registered with
};

}  // namespace

int run_launch(const launch_options& opt, const config& cfg) {
  launcher l(opt, cfg);
  return l.run();
}

}  // namespace cohort::cli
