// train.precision: bf16 on the CPU across processes: bitwise mode keeps its promise with bf16
// products (every DP size, a killed worker, a change of size end on `cohort train`'s hash
// with the same precision), and bf16 really changes the numbers (its hash is not fp32's).
#include <doctest/doctest.h>

#include <string>

#include "tests/mp/dp_util.hpp"

using namespace cohort;
using namespace cohort::mp;
using std::chrono::milliseconds;

namespace {

std::string with_bf16(std::string yaml) {
  const std::string key = "  determinism: bitwise\n";
  const auto at = yaml.find(key);
  REQUIRE(at != std::string::npos);
  return yaml.insert(at + key.size(), "  precision: bf16\n");
}

nlohmann::json launch(const temp_dir& dir, const std::string& cfg, const std::string& tag,
                      std::vector<std::string> extra) {
  const std::string out = dir.path() + "/" + tag + ".json";
  std::vector<std::string> args{"launch", cfg, "-q", "--summary", out};
  args.insert(args.end(), extra.begin(), extra.end());
  child_process p(args, dir.path(), tag);
  const auto code = p.wait_exit(milliseconds(180000));
  REQUIRE_MESSAGE(code.has_value(), "launch did not finish: " << p.err());
  CHECK_MESSAGE(*code == 0, p.out() << p.err());
  return read_json(out);
}

}  // namespace

TEST_CASE("bf16 bitwise: the GPT ends on cohort train's hash at dp 1 2 and 4, not on fp32's") {
  temp_dir dir;
  const std::string fp32 = dir.write("fp32.yaml", gpt_yaml(dir.path(), 6));
  const std::string cfg = dir.write("bf16.yaml", with_bf16(gpt_yaml(dir.path(), 6)));
  const std::string ref32 = train_summary(dir, fp32)["params_sha256"];
  const nlohmann::json ref = train_summary(dir, cfg);
  const std::string hash = ref["params_sha256"];
  REQUIRE(hash.size() == 64);
  CHECK(hash != ref32);  // the products really ran in bf16
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    const nlohmann::json s = launch(dir, cfg, "dp" + std::to_string(n),
                                    {"--set", "cluster.workers=" + std::to_string(n)});
    REQUIRE(s.is_object());
    CHECK(s["dp"] == n);
    check_fault_free(s, hash, 6);
  }
}

TEST_CASE("bf16 bitwise: pipeline stages end on cohort train's hash, tensor parallel within 1e-3") {
  temp_dir dir;
  const std::string cfg = dir.write("bf16.yaml", with_bf16(gpt_yaml(dir.path(), 6)));
  const nlohmann::json ref = train_summary(dir, cfg);
  const nlohmann::json pp =
      launch(dir, cfg, "pp2", {"--set", "cluster.workers=4", "--set", "parallel.pp=2"});
  REQUIRE(pp.is_object());
  check_fault_free(pp, ref["params_sha256"], 6);
  // Row-parallel products sum partial results in another order: close, not the same bits.
  const nlohmann::json tp =
      launch(dir, cfg, "tp2", {"--set", "cluster.workers=2", "--set", "parallel.tp=2"});
  REQUIRE(tp.is_object());
  CHECK(tp["steps_completed"] == 6);
  CHECK(tp["final_loss"].get<double>() ==
        doctest::Approx(ref["final_loss"].get<double>()).epsilon(1e-3));
}

TEST_CASE("bf16 bitwise: a killed worker and a change of size end on cohort train's hash") {
  temp_dir dir;
  const int steps = 40;
  const std::string cfg =
      dir.write("cfg.yaml", with_bf16(small_yaml(dir.path(), "bitwise", steps)));
  const std::string hash = train_summary(dir, cfg)["params_sha256"];
  const nlohmann::json s =
      launch(dir, cfg, "faults",
             {"--set", "cluster.workers=3", "--set", "elastic.min_workers=2", "--inject",
              "kill rank=1 at step=10", "--inject", "scale to=2 at step=25"});
  REQUIRE(s.is_object());
  CHECK_MESSAGE(events_of(s, "kill").size() == 1, s["events"].dump());
  CHECK_MESSAGE(events_of(s, "scale").size() == 1, s["events"].dump());
  check_fault_free(s, hash, steps);
}
