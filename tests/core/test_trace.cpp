// The trace recorder (runtime/core/trace.hpp): nothing recorded while off, spans and
// instants kept in order with their fields, the bound counted in dropped(); and the clock
// offset estimate (runtime/core/clock_sync.hpp): NTP's rule on closed-form probes.
#include <doctest/doctest.h>

#include <thread>
#include <vector>

#include "runtime/core/clock_sync.hpp"
#include "runtime/core/trace.hpp"

using namespace cohort;

TEST_CASE("trace: off records nothing, on keeps spans and instants in order, up to its bound") {
  trace::enable(false);
  trace::take();
  trace::complete("forward", "compute", 10, 30, trace::track::compute);
  { trace::span s("backward", "compute", trace::track::compute); }
  CHECK(trace::take().empty());

  trace::enable(true, 3);
  const uint64_t dropped_before = trace::dropped();
  trace::complete("forward", "compute", 10, 30, trace::track::compute, trace::args({{"mb", 2}}));
  trace::instant("kill", "fault", 40, trace::track::control);
  const int64_t before = trace::now_ns();
  {
    trace::span s("allreduce", "comm", trace::track::comm,
                  trace::args({{"bytes", 4096}, {"bucket", 1}}));
  }
  const int64_t after = trace::now_ns();
  trace::complete("late", "compute", 50, 40, trace::track::compute);  // over the bound
  const std::vector<trace::event> got = trace::take();
  REQUIRE(got.size() == 3);
  CHECK(got[0].name == "forward");
  CHECK(got[0].ph == 'X');
  CHECK(got[0].ts_ns == 10);
  CHECK(got[0].dur_ns == 20);
  CHECK(got[0].args == "\"mb\":2");
  CHECK(got[1].name == "kill");
  CHECK(got[1].ph == 'i');
  CHECK(got[1].tid == trace::track::control);
  CHECK(got[2].name == "allreduce");
  CHECK(got[2].args == "\"bytes\":4096,\"bucket\":1");
  // The scope's span lies within the clock readings around it.
  CHECK(got[2].ts_ns >= before);
  CHECK(got[2].ts_ns + got[2].dur_ns <= after);
  CHECK(got[2].dur_ns >= 0);
  CHECK(trace::dropped() == dropped_before + 1);
  // take() empties the buffer: the bound applies between two takes.
  trace::complete("again", "compute", 0, 5, trace::track::compute);
  CHECK(trace::take().size() == 1);
  trace::enable(false);
}

TEST_CASE("trace: threads recording at once lose nothing under the bound") {
  trace::enable(true, 4 * 1000);
  trace::take();
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([t] {
      for (int i = 0; i < 1000; ++i)
        trace::complete("x", "compute", i, i + 1, static_cast<uint32_t>(t));
    });
  for (auto& t : ts) t.join();
  const auto got = trace::take();
  CHECK(got.size() == 4000);
  std::vector<int> per(4, 0);
  for (const auto& e : got) ++per.at(e.tid);
  CHECK(per == std::vector<int>{1000, 1000, 1000, 1000});
  trace::enable(false);
}

TEST_CASE("clock_sync: the shortest round trip gives the offset, half of it the error") {
  clock_sync c(3);
  CHECK(c.current().error_ns == -1);
  // The peer's clock is 1000 ahead. A symmetric probe: sent at 0, answered at 1000 + 50,
  // back at 100: exact.
  c.sample(0, 1050, 100);
  CHECK(c.current().offset_ns == 1000);
  CHECK(c.current().error_ns == 50);
  // A slower, lopsided probe (60 out, 340 back) is not used: its round trip is longer.
  c.sample(1000, 1000 + 60 + 1000, 1400);
  CHECK(c.current().offset_ns == 1000);
  // A faster lopsided one (30 out, 10 back) is, and its error stays within its bound.
  c.sample(2000, 2000 + 30 + 1000, 2040);
  CHECK(c.current().error_ns == 20);
  CHECK(c.current().offset_ns == 1010);  // true 1000: off by 10 <= 20
  // The window forgets the oldest probes; one that came back before it left is ignored.
  c.sample(3000, 3000 + 200 + 1000, 3400);
  c.sample(5000, 0, 4000);
  c.sample(4000, 4000 + 150 + 1000, 4300);
  CHECK(c.current().offset_ns == 1010);  // the 40 ns probe is still among the last three
  c.sample(5000, 5000 + 100 + 1000, 5200);
  CHECK(c.current().offset_ns == 1000);  // 3000's probe aged out; 5000's: rtt 200, centred
  CHECK(c.current().error_ns == 100);
}
