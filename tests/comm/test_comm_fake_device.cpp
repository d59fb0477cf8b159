// The GPU path's ordering over a CPU fake of the NCCL communicator (fake_device_comm.hpp):
// the bucket engine enqueues each bucket as backward completes it and every rank's stream
// completes them in the same order; an abort during a collective ends every rank's call;
// a hung abort or shrink is cut by the deadline; the elastic plan (nccl_elastic.hpp) is
// applied across generation changes (shrink after a death, new init for a joiner).
#include <doctest/doctest.h>

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/comm/buckets.hpp"
#include "runtime/comm/deadline_call.hpp"
#include "runtime/comm/nccl_elastic.hpp"
#include "tests/comm/fake_device_comm.hpp"

using namespace cohort::comm;
using namespace cohort::comm::testing;
using std::chrono::milliseconds;

namespace {

constexpr milliseconds kLong{60000};  // never reached: a test that needs it failed

// A bound on waits that only a broken test reaches (it then fails instead of hanging).
constexpr std::chrono::seconds kGuard{30};

std::vector<std::shared_ptr<fake_device_comm>> make_group(
    int n, std::shared_ptr<fake_nccl_group>* g_out = nullptr, milliseconds timeout = kLong) {
  auto g = std::make_shared<fake_nccl_group>(n);
  std::vector<std::shared_ptr<fake_device_comm>> comms;
  for (int r = 0; r < n; ++r) comms.push_back(std::make_shared<fake_device_comm>(g, r, timeout));
  if (g_out) *g_out = g;
  return comms;
}

// Runs fn(rank) on one thread per rank and joins them.
void on_ranks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r) ts.emplace_back(fn, r);
  for (auto& t : ts) t.join();
}

// Every rank contributes rank + 1 to each element: the sum is n (n + 1) / 2.
float allreduce_sum_of_ranks(const std::vector<std::shared_ptr<fake_device_comm>>& comms) {
  std::vector<float> out(comms.size());
  on_ranks(static_cast<int>(comms.size()), [&](int r) {
    std::vector<float> v(5, float(comms[r]->rank() + 1));
    comms[r]->allreduce_sum(v.data(), v.size());
    out[r] = v[4];
  });
  for (float x : out) CHECK(x == out[0]);
  return out[0];
}

}  // namespace

TEST_CASE("fake device comm: the collectives give the closed-form results") {
  auto comms = make_group(3);
  CHECK(allreduce_sum_of_ranks(comms) == 6.0f);
  on_ranks(3, [&](int r) {
    std::vector<std::int64_t> v(4, (std::int64_t(1) << 40) + r);
    comms[r]->allreduce_sum(v.data(), v.size());
    CHECK(v[3] == 3 * (std::int64_t(1) << 40) + 3);
    const char mine = char('a' + r);
    std::vector<char> all(3);
    comms[r]->allgather(&mine, all.data(), 1);
    CHECK(std::string(all.begin(), all.end()) == "abc");
    std::vector<char> send{char('0' + r), char('3' + r), char('6' + r)}, recv(3);
    comms[r]->alltoall(send.data(), recv.data(), 1);  // block j of rank i: '0' + 3j + i
    CHECK(recv == std::vector<char>{char('0' + 3 * r), char('1' + 3 * r), char('2' + 3 * r)});
    int x = r == 2 ? 42 : 0;
    comms[r]->broadcast(&x, sizeof x, 2);
    CHECK(x == 42);
    comms[r]->barrier();
  });
  const std::vector<fake_event> e0 = comms[0]->events();
  REQUIRE(e0.size() == 6);
  CHECK(e0[0] == fake_event{0, "allreduce_f32", 5});
  CHECK(e0[5] == fake_event{5, "barrier", 0});
  for (auto& c : comms) CHECK(c->events() == e0);
}

TEST_CASE(
    "bucket engine over the fake: buckets go out as backward completes them, events in order") {
  constexpr int n = 3;
  constexpr std::size_t per = 1000, elements = 3 * per;
  auto comms = make_group(n);
  // Lane thread hook: how many collectives each rank's engine has finished this step.
  std::mutex m;
  std::condition_variable cv;
  std::vector<std::size_t> done(n, 0);
  on_ranks(n, [&](int r) {
    bucket_engine engine(*comms[r], elements, grad_type::f32, per * 4.0 / (1 << 20));
    REQUIRE(engine.buckets().size() == 3);
    engine.set_before_wait([&, r](std::size_t d) {
      std::lock_guard<std::mutex> lock(m);
      done[r] = d;
      cv.notify_all();
    });
    std::vector<float> grads(elements);
    for (std::size_t i = 0; i < elements; ++i) grads[i] = float((r + 1) * (i % 7));
    engine.begin(grads.data());
    engine.mark_ready(2 * per, per);  // backward ends the last layer first: bucket 0
    {
      std::unique_lock<std::mutex> lock(m);
      REQUIRE(cv.wait_for(lock, kGuard, [&] { return done[r] >= 1; }));
    }
    // Bucket 0 was enqueued and its event completed before backward marked anything else.
    CHECK(comms[r]->enqueued() == 1);
    CHECK(comms[r]->events() == std::vector<fake_event>{{0, "allreduce_f32", per}});
    engine.mark_ready(0, per);  // out of order: bucket 2 is ready before bucket 1
    engine.mark_ready(per, per);
    engine.wait_all();
    for (std::size_t i = 0; i < elements; ++i) REQUIRE(grads[i] == float(6 * (i % 7)));
    CHECK(comms[r]->events() == std::vector<fake_event>{{0, "allreduce_f32", per},
                                                        {1, "allreduce_f32", per},
                                                        {2, "allreduce_f32", per}});
  });
}

