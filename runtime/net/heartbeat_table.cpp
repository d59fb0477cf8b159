// The heartbeat table shared by the coordinator's bridge thread and its actor; see
// heartbeat_table.hpp.
#include "runtime/net/heartbeat_table.hpp"

#include <algorithm>

namespace cohort::net {

heartbeat_table::heartbeat_table(std::chrono::milliseconds period, std::chrono::milliseconds window,
                                 std::chrono::milliseconds max_lag)
    : period_(period), window_(window), max_lag_(max_lag) {}

void heartbeat_table::note_delay(membership::mono_time now, membership::mono_time::duration delay) {
  if (now - window_start_ >= window_) {
    // A new window: the previous one is kept, anything older forgotten.
    delay_before_ =
        now - window_start_ >= 2 * window_ ? membership::mono_time::duration{} : delay_now_;
    delay_now_ = {};
    window_start_ = now;
  }
  delay_now_ = std::max(delay_now_, delay);
}

std::chrono::milliseconds heartbeat_table::lag(membership::mono_time now) const {
  std::lock_guard<std::mutex> lock(mu_);
  membership::mono_time::duration d{};
  if (now - window_start_ < 2 * window_) d = std::max(d, delay_now_);
  if (now - window_start_ < window_) d = std::max(d, delay_before_);
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::min(d, max_lag_));
}

std::optional<std::uint64_t> heartbeat_table::on_beat(std::string_view peer,
                                                      membership::member_id id,
                                                      std::uint64_t generation,
                                                      membership::mono_time now) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = slots_.find(id);
  if (it == slots_.end() || !it->second.alive || it->second.peer != peer ||
      generation > generation_)
    return std::nullopt;
  // The first beat recorded here (published with the registration's time) says nothing.
  if (it->second.beaten && now - it->second.last > period_)
    note_delay(now, now - it->second.last - period_);
  it->second.beaten = true;
  it->second.last = std::max(it->second.last, now);
  ++answered_;
  return generation_;
}

void heartbeat_table::publish(
    const membership::roster& r,
    const std::unordered_map<membership::member_id, std::string>& peer_of) {
  std::unordered_map<membership::member_id, slot> next;
  next.reserve(r.members.size());
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& m : r.members) {
      auto p = peer_of.find(m.id);
      if (p == peer_of.end()) continue;  // nobody may beat for it here
      slot s;
      s.peer = p->second;
      s.alive = m.state != membership::member_state::joining;
      s.last = m.last_heartbeat;
      if (auto old = slots_.find(m.id); old != slots_.end()) {
        s.last = std::max(s.last, old->second.last);
        s.beaten = old->second.beaten;
      }
      next.emplace(m.id, std::move(s));
    }
    slots_.swap(next);
    generation_ = r.generation;
  }
  // The old table is freed here, outside the lock.
}

void heartbeat_table::mark_alive(membership::member_id id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = slots_.find(id); it != slots_.end()) it->second.alive = true;
}

void heartbeat_table::refresh(membership::roster& r) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& m : r.members) {
    auto it = slots_.find(m.id);
    if (it != slots_.end()) m.last_heartbeat = std::max(m.last_heartbeat, it->second.last);
  }
}

std::uint64_t heartbeat_table::answered() const {
  std::lock_guard<std::mutex> lock(mu_);
  return answered_;
}

}  // namespace cohort::net
