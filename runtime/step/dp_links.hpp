// The data plane of one generation for a worker's seat: the DP group's communicators (one
// per lane) with their bucket engine, and for a pipeline stage its TP group and its
// point-to-point channel to the neighbouring stages; and dp_group_shared, through which the
// worker actor aborts them when the coordinator announces a newer generation.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/comm/communicator.hpp"
#include "runtime/comm/regroup.hpp"
#include "runtime/core/comm_choices.hpp"
#include "runtime/net/curve.hpp"
#include "runtime/net/protocol.hpp"
#include "runtime/nn/moe.hpp"

namespace cohort {
struct config;
}
namespace cohort::comm {
class build_abort;
class bucket_engine;
class p2p_channel;
}  // namespace cohort::comm
namespace cohort::train {
class seat;
}

namespace cohort::step {

class remote_kv;

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
  /// at once below the floor. INTERRUPT, when given, is what a newer generation calls instead
  /// of ABORT (a communicator the survivors may shrink: communicator::interrupt).
  void install_extra(std::function<void()> abort, std::function<void()> interrupt = {});
  /// Raises the floor to `generation`, and aborts the build, the communicator and the
  /// extras if they belong to a generation below it. The DP group's communicators are
  /// interrupted, not aborted (communicator::interrupt): with NCCL the survivors of a
  /// departure shrink them (comm::regroup); every other backend aborts.
  void abort_below(uint64_t generation);
  /// Aborts whatever is installed or being built (the worker was declared dead: the
  /// generations it knew are over; the next one it joins is higher).
  void abort_all();
  /// abort_all, and every build or install after it too (process exit).
  void shut();
  /// True once after abort_all: the group's next build drops what the links kept for a
  /// shrink (dp_links::prior), since this worker comes back as a new member.
  bool take_rejoined();

 private:
  void abort_locked(const std::string& why, bool interrupt);
  struct extra {
    std::function<void()> abort, interrupt;
  };
  std::mutex mu_;
  comm::communicator* comm_ = nullptr;
  std::vector<extra> extra_;
  std::shared_ptr<comm::build_abort> build_;
  uint64_t generation_ = 0;  ///< of what is installed or being built
  uint64_t floor_ = 0;       ///< generations below it are over
  bool rejoined_ = false;    ///< abort_all since the last take_rejoined
};

/// The links of one generation (empty between generations).
struct dp_links {
  std::unique_ptr<comm::communicator> comm;  ///< the DP group, lane 0
  /// Further communicators of the DP group (comm.lanes), so buckets overlap in flight.
  std::vector<std::unique_ptr<comm::communicator>> lanes;
  std::unique_ptr<comm::bucket_engine> engine;  ///< over comm and lanes, the seat's buffer
  std::unique_ptr<comm::communicator> tp_comm;  ///< a stage's TP group (tp > 1)
  std::unique_ptr<comm::p2p_channel> p2p;       ///< a stage's neighbours (pp > 1)
  /// Sharded parameters (train.zero: 3, a group of two or more): the DP group once more, for
  /// the blocks' gathers that forward and backward run while the engine sums on its lanes.
  std::unique_ptr<comm::communicator> params;
  /// Expert parallelism (parallel.ep, a group of two or more): this worker's EP group, over
  /// which the MoE layers' tokens travel to their experts during forward and backward.
  std::unique_ptr<comm::communicator> experts;
  uint64_t generation = 0;
  int rank = -1, size = 0;  ///< this worker's DP rank and the group's size
  /// comm.backend: nccl: the DP group's communicators (comm, lanes, params) of the last
  /// generation, interrupted but not aborted, kept by drop() for the next build to shrink
  /// (comm::regroup); empty with every other backend.
  comm::prior_group prior;
  /// How the last build made the DP group's communicators (net::step_timing::regroup_path:
  /// 0 a host backend, 1 new init, 2 shrink, 3 new init after a failed shrink) and its time.
  uint64_t regroup_path = 0;
  uint64_t regroup_us = 0;

