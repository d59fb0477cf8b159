// fault_seat (runtime/step/step_faults.hpp): the wrapper that carries out injected faults around a
// seat, against a fake seat that records what it was asked. kill is not tried here (it
// SIGKILLs the process): the multi-process fault tests cover it.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/step/step_faults.hpp"

using namespace cohort;
using cohort::step::fault_hooks;
using cohort::step::fault_seat;

namespace {

using clock_type = std::chrono::steady_clock;
using std::chrono::milliseconds;

/// A seat whose compute hands over two ranges and records every call it gets. Its compute
/// takes `compute_time` on the fake clock `clock`; a stage-like one also reports passes of
/// `passes` through its links' after_compute.
struct fake_seat final : train::seat {
  std::vector<std::string>* log;
  clock_type::time_point* clock = nullptr;
  clock_type::duration compute_time{};
  std::vector<clock_type::duration> passes;
  train::stage_links links;
  explicit fake_seat(std::vector<std::string>* l) : log(l) {}
  std::pair<int, int> position() const override { return {0, 0}; }
  int micro_batches() const override { return 2; }
  comm::grad_type reduction_type() const override { return comm::grad_type::f32; }
  std::size_t elements() override { return 4; }
  void set_links(train::stage_links l) override { links = std::move(l); }
  void begin_step() override {}
  double compute_gradients(int64_t step, const std::vector<int>&,
                           const nn::grads_ready_fn& ready) override {
    log->push_back("compute " + std::to_string(step));
    if (clock != nullptr) *clock += compute_time;
    for (const auto p : passes)
      if (links.after_compute) links.after_compute(p);
    log->push_back("ready 2");
    if (ready) ready(2, 2);
    log->push_back("ready 0");
    if (ready) ready(0, 2);
    return 1.5;
  }
  void* reduction_buffer() override { return buf; }
  comm::wire_plan wire(int, int) override { return {}; }
  void finish_gradients(int64_t) override {}
  void apply_step(int64_t) override {}
  bool speaks_for_loss() const override { return true; }
  std::vector<std::pair<float*, std::size_t>> state_buffers() override { return {}; }
  int64_t optimizer_steps() const override { return 0; }
  void set_optimizer_steps(int64_t) override {}
  int64_t load_checkpoint(const std::string&) override { return 0; }
  void save(train::checkpoint_writer&, int64_t, uint64_t) override {}
  bool saves_every_rank() const override { return false; }
  train::evaluation evaluate(int64_t) override { return {}; }
  train::seat_report report() override { return {}; }
  int64_t peak_pool_bytes() const override { return 0; }
  float buf[4] = {};
};

struct fixture {
  std::vector<std::string> log;
  fake_seat* inner;
  fault_seat seat;
  fixture(fault_hooks h = {}, step::slow_clock c = {})
      : fixture(std::make_unique<fake_seat>(&log), std::move(h), std::move(c)) {}
  fixture(std::unique_ptr<fake_seat> s, fault_hooks h, step::slow_clock c)
      : inner(s.get()), seat(std::move(s), std::move(h), std::move(c)) {}
  void step(uint64_t generation, int64_t step, int rank = 0) {
    seat.begin(generation, step, rank, [this] { log.push_back("abort comm"); });
    CHECK(seat.compute_gradients(step, {0}, [this](std::size_t off, std::size_t) {
      log.push_back("marked " + std::to_string(off));
    }) == 1.5);
  }
};

net::fault_order order(net::fault_action a, uint64_t generation, int64_t step) {
  net::fault_order f;
  f.action = a;
  f.generation = generation;
  f.step = step;
  f.duration_ms = 30;
  f.factor = 3;
  return f;
}

}  // namespace

TEST_CASE("no fault armed: every call passes straight through") {
  fixture x;
  x.step(1, 0);
  CHECK(x.log ==
        std::vector<std::string>{"compute 0", "ready 2", "marked 2", "ready 0", "marked 0"});
}

