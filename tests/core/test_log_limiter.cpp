// log_limiter (runtime/core/log_limiter.*) on a manual clock: which occurrences of a flooded
// warning are logged, and that the counts of those left out add up. No sleeps.
#include <doctest/doctest.h>

#include <chrono>
#include <memory>

#include "runtime/core/log_limiter.hpp"

using namespace cohort;
using std::chrono::milliseconds;
using std::chrono::seconds;
using std::chrono::steady_clock;

namespace {

// A limiter of BURST lines per 10 s reading *NOW.
log_limiter limiter_at(const std::shared_ptr<steady_clock::time_point>& now, int burst) {
  log_limiter::options o;
  o.burst = burst;
  o.period = seconds(10);
  return log_limiter(o, [now] { return *now; });
}

}  // namespace

TEST_CASE("log limiter: a burst is logged, the rest counted, and the next line says how many") {
  auto now = std::make_shared<steady_clock::time_point>();
  log_limiter l = limiter_at(now, 3);
  for (int i = 0; i < 3; ++i) {
    const auto line = l.admit();
    REQUIRE(line.has_value());
    CHECK(line->left_out == 0);
    CHECK(log_limiter::suffix(*line, "refused").empty());
  }
  // The rest of the period is left out, up to its last instant.
  for (int i = 0; i < 7; ++i) CHECK_FALSE(l.admit().has_value());
  *now += seconds(10) - milliseconds(1);
  CHECK_FALSE(l.admit().has_value());
  // A new period: logged at once, with the count of the 8 left out and the time since.
  *now += milliseconds(1);
  const auto line = l.admit();
  REQUIRE(line.has_value());
  CHECK(line->left_out == 8);
  CHECK(line->since == seconds(10));
  CHECK(log_limiter::suffix(*line, "refused") ==
        "; 8 more refused since the last line (10.0 s ago), not logged");
  // Each count is told once: the next line of the period has none.
  const auto next = l.admit();
  REQUIRE(next.has_value());
  CHECK(next->left_out == 0);
}

TEST_CASE("log limiter: a long flood costs burst lines a period and loses no count") {
  auto now = std::make_shared<steady_clock::time_point>();
  log_limiter l = limiter_at(now, 5);
  const int periods = 100, per_period = 1000;
  uint64_t lines = 0, told = 0;
  for (int p = 0; p < periods; ++p) {
    for (int i = 0; i < per_period; ++i) {
      if (const auto line = l.admit()) {
        ++lines;
        told += line->left_out;
      }
      *now += milliseconds(10);  // 1000 occurrences spread over each 10 s period
    }
  }
  CHECK(lines == 5u * periods);
  // Every occurrence is either logged or told by a later line, except the last period's
  // tail, which waits for the next line.
  const uint64_t tail = per_period - 5;
  CHECK(told + lines + tail == static_cast<uint64_t>(periods) * per_period);
  *now += seconds(60);
  const auto after = l.admit();
  REQUIRE(after.has_value());
  CHECK(after->left_out == tail);
}

TEST_CASE("log limiter: after a quiet spell the next occurrence is logged at once") {
  auto now = std::make_shared<steady_clock::time_point>();
  log_limiter l = limiter_at(now, 1);
  REQUIRE(l.admit().has_value());
  CHECK_FALSE(l.admit().has_value());
  *now += seconds(3600);
  const auto line = l.admit();
  REQUIRE(line.has_value());
  CHECK(line->left_out == 1);
  CHECK(line->since == seconds(3600));
}

TEST_CASE("log_quoted: a stranger's text quoted, its other bytes and the quote escaped, cut at max") {
  CHECK(cohort::log_quoted("/cohort/run-a/done") == "'/cohort/run-a/done'");
  CHECK(cohort::log_quoted(std::string("a'\x01\xff", 4)) == "'a\\x27\\x01\\xff'");
  CHECK(cohort::log_quoted("abcdef", 3) == "'abc'...");
  CHECK(cohort::log_quoted("abc", 3) == "'abc'");
}
