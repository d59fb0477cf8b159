// The host agent's relay thread; see host_relay.hpp.
#include "runtime/net/host_relay.hpp"

#include <pthread.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <vector>
#include <zmq_addon.hpp>

#include "runtime/core/error.hpp"
#include "runtime/net/codec.hpp"
#include "runtime/net/relay.hpp"
#include "runtime/net/zmq_bridge.hpp"

namespace cohort::net {
namespace {

using clock_type = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::atomic<uint64_t> relay_pipes{0};
constexpr int relay_hwm = 100000;
// The relay asks the coordinator to answer one host_beat in this many at most (as a worker
// does: actors::max_beats_per_ack), and often enough that it hears the coordinator four
// times within the workers' coordinator timeout: their acks depend on it.
constexpr uint64_t max_host_beats_per_ack = 8;
uint64_t host_beats_per_ack(std::chrono::milliseconds period, std::chrono::milliseconds timeout) {
  const auto n = static_cast<uint64_t>(std::max<int64_t>(1, timeout.count() / (4 * std::max<int64_t>(1, period.count()))));
  return std::min(max_host_beats_per_ack, n);
}

// The next host beat: on the wall clock's grid of PERIOD (every multiple of it since the
// epoch). Hosts whose clocks agree (NTP: a millisecond or so) beat together, so the
// coordinator reads a period's host beats in a few wake-ups instead of one each
// (docs/agent.md, "Figures": what the alignment saves).
clock_type::time_point next_on_grid(std::chrono::milliseconds period) {
  const auto p = std::chrono::duration_cast<std::chrono::nanoseconds>(period).count();
  const auto wall = std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();
  return clock_type::now() + std::chrono::nanoseconds(p - wall % p);
}

int64_t to_ns(clock_type::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

bool send_parts(zmq::socket_t& s, std::string_view a, std::string_view b) {
  try {
    if (!s.send(zmq::buffer(a), zmq::send_flags::sndmore | zmq::send_flags::dontwait)) return false;
    return s.send(zmq::buffer(b), zmq::send_flags::dontwait).has_value();
  } catch (const zmq::error_t&) {
    return false;  // EHOSTUNREACH (router_mandatory): that worker is gone
  }
}

bool send_one(zmq::socket_t& s, std::string_view f) {
  try {
    return s.send(zmq::buffer(f), zmq::send_flags::dontwait).has_value();
  } catch (const zmq::error_t&) {
    return false;
  }
}

}  // namespace

host_relay::host_relay(relay_options opts) : opts_(std::move(opts)), ctx_(1) {
  if (!is_agent_name(opts_.name))
    throw usage_error("host agent name '" + opts_.name + "' must start with 'agent-'");
  pipe_name_ = "inproc://cohort-relay-" + std::to_string(relay_pipes.fetch_add(1));
  if (opts_.keys) {
    self_ = make_keypair();
    zap_ = std::make_unique<zap_handler>(
        ctx_, std::map<std::string, key_role>{{opts_.worker_public, key_role::worker}});
  }
  heard_ns_ = to_ns(clock_type::now());
  std::promise<std::string> ready;
  auto fut = ready.get_future();
  thread_ = std::thread([this, &ready] { run(&ready); });
  try {
    endpoint_ = fut.get();
  } catch (...) {
    thread_.join();
    throw;
  }
  push_ = std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::push);
  push_->set(zmq::sockopt::linger, 0);
  push_->set(zmq::sockopt::sndhwm, relay_hwm);
  push_->connect(pipe_name_);
}

host_relay::~host_relay() { stop(); }

void host_relay::stop() {
  {
    std::lock_guard<std::mutex> lock(push_mu_);
    if (stopped_) return;
    stopped_ = true;
    if (push_) push_->send(zmq::message_t(), zmq::send_flags::dontwait);
  }
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(push_mu_);
  if (push_) push_->close();
  zap_.reset();
}

bool host_relay::wait_registered(milliseconds wait) {
  const auto until = clock_type::now() + wait;
  while (!registered_.load()) {
    if (clock_type::now() >= until || !refusal().empty()) return false;
    std::this_thread::sleep_for(milliseconds(5));
  }
  return true;
}

std::string host_relay::refusal() const {
  std::lock_guard<std::mutex> lock(state_mu_);
  return refusal_;
}

void host_relay::report_exit(const std::string& name, int64_t pid, int32_t code) {
  const std::string frame = encode(exit_notice{name, pid, code});
  std::lock_guard<std::mutex> lock(push_mu_);
  if (stopped_ || !push_) return;
  // The caller reaps on SIGCHLD: another child's signal may cut the send (EINTR, as libzmq
  // processes the socket's commands first); nothing was queued then, so it is sent again.
  for (int tries = 0; tries < 100; ++tries) {
    try {
      push_->send(zmq::buffer(frame), zmq::send_flags::dontwait);
      return;
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) return;
    }
  }
}

