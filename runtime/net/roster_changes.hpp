// What changed between recent generations of the roster, so that the coordinator tells a
// member holding generation g only who left since g (roster_update's change form) instead
// of the whole roster; a member that is new, or older than what is remembered, gets a full
// copy. Pure data: no clock, sockets or actors. Bounded in generations and ids.
#pragma once
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "runtime/net/membership.hpp"

namespace cohort::net::membership {

/// Ids of the members of BEFORE that AFTER no longer holds, in BEFORE's order. Both lists
/// in id order (every decision leaves them so): one merge pass.
std::vector<member_id> left_between(const std::vector<member_id>& before,
                                    const std::vector<member_id>& after);

/// Ids of R's live members, in id order.
std::vector<member_id> ids_of(const roster& r);

/// The change of each generation the coordinator announced, newest last.
class change_log {
 public:
  /// Keeps at most MAX_GENERATIONS entries and MAX_IDS departed ids in all (oldest dropped).
  explicit change_log(std::size_t max_generations = 256, std::size_t max_ids = 1u << 16);

  /// Generation GENERATION was announced; LEFT went since the previous one announced (which
  /// may be several generations back: a registration can replace a member in one step).
  /// Generations must grow; the first call only sets where the log starts.
  void record(std::uint64_t generation, std::vector<member_id> left);

  /// Who left after BASE, up to the newest generation recorded, in the order they left;
  /// nullopt (send a full copy) when BASE is 0, newer than the log, or older than it
  /// remembers. A BASE between two announced generations gets the superset that covers it.
  std::optional<std::vector<member_id>> left_since(std::uint64_t base) const;

  /// Oldest generation a change can start from (0: none recorded).
  std::uint64_t oldest_base() const { return entries_.empty() ? start_ : entries_.front().from; }
  std::uint64_t newest() const { return newest_; }

 private:
  struct entry {
    std::uint64_t from = 0;        ///< generation announced before this one
    std::uint64_t generation = 0;  ///< generation announced
    std::vector<member_id> left;
  };
  std::size_t max_generations_;
  std::size_t max_ids_;
  std::size_t ids_ = 0;
  std::uint64_t start_ = 0;   ///< first generation recorded
  std::uint64_t newest_ = 0;  ///< last generation recorded
  std::deque<entry> entries_;
};

}  // namespace cohort::net::membership
