// The control plane at scale (issue 20): `cohort bench control` forms a job of 512 simulated
// workers, speaking the real wire protocol with the job's keys, against a real coordinator
// process; none is forced to register again, none that keeps beating is declared dead, and a
// few stopped at once are seen gone through rosters that carry only the change.
#include <doctest/doctest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/mp/mp_util.hpp"

using namespace cohort::mp;

TEST_CASE("bench control forms 512 simulated workers without a forced rejoin") {
  // The timeout leaves a loaded 2-core machine room (agents and coordinator share it), so
  // that any eviction of a beating agent is the control plane's fault, not the test's.
  const int agents = 512, heartbeat = 200, timeout = 2000 * time_scale();
  int rc = -1;
  const std::string out =
      run_capture("bench control --agents " + std::to_string(agents) + " --heartbeat-ms " +
                      std::to_string(heartbeat) + " --timeout-ms " + std::to_string(timeout) +
                      " --steady-s 2 --stop-percent 1 --form-limit-s " +
                      std::to_string(60 * time_scale()) + " --json",
                  &rc);
  REQUIRE_MESSAGE(rc == 0, out);
  const auto j = nlohmann::json::parse(out, nullptr, false);
  REQUIRE_MESSAGE(j.is_object(), out);
  INFO(j.dump());
  const auto& f = j["form"];
  REQUIRE(f["formed"] == true);
  CHECK(f["alive"] == agents);
  CHECK(f["forced_rejoins"] == 0);
  CHECK(f["rejects"] == 0);
  // Joins that arrive together share generations: far fewer than one per join.
  CHECK(f["generations"].get<int>() >= 1);
  CHECK(f["generations"].get<int>() <= agents / 8);
  const auto& s = j["steady"];
  CHECK(s["false_positives"] == 0);
  CHECK(s["generations"] == 0);
  CHECK(s["alive_at_end"] == agents);
  const auto& k = j["stop"];
  CHECK(k["stopped"] == 5);  // 1% of 512
  CHECK(k["settled"] == true);
  CHECK(k["seen"] == 5);
  CHECK(k["survivor_generations"] == 1);
  CHECK(k["false_positives"] == 0);
  // Each survivor hears the change, not the roster: its frames carry five ids, so the
  // whole change costs a few hundred bytes per survivor (a full roster of 507 members
  // would be tens of kilobytes each).
  const double per_update =
      k["roster_bytes"].get<double>() / std::max(1.0, k["roster_updates"].get<double>());
  CHECK(per_update < 200);
  CHECK(k["roster_updates"].get<int>() >= agents - 5);
}
