// The allreduce_group actor: a worker's place in its data-parallel group, as a thread and a
// mailbox around runtime/step/replica_step.hpp, which owns the step (the seat, the links of the
// generation, state transfer, restore, commit, checkpoint and evaluation cadence, reports).
// It runs on its own thread (a detached CAF actor) because a step blocks for as long as
// compute and collectives take. The worker actor forwards it the job, step openings and step
// results; it answers the coordinator directly (ready, vote, report). Decisions about commit
// and abort are the coordinator's (runtime/step/training_job.hpp).
#pragma once
#include <caf/all.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "actors/messages.hpp"
#include "runtime/core/clock_sync.hpp"
#include "runtime/net/protocol.hpp"
#include "runtime/step/dp_links.hpp"

namespace cohort::actors {

// The step's logic lives in runtime/step/; the group's thread drives it.
using step::dp_group_shared;
using step::dp_links;

/// Atoms of the worker -> group protocol.
using co_job_atom = caf::atom_constant<caf::atom("co_job")>;    ///< (job_spec, member, gen)
using co_open_atom = caf::atom_constant<caf::atom("co_open")>;  ///< (step_open, member, rank)
using co_res_atom = caf::atom_constant<caf::atom("co_res")>;    ///< (step_result)
using co_next_atom =
    caf::atom_constant<caf::atom("co_next")>;  ///< group -> itself: (step_open, member, rank)
using co_fatal_atom = caf::atom_constant<caf::atom("co_fatal")>;  ///< group -> worker: (why)
using co_fault_atom = caf::atom_constant<caf::atom("co_fault")>;  ///< (fault_order)

/// What the group needs from its worker process.
struct dp_group_io {
  /// To the coordinator (thread-safe).
  std::function<void(const net::message&)> send;
  /// Rendezvous-store call through the worker's connection (worker_node::kv_call).
  std::function<net::kv_reply(net::message, std::chrono::milliseconds)> kv_call;
  /// The address the data plane uses when comm.interface is auto (worker_io::data_host).
  std::string data_host = "127.0.0.1";
  /// The worker's CURVE keys: a pipeline's p2p channels admit only the job's worker key.
  /// Null: plain ZeroMQ (a coordinator without keys).
  std::shared_ptr<const net::client_keys> keys;
  /// The coordinator's clock against this process's (telemetry's trace spans).
  std::function<clock_sync::estimate()> clock;
  /// The job cannot run in this process (bad config, missing data): the worker exits 1.
  std::function<void(const std::string& why)> fatal;
  /// Fault injection (hang): the worker sends no heartbeat for this long.
  std::function<void(uint32_t ms)> mute_heartbeats;
  /// Fault injection (partition): no heartbeats and no control frames either way for this
  /// long, while the process goes on.
  std::function<void(uint32_t ms)> cut_off;
};

/// The group actor (spawn it detached). Messages:
///   (co_job, job_spec, member_id, generation)  build the seat once (a stage: at its first
///                                              step_open), answer worker_ready
///   (co_open, step_open, member_id, rank)      run the step, answer step_vote
///   (co_next, step_open, member_id, rank)      the group to itself: a commit window's next
///                                              step, run unless an abort came first
///   (co_res, step_result)                      commit (apply) or abort (drop); after the
///                                              last step: evaluate (rank 0), report; in a
///                                              window an abort answers worker_ready
///   (co_fault, fault_order)                    carry out an injected fault in that step
caf::behavior dp_group_actor(caf::event_based_actor* self, dp_group_io io,
                             std::shared_ptr<dp_group_shared> shared);

}  // namespace cohort::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(cohort::net::job_spec)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(cohort::net::step_open)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(cohort::net::step_result)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(cohort::net::fault_order)
