// The heartbeat table shared by the coordinator's bridge thread and its actor; see
// heartbeat_table.hpp.
#include "runtime/net/heartbeat_table.hpp"

#include <algorithm>
#include <functional>

#include "runtime/net/relay.hpp"

namespace cohort::net {

heartbeat_table::heartbeat_table(std::chrono::milliseconds period, std::chrono::milliseconds window,
                                 std::chrono::milliseconds max_lag)
    : period_(period), window_(window), max_lag_(max_lag) {}

namespace {

using duration = membership::mono_time::duration;

// The delay at least Q of the late beats in HEAP reached (its smallest, once it holds Q).
duration agreed(const std::vector<duration>& heap, std::size_t q) {
  return heap.size() >= q ? heap.front() : duration{};
}

}  // namespace

std::size_t heartbeat_table::quorum_locked() const {
  return std::max<std::size_t>(2, slots_.size() / 512);
}

std::size_t heartbeat_table::late_quorum() const {
  std::lock_guard<std::mutex> lock(mu_);
  return quorum_locked();
}

void heartbeat_table::note_delay(membership::mono_time now, duration delay) {
  const std::size_t q = quorum_locked();
  if (now - window_start_ >= window_) {
    // A new window: the previous one's agreed lag is kept, anything older forgotten.
    lag_before_ = now - window_start_ >= 2 * window_ ? duration{} : agreed(late_now_, q);
    late_now_.clear();
    window_start_ = now;
  }
  const std::greater<duration> min_heap;
  late_now_.push_back(delay);
  std::push_heap(late_now_.begin(), late_now_.end(), min_heap);
  while (late_now_.size() > q) {
    std::pop_heap(late_now_.begin(), late_now_.end(), min_heap);
    late_now_.pop_back();
  }
}

std::chrono::milliseconds heartbeat_table::lag(membership::mono_time now) const {
  std::lock_guard<std::mutex> lock(mu_);
  duration d{};
  if (now - window_start_ < 2 * window_) d = std::max(d, agreed(late_now_, quorum_locked()));
  if (now - window_start_ < window_) d = std::max(d, lag_before_);
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::min(d, max_lag_));
}

std::optional<std::uint64_t> heartbeat_table::on_beat(std::string_view peer,
                                                      membership::member_id id,
                                                      std::uint64_t generation,
                                                      membership::mono_time now,
                                                      bool counts_lag) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = slots_.find(id);
  if (it == slots_.end() || !it->second.alive || it->second.peer != peer ||
      generation > generation_)
    return std::nullopt;
  // The first beat recorded here (published with the registration's time) says nothing.
  if (counts_lag && it->second.beaten && now - it->second.last > period_)
    note_delay(now, now - it->second.last - period_);
  it->second.beaten = true;
  it->second.last = std::max(it->second.last, now);
  ++answered_;
  return generation_;
}

void heartbeat_table::on_relay_beat(std::string_view agent, membership::mono_time now) {
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, fresh] = relays_.try_emplace(std::string(agent), now);
  if (!fresh && now - it->second > period_) note_delay(now, now - it->second - period_);
  it->second = std::max(it->second, now);
}

std::vector<std::optional<std::uint64_t>> heartbeat_table::on_host_beat(
    std::string_view agent, const std::vector<relayed_beat>& beats, membership::mono_time now) {
  std::vector<std::optional<std::uint64_t>> out(beats.size());
  std::lock_guard<std::mutex> lock(mu_);
  auto [rt, fresh] = relays_.try_emplace(std::string(agent), now);
  if (!fresh && now - rt->second > period_) note_delay(now, now - rt->second - period_);
  rt->second = std::max(rt->second, now);
  for (std::size_t i = 0; i < beats.size(); ++i) {
    const relayed_beat& b = beats[i];
    auto it = slots_.find(b.member_id);
    if (it == slots_.end() || !it->second.alive || b.generation > generation_ ||
        !is_relay_peer_of(it->second.peer, agent, b.worker))
      continue;
    it->second.beaten = true;
    it->second.last = std::max(it->second.last, now);
    ++answered_;
    out[i] = generation_;
  }
  return out;
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