TEST_CASE("a hang mutes heartbeats and stalls right after the first range went out, once") {
  std::vector<uint32_t> muted;
  fixture x(fault_hooks{[&](uint32_t ms) { muted.push_back(ms); }, {}});
  x.seat.arm(order(net::fault_action::hang, 2, 5));
  x.step(2, 4);  // another step: nothing
  CHECK(muted.empty());
  const auto t0 = std::chrono::steady_clock::now();
  x.log.clear();
  x.step(2, 5);
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(30));
  CHECK(muted == std::vector<uint32_t>{30});
  // The first range reached the data plane before the stall; the second came after it.
  CHECK(x.log ==
        std::vector<std::string>{"compute 5", "ready 2", "marked 2", "ready 0", "marked 0"});
  x.step(2, 5);  // carried out once: a retry of the step runs clean
  CHECK(muted.size() == 1);
}

TEST_CASE("a fault for another generation is kept until its own step comes") {
  std::vector<uint32_t> cut;
  fixture x(fault_hooks{{}, [&](uint32_t ms) { cut.push_back(ms); }});
  x.seat.arm(order(net::fault_action::partition, 3, 7));
  x.step(2, 7);  // same step number, older generation
  CHECK(cut.empty());
  x.step(3, 7);
  CHECK(cut == std::vector<uint32_t>{30});
}

TEST_CASE("slow stretches a seat's whole compute when it reports no pass, that step only") {
  clock_type::time_point fake_now{};
  std::vector<clock_type::duration> paused;
  step::slow_clock c;
  c.pause = [&](clock_type::duration d) { paused.push_back(d); };
  c.now = [&] { return fake_now; };
  fixture x({}, c);
  x.inner->clock = &fake_now;
  x.inner->compute_time = milliseconds(10);
  x.seat.arm(order(net::fault_action::slow, 1, 2));  // factor 3
  x.step(1, 2);
  CHECK(paused == std::vector<clock_type::duration>{milliseconds(20)});
  x.step(1, 3);
  CHECK(paused.size() == 1);
}

TEST_CASE("slow stretches each pass a stage reports, inside its compute, that step only") {
  std::vector<clock_type::duration> paused;
  std::vector<clock_type::duration> reported;  // the links' own hook still sees every pass
  step::slow_clock c;
  c.pause = [&](clock_type::duration d) { paused.push_back(d); };
  fixture x({}, c);
  x.inner->passes = {milliseconds(4), milliseconds(6)};
  train::stage_links l;
  l.after_compute = [&](clock_type::duration d) { reported.push_back(d); };
  x.seat.set_links(std::move(l));
  x.seat.arm(order(net::fault_action::slow, 1, 2));
  x.step(1, 2);
  // (3 - 1) x each pass, and nothing more for the call as a whole.
  CHECK(paused == std::vector<clock_type::duration>{milliseconds(8), milliseconds(12)});
  x.step(1, 3);
  CHECK(paused.size() == 2);
  CHECK(reported.size() == 4);
}

TEST_CASE("slow_extra: (factor - 1) x the time spent, nothing at or below factor 1") {
  CHECK(step::slow_extra(milliseconds(10), 3) == milliseconds(20));
  CHECK(step::slow_extra(milliseconds(10), 1.5) == milliseconds(5));
  CHECK(step::slow_extra(milliseconds(10), 1) == clock_type::duration::zero());
  CHECK(step::slow_extra(milliseconds(10), 0.5) == clock_type::duration::zero());
}

TEST_CASE("COHORT_TEST_ABORT_COMM aborts the communicator of that step and rank, once") {
  ::setenv("COHORT_TEST_ABORT_COMM", "4:1", 1);
  fixture x;
  ::unsetenv("COHORT_TEST_ABORT_COMM");
  x.step(1, 4, 0);  // another rank
  CHECK(std::count(x.log.begin(), x.log.end(), "abort comm") == 0);
  x.log.clear();
  x.step(1, 4, 1);
  CHECK(x.log == std::vector<std::string>{"compute 4", "ready 2", "marked 2", "abort comm",
                                          "ready 0", "marked 0"});
  x.log.clear();
  x.step(2, 4, 1);  // once per process
  CHECK(std::count(x.log.begin(), x.log.end(), "abort comm") == 0);
}
