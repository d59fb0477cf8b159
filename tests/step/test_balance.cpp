// train.balance (runtime/step/balance.hpp): the planner's arithmetic as tables: shares in
// proportion to speed, whole micro-batches, at least one each, none lost or duplicated;
// which micro-batches each rank computes; the filter over measured times; when a re-plan
// is worth it; and the coordinator putting its plans into step_open.
#include <doctest/doctest.h>

#include <cmath>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "runtime/core/config.hpp"
#include "runtime/core/error.hpp"
#include "runtime/step/balance.hpp"
#include "runtime/step/training_job.hpp"

using namespace cohort;
using namespace cohort::step;

TEST_CASE("balance: shares follow speed, whole, at least one each, summing to the step") {
  struct row {
    std::vector<double> speeds;
    int micro;
    std::vector<int> want;
  };
  const std::vector<row> table = {
      {{1, 1}, 4, {2, 2}},
      {{1, 0.5}, 4, {3, 1}},      // 2.67 / 1.33: the extra one to the larger remainder
      {{2, 1}, 6, {4, 2}},        // exact
      {{1, 1, 1}, 4, {2, 1, 1}},  // a tie goes to the lower rank
      {{1, 0.01}, 8, {7, 1}},     // the slow one keeps one
      {{1, 0.01, 0.01}, 8, {6, 1, 1}},
      {{3, 1, 1, 1}, 12, {6, 2, 2, 2}},
      {{1, 2, 3, 4}, 4, {1, 1, 1, 1}},  // as many micro-batches as ranks
      {{5}, 3, {3}},
  };
  for (const row& r : table) {
    CAPTURE(r.micro);
    const std::vector<int> got = shares_for(r.speeds, r.micro);
    CHECK(got == r.want);
    CHECK(std::accumulate(got.begin(), got.end(), 0) == r.micro);
  }
  // Any speeds: never below one, never a micro-batch lost or given twice.
  for (int n = 1; n <= 6; ++n)
    for (int m = n; m <= 3 * n + 5; ++m)
      for (double skew : {1.0, 1.7, 3.0, 50.0}) {
        std::vector<double> s;
        for (int r = 0; r < n; ++r) s.push_back(r % 2 ? skew : 1.0 + 0.1 * r);
        const std::vector<int> got = shares_for(s, m);
        CHECK(std::accumulate(got.begin(), got.end(), 0) == m);
        for (int x : got) CHECK(x >= 1);
      }
  CHECK_THROWS_AS(shares_for({1, 1, 1}, 2), error);  // fewer micro-batches than ranks
  CHECK_THROWS_AS(shares_for({1, 0}, 4), error);     // a speed of zero
  CHECK(predicted_step_s({3, 1}, {1, 0.5}) == doctest::Approx(3.0));
  CHECK(predicted_step_s({2, 2}, {1, 0.5}) == doctest::Approx(4.0));
}

TEST_CASE("balance: each rank's micro-batches, a pure function of the shares, bad ones refused") {
  // Contiguous ranges in rank order under shares; the round robin without.
  CHECK(micro_batches_of({3, 1}, 4, 2, 0) == std::vector<int>{0, 1, 2});
  CHECK(micro_batches_of({3, 1}, 4, 2, 1) == std::vector<int>{3});
  CHECK(micro_batches_of({1, 2, 3}, 6, 3, 2) == std::vector<int>{3, 4, 5});
  CHECK(micro_batches_of({}, 5, 2, 0) == std::vector<int>{0, 2, 4});
  CHECK(micro_batches_of({}, 5, 2, 1) == std::vector<int>{1, 3});
  // Every micro-batch of the step exactly once over the ranks.
  const std::vector<int32_t> shares = {2, 5, 1};
  std::multiset<int> all;
  for (int r = 0; r < 3; ++r)
    for (int i : micro_batches_of(shares, 8, 3, r)) all.insert(i);
  CHECK(all == std::multiset<int>{0, 1, 2, 3, 4, 5, 6, 7});
  // A step_open whose shares do not fit the step (hostile, or another job's) is refused.
  CHECK_THROWS_AS(micro_batches_of({3, 1}, 5, 2, 0), error);  // sum 4, not 5
  CHECK_THROWS_AS(micro_batches_of({4, 0}, 4, 2, 0), error);  // a rank with none
  CHECK_THROWS_AS(micro_batches_of({4}, 4, 2, 0), error);     // one count for two ranks
  CHECK_THROWS_AS(micro_batches_of({2, 2}, 4, 2, 2), error);  // no such rank
  net::step_open o;
  o.replicas = 2;
  o.rank = 1;
  CHECK(micro_count(o, 5) == 2);
  o.shares = {4, 1};
  CHECK(micro_count(o, 5) == 1);
}