TEST_CASE("fake device comm: an abort during a collective ends every rank's call") {
  std::shared_ptr<fake_nccl_group> g;
  // 10 s: a broken abort shows as a timeout here instead of a minute's wait.
  auto comms = make_group(3, &g, milliseconds(10000));
  g->hang_at(2, 0);  // rank 2's stream is stuck in the first collective
  std::vector<comm_failure> kinds(3, comm_failure::invalid);
  std::vector<int> threw(3, 0);  // not vector<bool>: ranks write their own element
  std::thread coordinator([&] {
    g->wait_running(3);                // every rank's collective is in flight
    for (auto& c : comms) c->abort();  // the elastic path aborts every survivor (and the hung one)
  });
  on_ranks(3, [&](int r) {
    std::vector<float> v(8, 1.0f);
    try {
      comms[r]->allreduce_sum(v.data(), v.size());
    } catch (const comm_error& e) {
      threw[r] = 1;
      kinds[r] = e.kind();
    }
  });
  coordinator.join();
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    CHECK(threw[r]);
    // Aborted or failed by a peer's abort; never the timeout.
    CHECK((kinds[r] == comm_failure::aborted || kinds[r] == comm_failure::peer_lost));
    CHECK(comms[r]->dead());
    CHECK(comms[r]->events().empty());
  }
  CHECK(kinds[2] == comm_failure::aborted);  // the hung rank's stream never came back
  // What the abort leaves: a dead communicator whose next call is refused at once.
  std::vector<float> v(1);
  try {
    comms[0]->allreduce_sum(v.data(), 1);
    FAIL("a dead communicator ran a collective");
  } catch (const comm_error& e) {
    CHECK(e.kind() == comm_failure::invalid);
    CHECK(std::string(e.what()).find("dead after an earlier failure; build a new one") !=
          std::string::npos);
  }
}

TEST_CASE("fake device comm: a failure on one rank fails the peers' pending collectives") {
  std::shared_ptr<fake_nccl_group> g;
  auto comms = make_group(2, &g);
  g->fail_at(1, 1);
  std::vector<int> ok(2, 0);
  on_ranks(2, [&](int r) {
    std::vector<float> v(2, 1.0f);
    comms[r]->allreduce_sum(v.data(), 2);
    try {
      comms[r]->allreduce_sum(v.data(), 2);
      ok[r] = 1;
    } catch (const comm_error& e) {
      CHECK(e.kind() == comm_failure::peer_lost);
    }
  });
  CHECK(ok == std::vector<int>{0, 0});
  CHECK(comms[0]->events().size() == 1);
}

TEST_CASE("elastic: a death shrinks the group (plan applied), a joiner gets a new init") {
  // Generation 1: a b c d. c hangs in a collective; everyone is aborted; generation 2 is
  // a b d, which every survivor reaches by the plan's shrink.
  std::shared_ptr<fake_nccl_group> g1;
  auto gen1 = make_group(4, &g1);
  const std::vector<std::string> m1{"a", "b", "c", "d"}, m2{"a", "b", "d"}, m3{"a", "b", "d", "e"};
  CHECK(allreduce_sum_of_ranks(gen1) == 10.0f);
  g1->hang_at(2, 1);
  std::thread coordinator([&] {
    g1->wait_running(4);
    for (auto& c : gen1) c->abort();
  });
  on_ranks(4, [&](int r) {
    std::vector<float> v(1, 1.0f);
    CHECK_THROWS_AS(gen1[r]->allreduce_sum(v.data(), 1), comm_error);
  });
  coordinator.join();

  std::vector<std::shared_ptr<fake_device_comm>> gen2(3);
  std::vector<nccl_rebuild_plan> plans(4);
  on_ranks(4, [&](int r) {
    nccl_rebuild_input in;
    in.old_gen = {1, m1};
    in.new_gen = {2, m2};
    in.self = m1[r];
    in.departed = {{"c", departure_kind::hung}};
    in.nccl_version = nccl_shrink_min_version;
    plans[r] = plan_nccl_rebuild(in);
    if (plans[r].path != nccl_rebuild_path::shrink) return;
    std::shared_ptr<fake_device_comm> next;
    const deadline_result d = run_with_deadline(
        "ncclCommShrink",
        [&] {
          next = gen1[r]->shrink(plans[r].excluded, plans[r].abort_parent);
          return true;
        },
        kLong);
    REQUIRE(d.outcome == deadline_outcome::done);
    CHECK(next->rank() == plans[r].rank);
    gen2[plans[r].rank] = next;
  });
  CHECK(plans[2].path == nccl_rebuild_path::leave);
  for (int r : {0, 1, 3}) CHECK(plans[r].path == nccl_rebuild_path::shrink);
  for (auto& c : gen2) REQUIRE(c.get() != nullptr);
  CHECK(allreduce_sum_of_ranks(gen2) == 6.0f);

  // Generation 3: e joins. Every member's plan says new init (NCCL cannot grow a group);
  // the new group stands for the unique id published under generation 3.
  auto g3 = std::make_shared<fake_nccl_group>(4);
  std::vector<std::shared_ptr<fake_device_comm>> gen3(4);
  for (const std::string& self : m3) {
    nccl_rebuild_input in;
    in.old_gen = self == "e" ? nccl_membership{} : nccl_membership{2, m2};
    in.new_gen = {3, m3};
    in.self = self;
    in.nccl_version = nccl_shrink_min_version;
    in.holds_old = self != "e";
    const nccl_rebuild_plan p = plan_nccl_rebuild(in);
    CHECK(p.path == nccl_rebuild_path::new_init);
    gen3[p.rank] = std::make_shared<fake_device_comm>(g3, p.rank, kLong);
  }
  CHECK(allreduce_sum_of_ranks(gen3) == 10.0f);
}

