// Where each member of a pipeline / tensor-parallel job sits (pp * tp > 1; docs/pipeline.md,
// "Elasticity"): seats for life, the order a scale-down drains, and the opens of a step over
// the whole replicas with a donor per seat. The rest of the step protocol is
// training_job.cpp's.
#include <algorithm>

#include "runtime/step/training_job.hpp"

namespace cohort::step {

std::optional<std::array<int, 3>> training_job::seat_of(mb::member_id id) const {
  auto it = seat_.find(id);
  if (it == seat_.end()) return std::nullopt;
  const int tp = cfg_.parallel.tp;
  return std::array<int, 3>{it->second / seat_size_, (it->second % seat_size_) / tp,
                            it->second % tp};
}

std::vector<mb::member_id> training_job::drain_order(const mb::roster& r) const {
  std::map<int, int> filled;  // replica slot -> members seated there
  for (const auto& m : r.members)
    if (auto it = seat_.find(m.id); it != seat_.end()) ++filled[it->second / seat_size_];
  std::vector<std::pair<std::pair<int, int>, mb::member_id>> keyed;  // (broken?, -seat)
  for (const auto& m : r.members) {
    auto it = seat_.find(m.id);
    if (it == seat_.end()) {
      keyed.push_back({{0, 0}, m.id});
      continue;
    }
    const bool whole = filled[it->second / seat_size_] == seat_size_;
    keyed.push_back({{whole ? 1 : 0, -it->second}, m.id});
  }
  std::stable_sort(keyed.begin(), keyed.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<mb::member_id> out;
  for (const auto& k : keyed) out.push_back(k.second);
  return out;
}

void training_job::assign_seats(const mb::roster& r) {
  for (auto it = seat_.begin(); it != seat_.end();)
    it = r.find(it->first) == nullptr ? seat_.erase(it) : std::next(it);
  const int slots = std::max(1, cfg_.elastic.max_workers / seat_size_) * seat_size_;
  std::vector<mb::member_id> holder(static_cast<std::size_t>(slots), 0);
  for (const auto& [id, seat] : seat_)
    if (seat < slots) holder[static_cast<std::size_t>(seat)] = id;
  for (const auto& m : r.members) {
    if (seat_.count(m.id) != 0 || m.state == mb::member_state::leaving) continue;
    // The most nearly whole replica with a free seat (lowest first on a tie): a joiner
    // completes a broken replica before it starts a new one.
    // Among equally full ones, the replica whose members hold the newest state: the stale
    // replica's members would need a donor the other broken replica cannot be.
    int best = -1, best_filled = -1;
    int64_t best_step = -1;
    for (int d = 0; d * seat_size_ < slots; ++d) {
      int filled = 0;
      int64_t newest = -1;
      for (int k = 0; k < seat_size_; ++k) {
        const mb::member_id id = holder[d * seat_size_ + k];
        if (id == 0) continue;
        ++filled;
        auto at = ready_.find(id);
        if (at != ready_.end()) newest = std::max(newest, at->second);
      }
      if (filled < seat_size_ &&
          (filled > best_filled || (filled == best_filled && newest > best_step))) {
        best = d;
        best_filled = filled;
        best_step = newest;
      }
    }
    if (best < 0) continue;  // no free seat: it waits (the roster caps members anyway)
    for (int k = 0; k < seat_size_; ++k) {
      const int seat = best * seat_size_ + k;
      if (holder[seat] == 0) {
        holder[seat] = m.id;
        seat_[m.id] = seat;
        break;
      }
    }
  }
}

bool training_job::open_hybrid(const mb::roster& r, double now_s, job_actions& out,
                               std::map<mb::member_id, net::step_open>& opens) {
  assign_seats(r);
  // Whole replicas, in seat order: their members train; a broken replica's members wait
  // (and fall behind) until a joiner fills the seat.
  std::map<int, std::vector<const mb::member*>> replica;  // d -> members by seat
  for (const auto& m : r.members) {
    auto it = seat_.find(m.id);
    if (it == seat_.end()) continue;
    auto& v = replica[it->second / seat_size_];
    v.resize(static_cast<std::size_t>(seat_size_), nullptr);
    v[static_cast<std::size_t>(it->second % seat_size_)] = &m;
  }
  std::vector<std::vector<const mb::member*>> whole;
  for (auto& [d, v] : replica) {
    bool full = true;
    for (const auto* m : v) full = full && m != nullptr;
    if (full) whole.push_back(v);
  }
  const int needed = std::max(1, min_workers() / seat_size_);
  int not_ready = 0;
  for (const auto& v : whole)
    for (const auto* m : v)
      if (m->state != mb::member_state::alive || ready_.count(m->id) == 0) ++not_ready;
  if (static_cast<int>(whole.size()) < needed || not_ready > 0) {
    if (!waiting_.noted && next_step_ > start_step_) {
      out.notes.push_back(static_cast<int>(whole.size()) < needed
                              ? "waiting for replicas: " + std::to_string(whole.size()) +
                                    " whole, " + std::to_string(needed) +
                                    " needed (elastic.min_workers / (pp * tp))"
                              : "waiting for " + std::to_string(not_ready) +
                                    " worker(s) of whole replicas to load the job");
      waiting_.noted = true;
    }
    if (static_cast<int>(whole.size()) < needed && was_training() &&
        waiting_.paused_since_s < 0)
      waiting_.paused_since_s = now_s;
    return false;
  }
  // Per DP group (seat k = (p, t)): the first replica holding the step's state donates to
  // members behind it (a joiner, or a member whose replica sat out).
  const int n = static_cast<int>(whole.size());
  for (int k = 0; k < seat_size_; ++k) {
    int donor = -1;
    bool behind = false;
    for (int d = 0; d < n; ++d) {
      const auto* m = whole[d][k];
      if (ready_[m->id] == next_step_) {
        if (donor < 0) donor = d;
      } else {
        behind = true;
      }
    }
    if (behind && donor < 0) {
      // A member of a broken replica may still hold this seat's state: wait for joiners to
      // make its replica whole rather than give up.
      bool held = false;
      for (const auto& [id, seat] : seat_)
        if (seat % seat_size_ == k && r.find(id) != nullptr && ready_.count(id) != 0 &&
            ready_.at(id) == next_step_)
          held = true;
      if (held) {
        if (!waiting_.noted) {
          out.notes.push_back("waiting for a joiner: the state of stage " +
                              std::to_string(k / cfg_.parallel.tp) +
                              " is held only by a replica that is not whole");
          waiting_.noted = true;
        }
        return false;
      }
      out.failed = "no live worker holds the training state of stage " +
                   std::to_string(k / cfg_.parallel.tp) + " / TP rank " +
                   std::to_string(k % cfg_.parallel.tp) + " at step " + std::to_string(next_step_) +
                   "; restart from a checkpoint";
      finished_ = true;
      return false;
    }
    if (!behind) donor = -1;
    if (donor >= 0)
      out.notes.push_back("step " + std::to_string(next_step_) + ": stage " +
                          std::to_string(k / cfg_.parallel.tp) + " state sent from replica " +
                          std::to_string(donor) + " to the members behind it");
    for (int d = 0; d < n; ++d) {
      const auto* m = whole[d][k];
      opens[m->id] = net::step_open{r.generation,         next_step_,          n, donor, d,
                                    k / cfg_.parallel.tp, k % cfg_.parallel.tp};
    }
  }
  return true;
}

}  // namespace cohort::step
