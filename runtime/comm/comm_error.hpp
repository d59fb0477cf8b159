// The error every collective path throws (Gloo, NCCL, rendezvous, bucket engine): a
// cohort::error that says which operation failed, on which rank, and why. Owns only the
// error type; what to do after one (rebuild the communicator) is the caller's business.
#pragma once
#include <string>

#include "runtime/core/error.hpp"

namespace cohort::comm {

/// Why a collective or a rendezvous failed; advisory (the message carries the detail).
enum class comm_failure {
  timeout,      ///< a peer did not answer within the timeout (hung, slow or gone)
  peer_lost,    ///< the transport saw a peer close or reset (it died or aborted)
  aborted,      ///< abort() was called on this communicator
  rendezvous,   ///< the key-value store failed (key missing past its timeout, I/O error)
  unreachable,  ///< every rank arrived, but a peer's advertised address could not be connected
  unavailable,  ///< the backend cannot run here (no GPU, NCCL not compiled, bad device)
  invalid,      ///< the call was used wrongly (dead communicator, sizes that disagree)
};

/// "timeout", "peer lost", ...
const char* to_string(comm_failure f);

/// A failed collective. After one, the communicator that threw is dead: every later call
/// throws again at once; build a new one (for the next generation) instead.
class comm_error : public error {
 public:
  /// `op` names the operation ("allreduce_sum", "rendezvous get 'gen/3/gloo/1'", ...).
  comm_error(comm_failure kind, std::string op, const std::string& detail);
  comm_failure kind() const { return kind_; }
  /// The operation that failed, as given to the constructor.
  const std::string& op() const { return op_; }

 private:
  comm_failure kind_;
  std::string op_;
};

}  // namespace cohort::comm