TEST_CASE("balance: the speed filter weighs the newest step by alpha") {
  speed_meter m;
  CHECK_FALSE(m.speed(7).has_value());
  m.record(7, 0.4, 4);  // 0.1 s a micro-batch
  REQUIRE(m.speed(7).has_value());
  CHECK(*m.speed(7) == doctest::Approx(10.0));
  m.record(7, 0.8, 4);  // 0.2 s: 0.3 * 0.2 + 0.7 * 0.1 = 0.13
  CHECK(*m.speed(7) == doctest::Approx(1.0 / 0.13));
  m.record(7, 1.0, 0);  // no micro-batches: ignored
  CHECK(*m.speed(7) == doctest::Approx(1.0 / 0.13));
  m.forget(7);
  CHECK_FALSE(m.speed(7).has_value());
  // Worth a new plan only when the predicted step shortens by more than the threshold.
  CHECK(worth_replanning({2, 2}, {3, 1}, {1, 0.5}, 0.05));  // 4 s -> 3 s
  CHECK_FALSE(worth_replanning({2, 2}, {2, 2}, {1, 0.5}, 0.05));
  CHECK_FALSE(worth_replanning({2, 2}, {3, 1}, {1, 0.95}, 0.05));    // 2.1 s -> 3 s: worse
  CHECK_FALSE(worth_replanning({10, 10}, {11, 9}, {1, 0.9}, 0.05));  // 11.1 s -> 11 s: 1%
}

TEST_CASE("balance: the speeds' drift counts fractions of the total, not absolute speeds") {
  CHECK(speed_drift({1, 1}, {1, 1}) == 0.0);
  CHECK(speed_drift({1, 1}, {2, 2}) == 0.0);  // everyone twice as fast: no rank's share moves
  CHECK(speed_drift({1, 1}, {3, 1}) == doctest::Approx(0.5));  // 1/2 -> 3/4 and 1/2 -> 1/4
  CHECK(speed_drift({2, 1}, {2, 0.5}) == doctest::Approx(0.4));  // b: 1/3 -> 1/5
  CHECK(speed_drift({1, 1, 1, 1}, {1, 1, 1, 0.9}) == doctest::Approx(0.0769).epsilon(0.001));
  CHECK(std::isinf(speed_drift({}, {1, 1})));
  CHECK(std::isinf(speed_drift({1, 1, 1}, {1, 1})));
}

TEST_CASE("balance: a drift within the bound moves no micro-batch, even when worth 5%") {
  using ranks = std::vector<std::pair<uint64_t, std::string>>;
  const ranks ab = {{1, "a"}, {2, "b"}};
  const auto settle = [](balancer& b, uint64_t id, double speed) {
    for (int i = 0; i < 60; ++i) b.measured(id, 1.0 / speed, 1);  // the filter converges
  };
  balancer b(true, 16, 8);
  settle(b, 1, 1.0);
  settle(b, 2, 1.0);
  std::string note;
  CHECK(b.plan(ab, &note).empty());  // judged at (1, 1): 8 / 8 is best
  // b at 0.7: 9 / 7 would predict 10 s against 8 / 0.7 = 11.4 s (12.5% shorter), but b's
  // fraction of the speed moved from 1/2 to 0.4118, 17.6% of it: within the 20% bound.
  settle(b, 2, 0.7);
  CHECK(worth_replanning({8, 8}, {9, 7}, {1, 0.7}, balancer::threshold));
  CHECK(speed_drift({1, 1}, {1, 0.7}) <= balancer::drift);
  CHECK(b.plan(ab, &note).empty());
  CHECK(b.json()["replans"] == 0);
  // b at 0.6: 25% of its fraction: a plan, judged at these speeds from now on.
  settle(b, 2, 0.6);
  CHECK(b.plan(ab, &note) == std::vector<int32_t>{10, 6});
  CHECK(b.json()["replans"] == 1);
  // b at 0.75 (its fraction 0.375 -> 0.4286, 14%): 9 / 7 would be 6.7% shorter, yet the
  // plan stays: noise of that size moves nothing back and forth.
  settle(b, 2, 0.75);
  CHECK(worth_replanning({10, 6}, {9, 7}, {1, 0.75}, balancer::threshold));
  CHECK(b.plan(ab, &note) == std::vector<int32_t>{10, 6});
  CHECK(b.json()["replans"] == 1);
}