TEST_CASE("elastic: a plain shrink refuses a busy parent, NCCL_SHRINK_ABORT ends its work") {
  std::shared_ptr<fake_nccl_group> g;
  auto comms = make_group(3, &g);
  g->hang_at(0, 0);
  comm_failure stuck_kind = comm_failure::invalid;
  std::thread stuck([&] {
    std::vector<float> v(1);
    try {
      comms[0]->allreduce_sum(v.data(), 1);
    } catch (const comm_error& e) {
      stuck_kind = e.kind();
    }
  });
  g->wait_running(1);
  try {
    comms[0]->shrink({2}, false);
    FAIL("a busy parent was shrunk without NCCL_SHRINK_ABORT");
  } catch (const comm_error& e) {
    CHECK(e.kind() == comm_failure::invalid);
    CHECK(std::string(e.what()).find("NCCL_SHRINK_ABORT ends them") != std::string::npos);
  }
  std::vector<std::shared_ptr<fake_device_comm>> next(2);
  on_ranks(2, [&](int r) { next[r] = comms[r]->shrink({2}, true); });
  stuck.join();
  CHECK(stuck_kind == comm_failure::aborted);  // ended by the shrink's abort, not the timeout
  CHECK(allreduce_sum_of_ranks(next) == 3.0f);
}

TEST_CASE("elastic: an abort that does not return is cut by the deadline, the worker leaves") {
  std::shared_ptr<fake_nccl_group> g;
  auto comms = make_group(2, &g);
  g->hang_abort(1);
  std::shared_ptr<fake_device_comm> c1 = comms[1];
  const deadline_result d = run_with_deadline(
      "ncclCommAbort",
      [c1] {
        c1->abort();
        return true;
      },
      milliseconds(50));
  CHECK(d.outcome == deadline_outcome::expired);
  CHECK(d.text.find("leaves the group as a dead member") != std::string::npos);
  // Without its old communicator, its plan for the shrinking generation is to leave.
  nccl_rebuild_input in;
  in.old_gen = {1, {"a", "b", "c"}};
  in.new_gen = {2, {"a", "b"}};
  in.self = "b";
  in.nccl_version = 22809;
  in.holds_old = d.outcome == deadline_outcome::done;
  CHECK(plan_nccl_rebuild(in).path == nccl_rebuild_path::leave);
  g->release_hangs();
  g->wait_aborts_returned(1);  // the left-behind thread finished before the comm goes
}

TEST_CASE("elastic: a shrink that does not return is cut by the deadline") {
  std::shared_ptr<fake_nccl_group> g;
  auto comms = make_group(3, &g);
  g->hang_shrink(0);
  auto c0 = comms[0];
  auto finished = std::make_shared<std::pair<std::mutex, std::condition_variable>>();
  auto returned = std::make_shared<bool>(false);
  const deadline_result d = run_with_deadline(
      "ncclCommShrink",
      [c0, finished, returned] {
        try {
          c0->shrink({2}, true);
        } catch (const comm_error&) {
        }
        std::lock_guard<std::mutex> lock(finished->first);
        *returned = true;
        finished->second.notify_all();
        return true;
      },
      milliseconds(50));
  CHECK(d.outcome == deadline_outcome::expired);
  CHECK(d.text.rfind("ncclCommShrink did not return within 50 ms", 0) == 0);
  g->release_hangs();
  std::unique_lock<std::mutex> lock(finished->first);
  finished->second.wait(lock, [&] { return *returned; });
}
