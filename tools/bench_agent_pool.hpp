// `cohort bench control --agents` (tools/bench_agents.cpp): the simulated agents themselves.
// One thread drives every agent's DEALER socket through one epoll set: registration (as a
// worker, or with per_host as a host agent speaking for its workers), heartbeats spread evenly
// over the period, and what the coordinator sends back (rosters, acks, rejects), counted.
#pragma once
#include <fcntl.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <variant>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "runtime/net/codec.hpp"
#include "runtime/net/curve.hpp"
#include "runtime/net/relay.hpp"
#include "runtime/net/zmq_bridge.hpp"
#include "tools/bench_agents.hpp"

namespace cohort::cli::agents_bench {

using std::chrono::milliseconds;
using clock_type = std::chrono::steady_clock;

// A worker behind a simulated host agent: the agent speaks for it with [rid, frame].
struct relayed_worker {
  std::string rid;
  std::string name;
  uint64_t member_id = 0;
  uint64_t generation = 0;
  uint64_t seq = 0;
  bool registered = false;
};

struct agent {
  std::unique_ptr<zmq::socket_t> sock;
  // per_host > 0: a host agent: its own registration (as agent-NAME) and its workers.
  bool host_registered = false;
  std::vector<relayed_worker> workers;
  std::string name;
  uint64_t member_id = 0;
  uint64_t generation = 0;  ///< the newest the coordinator told it
  uint64_t seq = 0;
  bool registered = false;
  bool stopped = false;  ///< silent on purpose (the stop phase)
  clock_type::time_point next_beat{};
};

// Counters the agents' thread keeps; read between phases.
struct traffic {
  uint64_t roster_frames = 0;
  uint64_t roster_bytes = 0;
  uint64_t heartbeats = 0;  ///< heartbeat frames (host beats with per_host)
  uint64_t relayed_beats = 0;  ///< workers' beats inside host beats
  uint64_t rejoins = 0;        ///< heartbeat_acks that said rejoin_required
  uint64_t rejects = 0;        ///< register_rejects
  uint64_t send_failures = 0;  ///< frames the agent's socket would not queue
};

class agent_pool {
 public:
  agent_pool(const agents_options& o, const std::string& endpoint, const net::client_keys* keys)
      : opts_(o), ctx_(2) {
    ctx_.set(zmq::ctxopt::max_sockets, o.agents + 64);
    agents_.resize(static_cast<size_t>(o.agents));
    for (int i = 0; i < o.agents; ++i) {
      agent& a = agents_[static_cast<size_t>(i)];
      a.name = "agent-" + std::to_string(i);
      for (int w = 0; w < o.per_host; ++w) {
        relayed_worker rw;
        rw.rid = "w" + std::to_string(w);
        rw.name = "h" + std::to_string(i) + "-w" + std::to_string(w);
        a.workers.push_back(std::move(rw));
      }
      a.sock = std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::dealer);
      a.sock->set(zmq::sockopt::linger, 0);
      a.sock->set(zmq::sockopt::routing_id, net::make_identity(a.name));
      if (keys) {
        a.sock->set(zmq::sockopt::curve_serverkey, keys->server_public);
        a.sock->set(zmq::sockopt::curve_publickey, keys->self.public_key);
        a.sock->set(zmq::sockopt::curve_secretkey, keys->self.secret_key);
      }
      a.sock->connect(endpoint);
    }
    // Which sockets have something to read: epoll over each socket's ZMQ_FD, so a pass costs
    // what arrived, not the number of agents (zmq_poll asks every socket, every time).
    epoll_ = ::epoll_create1(EPOLL_CLOEXEC);
    if (epoll_ < 0) throw error("bench control: epoll_create1 failed");
    for (size_t i = 0; i < agents_.size(); ++i) {
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u64 = i;
      const int fd = agents_[i].sock->get(zmq::sockopt::fd);
      if (::epoll_ctl(epoll_, EPOLL_CTL_ADD, fd, &ev) != 0)
        throw error("bench control: epoll_ctl failed");
    }
  }
  ~agent_pool() { ::close(epoll_); }
  agent_pool(const agent_pool&) = delete;
  agent_pool& operator=(const agent_pool&) = delete;

