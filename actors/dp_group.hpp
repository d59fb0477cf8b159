// The allreduce_group actor: a worker's seat in its data-parallel group. It owns the
// trainer (model, data, optimizer), the communicator of the current generation and its
// bucket engine, and runs on its own thread (a detached CAF actor) because a step blocks
// for as long as compute and collectives take. The worker actor forwards it the job, step
// openings and step results; it answers the coordinator directly (ready, vote, report).
// Decisions about commit and abort are the coordinator's (actors/training_job.hpp).
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
#include "runtime/net/protocol.hpp"

namespace cohort::comm {
class communicator;
class build_abort;
}  // namespace cohort::comm

namespace cohort::actors {

/// Atoms of the worker -> group protocol.
using co_job_atom = caf::atom_constant<caf::atom("co_job")>;      ///< (job_spec, member, gen)
using co_open_atom = caf::atom_constant<caf::atom("co_open")>;    ///< (step_open, member, rank)
using co_res_atom = caf::atom_constant<caf::atom("co_res")>;      ///< (step_result)
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
  /// The job cannot run in this process (bad config, missing data): the worker exits 1.
  std::function<void(const std::string& why)> fatal;
  /// Fault injection (hang): the worker sends no heartbeat for this long.
  std::function<void(uint32_t ms)> mute_heartbeats;
  /// Fault injection (partition): no heartbeats and no control frames either way for this
  /// long, while the process goes on.
  std::function<void(uint32_t ms)> cut_off;
};

/// Shared between the group's thread and the worker actor, so that a newer generation
/// announced by the coordinator aborts a collective the group is blocked in at once,
/// instead of waiting for the collective's timeout, and a build of an older generation's
/// links (a rendezvous, a TCP connect to a peer that is gone) as well.
///
/// The order of the two threads does not matter: abort_below(G) raises a floor, and
/// whatever the group begins or installs later for a generation below the floor is
/// aborted at once (a newer roster can arrive before the group starts building).
class dp_group_shared {
 public:
  /// Called by the group before it builds the links of GENERATION: the handle every
  /// builder of that generation takes (comm::transport_options::cancel). Already aborted
  /// when GENERATION is below the floor.
  std::shared_ptr<comm::build_abort> begin_build(uint64_t generation);
  /// Called by the group when it installs (or drops: nullptr) its communicator. One of a
  /// generation below the floor is aborted at once.
  void install(comm::communicator* c, uint64_t generation);
  /// Also aborted with the communicator: the DP group's further lanes, the other links of
  /// a pipeline stage (its TP communicator, its point-to-point channel). Cleared by install(); run
  /// at once below the floor.
  void install_extra(std::function<void()> abort);
  /// Raises the floor to `generation`, and aborts the build, the communicator and the
  /// extras if they belong to a generation below it.
  void abort_below(uint64_t generation);
  /// Aborts whatever is installed or being built (the worker was declared dead: the
  /// generations it knew are over; the next one it joins is higher).
  void abort_all();
  /// abort_all, and every build or install after it too (process exit).
  void shut();

 private:
  void abort_locked(const std::string& why);
  std::mutex mu_;
  comm::communicator* comm_ = nullptr;
  std::vector<std::function<void()>> extra_;
  std::shared_ptr<comm::build_abort> build_;
  uint64_t generation_ = 0;  ///< of what is installed or being built
  uint64_t floor_ = 0;       ///< generations below it are over
};

/// Collective timeout a group uses, from fault_tolerance.timeout_ms: a peer that stops
/// answering is normally noticed by the coordinator first (which aborts the collective
/// through dp_group_shared); this bound only catches what the coordinator cannot see, and
/// must cover compute skew between workers on a loaded machine.
int collective_timeout_ms(int fault_timeout_ms);

/// The group actor (spawn it detached). Messages:
///   (co_job, job_spec, member_id, generation)  build the trainer once, answer worker_ready
///   (co_open, step_open, member_id, rank)      run the step, answer step_vote
///   (co_res, step_result)                      commit (apply) or abort (drop); after the
///                                              last step: evaluate (rank 0), report
///   (co_fault, fault_order)                    carry out an injected fault in that step
caf::behavior dp_group_actor(caf::event_based_actor* self, dp_group_io io,
                             std::shared_ptr<dp_group_shared> shared);

}  // namespace cohort::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(cohort::net::job_spec)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(cohort::net::step_open)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(cohort::net::step_result)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(cohort::net::fault_order)
