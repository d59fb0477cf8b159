// When `cohort launch` restarts a child that died (elastic.respawn): not one that keeps
// dying within a second of its start, and, with elastic.spares, not at once: a loaded spare
// takes the dead worker's seat in the rerun, and the replacement (the next spare) starts
// after that rerun so that its start and load do not compete with it for the cores.
#pragma once
#include <chrono>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace cohort::cli {

class respawns {
 public:
  using clock_type = std::chrono::steady_clock;

  /// A death of NAME, started at STARTED: false (said on stdout) once it has died 5 times
  /// in a row within a second of its start.
  bool worth(const std::string& name, clock_type::time_point started);
  /// Restart NAME after DELAY rather than now.
  void put_off(const std::string& name, std::chrono::milliseconds delay);
  /// The put-off names whose time has come at NOW, taken off the list, oldest first.
  std::vector<std::string> due(clock_type::time_point now);
  /// Forgets the put-off ones (launch is stopping).
  void clear() { due_.clear(); }

 private:
  std::map<std::string, int> quick_deaths_;  ///< per name: deaths right after a start
  std::vector<std::pair<std::string, clock_type::time_point>> due_;
};

}  // namespace cohort::cli