TEST_CASE("balance: the planner's sequence: off, unmeasured, a plan, a drift, new members") {
  using ranks = std::vector<std::pair<uint64_t, std::string>>;
  const ranks ab = {{1, "a"}, {2, "b"}};
  balancer off(false, 4, 16);
  off.measured(1, 0.1, 2);
  off.measured(2, 0.4, 2);
  CHECK(off.plan(ab, nullptr).empty());
  CHECK(off.json()["mode"] == "equal");
  CHECK(off.json()["shares"]["a"] == 2);

  balancer b(true, 4, 16);
  std::string note;
  CHECK(b.plan(ab, &note).empty());  // no speed known yet: equal
  CHECK(note.empty());
  b.measured(1, 0.2, 2);             // a: 10 micro-batches/s
  b.measured(2, 0.2, 2);             // b: the same
  CHECK(b.plan(ab, &note).empty());  // equal is already best
  b.measured(2, 0.8, 2);             // b slows to 0.3 * 0.4 + 0.7 * 0.1 = 0.19 s a micro-batch
  const std::vector<int32_t> p = b.plan(ab, &note);
  CHECK(p == std::vector<int32_t>{3, 1});
  CHECK(note.find("a 3") != std::string::npos);
  CHECK(note.find("b 1") != std::string::npos);
  CHECK(b.json()["replans"] == 1);
  CHECK(b.json()["shares"]["b"] == 1);
  CHECK(b.json()["samples_per_s"]["a"].get<double>() == doctest::Approx(160.0));
  note.clear();
  CHECK(b.plan(ab, &note) == p);  // the same speeds: the same plan, nothing noted
  CHECK(note.empty());
  // b recovers: back to 2 / 2 once that is worth it.
  for (int i = 0; i < 10; ++i) b.measured(2, 0.1, 1);
  CHECK(b.plan(ab, &note) == std::vector<int32_t>{2, 2});
  CHECK(b.json()["replans"] == 2);
  // A new member (c, unmeasured, counted at the median) and new ranks: a plan for them.
  const ranks abc = {{1, "a"}, {2, "b"}, {3, "c"}};
  b.measured(2, 0.8, 2);
  const std::vector<int32_t> q = b.plan(abc, &note);
  CHECK((q.empty() || std::accumulate(q.begin(), q.end(), 0) == 4));
  CHECK(b.json()["shares"].size() == 3);
}

