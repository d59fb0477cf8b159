// The elastic NCCL host logic as tables (runtime/comm/nccl_elastic.*): which generation
// change gets a shrink, which a new init, which member leaves; the refusals' texts; and the
// deadline around a call that may hang (runtime/comm/deadline_call.*).
#include <doctest/doctest.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "runtime/comm/deadline_call.hpp"
#include "runtime/comm/nccl_elastic.hpp"
#include "runtime/core/error.hpp"

using namespace cohort;
using namespace cohort::comm;
using std::chrono::milliseconds;

namespace {

using names = std::vector<std::string>;
constexpr int v2289 = 22809, v2263 = 22603;

struct row {
  const char* what;
  names before, after;
  std::string self;
  std::map<std::string, departure_kind> departed;
  int version;
  bool holds_old;
  nccl_rebuild_path path;
  std::vector<int> excluded;
  bool abort_parent;
  std::vector<int> new_rank;
  int rank;
  const char* reason_has;
};

nccl_rebuild_input input_of(const row& r, std::uint64_t g0 = 4, std::uint64_t g1 = 5) {
  nccl_rebuild_input in;
  in.old_gen = {r.before.empty() ? 0 : g0, r.before};
  in.new_gen = {g1, r.after};
  in.self = r.self;
  in.departed = r.departed;
  in.nccl_version = r.version;
  in.holds_old = r.holds_old;
  return in;
}

}  // namespace

TEST_CASE("nccl rebuild: shrink only for departures in the old order with 2.27+, else new init") {
  using P = nccl_rebuild_path;
  using D = departure_kind;
  const names abcd{"a", "b", "c", "d"};
  const std::vector<row> rows = {
      {"one died",
       abcd,
       {"a", "b", "d"},
       "b",
       {{"c", D::died}},
       v2289,
       true,
       P::shrink,
       {2},
       true,
       {0, 1, -1, 2},
       1,
       "1 of 4 ranks left, none joined: ncclCommShrink with NCCL_SHRINK_ABORT"},
      {"one hung",
       abcd,
       {"a", "b", "d"},
       "d",
       {{"c", D::hung}},
       v2289,
       true,
       P::shrink,
       {2},
       true,
       {0, 1, -1, 2},
       2,
       "NCCL_SHRINK_ABORT"},
      {"one left (drained): plain shrink",
       abcd,
       {"b", "c", "d"},
       "c",
       {{"a", D::left}},
       v2289,
       true,
       P::shrink,
       {0},
       false,
       {-1, 0, 1, 2},
       1,
       "ncclCommShrink"},
      {"unlisted departure counts as died",
       abcd,
       {"a", "d"},
       "a",
       {{"b", D::left}},
       v2289,
       true,
       P::shrink,
       {1, 2},
       true,
       {0, -1, -1, 1},
       0,
       "2 of 4 ranks left"},
      {"a joiner: new init",
       abcd,
       {"a", "b", "c", "d", "e"},
       "a",
       {},
       v2289,
       true,
       P::new_init,
       {},
       false,
       {0, 1, 2, 3},
       0,
       "joiners [e] need a new communicator"},
      {"a death and a joiner: new init",
       abcd,
       {"a", "b", "d", "e"},
       "e",
       {{"c", D::died}},
       v2289,
       false,
       P::new_init,
       {2},
       true,
       {0, 1, -1, 2},
       3,
       "joiners [e]"},
      {"NCCL 2.26 has no shrink",
       abcd,
       {"a", "b", "d"},
       "a",
       {{"c", D::died}},
       v2263,
       true,
       P::new_init,
       {2},
       true,
       {0, 1, -1, 2},
       0,
       "NCCL 2.26.3 has no ncclCommShrink (2.27 or later)"},
      {"no NCCL compiled",
       abcd,
       {"a", "b", "d"},
       "a",
       {{"c", D::died}},
       0,
       true,
       P::new_init,
       {2},
       true,
       {0, 1, -1, 2},
       0,
       "NCCL is not compiled in"},
      {"survivors reordered",
       abcd,
       {"b", "a", "d"},
       "a",
       {{"c", D::died}},
       v2289,
       true,
       P::new_init,
       {2},
       true,
       {1, 0, -1, 2},
       1,
       "reorders the survivors"},
      {"same members, new generation",
       abcd,
       abcd,
       "c",
       {},
       v2289,
       true,
       P::new_init,
       {},
       false,
       {0, 1, 2, 3},
       2,
       "same members"},
      {"the departed worker itself",
       abcd,
       {"a", "b", "d"},
       "c",
       {{"c", D::hung}},
       v2289,
       true,
       P::leave,
       {2},
       true,
       {0, 1, -1, 2},
       -1,
       "'c' is not a member of the new generation"},
      {"a survivor whose abort did not return",
       abcd,
       {"a", "b", "d"},
       "b",
       {{"c", D::died}},
       v2289,
       false,
       P::leave,
       {2},
       true,
       {0, 1, -1, 2},
       -1,
       "holds no communicator of generation 4; it leaves and rejoins as new"},
      {"a survivor without the old comm, group new-inits",
       abcd,
       {"a", "b", "d", "e"},
       "b",
       {{"c", D::died}},
       v2289,
       false,
       P::new_init,
       {2},
       true,
       {0, 1, -1, 2},
       1,
       "joiners"},
      {"first generation",
       {},
       {"a", "b"},
       "b",
       {},
       v2289,
       false,
       P::new_init,
       {},
       false,
       {},
       1,
       "this worker is new"},
  };
  for (const row& r : rows) {
    CAPTURE(r.what);
    const nccl_rebuild_plan p = plan_nccl_rebuild(input_of(r));
    CHECK(p.path == r.path);
    CHECK(p.excluded == r.excluded);
    CHECK(p.abort_parent == r.abort_parent);
    CHECK(p.new_rank == r.new_rank);
    CHECK(p.rank == r.rank);
    CHECK(p.size == static_cast<int>(r.after.size()));
    CHECK_MESSAGE(p.reason.find(r.reason_has) != std::string::npos, p.reason);
  }
}

