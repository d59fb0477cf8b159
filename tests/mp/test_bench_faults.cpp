// `cohort bench faults` end to end: one pair of launches of a small bitwise MLP, with and
// without a kill, its ETTR from the two runs' own summaries and the hash check against
// `cohort train`; a bad schedule refused before any run starts.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "tests/mp/dp_util.hpp"

using namespace cohort;
using namespace cohort::mp;

TEST_CASE("bench faults: a pair's ETTR is its summaries' wall times, every run on the same bits") {
  temp_dir dir;
  const std::string cfg = dir.write("cfg.yaml", small_yaml(dir.path(), "bitwise", 200));
  const std::string hash = train_summary(dir, cfg)["params_sha256"];
  const std::string runs = dir.path() + "/runs";
  int rc = -1;
  const std::string out =
      run_capture("bench faults " + cfg + " --faults 'kill rank=1 at step=40' --pairs 1 --json " +
                      "--set cluster.workers=3 --out " + runs,
                  &rc, true);
  REQUIRE_MESSAGE(rc == 0, out);
  const nlohmann::json j = nlohmann::json::parse(out.substr(out.rfind("\n{") + 1), nullptr, false);
  REQUIRE_MESSAGE(j.is_object(), out);
  CHECK(j["same_hash"] == true);
  CHECK(j["params_sha256"] == hash);  // the fault-free launch ends on `cohort train`'s bits
  REQUIRE(j["pairs"].size() == 1);
  const nlohmann::json& p = j["pairs"][0];
  const nlohmann::json clean = read_json(runs + "/clean-0.json");
  const nlohmann::json faulty = read_json(runs + "/faulty-0.json");
  CHECK(faulty["params_sha256"] == hash);
  CHECK(p["kills"] == 1);
  CHECK(p["aborted_steps"] == faulty["aborted_steps"]);
  CHECK(clean["events"].empty());  // the fault-free run got no fault
  const double ettr = clean["wall_s"].get<double>() / faulty["wall_s"].get<double>();
  CHECK(p["ettr"].get<double>() == doctest::Approx(ettr));
  CHECK(j["ettr"]["median"].get<double>() == doctest::Approx(ettr));  // one pair
  REQUIRE(p["kill_costs"].size() == 1);
  CHECK(p["kill_costs"][0]["whole_ms"].is_number());
  // Accounted: 1 - the kill's lost_ms over the faulty run's wall time.
  nlohmann::json cost;
  for (const auto& e : faulty["events"])
    if (e["kind"] == "kill") cost = e["cost"];
  REQUIRE(cost["lost_ms"].is_number());
  const double accounted =
      1.0 - cost["lost_ms"].get<double>() / 1e3 / faulty["wall_s"].get<double>();
  CHECK(p["ettr_accounted"].get<double>() == doctest::Approx(accounted));
  CHECK(j["ettr_accounted"]["median"].get<double>() == doctest::Approx(accounted));
}

TEST_CASE("bench faults refuses a bad schedule before starting any run") {
  temp_dir dir;
  const std::string cfg = dir.write("cfg.yaml", small_yaml(dir.path(), "bitwise", 20));
  int rc = -1;
  const std::string out = run_capture(
      "bench faults " + cfg + " --faults 'kill rank=1 at stepp=4' --out " + dir.path() + "/runs",
      &rc, true);
  CHECK(rc == 2);
  CHECK(out.find("--faults") != std::string::npos);
  CHECK(out.find("unknown word 'stepp'") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(dir.path() + "/runs"));
}
