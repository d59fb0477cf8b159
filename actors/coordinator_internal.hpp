// What the coordinator actor's source files share: coordinator.cpp (the wire, membership,
// the job), coordinator_joins.cpp (registrations, the join window, spares),
// coordinator_store.cpp (the rendezvous store's requests) and coordinator_admin.cpp
// (ctl drain / scale / inject). Not for use
// outside the coordinator actor; its interface is coordinator.hpp.
#pragma once
#include <cstdint>
#include <string>

#include "actors/coordinator.hpp"

namespace cohort::actors::coord {

using self_ptr = caf::stateful_actor<coordinator_state>*;

/// The coordinator's clock (io.clock, or steady_clock), and the same in seconds for the job.
mb::mono_time now(self_ptr self);
double now_s(self_ptr self);
/// Logs TEXT ("coordinator: TEXT"), a warning a peer's frame caused (a spoofed heartbeat, a
/// refused registration): a peer may send such frames at will, so at most a few lines a
/// period are written, the next one counting those left out (log_limiter).
void warn_peer(self_ptr self, const std::string& text);
/// Sends M to PEER unless `drop control` drops it.
void send(self_ptr self, const std::string& peer, const net::message& m);
/// Adopts a decision's roster; true when the generation grew (the caller then broadcasts).
bool adopt(self_ptr self, mb::decision&& d);
/// Broadcasts the new roster, tells the job, and answers store waiters of older generations.
void on_new_generation(self_ptr self);
/// Sends what the job decided and acts on it (new generation, leave, scale, stop).
void run_job(self_ptr self, job_actions a);

/// The roster's members that are not leaving (what a scale counts, with the join window).
inline int live_members(const mb::roster& r) {
  return static_cast<int>(r.members.size()) - r.count(mb::member_state::leaving);
}

// coordinator_joins.cpp

/// A register_request from PEER (a worker or a client): answered now, or put in the join
/// window, or kept as a spare.
void on_register(self_ptr self, const std::string& peer, const net::register_request& r);
/// The join window's timer: admits its registrations as one generation once it is closed,
/// or complete (nobody else could enter with them: mb::join_window_complete).
void close_joins(self_ptr self);
/// Fills free seats with waiting spares, oldest first (before a roster goes out).
void seat_spares(self_ptr self);
/// Tells everyone waiting to join (spares, the join window) to stop.
void stop_joiners(self_ptr self, const net::stop& s);

// coordinator_store.cpp

/// The store's owner id of a connection: its pending waits are capped per owner and go when
/// the member it registered leaves the roster.
uint64_t store_owner(const std::string& peer);
/// Answers a store waiter that a set, an expiry or a dropped generation completed.
void answer_waiter(self_ptr self, const net::kv::reply& r);
/// A kv_set, kv_get or kv_wait from PEER: answered now, or parked as a waiter.
void on_kv(self_ptr self, const std::string& peer, const net::message& m);

// coordinator_admin.cpp

/// Member ID leaves at the next step boundary (ctl drain, SIGTERM to the worker, scale
/// down). Without a job there are no steps: it leaves now.
void drain(self_ptr self, mb::member_id id);
/// Moves the member count toward TARGET: asks the launcher for more workers, or drains
/// the highest ranks. Returns why it cannot (empty: under way). `ctl scale` asks it only once
/// the workers can be counted (a new leader's have re-attached); a scale fault fires at a
/// step's open, after they have.
std::string scale_to(self_ptr self, int target, const std::string& spec);
/// The newest scale order again, for the workers it asked for that are not here yet, to
/// the launcher that has just registered: one registered from a connection that closed
/// (an attempt launch gave up on, whose registration came late) took the order before.
/// The launcher carries out each order once (scale_order::seq).
void resend_scale(self_ptr self);
/// Stops the training job early with a checkpoint (training_job::stop_early), BY asking:
/// empty when it will, else why not.
std::string checkpoint_stop(self_ptr self, const std::string& by);
/// ctl drain / scale / inject, and a worker's own drain on SIGTERM: decided by the role of
/// the key that opened FROM's connection, answered to it.
void on_admin(self_ptr self, const net::sender& from, const net::admin_request& a);

}  // namespace cohort::actors::coord
