// The control plane's injected faults as a frame filter (runtime/step/control_faults.hpp):
// which frames `drop control` may lose, its draw as a pure function of (seed, frame number),
// the job's filter, which reads a drop control added mid-run and counts what it drops, and
// the coordinator's link cut on a fake clock.
#include <doctest/doctest.h>

#include <chrono>
#include <vector>

#include "runtime/core/config.hpp"
#include "runtime/core/rng.hpp"
#include "runtime/step/control_faults.hpp"
#include "runtime/step/training_job.hpp"

using namespace cohort;
using namespace cohort::step;

namespace {

config job_config() {
  return load_config_text(
      "cluster:\n  workers: 2\ntrain:\n  steps: 3\n  global_batch: 64\n  micro_batch: 16\n",
      "<test>");
}

}  // namespace

TEST_CASE("drop control may lose the step protocol, rosters and heartbeats, nothing else") {
  using net::msg_type;
  for (const msg_type t :
       {msg_type::roster_update, msg_type::heartbeat, msg_type::heartbeat_ack, msg_type::job_spec,
        msg_type::worker_ready, msg_type::step_open, msg_type::step_vote, msg_type::step_result,
        msg_type::train_report, msg_type::fault_order})
    CHECK(drop_control_may_drop(t));
  for (const msg_type t : {msg_type::register_request, msg_type::admin_request, msg_type::kv_set,
                           msg_type::kv_wait, msg_type::stop, msg_type::ping})
    CHECK_FALSE(drop_control_may_drop(t));
}

TEST_CASE("drop control's draw n is lost when hash(seed, 'drop', n) falls below p") {
  const faults::fault_spec d = faults::parse_fault("drop control p=0.25 seed=7");
  int lost = 0, differ = 0;
  for (uint64_t n = 0; n < 4000; ++n) {
    const double u =
        static_cast<double>(hash_coords(7, 0x64726f70u, n) >> 11) * (1.0 / 9007199254740992.0);
    differ += drop_control_draw(d, n) != (u < 0.25) ? 1 : 0;
    lost += drop_control_draw(d, n) ? 1 : 0;
  }
  CHECK(differ == 0);
  CHECK(lost > 800);  // about a quarter of 4000
  CHECK(lost < 1200);
  CHECK(drop_control_draw(faults::parse_fault("drop control p=1 seed=7"), 0));
}

TEST_CASE("the job's filter drops nothing until a drop control is set, then draws in order") {
  const config c = job_config();
  auto job = std::make_shared<training_job>(c, dump_config(c));
  const std::shared_ptr<frame_filter> f = job_frame_filter(job);
  REQUIRE(f != nullptr);
  CHECK(job_frame_filter(nullptr) == nullptr);
  CHECK_FALSE(f->decides(net::msg_type::heartbeat));
  CHECK_FALSE(f->drop(net::msg_type::heartbeat));
  CHECK(f->counters().empty());

  job->set_faults({faults::parse_fault("drop control p=0.5 seed=3")});
  const faults::fault_spec d = *job->drop_control();
  CHECK(f->decides(net::msg_type::heartbeat));
  CHECK_FALSE(f->decides(net::msg_type::register_request));
  // Frames it may not drop use no draw: the n-th droppable frame takes draw n.
  uint64_t draw = 0, lost = 0;
  for (int i = 0; i < 200; ++i) {
    CHECK_FALSE(f->drop(net::msg_type::register_request));
    const bool want = drop_control_draw(d, draw++);
    CHECK(f->drop(net::msg_type::step_vote) == want);
    lost += want ? 1 : 0;
  }
  CHECK(lost > 0);
  CHECK(job->report().dropped_frames() == lost);
  const auto counters = f->counters();
  REQUIRE(counters.size() == 1);
  CHECK(counters[0].name == "drop_control");
  CHECK(counters[0].value == lost);
}

TEST_CASE("a link cut is down from the cut until its deadline, and a later cut replaces it") {
  std::chrono::steady_clock::time_point now{};
  link_cut cut([&] { return now; });
  CHECK_FALSE(cut.down());
  cut.cut_for(std::chrono::milliseconds(100));
  CHECK(cut.down());
  now += std::chrono::milliseconds(99);
  CHECK(cut.down());
  now += std::chrono::milliseconds(1);
  CHECK_FALSE(cut.down());  // the deadline itself: up again
  cut.cut_for(std::chrono::milliseconds(50));
  cut.cut_for(std::chrono::milliseconds(10));  // replaces, does not extend
  now += std::chrono::milliseconds(10);
  CHECK_FALSE(cut.down());
}

TEST_CASE(
    "a worker's held link: muted sends no heartbeats, cut holds frames and gives them back in "
    "order") {
  std::chrono::steady_clock::time_point now{};
  held_link link([&] { return now; });
  CHECK_FALSE(link.muted());
  net::message a = net::heartbeat{};
  CHECK_FALSE(link.hold_out(a));  // up: the caller sends it

  // hang: silent, but frames still go.
  link.mute_for(std::chrono::milliseconds(30));
  CHECK(link.muted());
  CHECK_FALSE(link.cut());
  CHECK_FALSE(link.hold_out(a));
  now += std::chrono::milliseconds(30);
  CHECK_FALSE(link.muted());

  // partition: muted and every frame held, each direction in order.
  link.cut_for(std::chrono::milliseconds(100));
  CHECK(link.muted());
  net::heartbeat h1{};
  h1.seq = 1;
  net::heartbeat h2{};
  h2.seq = 2;
  CHECK(link.hold_out(h1));
  CHECK(link.hold_out(h2));
  net::message in = net::heartbeat_ack{};
  CHECK(link.hold_in("coordinator", in));
  auto nothing = link.release();  // still cut: nothing comes back
  CHECK(nothing.first.empty());
  CHECK(nothing.second.empty());
  now += std::chrono::milliseconds(100);
  auto [out, back] = link.release();
  REQUIRE(out.size() == 2);
  CHECK(std::get<net::heartbeat>(out[0]).seq == 1);
  CHECK(std::get<net::heartbeat>(out[1]).seq == 2);
  REQUIRE(back.size() == 1);
  CHECK(back[0].first == "coordinator");
  CHECK(std::holds_alternative<net::heartbeat_ack>(back[0].second));
  CHECK(link.release().first.empty());  // given back once
}
