// The change log of announced generations; see roster_changes.hpp and docs/protocol.md.
#include "runtime/net/roster_changes.hpp"

#include "runtime/core/error.hpp"

namespace cohort::net::membership {

std::vector<member_id> left_between(const std::vector<member_id>& before,
                                    const std::vector<member_id>& after) {
  std::vector<member_id> left;
  std::size_t j = 0;
  for (const member_id id : before) {
    while (j < after.size() && after[j] < id) ++j;
    if (j == after.size() || after[j] != id) left.push_back(id);
  }
  return left;
}

std::vector<member_id> ids_of(const roster& r) {
  std::vector<member_id> ids;
  ids.reserve(r.members.size());
  for (const auto& m : r.members) ids.push_back(m.id);
  return ids;
}

change_log::change_log(std::size_t max_generations, std::size_t max_ids)
    : max_generations_(max_generations), max_ids_(max_ids) {
  COHORT_CHECK(max_generations_ > 0);
}

void change_log::record(std::uint64_t generation, std::vector<member_id> left) {
  if (start_ == 0 && newest_ == 0) {
    start_ = newest_ = generation;
    return;
  }
  COHORT_CHECK(generation > newest_);
  ids_ += left.size();
  entries_.push_back(entry{newest_, generation, std::move(left)});
  newest_ = generation;
  while (entries_.size() > max_generations_ || (ids_ > max_ids_ && entries_.size() > 1)) {
    ids_ -= entries_.front().left.size();
    entries_.pop_front();
  }
}

std::optional<std::vector<member_id>> change_log::left_since(std::uint64_t base) const {
  if (base == 0 || base > newest_ || base < oldest_base() || (start_ == 0 && newest_ == 0))
    return std::nullopt;
  std::vector<member_id> left;
  for (const auto& e : entries_) {
    if (e.generation <= base) continue;
    left.insert(left.end(), e.left.begin(), e.left.end());
  }
  return left;
}

}  // namespace cohort::net::membership
