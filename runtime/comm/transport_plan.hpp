// The transport plan of a group with comm.transport auto: what rank 0 decided from every
// rank's host (one Gloo group, one shared-memory segment, or shared memory per host with
// Gloo among the hosts' leaders) and the record that carries it to the other ranks through
// the rendezvous store. Owns the record's encoding only; the decision is factory.cpp's.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/comm/hier_comm.hpp"

namespace cohort::comm {

/// What a group with transport auto is built as.
enum class plan_kind { gloo, shm, hier };

/// Rank 0's decision for a group; `layout` is set for hier only (every rank's host).
struct transport_plan {
  /// The record's version: a worker reads only this one (workers of one job run one build).
  static constexpr std::uint32_t version = 1;
  plan_kind kind = plan_kind::gloo;
  host_layout layout;
};

/// The record as stored: "cohort.plan <version> <kind>[ <layout>]", e.g.
/// "cohort.plan 1 hier 0,0,1,1" (text, so a store dump reads plainly).
std::vector<char> encode_plan(const transport_plan& p);
/// The plan of a group of `size` ranks from a stored record. Throws
/// comm_error(invalid) naming the record and what is wrong with it when it is not a plan,
/// is of another version, names an unknown kind, or its layout does not fit `size` ranks.
transport_plan decode_plan(const std::vector<char>& record, int size);

/// "gloo", "shm", "hier": the plan's kind as the record and the logs spell it.
const char* to_string(plan_kind k);

}  // namespace cohort::comm
