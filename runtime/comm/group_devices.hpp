// The device check of a group when a generation forms: every member says which worker it is
// and which device it computes on (train.device as that worker resolved it), and the group
// refuses, on every member alike, to form when the members compute on different kinds of
// device (cpu and cuda). Owns that check and its record; the communicators are factory.cpp's.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/comm/kv_client.hpp"

namespace cohort::comm {

/// One member of a group as it introduced itself: its worker and its resolved device
/// ("cpu", "cuda:N").
struct group_member {
  std::string worker;
  std::string device;
};

/// "" when every member computes on the same kind of device (cuda:0 and cuda:1 are one kind:
/// each worker has its own GPU); otherwise the refusal, naming each kind with its workers
/// (ranks in brackets, at most 8 named per kind) and how to fix it. `group` names the group.
std::string mixed_devices_text(const std::string& group, const std::vector<group_member>& members);

/// The check itself, through the rendezvous store under `generation`'s keys
/// (<group>/devices/...): every rank sets its record, rank 0 reads them all and publishes the
/// verdict, which every other rank reads back (one round through the store). Throws
/// usage_error with mixed_devices_text on every rank when the group mixes device kinds, and
/// comm_error when a record does not come within `timeout` or cannot be read.
void check_group_devices(kv_client& kv, std::uint64_t generation, const std::string& group,
                         int rank, int size, const group_member& me,
                         std::chrono::milliseconds timeout);

}  // namespace cohort::comm