clock_type::time_point host_relay::heard() const {
  return clock_type::time_point(std::chrono::nanoseconds(heard_ns_.load()));
}

relay_counters host_relay::counters() const {
  std::lock_guard<std::mutex> lock(state_mu_);
  return counters_;
}

void host_relay::run(std::promise<std::string>* ready) {
  // No signal handler runs on this thread (its host, launch or the agent, reaps children on
  // SIGCHLD): its socket calls are never cut short by EINTR.
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, nullptr);
  zmq::socket_t up(ctx_, zmq::socket_type::dealer);
  zmq::socket_t down(ctx_, zmq::socket_type::router);
  zmq::socket_t pull(ctx_, zmq::socket_type::pull);
  const auto limit = static_cast<int64_t>(std::max<size_t>(2 * opts_.max_message_bytes, 1u << 20));
  try {
    for (zmq::socket_t* s : {&up, &down}) {
      s->set(zmq::sockopt::sndhwm, relay_hwm);
      s->set(zmq::sockopt::rcvhwm, relay_hwm);
      s->set(zmq::sockopt::maxmsgsize, limit);
    }
    // Its last exit notices still leave when the agent stops.
    up.set(zmq::sockopt::linger, 1000);
    up.set(zmq::sockopt::routing_id, make_identity(opts_.name));
    if (opts_.keys) {
      up.set(zmq::sockopt::curve_serverkey, opts_.keys->server_public);
      up.set(zmq::sockopt::curve_publickey, opts_.keys->self.public_key);
      up.set(zmq::sockopt::curve_secretkey, opts_.keys->self.secret_key);
    }
    down.set(zmq::sockopt::linger, 0);
    down.set(zmq::sockopt::router_mandatory, 1);
    if (zap_) {
      down.set(zmq::sockopt::curve_server, 1);
      down.set(zmq::sockopt::curve_secretkey, self_.secret_key);
      down.set(zmq::sockopt::zap_domain, "cohort");
    }
    down.bind(opts_.bind);
    up.connect(opts_.coordinator);
    pull.set(zmq::sockopt::linger, 0);
    pull.set(zmq::sockopt::rcvhwm, relay_hwm);
    pull.bind(pipe_name_);
  } catch (const zmq::error_t& e) {
    const std::string msg = "host agent: cannot bind " + opts_.bind + " or connect to " +
                            opts_.coordinator + ": " + e.what();
    const bool malformed = e.num() == EINVAL || e.num() == EPROTONOSUPPORT;
    ready->set_exception(malformed ? std::make_exception_ptr(usage_error(msg))
                                   : std::make_exception_ptr(io_error(msg)));
    return;
  }
  ready->set_value(down.get(zmq::sockopt::last_endpoint));

  relay_beats beats(milliseconds(opts_.timeout_ms));
  auto period = milliseconds(std::max(1, opts_.heartbeat_ms));
  auto coordinator_timeout = milliseconds(std::max(1, opts_.coordinator_timeout_ms));
  uint64_t term = 0;  // the coordinator's, stamped on the relay's own answers to workers
  uint64_t seq = 0;
  relay_counters c;
  const auto publish = [&] {
    std::lock_guard<std::mutex> lock(state_mu_);
    counters_ = c;
  };
  const std::string registration = encode(
      register_request{peer_role::client, opts_.name, static_cast<int64_t>(::getpid()), 0, 0});
  send_one(up, registration);
  auto next_register = clock_type::now() + milliseconds(1000);
  auto next_beat = next_on_grid(period);
  std::vector<zmq::message_t> parts;
  bool running = true;
  // When this thread last ran: after a stall of its own (a starved or stopped agent) its
  // workers' silence is first its own to catch up with, not theirs.
  auto last_wake = clock_type::now();
  bool starved = false;
  while (running) {
    const bool registered = registered_.load();
    // Workers are read only once the coordinator knows the agent: until then their frames
    // wait in the socket (a relayed frame from an unknown agent is dropped there).
    zmq::pollitem_t items[] = {{up.handle(), 0, ZMQ_POLLIN, 0},
                               {pull.handle(), 0, ZMQ_POLLIN, 0},
                               {down.handle(), 0, static_cast<short>(registered ? ZMQ_POLLIN : 0), 0}};
    const auto due = registered ? next_beat : next_register;
    const auto wait = std::max<int64_t>(
        0, std::chrono::duration_cast<milliseconds>(due - clock_type::now()).count());
    try {
      zmq::poll(items, 3, milliseconds(wait));
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      spdlog::error("host agent: poll failed: {}", e.what());
      break;
    }
    const auto now = clock_type::now();
    starved = starved || now - last_wake > 2 * period;
    last_wake = now;
    if (items[0].revents & ZMQ_POLLIN) {
      while (true) {
        parts.clear();
        if (!zmq::recv_multipart(up, std::back_inserter(parts), zmq::recv_flags::dontwait)) break;
        heard_ns_ = to_ns(clock_type::now());
        const std::string_view frame(parts.back().data<char>(), parts.back().size());
        term = std::max(term, frame_term(frame));
        if (parts.size() == 2) {
          // The coordinator's frame for a worker: [worker, frame].
          if (send_parts(down, parts[0].to_string_view(), frame))
            ++c.down;
          else
            ++c.dropped;
          continue;
        }
        if (parts.size() != 1) {
          ++c.dropped;
          continue;
        }
        decoded d = decode(frame, opts_.max_message_bytes);
        if (!d.ok()) {
          ++c.dropped;
          continue;
        }
        if (const auto* ok = std::get_if<register_ok>(&d.msg)) {
          if (ok->heartbeat_ms > 0) period = milliseconds(ok->heartbeat_ms);
          if (ok->timeout_ms > 0) beats = relay_beats(milliseconds(ok->timeout_ms));
          if (!registered_.exchange(true))
            spdlog::info("host agent: '{}' registered with {} (heartbeat {} ms, timeout {} ms)",
                         opts_.name, opts_.coordinator, period.count(), ok->timeout_ms);
          next_beat = clock_type::now();
        } else if (const auto* rej = std::get_if<register_reject>(&d.msg)) {
          std::lock_guard<std::mutex> lock(state_mu_);
          refusal_ = rej->reason;
        }
      }
    }
    if (items[1].revents & ZMQ_POLLIN) {
      while (true) {
        zmq::message_t m;
        if (!pull.recv(m, zmq::recv_flags::dontwait)) break;
        if (m.size() == 0) {
          running = false;
          break;
        }
        const std::string_view frame(m.data<char>(), m.size());
        decoded d = decode(frame, opts_.max_message_bytes);
        if (const auto* x = d.ok() ? std::get_if<exit_notice>(&d.msg) : nullptr)
          beats.forget_name(x->name);
        if (send_one(up, frame))
          ++c.exits;
        else
          ++c.dropped;
      }
    }
    if (items[2].revents & ZMQ_POLLIN) {
      const bool coordinator_heard = now - heard() < coordinator_timeout;
      while (true) {
        parts.clear();
        if (!zmq::recv_multipart(down, std::back_inserter(parts), zmq::recv_flags::dontwait)) break;
        if (parts.size() != 2 || parts[0].size() == 0 || parts[0].size() > 255) {
          ++c.dropped;
          continue;
        }
        const std::string worker = parts[0].to_string();
        const std::string_view frame(parts[1].data<char>(), parts[1].size());
        const int type = frame_version(frame) == protocol_version ? frame_type(frame) : -1;
        if (type == static_cast<int>(msg_type::heartbeat)) {
          decoded d = decode(frame, opts_.max_message_bytes);
          if (const auto* hb = d.ok() ? std::get_if<heartbeat>(&d.msg) : nullptr) {
            beats.on_beat(worker, *hb, now);
            // Its answer, when asked, says only that the coordinator is there: the coordinator
            // itself answers (through here) a worker that is behind or must rejoin.
            if (hb->want_ack && coordinator_heard &&
                send_parts(down, worker,
                           encode(heartbeat_ack{hb->member_id, hb->generation, hb->seq, false}, term)))
              ++c.acks;
            continue;
          }
        }
        if (type == static_cast<int>(msg_type::register_request)) {
          decoded d = decode(frame, opts_.max_message_bytes);
          if (const auto* r = d.ok() ? std::get_if<register_request>(&d.msg) : nullptr)
            beats.on_register(worker, *r, now);
        }
        if (send_parts(up, worker, frame))
          ++c.up;
        else
          ++c.dropped;
      }
    }
    if (registered_.load() && clock_type::now() >= next_beat) {
      host_beat hb;
      hb.seq = ++seq;
      const uint64_t every = host_beats_per_ack(period, coordinator_timeout);
      hb.want_ack = every <= 1 || seq % every == 1;
      hb.beats = beats.take(clock_type::now());
      if (send_one(up, encode(hb)))
        ++c.host_beats;
      else
        ++c.dropped;
      // After a stall of the agent's own, its workers' queued beats are read first: a
      // report waits for the next period.
      const bool judge = !starved;
      starved = false;
      for (const auto& s : judge ? beats.hung(clock_type::now()) : std::vector<relay_beats::silent>{}) {
        spdlog::warn("host agent: {} (pid {}) silent for {} ms: reported hung", s.name, s.pid,
                     s.for_ms.count());
        send_one(up, encode(exit_notice{s.name, s.pid, exit_code_hung}));
        ++c.hung;
      }
      next_beat = next_on_grid(period);
    }
    if (!registered_.load() && clock_type::now() >= next_register) {
      send_one(up, registration);
      next_register = clock_type::now() + milliseconds(1000);
    }
    publish();
  }
  publish();
}

}  // namespace cohort::net
