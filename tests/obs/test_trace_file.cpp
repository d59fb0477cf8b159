// The job's trace file (runtime/obs/trace_file.hpp): the Chrome trace-event JSON it writes,
// field for field (microseconds from the zero with nanoseconds kept, instants on their
// thread, names escaped); the file under its name only once closed; the bound, where every
// event is either written or counted as dropped; and a path that cannot be created refused.
#include <doctest/doctest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "runtime/core/error.hpp"
#include "runtime/obs/trace_file.hpp"

using namespace cohort;

namespace {

struct temp_dir {
  std::string path;
  temp_dir() {
    char tmpl[] = "/tmp/cohort-trace-file-XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~temp_dir() { std::filesystem::remove_all(path); }
};

nlohmann::json read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return nlohmann::json::parse(s.str());
}

}  // namespace

TEST_CASE("trace file: events field for field, on the zero's clock, under its name once closed") {
  temp_dir d;
  const std::string path = d.path + "/job.json";
  obs::trace_file f(path, 500);
  CHECK(std::filesystem::exists(path + ".partial"));
  CHECK_FALSE(std::filesystem::exists(path));
  f.name_process(1, "worker \"0\"", 1);
  f.name_thread(1, trace::compute, "compute");
  f.add(1, trace::event{"forward", "compute", 'X', 1500, 2500, trace::compute, "\"mb\":3"});
  f.add(0, trace::event{"kill w\\1", "fault", 'i', 250, 0, 1, ""});
  f.set_meta("clock", "test");
  f.close();
  f.close();  // idempotent
  CHECK_FALSE(std::filesystem::exists(path + ".partial"));
  const nlohmann::json j = read(path);
  CHECK(j["displayTimeUnit"] == "ms");
  const auto& ev = j["traceEvents"];
  REQUIRE(ev.size() == 5);  // process name, sort index, thread name, two events
  CHECK(ev[0]["name"] == "process_name");
  CHECK(ev[0]["args"]["name"] == "worker \"0\"");
  CHECK(ev[1]["args"]["sort_index"] == 1);
  CHECK(ev[2]["args"]["name"] == "compute");
  const auto& x = ev[3];
  CHECK(x["name"] == "forward");
  CHECK(x["ph"] == "X");
  CHECK(x["ts"].get<double>() == doctest::Approx(1.0));   // (1500 - 500) ns
  CHECK(x["dur"].get<double>() == doctest::Approx(2.5));  // 2500 ns
  CHECK(x["pid"] == 1);
  CHECK(x["tid"] == 0);
  CHECK(x["args"]["mb"] == 3);
  const auto& i = ev[4];
  CHECK(i["name"] == "kill w\\1");
  CHECK(i["ph"] == "i");
  CHECK(i["s"] == "t");
  CHECK(i["ts"].get<double>() == doctest::Approx(-0.25));  // before the zero, sign kept
  CHECK_FALSE(i.contains("dur"));
  CHECK(j["otherData"]["clock"] == "test");
  CHECK(j["otherData"]["clock_zero_ns"] == 500);
  CHECK(j["otherData"]["events_dropped"] == 0);
  CHECK(j["otherData"]["events_written"] == 5);
}

TEST_CASE("trace file: past its bound every event is either written or counted as dropped") {
  temp_dir d;
  const std::string path = d.path + "/bounded.json";
  obs::trace_file f(path, 0, 3);
  for (int k = 0; k < 10; ++k)
    f.add(1, trace::event{"forward", "compute", 'X', k * 1000, 10, trace::compute, ""});
  f.close();
  const nlohmann::json j = read(path);
  const auto written = j["traceEvents"].size();
  const auto dropped = j["otherData"]["events_dropped"].get<std::size_t>();
  CHECK(written >= 3);
  CHECK(written + dropped == 10);
  CHECK(f.dropped() == dropped);
}

TEST_CASE("trace file: a path that cannot be created is a usage error naming it") {
  try {
    obs::trace_file f("/nonexistent-folder-of-cohort/job.json", 0);
    FAIL("no error");
  } catch (const usage_error& e) {
    const std::string what = e.what();
    CHECK(what.find("/nonexistent-folder-of-cohort/job.json") != std::string::npos);
    CHECK(what.find("folder that exists") != std::string::npos);
  }
}

TEST_CASE("trace file: abandoned, it leaves nothing behind, and a later close does nothing") {
  temp_dir d;
  const std::string path = d.path + "/never.json";
  obs::trace_file f(path, 0);
  f.add(0, trace::event{"step", "job", 'X', 0, 10, 0, ""});
  f.abandon();
  CHECK_FALSE(std::filesystem::exists(path + ".partial"));
  CHECK_FALSE(std::filesystem::exists(path));
  f.close();
  CHECK_FALSE(std::filesystem::exists(path));
}
