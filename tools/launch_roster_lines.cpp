// The membership lines `cohort launch` prints (see launch_roster_lines.hpp).
#include "tools/launch_roster_lines.hpp"

#include <cstdio>

namespace cohort::cli {

void roster_lines::show(const net::status_reply& s, int expected) {
  int alive = 0, live = 0;
  for (const auto& w : s.workers) {
    const auto& m = w.member;
    alive += m.state == net::member_state::alive;
    live += m.state != net::member_state::dead;
    auto [it, fresh] = seen_.emplace(m.member_id, m.state);
    if (fresh && m.state != net::member_state::dead) {
      // No seat here: the job seats a member once it has loaded (`cohort ctl status`).
      std::printf("launch: %s registered: member %llu, rank %d\n", m.name.c_str(),
                  static_cast<unsigned long long>(m.member_id), m.rank);
    } else if (!fresh && it->second != m.state && m.state == net::member_state::dead) {
      std::printf("launch: %s (member %llu) is dead\n", m.name.c_str(),
                  static_cast<unsigned long long>(m.member_id));
    }
    it->second = m.state;
  }
  if (s.generation != generation_) {
    generation_ = s.generation;
    std::printf("launch: generation %llu, %d of %d worker(s) registered, %d alive\n",
                static_cast<unsigned long long>(s.generation), live, expected, alive);
  }
  std::fflush(stdout);
}

}  // namespace cohort::cli
