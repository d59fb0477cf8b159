// worker_node: one worker process's parts around the worker actor: the DEALER bridge to
// the coordinator (its candidates' with standbys), the heartbeat thread, rendezvous-store
// calls, and the frames an injected partition holds back. The actor itself is worker.cpp.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "actors/coordinator.hpp"
#include "actors/worker.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/trace.hpp"
#include "runtime/net/host_address.hpp"

namespace cohort::actors {

using std::chrono::milliseconds;

// A frame from the coordinator: kv replies go straight to their waiting caller, the rest
// to the actor.
void worker_node::deliver(worker_shared& shared, kv_pending& kv, const caf::actor& target,
                          const std::string& peer, net::message m) {
  // Any word from the coordinator proves it alive, even while the actor is busy.
  shared.unacked = 0;
  if (auto* p = std::get_if<net::pong>(&m)) {
    // The answer to a clock probe (tracing): timed here, not after the actor's mailbox.
    shared.clock.sample(static_cast<int64_t>(p->sent_ns), static_cast<int64_t>(p->reply_ns),
                        static_cast<int64_t>(net::now_ns()));
    return;
  }
  if (auto* r = std::get_if<net::kv_reply>(&m)) {
    std::lock_guard<std::mutex> lock(kv.mu);
    auto it = kv.waiting.find(r->request_id);
    if (it != kv.waiting.end()) {
      it->second.set_value(std::move(*r));
      kv.waiting.erase(it);
    }
    return;
  }
  caf::anon_send(target, co_in_atom::value, peer, std::move(m));
}

void worker_node::send_out(const net::message& m) {
  if (shared_->link.hold_out(m)) return;
  flush_held();
  if (auto* b = out_.load()) b->send(std::string(), m);
}

void worker_node::flush_held() {
  auto [out, in] = shared_->link.release();
  if (auto* b = out_.load())
    for (const auto& m : out) b->send(std::string(), m);
  for (auto& [peer, m] : in) deliver(*shared_, *kv_, actor_, peer, std::move(m));
}

worker_node::worker_node(const std::string& endpoint, worker_options opts, size_t max_message_bytes)
    : coordinator_timeout_ms_(opts.coordinator_timeout_ms),
      caf_cfg_(make_caf_config()),
      system_(std::make_unique<caf::actor_system>(*caf_cfg_)) {
  // Order: actor (silent until co_start), then the bridge that feeds it, then co_start.
  worker_io io;
  io.send = [this](const net::message& m) { send_out(m); };
  io.on_exit = [this](int code) { exit_code_ = code; };
  io.kv_call = [this](net::message req, std::chrono::milliseconds timeout) {
    return kv_call(std::move(req), timeout);
  };
  io.data_host = net::local_address_toward(opts.route_to.empty() ? endpoint : opts.route_to);
  if (opts.ha()) {
    io.reconnect = [this](const std::string& ep) {
      if (bridge_) bridge_->reconnect(ep);
    };
    io.term = [this] { return bridge_ ? bridge_->term_floor() : 0; };
  }
  actor_ = system_->spawn(worker_actor, opts, io, shared_);
  actor_->attach_functor([this](const caf::error&) {
    done_ = true;
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
  });
  net::bridge_options bo;
  bo.kind = net::bridge_options::socket_kind::dealer;
  bo.endpoint = endpoint;
  bo.max_message_bytes = max_message_bytes;
  bo.identity = net::make_identity("worker");
  bo.spin_us = bridge_spin_us();
  bo.curve_client = opts.keys;
  if (opts.ha()) {
    // The leader's process died (its socket closed): look for the next one now, not after
    // its silence.
    caf::actor to = actor_;
    bo.on_disconnect = [to] { caf::anon_send(to, co_lost_atom::value); };
  }
  {
    caf::actor to = actor_;
    bo.on_version_mismatch = [to, endpoint](int version) {
      caf::anon_send(to, co_version_atom::value,
                     "the coordinator at " + endpoint + " speaks cohort protocol v" +
                         std::to_string(version) + ", this worker v" +
                         std::to_string(net::protocol_version) +
                         ": run the same cohort build on both");
    };
  }
  auto shared = shared_;
  auto kv = kv_;
  caf::actor target = actor_;
  try {
    bridge_ = std::make_unique<net::zmq_bridge>(
        bo, [shared, kv, target](const net::sender& from, net::message m) {
          if (shared->link.hold_in(from.peer, m)) return;  // it arrives when the cut ends
          deliver(*shared, *kv, target, from.peer, std::move(m));
        });
  } catch (...) {
    caf::anon_send_exit(actor_, caf::exit_reason::user_shutdown);
    throw;
  }
  out_ = bridge_.get();
  caf::anon_send(actor_, co_start_atom::value);
  heartbeats_ = std::thread([this] { heartbeat_loop(); });
}

worker_node::~worker_node() {
  if (!done_) caf::anon_send_exit(actor_, caf::exit_reason::user_shutdown);
  wait();
  out_ = nullptr;
  bridge_.reset();
  actor_ = nullptr;
  system_.reset();
}

int worker_node::wait() {
  {
    caf::scoped_actor self{*system_};
    self->wait_for(actor_);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_heartbeats_ = true;
  }
  cv_.notify_all();
  if (heartbeats_.joinable()) heartbeats_.join();
  return exit_code_.load();
}

net::kv_reply worker_node::kv_call(net::message req, std::chrono::milliseconds timeout) {
  uint64_t id = 0;
  std::future<net::kv_reply> answer;
  {
    std::lock_guard<std::mutex> lock(kv_->mu);
    id = kv_->next_id++;
    answer = kv_->waiting[id].get_future();
  }
  const bool is_kv = std::visit(
      [id](auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, net::kv_set> || std::is_same_v<T, net::kv_get> ||
                      std::is_same_v<T, net::kv_wait>) {
          x.request_id = id;
          return true;
        } else {
          return false;
        }
      },
      req);
  COHORT_CHECK(is_kv);
  send_out(req);
  if (answer.wait_for(timeout) == std::future_status::ready) return answer.get();
  {
    std::lock_guard<std::mutex> lock(kv_->mu);
    kv_->waiting.erase(id);  // a late answer finds nobody and is dropped
  }
  return net::kv_reply{
      id, net::kv_status::timeout, "",
      "no answer from the coordinator within " + std::to_string(timeout.count()) + " ms"};
}

