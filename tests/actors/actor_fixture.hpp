// What the actor tests share: a recorder of every frame an actor sends, CAF's testing
// scheduler (no threads) and a coordinator wired to both with a manual clock. No sockets,
// no sleeps.
#pragma once
#include <doctest/doctest.h>
#include <spdlog/spdlog.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "actors/coordinator.hpp"

namespace cohort::actors::testing {

using std::chrono::milliseconds;

struct sent_frame {
  std::string peer;
  net::message msg;
};

// Everything the actor under test sent, plus a clock the test moves by hand.
struct recorder {
  std::vector<sent_frame> frames;
  std::vector<std::string> admitted;
  std::vector<std::string> forgotten;
  mb::mono_time now{};  // starts at the epoch; only differences matter

  // Frames of type T sent to PEER (all peers when empty), oldest first.
  template <class T>
  std::vector<T> to(const std::string& peer = "") const {
    std::vector<T> out;
    for (const auto& f : frames) {
      if (!peer.empty() && f.peer != peer) continue;
      if (const auto* x = std::get_if<T>(&f.msg)) out.push_back(*x);
    }
    return out;
  }
};

inline std::unique_ptr<caf::actor_system_config> testing_config() {
  auto c = std::make_unique<caf::actor_system_config>();
  c->set("scheduler.policy", caf::atom("testing"));
  return c;
}

// An actor system on CAF's single-threaded testing scheduler; members in this order so the
// config outlives the system.
struct testing_system {
  std::unique_ptr<caf::actor_system_config> cfg = testing_config();
  caf::actor_system sys{*cfg};
  caf::scheduler::test_coordinator& sched =
      dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler());
  testing_system() {
    sys.await_actors_before_shutdown(false);
    spdlog::set_level(spdlog::level::warn);  // the actors narrate every join at info
  }
};

struct coordinator_fixture : testing_system {
  std::shared_ptr<recorder> rec = std::make_shared<recorder>();
  coordinator_options opts;
  caf::actor coord;

  /// TWEAK may change the options and the io (a join window, a heartbeat table) first.
  explicit coordinator_fixture(
      std::function<void(coordinator_options&, coordinator_io&)> tweak = nullptr) {
    opts.membership.heartbeat_ms = 50;
    opts.membership.timeout_ms = 300;
    opts.membership.dp = 3;
    opts.tick_ms = 25;
    coordinator_io io;
    auto r = rec;
    io.send = [r](const std::string& peer, const net::message& m) {
      r->frames.push_back({peer, m});
    };
    io.admit = [r](const std::string& peer) { r->admitted.push_back(peer); };
    io.forget = [r](const std::string& peer) { r->forgotten.push_back(peer); };
    io.drop_counts = [] { return std::vector<net::counter>{{"bad_magic", 4}}; };
    io.clock = [r] { return r->now; };
    if (tweak) tweak(opts, io);
    coord = sys.spawn(coordinator_actor, opts, io);
    sched.run();
  }
  ~coordinator_fixture() {
    caf::anon_send_exit(coord, caf::exit_reason::user_shutdown);
    sched.run();
  }

  /// M from PEER's connection, opened without keys (no role).
  void deliver(const std::string& peer, net::message m) {
    caf::anon_send(coord, co_in_atom::value, net::sender{peer, std::nullopt}, std::move(m));
    sched.run();
  }
  /// M from PEER's connection, opened with a key of ROLE (CURVE).
  void deliver_as(const std::string& peer, net::key_role role, net::message m) {
    caf::anon_send(coord, co_in_atom::value, net::sender{peer, role}, std::move(m));
    sched.run();
  }
  void register_worker(const std::string& peer, const std::string& name) {
    deliver(peer, net::register_request{net::peer_role::worker, name, 100});
  }
  // What `cohort ctl status` would show now (asked as a client over the recorded wire).
  net::status_reply status() {
    deliver("ctl", net::register_request{net::peer_role::client, "ctl", 1});
    deliver("ctl", net::status_request{++status_requests});
    const auto replies = rec->to<net::status_reply>("ctl");
    REQUIRE(!replies.empty());
    return replies.back();
  }
  uint64_t status_requests = 0;
  // Advances the manual clock and fires the coordinator's tick.
  void advance(milliseconds d) {
    rec->now += d;
    sched.trigger_timeouts();
    sched.run();
  }
};

}  // namespace cohort::actors::testing
