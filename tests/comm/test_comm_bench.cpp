// `bench allreduce` end to end through its CLI (bench_allreduce_cli spawns the rank
// processes): the JSON has one row per size with positive times and consistent
// bandwidths; bad sizes are usage errors. No speed is asserted.
#include <doctest/doctest.h>
#include <stdio.h>
#include <sys/wait.h>

#include <nlohmann/json.hpp>
#include <string>

namespace {

const std::string kCli = std::string(COHORT_BINARY_DIR) + "/tests/comm/bench_allreduce_cli";

int run(const std::string& args, std::string* out) {
  FILE* p = popen((kCli + " " + args + " 2>/dev/null").c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[4096];
  std::size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out->append(buf, n);
  const int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

TEST_CASE("bench allreduce --json reports every size for cohort and buckets and raw Gloo") {
  std::string out;
  REQUIRE(run("bench allreduce --ranks 2 --sizes 4K,1M --iters 3 --warmup 1 "
              "--bucket-mb 0.25 --json",
              &out) == 0);
  const auto j = nlohmann::json::parse(out);
  CHECK(j.at("ranks") == 2);
  REQUIRE(j.at("rows").size() == 2);
  CHECK(j["rows"][0]["bytes"] == 4096);
  CHECK(j["rows"][1]["bytes"] == 1 << 20);
  for (const auto& row : j["rows"]) {
    for (const char* path : {"cohort", "buckets", "raw_gloo"}) {
      const double t = row[path]["time_us"], alg = row[path]["algbw_gbps"],
                   bus = row[path]["busbw_gbps"];
      CHECK(t > 0);
      // nccl-tests: algbw = bytes / time; busbw = algbw * 2(n-1)/n = algbw for n = 2.
      CHECK(alg == doctest::Approx(double(row["bytes"]) / (t * 1e-6) / 1e9));
      CHECK(bus == doctest::Approx(alg));
    }
    // Paired ratios (median over calls of raw_i / cohort_i): set and finite.
    for (const char* ratio : {"ratio_cohort_raw", "ratio_buckets_raw"}) {
      CHECK(double(row[ratio]) > 0.0);
      CHECK(double(row[ratio]) < 1e6);
    }
  }
}

TEST_CASE("bench allreduce rejects sizes it cannot run") {
  std::string out;
  CHECK(run("bench allreduce --ranks 2 --sizes 3", &out) == 2);
  CHECK(run("bench allreduce --ranks 2 --sizes 1X", &out) == 2);
  CHECK(run("bench allreduce --ranks 0", &out) == 2);
}

TEST_CASE("bench alltoall --json: a row per size for shared memory and for Gloo, both paths "
          "checked byte for byte before they are timed") {
  for (const std::string transport : {"shm", "gloo"}) {
    CAPTURE(transport);
    std::string out;
    REQUIRE(run("bench alltoall --ranks 3 --sizes 1000,64K --iters 3 --warmup 1 --transport " +
                    transport + " --json",
                &out) == 0);
    const auto j = nlohmann::json::parse(out);
    CHECK(j.at("ranks") == 3);
    CHECK(j.at("transport") == transport);
    REQUIRE(j.at("rows").size() == 2);
    CHECK(j["rows"][0]["bytes"] == 1000);
    CHECK(j["rows"][1]["bytes"] == 65536);
    for (const auto& row : j["rows"]) {
      CHECK(row["iters"] == 3);
      CHECK(double(row["cohort"]["median_s"]) > 0);
      CHECK(double(row["raw"]["median_s"]) > 0);
      CHECK(double(row["ratio_cohort_raw"]) > 0);
    }
  }
  std::string out;
  CHECK(run("bench alltoall --ranks 1", &out) == 2);
  CHECK(run("bench alltoall --ranks 2 --sizes 1Q", &out) == 2);
}
