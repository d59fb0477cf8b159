#include "runtime/comm/comm_error.hpp"

namespace cohort::comm {

const char* to_string(comm_failure f) {
  switch (f) {
    case comm_failure::timeout:
      return "timeout";
    case comm_failure::peer_lost:
      return "peer lost";
    case comm_failure::aborted:
      return "aborted";
    case comm_failure::rendezvous:
      return "rendezvous";
    case comm_failure::unreachable:
      return "unreachable";
    case comm_failure::unavailable:
      return "unavailable";
    case comm_failure::invalid:
      return "invalid";
  }
  return "unknown";
}

comm_error::comm_error(comm_failure kind, std::string op, const std::string& detail)
    : error(op + " failed (" + to_string(kind) + "): " + detail), kind_(kind), op_(std::move(op)) {}

}  // namespace cohort::comm
