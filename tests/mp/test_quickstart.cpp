// The README's main job, run as the README runs it: `cohort launch configs/quickstart.yaml`
// (4 workers, a kill at step 1500, a scale back to 4 at step 3000), checked against what the
// README and the config promise: test accuracy >= 0.883, the kill and the scale in the
// events table with detection and recovery figures, a joiner that took its state from a
// live peer, and the same params_sha256 as `cohort train` on the same config. Only the
// checkpoint folder is moved into a temporary one.
#include <doctest/doctest.h>

#include <map>

#include <nlohmann/json.hpp>
#include <string>

#include "tests/mp/dp_util.hpp"

using namespace cohort;
using namespace cohort::mp;

TEST_CASE("the README's quickstart keeps its promises") {
  temp_dir dir;
  const std::string cfg = std::string(COHORT_SOURCE_DIR) + "/configs/quickstart.yaml";
  const std::string ckpt = " --set fault_tolerance.checkpoint_dir=" + dir.path();
  int rc = -1;
  const std::string train_out = dir.path() + "/train.json";
  run_capture("train " + cfg + " -q --summary " + train_out + ckpt + "/train", &rc);
  REQUIRE(rc == 0);
  const nlohmann::json ref = read_json(train_out);
  REQUIRE(ref.is_object());

  const std::string out = dir.path() + "/launch.json";
  const std::string log =
      run_capture("launch " + cfg + " --summary " + out + ckpt + "/launch", &rc, true);
  REQUIRE_MESSAGE(rc == 0, log);
  const nlohmann::json s = read_json(out);
  REQUIRE_MESSAGE(s.is_object(), log);

  CHECK(s["steps_completed"] == 4690);
  REQUIRE(s["eval"].contains("accuracy"));
  CHECK_MESSAGE(s["eval"]["accuracy"].get<double>() >= 0.883, s["eval"].dump());
  CHECK(s["params_consistent"] == true);
  CHECK_MESSAGE(s["params_sha256"] == ref["params_sha256"], s.dump());
  CHECK(s["dp"] == 4);  // back to 4 after the scale

  // On a heavily loaded machine a worker starved for longer than timeout_ms (0.5 s here) is
  // declared dead and comes back: a "departed" then a "joined" of the same worker, recovered
  // like any failure (the hash checks above still hold). Such pairs are allowed, in any
  // number; every other event is one the config asked for. (Seen once in the flake hunt at
  // load 12-15 on 2 cores: worker-3 departed and rejoined at step 1819.)
  int kills = 0, scales = 0, joins = 0;
  std::map<std::string, int> departed;
  for (const auto& e : s["events"]) {
    const std::string worker = e["worker"].get<std::string>();
    if (e["kind"] == "kill") {
      ++kills;
      CHECK(worker == "worker-1");  // `kill worker=worker-1` names a worker, not a rank
      CHECK(e["step"] == 1500);
      REQUIRE(e["detect_ms"].is_number());
      REQUIRE(e["recover_ms"].is_number());
      CHECK(e["detect_ms"].get<double>() <= e["recover_ms"].get<double>());
    } else if (e["kind"] == "scale") {
      ++scales;
      CHECK(e["step"] == 3000);
      CHECK(e["target"] == 4);
      CHECK(e["recover_ms"].is_number());
    } else if (e["kind"] == "departed") {
      MESSAGE("not injected: " << e.dump());
      ++departed[worker];
    } else if (e["kind"] == "joined" && departed[worker] > 0) {
      --departed[worker];  // the worker that departed is back
      CHECK(e["recover_ms"].is_number());
    } else if (e["kind"] == "joined") {
      ++joins;  // the scale's joiner
      CHECK(e["step"].get<int64_t>() >= 3000);
      CHECK_MESSAGE(e.contains("transfer_mb_s"), e.dump());  // state from a live peer
    } else {
      FAIL_CHECK("an event the quickstart does not cause: " << e.dump());
    }
  }
  for (const auto& [worker, n] : departed) CHECK_MESSAGE(n == 0, worker << " never came back");
  CHECK_MESSAGE(kills == 1, s["events"].dump());
  CHECK_MESSAGE(scales == 1, s["events"].dump());
  CHECK_MESSAGE(joins == 1, s["events"].dump());
  // What the README shows a user: the accuracy and the events table.
  CHECK(log.find("params_sha256") != std::string::npos);
  CHECK(log.find("kill worker=worker-1 at step=1500") != std::string::npos);
}
