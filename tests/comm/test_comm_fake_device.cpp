// The GPU path's ordering over a CPU fake of the NCCL communicator (fake_device_comm.hpp):
// the bucket engine enqueues each bucket as backward completes it and every rank's stream
// completes them in the same order; an abort during a collective ends every rank's call;
// a hung abort or shrink is cut by the deadline; the elastic plan (nccl_elastic.hpp) is
// applied across generation changes (shrink after a death, new init for a joiner).
#include <doctest/doctest.h>

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/comm/buckets.hpp"
#include "runtime/comm/deadline_call.hpp"
#include "runtime/comm/local_kv.hpp"
#include "runtime/comm/nccl_elastic.hpp"
#include "runtime/comm/regroup.hpp"
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

// ---- regroup: the step's generation change on the NCCL path (runtime/comm/regroup.hpp) ----

namespace {

// A generation of N fake NCCL ranks, each its own communicator as the step holds it.
std::vector<std::unique_ptr<communicator>> owned_group(int n, std::shared_ptr<fake_nccl_group>* g,
                                                       milliseconds timeout = kLong) {
  *g = std::make_shared<fake_nccl_group>(n);
  std::vector<std::unique_ptr<communicator>> out;
  for (int r = 0; r < n; ++r) out.push_back(std::make_unique<fake_device_comm>(*g, r, timeout));
  return out;
}

// Sum of (rank + 1) over the communicators, each on its own thread; every rank must agree.
float sum_of_ranks(const std::vector<communicator*>& comms) {
  std::vector<float> out(comms.size());
  on_ranks(static_cast<int>(comms.size()), [&](int r) {
    std::vector<float> v(3, float(comms[r]->rank() + 1));
    comms[r]->allreduce_sum(v.data(), v.size());
    out[r] = v[2];
  });
  for (float x : out) CHECK(x == out[0]);
  return out[0];
}

// What every member of a regroup got, by new rank.
struct regroup_run {
  std::vector<regroup_result> results;
  std::vector<std::vector<std::string>> made;  // per rank: the tags make_new was called with
};

// Runs regroup for generation GEN on one thread per new rank; PRIORS[r] is what new rank r
// holds. make_new builds rank r's k-th communicator in FRESH[tag + k].
regroup_run run_regroup(std::vector<prior_group> priors, std::size_t count, std::uint64_t gen,
                        int nccl_version = 22809) {
  const int n = static_cast<int>(priors.size());
  memory_kv kv;
  std::mutex mu;
  std::map<std::string, std::shared_ptr<fake_nccl_group>> fresh;
  regroup_run run;
  run.results.resize(n);
  run.made.resize(n);
  on_ranks(n, [&](int r) {
    run.results[r] = regroup(
        kv, gen, "dp", r, n, std::move(priors[r]), count, nccl_version, 5000, milliseconds(20000),
        milliseconds(1800000),
        [&](std::size_t k, const std::string& tag) -> std::unique_ptr<communicator> {
          std::shared_ptr<fake_nccl_group> g;
          {
            std::lock_guard<std::mutex> l(mu);
            run.made[r].push_back(tag);
            auto& slot = fresh[tag + "/" + std::to_string(k)];
            if (!slot) slot = std::make_shared<fake_nccl_group>(n);
            g = slot;
          }
          return std::make_unique<fake_device_comm>(g, r, kLong);
        });
  });
  return run;
}

prior_group prior_of(std::uint64_t gen, int rank, int size, std::unique_ptr<communicator> c) {
  prior_group p;
  p.generation = gen;
  p.rank = rank;
  p.size = size;
  if (c) p.comms.push_back(std::move(c));
  return p;
}

}  // namespace

