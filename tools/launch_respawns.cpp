#include "tools/launch_respawns.hpp"

#include <cstdio>

namespace cohort::cli {

bool respawns::worth(const std::string& name, clock_type::time_point started) {
  int& quick = quick_deaths_[name];
  quick = clock_type::now() - started < std::chrono::milliseconds(1000) ? quick + 1 : 0;
  if (quick < 5) return true;
  std::printf("launch: %s died %d times within a second of starting; not restarting it\n",
              name.c_str(), quick);
  return false;
}

void respawns::put_off(const std::string& name, std::chrono::milliseconds delay) {
  due_.emplace_back(name, clock_type::now() + delay);
}

std::vector<std::string> respawns::due(clock_type::time_point now) {
  std::vector<std::string> names;
  for (auto it = due_.begin(); it != due_.end();) {
    if (it->second > now) {
      ++it;
      continue;
    }
    names.push_back(it->first);
    it = due_.erase(it);
  }
  return names;
}

}  // namespace cohort::cli
