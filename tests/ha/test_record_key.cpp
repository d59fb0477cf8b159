// The run's sealed etcd records (runtime/ha/record_key): what opens and what does not
// (a tampered value, another key, a record moved under another name, a stranger's plain
// value), the key's file (made private, refused when not), and the refusal log's limits.
// No etcd needed.
#include <doctest/doctest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <chrono>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/core/error.hpp"
#include "runtime/ha/record_key.hpp"
#include "tests/data/temp_dir.hpp"

using cohort::ha::record_key;
using cohort::ha::refusal_log;

namespace {

const record_key run_key(std::string(32, 'k'));
const std::string done = "/cohort/run-a/done";
const std::string fault0 = "/cohort/run-a/added_faults/0000000000";

}  // namespace

TEST_CASE("a sealed record opens under its key and name, with its value unchanged") {
  const std::string value = "kill worker=worker-1 at step=2000";
  const std::string rec = run_key.seal(fault0, value);
  CHECK(rec.rfind("cohort-rec-v1 ", 0) == 0);
  const auto o = run_key.open(fault0, rec);
  REQUIRE(o.value.has_value());
  CHECK(*o.value == value);
  // Any bytes, the empty value included.
  const std::string odd("a\0b\n\xff c", 7);
  CHECK(*run_key.open(done, run_key.seal(done, odd)).value == odd);
  CHECK(*run_key.open(done, run_key.seal(done, "")).value == "");
}

TEST_CASE("a tampered value, another key, another name or a plain value does not open") {
  const std::string rec = run_key.seal(fault0, "kill worker=worker-1 at step=2000");
  std::string tampered = rec;
  tampered.back() = '1';  // at step=2001
  CHECK_FALSE(run_key.open(fault0, tampered).value);
  CHECK(run_key.open(fault0, tampered).problem.find("seal does not hold") != std::string::npos);

  const record_key other(std::string(32, 'x'));
  CHECK_FALSE(other.open(fault0, rec).value);

  // Replayed under another key name: the MAC covers the name.
  CHECK_FALSE(run_key.open("/cohort/run-a/added_faults/0000000001", rec).value);
  CHECK_FALSE(run_key.open("/cohort/run-b/added_faults/0000000000", rec).value);
  // A name/value split moved by one byte does not collide either.
  CHECK_FALSE(run_key.open(done + "1", run_key.seal(done, "1")).value);

  // What a stranger writes with curl: no seal at all.
  for (const std::string& plain :
       std::vector<std::string>{"1", "", "cohort-rec-v1 ", "cohort-rec-v1 zz 1",
                                "cohort-rec-v1 " + std::string(64, '0') + " 1"}) {
    CAPTURE(plain);
    const auto o = run_key.open(done, plain);
    CHECK_FALSE(o.value);
    CHECK_FALSE(o.problem.empty());
  }
}

TEST_CASE("the key: at least 32 bytes, derived the same from the same coordinator secret") {
  CHECK_THROWS_AS(record_key(std::string(31, 'k')), cohort::usage_error);
  const auto a = record_key::from_coordinator_secret("secret-z85-of-the-coordinator-key-0000000");
  const auto b = record_key::from_coordinator_secret("secret-z85-of-the-coordinator-key-0000000");
  const auto c = record_key::from_coordinator_secret("secret-z85-of-the-coordinator-key-0000001");
  const std::string rec = a.seal(done, "1");
  CHECK(b.open(done, rec).value);
  CHECK_FALSE(c.open(done, rec).value);
  CHECK_THROWS_AS(record_key::from_coordinator_secret(""), cohort::usage_error);
}

TEST_CASE("the key file: written 0600, never overwritten, refused when others can read it") {
  cohort::test::temp_dir dir;
  const std::string f = dir.file("etcd-record.key");
  record_key::write_new(f);
  struct stat st {};
  REQUIRE(::stat(f.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  const auto k = record_key::load(f);
  CHECK(record_key::load(f).open(done, k.seal(done, "1")).value);
  CHECK_THROWS_AS(record_key::write_new(f), cohort::usage_error);  // still the same key
  CHECK(record_key::load(f).open(done, k.seal(done, "1")).value);

  ::chmod(f.c_str(), 0644);
  try {
    record_key::load(f);
    FAIL("a key others can read was loaded");
  } catch (const cohort::usage_error& e) {
    CHECK(std::string(e.what()).find("chmod 600") != std::string::npos);
  }
  const std::string bad = dir.file("bad.key");
  cohort::test::write_all(bad, "not hex\n");
  ::chmod(bad.c_str(), 0600);
  CHECK_THROWS_AS(record_key::load(bad), cohort::usage_error);
  CHECK_THROWS_AS(record_key::load(dir.file("missing.key")), cohort::usage_error);
}

TEST_CASE("refusals: each bad record logged once, at most one line per period") {
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
  auto logger = std::make_shared<spdlog::logger>("refusals", sink);
  auto before = spdlog::default_logger();
  spdlog::set_default_logger(logger);
  refusal_log log(std::chrono::hours(1));
  for (int i = 0; i < 100; ++i) log.refuse("coordinator", done, 7, "not sealed");
  CHECK(log.logged() == 1);
  log.refuse("coordinator", done, 8, "not sealed");            // a new write: held back
  log.refuse("coordinator", std::string("a\x01", 2), 9, "x");  // so is another key
  CHECK(log.logged() == 1);
  refusal_log fast(std::chrono::milliseconds(0));
  fast.refuse("coordinator", std::string("/k\x01", 3), 1, "why");
  fast.refuse("coordinator", done, 2, "why");
  CHECK(fast.logged() == 2);
  spdlog::set_default_logger(before);
  const std::string text = out.str();
  CHECK(text.find("/cohort/run-a/done") != std::string::npos);
  CHECK(text.find("/k\\x01") != std::string::npos);  // a stranger's bytes, escaped
}