TEST_CASE("balance: the coordinator puts its plan in every step_open of the window") {
  const config c = load_config_text(
      "cluster:\n  workers: 2\ntrain:\n  steps: 40\n  global_batch: 64\n  micro_batch: 16\n"
      "  balance: measured\n  determinism: bitwise\n",
      "<test>");
  training_job job(c, dump_config(c));
  mb::roster r;
  r.generation = 1;
  for (int i = 0; i < 2; ++i) {
    mb::member m;
    m.id = static_cast<mb::member_id>(i + 1);
    m.name = "w" + std::to_string(i);
    m.rank = i;
    m.state = mb::member_state::alive;
    r.members.push_back(m);
  }
  job.on_ready(r, net::worker_ready{1, 1, 0}, 0.0);
  job_actions a = job.on_ready(r, net::worker_ready{2, 1, 0}, 0.0);
  auto opens = [](const job_actions& x) {
    std::vector<net::step_open> out;
    for (const auto& [id, m] : x.sends)
      if (const auto* o = std::get_if<net::step_open>(&m)) out.push_back(*o);
    return out;
  };
  auto first = opens(a);
  REQUIRE(first.size() == 2);
  CHECK(first[0].shares.empty());  // nothing measured yet
  const int64_t through = first[0].through;
  REQUIRE(through >= 0);
  // Each step of the window: w0 takes 2 ms a micro-batch, w1 8 ms (it is 4x slower).
  job_actions last;
  bool opened = false;
  for (int64_t s = 0; s <= through && !opened; ++s)
    for (mb::member_id id : {1, 2}) {
      net::step_vote v;
      v.member_id = id;
      v.generation = 1;
      v.step = s;
      v.ok = true;
      v.applied = true;
      v.loss_rows = 1;
      v.rows = 32;
      v.timing.compute_us = id == 1 ? 4000 : 16000;
      last = job.on_vote(r, v, 0.01 * static_cast<double>(s + 1));
      opened = !opens(last).empty();
    }
  const auto next = opens(last);
  REQUIRE(next.size() == 2);
  CHECK(next[0].shares == std::vector<int32_t>{3, 1});
  CHECK(next[1].shares == next[0].shares);
  CHECK(job.balance_json()["shares"]["w1"] == 1);
  bool noted = false;
  for (const auto& n : last.notes) noted = noted || n.find("balance: micro-batches") != n.npos;
  CHECK(noted);
}

TEST_CASE("balance: a straggler is named after 3 plans in a row below the bound, then once") {
  using ranks = std::vector<std::pair<uint64_t, std::string>>;
  const ranks abc = {{1, "a"}, {2, "b"}, {3, "c"}};
  balancer off(false, 6, 10);     // no factor: never named
  balancer b(false, 6, 10, 2.0);  // equal shares: stragglers are still counted
  // Measured for fewer steps than the warm-up: not judged, however many plans.
  for (balancer* x : {&off, &b})
    for (int i = 0; i < balancer::straggler_warmup - 1; ++i) {
      x->measured(1, 0.1, 1);  // 10 micro-batches/s
      x->measured(2, 0.1, 1);
      x->measured(3, 0.3, 1);  // 3.3/s: below 10 / 2
    }
  for (int plan = 1; plan <= 5; ++plan) {
    b.plan(abc, nullptr);
    CHECK_FALSE(b.take_straggler().has_value());
  }
  for (balancer* x : {&off, &b}) {
    x->measured(1, 0.1, 1);
    x->measured(2, 0.1, 1);
    x->measured(3, 0.3, 1);  // the warm-up's last step
  }
  for (int plan = 1; plan <= 2; ++plan) {
    b.plan(abc, nullptr);
    off.plan(abc, nullptr);
    CHECK_FALSE(b.take_straggler().has_value());  // not yet: 3 plans in a row
  }
  b.plan(abc, nullptr);
  off.plan(abc, nullptr);
  CHECK_FALSE(off.take_straggler().has_value());
  const auto slow = b.take_straggler();
  REQUIRE(slow.has_value());
  CHECK(slow->first == 3);
  CHECK(slow->second.find("c computed 33 samples/s") != std::string::npos);
  CHECK_FALSE(b.take_straggler().has_value());  // taken once
  // Back above the bound in between: the count starts again.
  balancer d(false, 6, 10, 2.0);
  for (int i = 0; i < balancer::straggler_warmup; ++i) {
    d.measured(1, 0.1, 1);
    d.measured(2, 0.1, 1);
    d.measured(3, 0.3, 1);
  }
  d.plan(abc, nullptr);
  d.plan(abc, nullptr);
  for (int i = 0; i < 20; ++i) d.measured(3, 0.1, 1);  // c recovers
  d.plan(abc, nullptr);
  for (int i = 0; i < 20; ++i) d.measured(3, 0.3, 1);  // and slows again
  d.plan(abc, nullptr);
  d.plan(abc, nullptr);
  CHECK_FALSE(d.take_straggler().has_value());
  d.plan(abc, nullptr);
  CHECK(d.take_straggler().has_value());
}