namespace {

// What new ranks 0, 1, ... hold: generation 1's communicators of the old ranks OLD, in order.
std::vector<prior_group> priors_of(std::vector<std::unique_ptr<communicator>>& gen1,
                                   const std::vector<int>& old) {
  std::vector<prior_group> priors;
  for (int r : old)
    priors.push_back(prior_of(1, r, static_cast<int>(gen1.size()), std::move(gen1[r])));
  return priors;
}

// Every member built new communicators, for the reason WHY (a part of it).
void check_new_init(const regroup_run& run, const std::string& why) {
  for (const regroup_result& x : run.results) {
    CHECK(x.path == nccl_rebuild_path::new_init);
    CHECK_FALSE(x.fell_back);
    CHECK(x.reason.find(why) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("regroup: after a death mid-collective the survivors shrink what they hold") {
  std::shared_ptr<fake_nccl_group> g;
  auto gen1 = owned_group(4, &g);
  std::vector<communicator*> raw;
  for (auto& c : gen1) raw.push_back(c.get());
  CHECK(sum_of_ranks(raw) == 10.0f);
  // Rank 2 dies inside collective 1: the others wait in it until the roster's news
  // interrupts them (dp_group_shared::abort_below), which keeps their communicators.
  // (Its own call ends with its process: here, an abort.)
  g->hang_at(2, 1);
  std::thread news([&] {
    g->wait_running(4);
    for (int r : {0, 1, 3}) gen1[r]->interrupt();
    gen1[2]->abort();
  });
  on_ranks(4, [&](int r) {
    std::vector<float> v(1, 1.0f);
    try {
      gen1[r]->allreduce_sum(v.data(), 1);
      FAIL("a collective with a dead member completed");
    } catch (const comm_error& e) {
      CHECK(e.kind() == comm_failure::aborted);
    }
  });
  news.join();
  CHECK_FALSE(gen1[2]->can_shrink());
  for (int r : {0, 1, 3}) {
    CHECK(gen1[r]->dead());
    CHECK(gen1[r]->can_shrink());
  }
  regroup_run run = run_regroup(priors_of(gen1, {0, 1, 3}), 1, 2);
  std::vector<communicator*> gen2;
  for (int r = 0; r < 3; ++r) {
    const regroup_result& x = run.results[r];
    CHECK(x.path == nccl_rebuild_path::shrink);
    CHECK(x.excluded == std::vector<int>{2});
    CHECK_FALSE(x.fell_back);
    CHECK(x.ms >= 0);
    CHECK(x.reason.find("NCCL_SHRINK_ABORT") != std::string::npos);
    CHECK(run.made[r].empty());  // no unique id, no new init
    REQUIRE(x.comms.size() == 1);
    CHECK(x.comms[0]->rank() == r);
    CHECK(x.comms[0]->size() == 3);
    gen2.push_back(x.comms[0].get());
  }
  CHECK(sum_of_ranks(gen2) == 6.0f);
  g->release_hangs();
}

TEST_CASE("regroup: every communicator of the group is shrunk, lanes and parameters alike") {
  std::shared_ptr<fake_nccl_group> ga, gb;
  auto a = owned_group(3, &ga);
  auto b = owned_group(3, &gb);
  std::vector<prior_group> priors;
  for (int r : {0, 2}) {  // rank 1 drained
    prior_group p = prior_of(4, r, 3, std::move(a[r]));
    p.comms.push_back(std::move(b[r]));
    priors.push_back(std::move(p));
  }
  regroup_run run = run_regroup(std::move(priors), 2, 7);
  for (int k = 0; k < 2; ++k) {
    std::vector<communicator*> got;
    for (auto& x : run.results) {
      CHECK(x.path == nccl_rebuild_path::shrink);
      REQUIRE(x.comms.size() == 2);
      got.push_back(x.comms[k].get());
    }
    CHECK(sum_of_ranks(got) == 3.0f);
  }
}

TEST_CASE("regroup: a joiner, a reordering, an old NCCL or an aborted member make it a new init") {
  std::shared_ptr<fake_nccl_group> g;
  SUBCASE("a joiner: NCCL cannot grow a communicator") {
    auto gen1 = owned_group(2, &g);
    std::vector<prior_group> priors = priors_of(gen1, {0, 1});
    priors.push_back(prior_group{});  // the joiner holds nothing
    regroup_run run = run_regroup(std::move(priors), 1, 2);
    check_new_init(run, "rank 2 holds no communicator");
    std::vector<communicator*> got;
    for (int r = 0; r < 3; ++r) {
      CHECK(run.made[r] == std::vector<std::string>{""});
      got.push_back(run.results[r].comms[0].get());
    }
    CHECK(sum_of_ranks(got) == 6.0f);
  }
  SUBCASE("the survivors reordered: ncclCommShrink keeps the old order") {
    auto gen1 = owned_group(3, &g);
    check_new_init(run_regroup(priors_of(gen1, {2, 0}), 1, 2), "reorders");
  }
  SUBCASE("NCCL older than 2.27") {
    auto gen1 = owned_group(3, &g);
    check_new_init(run_regroup(priors_of(gen1, {0, 1}), 1, 2, 22612), "has no ncclCommShrink");
  }
  SUBCASE("a survivor whose own call timed out (NCCL aborts it: nothing left to shrink)") {
    auto gen1 = owned_group(3, &g, milliseconds(50));
    CHECK_THROWS_AS(gen1[0]->barrier(), comm_error);  // alone in it: times out
    CHECK_FALSE(gen1[0]->can_shrink());
    gen1[1]->interrupt();  // the other survivor only heard the roster's news
    CHECK(gen1[1]->can_shrink());
    check_new_init(run_regroup(priors_of(gen1, {0, 1}), 1, 2), "rank 0 holds no communicator");
  }
  SUBCASE("a survivor whose communicator was aborted (its own failure)") {
    auto gen1 = owned_group(3, &g);
    gen1[1]->abort();
    CHECK_FALSE(gen1[1]->can_shrink());
    check_new_init(run_regroup(priors_of(gen1, {0, 1}), 1, 2), "rank 1 holds no communicator");
  }
}

TEST_CASE("regroup: a shrink that fails on one member makes every member new-init, tagged retry") {
  std::shared_ptr<fake_nccl_group> g;
  auto gen1 = owned_group(4, &g, milliseconds(300));
  g->hang_shrink(1);  // rank 1's ncclCommShrink hangs; the others' time out waiting for it
  std::thread release([&] {
    std::this_thread::sleep_for(milliseconds(600));  // past the others' 300 ms timeout
    g->release_hangs();
  });
  regroup_run run = run_regroup(priors_of(gen1, {0, 1, 2}), 1, 2);
  release.join();
  std::vector<communicator*> got;
  for (int r = 0; r < 3; ++r) {
    const regroup_result& x = run.results[r];
    CHECK(x.path == nccl_rebuild_path::new_init);
    CHECK(x.fell_back);
    CHECK(x.excluded.empty());
    CHECK(x.reason.find("the shrink failed") != std::string::npos);
    CHECK(run.made[r] == std::vector<std::string>{"retry"});
    got.push_back(x.comms[0].get());
  }
  CHECK(sum_of_ranks(got) == 6.0f);
}

TEST_CASE("plan_regroup: rank 0's plan from the members' records, as a table") {
  struct row {
    std::vector<std::string> records;
    std::uint64_t gen;
    int version;
    std::string head;  // the plan's first line
  };
  const std::vector<row> rows = {
      {{"1 0 4", "1 1 4", "1 3 4"}, 2, 22809, "shrink 1 2"},
      {{"1 0 4", "1 3 4"}, 2, 22809, "shrink 1 1,2"},
      {{"1 1 4", "1 2 4", "1 3 4"}, 2, 22809, "shrink 1 0"},  // rank 0 died: still a shrink
      {{"1 0 2", "1 1 2"}, 2, 22809, "new_init"},            // same members, new generation
      {{"1 0 4", "none", "1 3 4"}, 2, 22809, "new_init"},     // a joiner
      {{"1 0 4", "1 1 4"}, 2, 22612, "new_init"},             // NCCL 2.26
      {{"1 0 4", "1 1 4"}, 2, 0, "new_init"},                 // no NCCL
      {{"1 1 4", "1 0 4"}, 2, 22809, "new_init"},             // reordered
      {{"1 0 4", "1 0 4"}, 2, 22809, "new_init"},             // two members on one old rank
      {{"1 0 4", "3 1 4"}, 4, 22809, "new_init"},             // different generations
      {{"1 0 4", "1 1 5"}, 2, 22809, "new_init"},             // different sizes
      {{"2 0 4", "2 1 4"}, 2, 22809, "new_init"},             // the same generation again
      {{"1 0 4", "1 x 4"}, 2, 22809, "new_init"},             // unreadable: holds nothing
      {{"1 0 4", "1 7 4"}, 2, 22809, "new_init"},             // a rank outside its size
  };
  for (const row& r : rows) {
    const std::string plan = plan_regroup(r.records, r.gen, r.version);
    CAPTURE(plan);
    CHECK(plan.substr(0, plan.find('\n')) == r.head);
    CHECK(plan.find('\n') != std::string::npos);  // every plan says why
  }
}
