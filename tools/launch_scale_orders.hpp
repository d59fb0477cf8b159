// Which scale orders `cohort launch` carries out: each (coordinator term, order number)
// once. A coordinator sends its newest order again to a launcher that registers while the
// workers the order asked for are missing (the first may have gone to a connection launch
// had closed: actors/coordinator_internal.hpp, resend_scale), so an order can come twice.
#pragma once
#include <cstdint>
#include <map>

#include "runtime/net/protocol.hpp"

namespace cohort::cli {

class scale_orders {
 public:
  /// Whether O is new (carry it out); false for one carried out already. Orders without a
  /// number (seq 0) are always new.
  bool take(const net::scale_order& o) {
    if (o.seq == 0) return true;
    uint64_t& done = done_[o.term];
    if (o.seq <= done) return false;
    done = o.seq;
    return true;
  }

 private:
  std::map<uint64_t, uint64_t> done_;  ///< per coordinator term: the newest order carried out
};

}  // namespace cohort::cli
