// A device group's communicators at a generation change: when every member of the new
// generation survived from the one before, in its old order, the members shrink the
// communicators they hold (ncclCommShrink: no bootstrap, no unique id); otherwise, or when
// a shrink fails on any member, every member builds new ones. The group agrees on the path
// through the rendezvous store before any NCCL call (rank 0 reads every member's record and
// publishes the plan), and again on the shrink's outcome, so no member keeps a shrunk
// communicator its peers gave up. Owns that agreement; the rule is plan_nccl_rebuild
// (nccl_elastic.hpp), the communicators are the backends'.
//
//   every member: "what I hold" (generation, rank, size | none) --> rank 0
//   rank 0: plan_nccl_rebuild over the records --> "plan": shrink (excluded) | new init
//   shrink: every member shrinks each communicator --> "ok" | why not --> rank 0
//   rank 0: "verdict": ok | retry --> on retry, every member new-inits (keys tagged "retry")
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/communicator.hpp"
#include "runtime/comm/kv_client.hpp"
#include "runtime/comm/nccl_elastic.hpp"

namespace cohort::comm {

/// What a member kept from the generation before: its communicators of one group (the
/// group's first, then its further ones, each over the same ranks), and the generation,
/// rank and size they were built for. Empty for a new member.
struct prior_group {
  std::uint64_t generation = 0;
  int rank = -1;
  int size = 0;
  std::vector<std::unique_ptr<communicator>> comms;
  /// There is something, and every communicator can still be shrunk (can_shrink()).
  bool holds() const;
};

/// How a member's communicators of the new generation came to be.
struct regroup_result {
  std::vector<std::unique_ptr<communicator>> comms;     ///< as many as asked, in order
  nccl_rebuild_path path = nccl_rebuild_path::new_init;  ///< shrink or new_init
  std::vector<int> excluded;  ///< shrink: the old ranks left out, ascending
  bool fell_back = false;     ///< a shrink was planned, some member's failed: new init after it
  double ms = 0;              ///< on this member, from the first record to the last communicator
  std::string reason;         ///< one line: the plan's reason (and the fallback's cause)
};

/// A member's record of what it holds ("<generation> <rank> <size>", or "none").
std::string prior_record(const prior_group& prior, std::size_t count);

/// Rank 0's plan from every member's record (RECORDS[r] is rank r's), as published:
/// "shrink <abort 0|1> <excluded, comma separated>\n<reason>" or "new_init\n<reason>".
/// The shrink needs every member to hold communicators of one older generation and size, at
/// distinct old ranks in ascending order, at least one old rank gone, and NCCL 2.27+
/// (NCCL_VERSION); departures count as deaths (NCCL_SHRINK_ABORT), since a member cannot
/// tell a drain from a kill here. Pure.
std::string plan_regroup(const std::vector<std::string>& records, std::uint64_t generation,
                         int nccl_version);

/// Builds COUNT communicators of GROUP (the store's keys: gen/<generation>/<group>/regroup/...)
/// for rank RANK of SIZE in GENERATION, from PRIOR where the group can shrink (each of
/// PRIOR's communicators shrunk with the plan's ranks excluded, bounded by
/// SHRINK_TIMEOUT_MS), else with MAKE_NEW(k, tag) for k = 0..COUNT-1 (tag "" at first,
/// "retry" after a failed shrink: use it in the new communicators' store keys, so that a
/// fallback never reads an id of the attempt before). PRIOR's communicators are dropped
/// (aborted) before any new one is built. Every member of the generation must call it.
/// Throws what MAKE_NEW throws, and comm_error when a record does not come within TIMEOUT
/// (after the shrinks: TIMEOUT plus COUNT shrink bounds, since a member reports only once its
/// shrinks ended; at most LONGEST_WAIT, the longest the store accepts).
regroup_result regroup(
    kv_client& kv, std::uint64_t generation, const std::string& group, int rank, int size,
    prior_group prior, std::size_t count, int nccl_version, int shrink_timeout_ms,
    std::chrono::milliseconds timeout, std::chrono::milliseconds longest_wait,
    const std::function<std::unique_ptr<communicator>(std::size_t k, const std::string& tag)>&
        make_new);

}  // namespace cohort::comm