  /// Every agent registers, at once (a burst, as a job's workers start).
  void register_all() {
    for (auto& a : agents_) {
      if (opts_.per_host > 0)
        send(a, net::register_request{net::peer_role::client, a.name, getpid()});
      else
        send(a, net::register_request{net::peer_role::worker, a.name, getpid()});
      // ZeroMQ signals a socket's fd only once a read found it empty: read (nothing) now,
      // so that the answer wakes epoll.
      drain(a);
    }
  }

  /// Runs the agents until PRED() holds or SECONDS pass; true if PRED held.
  template <class Pred>
  bool run_until(double seconds, Pred pred) {
    const auto end = clock_type::now() + std::chrono::duration_cast<clock_type::duration>(
                                             std::chrono::duration<double>(seconds));
    while (clock_type::now() < end) {
      if (pred()) return true;
      step();
    }
    return pred();
  }

  /// Stops the first K registered agents' heartbeats (they stay connected, silent: a hung
  /// or cut-off worker). Returns their member ids.
  std::vector<uint64_t> stop_some(int k) {
    std::vector<uint64_t> ids;
    int hosts = 0;
    for (auto& a : agents_) {
      if (opts_.per_host > 0) {
        // A host stops as a whole (its agent stopped): every worker of it goes silent.
        if (hosts == k) break;
        if (!a.host_registered) continue;
        a.stopped = true;
        ++hosts;
        for (const auto& w : a.workers)
          if (w.registered) ids.push_back(w.member_id);
        continue;
      }
      if (static_cast<int>(ids.size()) == k) break;
      if (!a.registered) continue;
      a.stopped = true;
      ids.push_back(a.member_id);
    }
    return ids;
  }

  const traffic& counts() const { return counts_; }
  void reset_counts() { counts_ = traffic{}; }

  /// The newest generation any agent was told of.
  uint64_t max_generation() const {
    uint64_t g = 0;
    for (const auto& a : agents_) {
      g = std::max(g, a.generation);
      for (const auto& w : a.workers) g = std::max(g, w.generation);
    }
    return g;
  }
  /// Generations the live (not stopped) agents hold: one entry when they agree.
  std::set<uint64_t> live_generations() const {
    std::set<uint64_t> g;
    for (const auto& a : agents_) {
      if (a.stopped) continue;
      if (a.registered) g.insert(a.generation);
      for (const auto& w : a.workers)
        if (w.registered) g.insert(w.generation);
    }
    return g;
  }
  /// When each of the stopped ids was first missing from a roster a live agent received.
  const std::map<uint64_t, clock_type::time_point>& seen_gone() const { return seen_gone_; }
  void watch(const std::vector<uint64_t>& ids) {
    watched_ = std::set<uint64_t>(ids.begin(), ids.end());
    seen_gone_.clear();
  }

 private:
  void send(agent& a, const net::message& m) {
    const std::string frame = net::encode(m);
    // A full queue (the coordinator far behind) loses the frame, as a worker's would be
    // late: counted, so a run that lost registrations or beats says so.
    if (!a.sock->send(zmq::buffer(frame), zmq::send_flags::dontwait)) ++counts_.send_failures;
  }
  // A roster_update's generation (its first field, little-endian after the envelope), read
  // without decoding the rest; nullopt for anything else, and in the stop phase, which
  // reads who left.
  std::optional<uint64_t> roster_generation(std::string_view frame) const {
    if (!watched_.empty() ||
        net::frame_type(frame) != static_cast<int>(net::msg_type::roster_update) ||
        frame.size() < net::envelope_header_bytes + 8)
      return std::nullopt;
    uint64_t g = 0;
    for (int i = 7; i >= 0; --i)
      g = (g << 8) |
          static_cast<unsigned char>(frame[net::envelope_header_bytes + static_cast<size_t>(i)]);
    return g;
  }

