// The elastic NCCL decision of one worker at a generation change: keep the communicator,
// shrink it (ncclCommShrink), build a new one from a unique id, or leave the group. A pure
// function of the two memberships, this worker's name and the NCCL version: no NCCL call,
// no clock, no store. Running the chosen path under a deadline is runtime/comm/deadline_call.*;
// wiring it into the step is not done yet (docs/gpu.md, "Elastic NCCL").
//
//   old generation g (ranks 0..n-1)        new generation g' > g
//        |                                      |
//        +--> only departures, order kept, NCCL >= 2.27, this worker holds g's comm
//        |        --> shrink: exclude the departed ranks (NCCL_SHRINK_ABORT if one died/hung)
//        +--> a joiner, a reordering, no departure, NCCL < 2.27 --> new init from a unique id
//        +--> this worker is not in g' --> leave
//        +--> the group shrinks but this worker lost g's comm --> leave (rejoin as new)
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace cohort::comm {

/// ncclGetVersion() of the first NCCL with ncclCommShrink (2.27.0).
constexpr int nccl_shrink_min_version = 22700;

/// Why a member of the old generation is not in the new one.
enum class departure_kind {
  left,  ///< asked to go (drain, scale down): its communicator is idle
  died,  ///< its process is gone: collectives in flight on the parent never finish
  hung,  ///< alive but stuck (heartbeats or a collective timed out): treated as dead
};

/// One generation's NCCL group: rank r is members[r] (the roster's member names).
struct nccl_membership {
  std::uint64_t generation = 0;
  std::vector<std::string> members;
};

/// What a worker knows at a generation change.
struct nccl_rebuild_input {
  nccl_membership old_gen;  ///< the generation this worker's communicator was built for
  nccl_membership new_gen;  ///< the generation to build
  std::string self;         ///< this worker's member name
  /// Why each departed member went; a departed member not listed counts as died (the
  /// cautious case: the parent may hold collectives that never finish).
  std::map<std::string, departure_kind> departed;
  int nccl_version = 0;  ///< gpu::nccl_version(); 0 when NCCL is not compiled
  /// This worker holds a communicator of old_gen it can shrink (false: it is new, its
  /// abort did not return, or its last rebuild failed).
  bool holds_old = true;
};

enum class nccl_rebuild_path {
  keep,      ///< same generation: nothing to do
  shrink,    ///< ncclCommShrink of the old communicator, `excluded` removed
  new_init,  ///< ncclCommInitRankConfig from a unique id published under the new generation
  leave,     ///< this worker is not part of the new group: drop the communicator and go
};

/// "keep", "shrink", "new init", "leave".
const char* to_string(nccl_rebuild_path p);

/// The decision, the same on every member for the group-wide fields (path, excluded,
/// abort_parent, new_rank, size): each is a function of the two memberships only.
struct nccl_rebuild_plan {
  nccl_rebuild_path path = nccl_rebuild_path::keep;
  std::vector<int> excluded;  ///< old ranks to pass to ncclCommShrink, ascending
  /// NCCL_SHRINK_ABORT: a departed member died or hung, so the parent may have operations
  /// in flight that must be ended before the shrink.
  bool abort_parent = false;
  std::vector<int> new_rank;  ///< per old rank: its rank in the new generation, -1 if gone
  int rank = -1;              ///< this worker's rank in the new generation; -1 on leave
  int size = 0;               ///< ranks in the new generation
  std::string reason;         ///< one line for the log and the events table
};

/// Decides how this worker reaches the new generation. Throws usage_error (what is wrong,
/// which generation) for an input no roster can produce: an empty or duplicate member
/// name, a new generation not after the old one, an empty self.
nccl_rebuild_plan plan_nccl_rebuild(const nccl_rebuild_input& in);

}  // namespace cohort::comm