void worker_node::request_leave() { caf::anon_send(actor_, co_leave_atom::value); }

void worker_node::heartbeat_loop() {
  using clock = std::chrono::steady_clock;
  uint64_t seq = 0;
  uint64_t probes = 0;  // heartbeats since tracing began (clock probes ride on some)
  bool lost_reported = false;
  auto next = clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_heartbeats_) {
    const uint32_t hb = shared_->heartbeat_ms.load();
    const auto period = milliseconds(hb > 0 ? hb : 50);
    next += period;
    // A long pause (SIGSTOP, overloaded machine) must not turn into a burst of beats.
    if (next < clock::now()) next = clock::now() + period;
    cv_.wait_until(lock, next, [this] { return stop_heartbeats_; });
    if (stop_heartbeats_) break;
    flush_held();  // a cut (partition) that ended: what it held goes now, in order
    const uint64_t id = shared_->member_id.load();
    if (id == 0) continue;
    // An injected hang: silent, as a stopped process would be.
    if (shared_->link.muted()) continue;
    lock.unlock();
    // An ack every few beats proves the coordinator alive well within the timeout (any frame
    // from it counts too); the beats between cost it no answer.
    const uint32_t lost_ms = shared_->lost_after_ms.load();
    const uint64_t limit_ms =
        lost_ms > 0 ? lost_ms : static_cast<uint64_t>(coordinator_timeout_ms_);
    const uint64_t ack_every = std::clamp<uint64_t>(
        limit_ms / (4 * static_cast<uint64_t>(period.count())), 1, max_beats_per_ack);
    ++seq;
    if (auto* b = out_.load())
      b->send(std::string(),
              net::heartbeat{id, shared_->generation, seq, seq % ack_every == 1 || ack_every == 1});
    // Tracing: a clock probe with each of the first 16 beats, then with every 10th; the
    // coordinator's pong says its time (deliver() times the answer, clock_sync keeps the
    // best of the last 16).
    if (trace::enabled() && (++probes <= 16 || probes % 10 == 0))
      if (auto* b = out_.load()) b->send(std::string(), net::ping{seq, net::now_ns()});
    const uint64_t unacked = ++shared_->unacked;
    // Counted in beats actually sent, not wall time: a process resumed after SIGSTOP has
    // sent nothing meanwhile and must not conclude the coordinator is gone.
    if (unacked * period.count() < limit_ms) {
      lost_reported = false;  // heard from since (ha: a new leader may be lost again)
    } else if (!lost_reported) {
      lost_reported = true;
      caf::anon_send(actor_, co_lost_atom::value);
    }
    lock.lock();
  }
}

}  // namespace cohort::actors