TEST_CASE("nccl rebuild: the group-wide fields are the same whoever asks") {
  const names before{"a", "b", "c", "d", "e"}, after{"a", "c", "e"};
  nccl_rebuild_plan first;
  for (const std::string& self : after) {
    nccl_rebuild_input in;
    in.old_gen = {7, before};
    in.new_gen = {9, after};
    in.self = self;
    in.nccl_version = 22809;
    const nccl_rebuild_plan p = plan_nccl_rebuild(in);
    if (self == "a") first = p;
    CHECK(p.path == nccl_rebuild_path::shrink);
    CHECK(p.excluded == first.excluded);
    CHECK(p.new_rank == first.new_rank);
    CHECK(p.abort_parent == first.abort_parent);
    CHECK(after[p.rank] == self);
  }
  CHECK(first.excluded == std::vector<int>{1, 3});
}

TEST_CASE("nccl rebuild: the same generation keeps the communicator") {
  nccl_rebuild_input in;
  in.old_gen = in.new_gen = {3, {"a", "b"}};
  in.self = "b";
  in.nccl_version = 22809;
  const nccl_rebuild_plan p = plan_nccl_rebuild(in);
  CHECK(p.path == nccl_rebuild_path::keep);
  CHECK(p.rank == 1);
  CHECK(std::string(to_string(p.path)) == "keep");
}

TEST_CASE("nccl rebuild: refusals name what is wrong and where") {
  struct bad {
    nccl_rebuild_input in;
    const char* text;
  };
  auto make = [](std::uint64_t g0, names before, std::uint64_t g1, names after, std::string self) {
    nccl_rebuild_input in;
    in.old_gen = {g0, std::move(before)};
    in.new_gen = {g1, std::move(after)};
    in.self = std::move(self);
    in.nccl_version = 22809;
    return in;
  };
  const std::vector<bad> rows = {
      {make(1, {"a"}, 2, {"a"}, ""), "this worker's member name is empty"},
      {make(1, {"a", ""}, 2, {"a"}, "a"),
       "rank 1 of the old generation 1 has an empty member name"},
      {make(1, {"a"}, 2, {"a", "b", "a"}, "a"),
       "member 'a' holds two ranks in the new generation 2"},
      {make(5, {"a", "b"}, 4, {"a"}, "a"), "generation 5 -> 4 goes backwards"},
      {make(5, {"a", "b"}, 5, {"a"}, "a"), "generation 5 has two memberships ([a, b] and [a])"},
  };
  for (const bad& b : rows) {
    CAPTURE(b.text);
    try {
      plan_nccl_rebuild(b.in);
      FAIL("no refusal");
    } catch (const usage_error& e) {
      CHECK_MESSAGE(std::string(e.what()).find(b.text) != std::string::npos, e.what());
    }
  }
}

TEST_CASE("deadline call: done, failed and thrown calls return their outcome") {
  deadline_result r = run_with_deadline(
      "ncclCommAbort", [] { return true; }, milliseconds(60000));
  CHECK(r.outcome == deadline_outcome::done);
  CHECK(r.text == "ncclCommAbort done");
  r = run_with_deadline(
      "ncclCommShrink", [] { return false; }, milliseconds(60000));
  CHECK(r.outcome == deadline_outcome::failed);
  CHECK(r.text == "ncclCommShrink failed");
  r = run_with_deadline(
      "ncclCommShrink", []() -> bool { throw std::runtime_error("ncclRemoteError"); },
      milliseconds(60000));
  CHECK(r.outcome == deadline_outcome::failed);
  CHECK(r.text == "ncclCommShrink failed: ncclRemoteError");
}

TEST_CASE("deadline call: a call that never returns expires and says the worker leaves as dead") {
  // The call blocks until the test releases it, after the deadline has expired.
  struct gate {
    std::mutex m;
    std::condition_variable cv;
    bool open = false, returned = false;
  };
  auto g = std::make_shared<gate>();
  // A watchdog opens the gate after 20 s: a run_with_deadline that waited for the call
  // instead of its 50 ms deadline would then see it return (done), not expire.
  std::thread watchdog([g] {
    std::unique_lock<std::mutex> lock(g->m);
    g->cv.wait_for(lock, std::chrono::seconds(20), [&] { return g->open; });
    g->open = true;
    g->cv.notify_all();
  });
  const deadline_result r = run_with_deadline(
      "ncclCommAbort",
      [g] {
        std::unique_lock<std::mutex> lock(g->m);
        g->cv.wait(lock, [&] { return g->open; });
        g->returned = true;
        g->cv.notify_all();
        return true;
      },
      milliseconds(50));
  CHECK(r.outcome == deadline_outcome::expired);
  CHECK(r.seconds >= 0.05);
  CHECK(r.text ==
        "ncclCommAbort did not return within 50 ms: this worker leaves the group as a dead member "
        "and exits (a thread stuck in NCCL holds the device); the group goes on without it");
  std::unique_lock<std::mutex> lock(g->m);
  g->open = true;
  g->cv.notify_all();
  g->cv.wait(lock, [&] { return g->returned; });  // the left-behind thread ends cleanly
  lock.unlock();
  watchdog.join();
}
