// coordinator_node: one coordinator process, the CAF actor system, the coordinator actor and
// the ROUTER bridge it is wired to; and the CAF settings every cohort process shares.
#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "actors/coordinator.hpp"
#include "runtime/net/relay.hpp"

namespace cohort::actors {

std::unique_ptr<caf::actor_system_config> make_caf_config() {
  auto cfg = std::make_unique<caf::actor_system_config>();
  // Tuning knobs for measurements (docs/architecture.md), not configuration proper.
  const char* policy = std::getenv("COHORT_CAF_POLICY");
  const char* threads = std::getenv("COHORT_CAF_THREADS");
  const bool stealing = policy != nullptr && std::string(policy) == "stealing";
  cfg->set("scheduler.policy", stealing ? caf::atom("stealing") : caf::atom("sharing"));
  cfg->set("scheduler.max-threads", threads != nullptr ? std::max(1, std::atoi(threads)) : 2);
  return cfg;
}

int bridge_spin_us() {
  const char* env = std::getenv("COHORT_BRIDGE_SPIN_US");
  return env != nullptr ? std::max(0, std::atoi(env)) : 0;
}

coordinator_node::coordinator_node(coordinator_options opts, const std::string& bind,
                                   size_t max_message_bytes,
                                   std::shared_ptr<const net::server_keys> keys)
    : caf_cfg_(make_caf_config()), system_(std::make_unique<caf::actor_system>(*caf_cfg_)) {
  coordinator_io io;
  io.send = [this](const std::string& peer, const net::message& m) {
    if (cut_.down()) return;
    if (auto* b = out_.load()) b->send(peer, m);
  };
  io.admit = [this](const std::string& peer) {
    if (auto* b = out_.load()) b->admit(peer);
  };
  io.relay = [this](const std::string& peer) {
    if (auto* b = out_.load()) b->allow_relay(peer);
  };
  io.forget = [this](const std::string& peer) {
    if (auto* b = out_.load()) b->forget(peer);
  };
  io.drop_counts = [this] {
    std::vector<net::counter> out;
    if (auto* b = out_.load()) {
      for (auto& [name, n] : b->drop_counts()) out.push_back(net::counter{name, n});
    }
    return out;
  };
  io.caught_up = [this] {
    auto* b = out_.load();
    return b != nullptr ? b->caught_up() : std::chrono::steady_clock::now();
  };
  // Live members' heartbeats are answered on the bridge thread, never behind the actor's
  // mailbox. Not where a fault filter decides on heartbeats: it must see every one, in order.
  if (!opts.control_filter) opts.control_filter = step::job_frame_filter(opts.job);
  std::shared_ptr<net::heartbeat_table> beats;
  if (!(opts.control_filter && opts.control_filter->decides(net::msg_type::heartbeat))) {
    const auto& m = opts.membership;
    beats = std::make_shared<net::heartbeat_table>(std::chrono::milliseconds(m.heartbeat_ms),
                                                   std::chrono::milliseconds(m.timeout_ms),
                                                   std::chrono::milliseconds(4 * m.timeout_ms));
  }
  io.beats = beats;
  actor_ = system_->spawn(coordinator_actor, opts, io);
  actor_->attach_functor([this](const caf::error&) { done_ = true; });
  net::bridge_options bo;
  bo.kind = net::bridge_options::socket_kind::router;
  bo.endpoint = bind;
  bo.max_message_bytes = max_message_bytes;
  bo.spin_us = bridge_spin_us();
  bo.curve_server = std::move(keys);
  bo.term = opts.term;
  caf::actor target = actor_;
  try {
    bridge_ = std::make_unique<net::zmq_bridge>(
        bo, [this, target, beats](const net::sender& from, net::message m) {
          const std::string& peer = from.peer;
          if (cut_.down()) return;          // injected cut (partition coordinator)
          auto* self_bridge = out_.load();  // null until the constructor is done
          if (const auto* hb = std::get_if<net::host_beat>(&m)) {
            // A host agent's beat (only a registered agent's passes the bridge): each entry is
            // its worker's heartbeat, the frame the agent's own (docs/agent.md).
            on_host_beat(from, *hb, beats.get(), self_bridge, target);
            return;
          }
          if (const auto* hb = std::get_if<net::heartbeat>(&m);
              hb != nullptr && beats && self_bridge != nullptr) {
            if (const auto g = beats->on_beat(peer, hb->member_id, hb->generation,
                                              std::chrono::steady_clock::now())) {
              // Nothing changed and no ack asked for: the beat is recorded, nothing is sent.
              if (hb->want_ack || hb->generation < *g)
                self_bridge->reply(peer, net::heartbeat_ack{hb->member_id, *g, hb->seq, false});
              return;
            }
          }
          // A ping (a worker's clock probe when tracing) is answered here too: its reply_ns
          // must not wait behind the actor's mailbox, or the probe's round trip, and so the
          // bound on the clock offset, grows by the wait.
          if (const auto* p = std::get_if<net::ping>(&m); p != nullptr && self_bridge != nullptr) {
            self_bridge->reply(peer, net::pong{p->seq, p->sent_ns, net::now_ns()});
            return;
          }
          caf::anon_send(target, co_in_atom::value, from, std::move(m));
        });
  } catch (...) {
    caf::anon_send_exit(actor_, caf::exit_reason::user_shutdown);
    throw;
  }
  out_ = bridge_.get();
}

void coordinator_node::on_host_beat(const net::sender& from, const net::host_beat& hb,
                                    net::heartbeat_table* beats, net::zmq_bridge* bridge,
                                    const caf::actor& target) {
  // All of one host's entries share its frame's time: a lost host's workers fall silent
  // together and leave in one change.
  const auto now = std::chrono::steady_clock::now();
  std::vector<std::optional<uint64_t>> acked;
  if (beats != nullptr && bridge != nullptr) acked = beats->on_host_beat(from.peer, hb.beats, now);
  // The frame is the agent's; each entry is its worker's, under the worker's own name.
  const std::optional<net::key_role> role =
      from.role ? std::optional<net::key_role>(net::key_role::worker) : std::nullopt;
  for (std::size_t i = 0; i < hb.beats.size(); ++i) {
    const auto& e = hb.beats[i];
    if (e.worker.empty() || e.worker.size() > 255) continue;
    if (i < acked.size() && acked[i]) {
      // Recorded; answered only when the worker is behind.
      if (e.generation < *acked[i])
        bridge->reply(net::relay_peer(from.peer, e.worker),
                      net::heartbeat_ack{e.member_id, *acked[i], e.seq, false});
      continue;
    }
    caf::anon_send(target, co_in_atom::value, net::sender{net::relay_peer(from.peer, e.worker), role},
                   net::message{net::heartbeat{e.member_id, e.generation, e.seq, false}});
  }
  if (hb.want_ack && bridge != nullptr) bridge->reply(from.peer, net::host_beat_ack{hb.seq});
}

coordinator_node::~coordinator_node() {
  if (!done_) caf::anon_send_exit(actor_, caf::exit_reason::user_shutdown);
  wait();
  // The bridge goes last among the parts that send: frames the actor queued before quitting
  // (stop to every worker) are still flushed by the socket's linger.
  out_ = nullptr;
  bridge_.reset();
  actor_ = nullptr;
  system_.reset();
}

void coordinator_node::cut_off(uint32_t ms) { cut_.cut_for(std::chrono::milliseconds(ms)); }

void coordinator_node::request_stop(const std::string& reason) {
  caf::anon_send(actor_, co_stop_atom::value, reason);
}

void coordinator_node::request_checkpoint_stop(const std::string& by) {
  caf::anon_send(actor_, co_ckstop_atom::value, by);
}

void coordinator_node::wait() {
  caf::scoped_actor self{*system_};
  self->wait_for(actor_);
}

}  // namespace cohort::actors