  // A relayed worker's frame: [rid, frame], as the agent's relay sends it.
  void send_for(agent& a, const relayed_worker& w, const net::message& m) {
    const std::string frame = net::encode(m);
    const bool ok = a.sock->send(zmq::buffer(w.rid), zmq::send_flags::sndmore | zmq::send_flags::dontwait) &&
                    a.sock->send(zmq::buffer(frame), zmq::send_flags::dontwait);
    if (!ok) ++counts_.send_failures;
  }
  void register_worker(agent& a, relayed_worker& w) {
    w.registered = false;
    send_for(a, w, net::register_request{net::peer_role::worker, w.name, getpid()});
  }
  // When host agent A beats next after NOW: on the period's grid (t0_ + k x period) plus
  // its own clock skew, or (not aligned) at its own phase, spread evenly over the period.
  clock_type::time_point next_host_beat(const agent& a, clock_type::time_point now) {
    const auto period = std::chrono::duration_cast<clock_type::duration>(
        milliseconds(opts_.heartbeat_ms));
    const auto i = static_cast<int64_t>(&a - agents_.data());
    const auto phase =
        opts_.aligned
            ? std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double, std::milli>(
                  opts_.skew_ms * static_cast<double>((i * 7919) % 1000) / 1000.0))
            : period * i / opts_.agents;
    const auto since = (now - t0_ - phase) % period;
    return now - since + period;
  }

  // A host agent's period: one host_beat listing every registered worker.
  void host_beat(agent& a) {
    net::host_beat hb;
    hb.seq = ++a.seq;
    hb.want_ack = a.seq % 8 == 1;
    for (auto& w : a.workers) {
      if (!w.registered) continue;
      hb.beats.push_back(net::relayed_beat{w.rid, w.member_id, w.generation, ++w.seq});
    }
    counts_.relayed_beats += hb.beats.size();
    send(a, hb);
  }
  // What arrived for worker RID of host agent A.
  void on_relayed(agent& a, std::string_view rid, std::string_view frame, size_t bytes) {
    relayed_worker* w = nullptr;
    for (auto& x : a.workers)
      if (x.rid == rid) w = &x;
    if (w == nullptr) return;
    // Rosters, outside the stop phase: their generation only, as drain() reads them (the
    // simulated hosts' one thread would otherwise spend itself decoding lists).
    if (const auto g = roster_generation(frame)) {
      ++counts_.roster_frames;
      counts_.roster_bytes += bytes;
      w->generation = std::max(w->generation, *g);
      return;
    }
    net::decoded d = net::decode(frame, 64u << 20);
    if (!d.ok()) return;
    if (const auto* ok = std::get_if<net::register_ok>(&d.msg)) {
      w->registered = true;
      w->member_id = ok->member_id;
      w->generation = std::max(w->generation, ok->generation);
    } else if (const auto* ru = std::get_if<net::roster_update>(&d.msg)) {
      ++counts_.roster_frames;
      counts_.roster_bytes += bytes;
      w->generation = std::max(w->generation, ru->generation);
      if (!a.stopped && !watched_.empty()) {
        const auto now = clock_type::now();
        for (uint64_t id : ru->left)
          if (watched_.count(id) != 0) seen_gone_.emplace(id, now);
      }
    } else if (const auto* ack = std::get_if<net::heartbeat_ack>(&d.msg)) {
      if (ack->rejoin_required && ack->member_id == w->member_id && !a.stopped) {
        ++counts_.rejoins;
        register_worker(a, *w);
      } else if (ack->generation > w->generation) {
        w->generation = ack->generation;
      }
    } else if (std::holds_alternative<net::register_reject>(d.msg)) {
      ++counts_.rejects;
    }
  }

  // Sends the heartbeats due, then reads what arrived, waiting at most until the next one.
  void step() {
    const auto now = clock_type::now();
    const auto period = milliseconds(opts_.heartbeat_ms);
    auto next_due = now + milliseconds(5);
    for (auto& a : agents_) {
      if (opts_.per_host > 0 && a.host_registered && !a.stopped) {
        if (a.next_beat <= now) {
          host_beat(a);
          ++counts_.heartbeats;
          a.next_beat = next_host_beat(a, now);
          drain(a);
        }
        next_due = std::min(next_due, a.next_beat);
        continue;
      }
      if (!a.registered || a.stopped) continue;
      if (a.next_beat <= now) {
        // As a worker with the default coordinator timeout asks: one answer in eight.
        ++a.seq;
        const uint64_t every = opts_.ack_every > 0 ? static_cast<uint64_t>(opts_.ack_every)
                                                   : actors::max_beats_per_ack;
        send(a, net::heartbeat{a.member_id, a.generation, a.seq, every <= 1 || a.seq % every == 1});
        ++counts_.heartbeats;
        a.next_beat += period;
        if (a.next_beat <= now) a.next_beat = now + period;  // fell behind: no burst
        // A send may consume the socket's read signal (ZMQ_FD is edge-like): read now.
        drain(a);
      }
      next_due = std::min(next_due, a.next_beat);
    }
    // At least a millisecond: beats due sooner go out together with the next batch.
    const auto wait = std::chrono::duration_cast<milliseconds>(next_due - clock_type::now());
    std::array<epoll_event, 256> ready;
    const int n = ::epoll_wait(epoll_, ready.data(), static_cast<int>(ready.size()),
                               static_cast<int>(std::max<int64_t>(1, wait.count())));
    for (int i = 0; i < n; ++i) drain(agents_[ready[static_cast<size_t>(i)].data.u64]);
  }

  void drain(agent& a) {
    if (opts_.per_host > 0) return drain_host(a);
    zmq::message_t m;
    while (a.sock->recv(m, zmq::recv_flags::dontwait)) {
      const std::string_view frame(m.data<char>(), m.size());
      // Rosters are the bulk of what a forming job sends: outside the stop phase only their
      // size and generation count (the first field, little-endian after the envelope), so
      // the agents spend their two cores' share on heartbeats, not on decoding lists.
      if (const auto g = roster_generation(frame)) {
        ++counts_.roster_frames;
        counts_.roster_bytes += m.size();
        a.generation = std::max(a.generation, *g);
        continue;
      }
      net::decoded d = net::decode(frame, 64u << 20);
      if (!d.ok()) continue;
      if (const auto* ok = std::get_if<net::register_ok>(&d.msg)) {
        a.registered = true;
        a.member_id = ok->member_id;
        a.generation = std::max(a.generation, ok->generation);
        // Spread the agents' beats over the period, as independent processes would be.
        a.next_beat = clock_type::now() +
                      milliseconds(static_cast<int64_t>(opts_.heartbeat_ms) *
                                   static_cast<int64_t>(&a - agents_.data()) / opts_.agents);
      } else if (const auto* ru = std::get_if<net::roster_update>(&d.msg)) {
        ++counts_.roster_frames;
        counts_.roster_bytes += m.size();
        a.generation = std::max(a.generation, ru->generation);
        if (!a.stopped && !watched_.empty()) {
          // A watched id is seen gone when a roster says it left. (A full copy says who is
          // here by count only: a survivor sent one would never see the id go, and the run
          // would report the change as not settled.)
          const auto now = clock_type::now();
          for (uint64_t id : ru->left)
            if (watched_.count(id) != 0) seen_gone_.emplace(id, now);
        }
      } else if (const auto* ack = std::get_if<net::heartbeat_ack>(&d.msg)) {
        if (ack->rejoin_required && ack->member_id == a.member_id && !a.stopped) {
          ++counts_.rejoins;
          a.registered = false;
          send(a, net::register_request{net::peer_role::worker, a.name, getpid()});
        }
      } else if (const auto* rj = std::get_if<net::register_reject>(&d.msg)) {
        ++counts_.rejects;
        (void)rj;
      }
    }
  }

  void drain_host(agent& a) {
    std::vector<zmq::message_t> parts;
    while (true) {
      parts.clear();
      if (!zmq::recv_multipart(*a.sock, std::back_inserter(parts), zmq::recv_flags::dontwait))
        break;
      if (parts.size() == 2) {
        on_relayed(a, parts[0].to_string_view(),
                   std::string_view(parts[1].data<char>(), parts[1].size()), parts[1].size());
        continue;
      }
      net::decoded d = net::decode(std::string_view(parts.back().data<char>(), parts.back().size()),
                                   64u << 20);
      if (!d.ok()) continue;
      if (std::holds_alternative<net::register_ok>(d.msg) && !a.host_registered) {
        a.host_registered = true;
        a.next_beat = next_host_beat(a, clock_type::now());
        for (auto& w : a.workers) register_worker(a, w);
      } else if (std::holds_alternative<net::register_reject>(d.msg)) {
        ++counts_.rejects;
      }
    }
  }

  agents_options opts_;
  clock_type::time_point t0_ = clock_type::now();  ///< the simulated hosts' common grid
  zmq::context_t ctx_;
  std::vector<agent> agents_;
  int epoll_ = -1;
  traffic counts_;
  std::set<uint64_t> watched_;
  std::map<uint64_t, clock_type::time_point> seen_gone_;
};

}  // namespace cohort::cli::agents_bench