  dp_links();
  ~dp_links();
  dp_links(const dp_links&) = delete;
  dp_links& operator=(const dp_links&) = delete;

  /// Built for this generation, rank and size, and nothing of it is dead.
  bool current(const net::step_open& o, int rank) const;
  /// Aborts and drops everything (joining the engine's threads), and uninstalls it from
  /// SHARED; the DP group's communicators, where they can still be shrunk (an NCCL group a
  /// newer generation interrupted), go to `prior` instead of being aborted. A communicator whose abort did not return (stuck(): a thread left inside NCCL,
  /// holding the device) goes to the stuck handler first: by default the process leaves
  /// as a dead member (set_stuck_handler).
  void drop(dp_group_shared& shared);
  /// The links whose abort did not return, named ("the DP group (nccl)", ...); empty if none.
  std::vector<std::string> stuck() const;
  /// Bytes the DP group's communicators posted to the transport so far (all lanes).
  comm::comm_traffic traffic() const;
};

/// What dp_links::drop does with a worker whose abort did not return: TEXT says which links
/// and why. The default logs it and ends the process at once with exit_device_stuck
/// (std::_Exit: no destructor may wait on the stuck thread); the coordinator then sees the
/// member gone (the launcher's exit notice, or its silence) and the group goes on without it,
/// as after a kill. Tests install their own (null: the default again).
void set_stuck_handler(std::function<void(const std::string& text)> handler);

/// What building a generation's links needs from the worker.
struct link_context {
  const config& cfg;
  std::string data_host;  ///< where this worker's pairs and channel listen
  remote_kv& kv;          ///< the coordinator's store, keyed by the generation
  dp_group_shared& shared;
  std::shared_ptr<const net::client_keys> keys;  ///< p2p channels admit only their holders
  /// This worker as its DP group's device check names it ("member 7 (10.0.0.2)").
  std::string member;
};

/// Drops L's old links and builds generation o.generation's for SEAT at DP rank RANK: the DP
/// group (group "dp" for the whole model, "dp.s<stage>.t<tp>" for a stage) with its lanes
/// and bucket engine over the seat's reduction buffer, and for a stage its TP group and
/// point-to-point channel, handed to the seat. Every member sets up the groups in the same
/// order and none waits on another's later group, so the rendezvous cannot deadlock; a
/// newer roster (shared.abort_below) ends a build that waits for a peer that is gone.
void build_links(dp_links& l, const link_context& ctx, const net::step_open& o, int rank,
                 train::seat& seat, bool staged);

/// Where DP rank RANK of REPLICAS sits for expert parallelism EP (runtime/nn/moe.hpp).
using nn::expert_group;
using nn::expert_place;

/// The bucket size (MiB) SEAT's DP engine is planned with: comm.bucket_mb, capped under
/// train.zero: 2 (with train.zero_release) at an eighth of the reduction buffer, so that a
/// bucket's pages go back while backward still runs.
double bucket_mb_for(const config& cfg, train::seat& seat);

/// The device a DP group's communicators are built for (make_communicator's `device`): the
/// seat's device ("cuda:N") with comm.backend nccl, where the trainer hands the group device
/// memory; "cpu" with every other backend, auto included, whose transports read host memory
/// (a GPU seat stages its buckets there).
std::string link_device(comm_backend backend, const std::string& seat_device);

/// Collective timeout a group uses, from fault_tolerance.timeout_ms: a peer that stops
/// answering is normally noticed by the coordinator first (which aborts the collective
/// through dp_group_shared); this bound only catches what the coordinator cannot see, and
/// must cover compute skew between workers on a loaded machine. max(10 s, 20 x it), at most
/// the rendezvous store's longest wait (net::kv::longest_wait), which the group's build asks.
int collective_timeout_ms(int fault_timeout_ms);

}  // namespace cohort::step
