// The lines `cohort launch` prints of the job's membership as the coordinator's status
// replies show it: each registration, each death, each new generation. Owns what it has
// already printed; not the status polling (cmd_launch.cpp) nor the progress line.
#pragma once
#include <cstdint>
#include <map>

#include "runtime/net/protocol.hpp"

namespace cohort::cli {

class roster_lines {
 public:
  /// Prints what changed in S since the last reply: a member first seen, a member now dead,
  /// a new generation (with EXPECTED, cluster.workers, beside the counts).
  void show(const net::status_reply& s, int expected);

 private:
  uint64_t generation_ = 0;
  std::map<uint64_t, net::member_state> seen_;
};

}  // namespace cohort::cli
