// `cohort generate` on checkpoints that `cohort train` and a pipeline-parallel `cohort launch`
// wrote (bitwise: the same parameters), through the command line: the same greedy text from
// both, a seeded sample that repeats, and bad input refused with exit 2 and what to fix.
#include <doctest/doctest.h>

#include <string>

#include "tests/mp/dp_util.hpp"

using namespace cohort;
using namespace cohort::mp;
using std::chrono::milliseconds;

namespace {

constexpr int steps = 30;

// The text a generate command prints on stdout (exit code checked).
std::string generated(const std::string& args) {
  int rc = -1;
  const std::string out = run_capture("generate " + args + " -q", &rc);
  CHECK_MESSAGE(rc == 0, args << ": " << out);
  return out;
}

}  // namespace

TEST_CASE("generate: cohort train's and a pipeline launch's checkpoints give the same text") {
  temp_dir dir;
  std::string yaml = gpt_yaml(dir.path(), steps);
  const std::string every = "checkpoint_every: 0";
  yaml.replace(yaml.find(every), every.size(), "checkpoint_every: " + std::to_string(steps));
  const std::string cfg = dir.write("gpt.yaml", yaml);
  const nlohmann::json ref = train_summary(dir, cfg);
  const std::string out = dir.path() + "/pp.json";
  child_process launch(
      {"launch", cfg, "-q", "--summary", out, "--set", "cluster.workers=2", "--set",
       "parallel.pp=2", "--set", "fault_tolerance.checkpoint_dir=" + dir.path() + "/ckpt_pp"},
      dir.path(), "pp2");
  const nlohmann::json pp = finish_launch(launch, out, milliseconds(180000));
  check_fault_free(pp, ref["params_sha256"], steps);

  const std::string greedy = "--prompt 'In the beginning' --max-tokens 40 --temperature 0";
  const std::string text = generated(dir.path() + "/ckpt " + greedy);
  CHECK(text.size() == 41);  // 40 characters and the newline
  CHECK(text.back() == '\n');
  // The run's checkpoint directory or its step folder; the pipeline's two shards.
  CHECK(generated(dir.path() + "/ckpt/step_00000030 " + greedy) == text);
  CHECK(generated(dir.path() + "/ckpt_pp " + greedy) == text);
  const std::string sampled = "--prompt 'And' --max-tokens 40 --seed 5 --top-p 0.9";
  const std::string a = generated(dir.path() + "/ckpt " + sampled);
  CHECK(a.size() == 41);
  CHECK(generated(dir.path() + "/ckpt_pp " + sampled) == a);

  int rc = -1;
  std::string said =
      run_capture("generate " + dir.path() + "/ckpt --prompt 'caf\xc3\xa9'", &rc, true);
  CHECK(rc == 2);
  CHECK_MESSAGE(
      said.find("byte 0xc3 at offset 3 is not in the model's vocabulary") != std::string::npos,
      said);
  said = run_capture("generate " + dir.path() + "/ckpt --prompt a --temperature -1", &rc, true);
  CHECK(rc == 2);
  CHECK_MESSAGE(said.find("--temperature") != std::string::npos, said);
  said = run_capture("generate " + dir.path() + "/nothing --prompt a", &rc, true);
  CHECK(rc == 2);
  CHECK_MESSAGE(said.find("no such folder") != std::string::npos, said);
}
