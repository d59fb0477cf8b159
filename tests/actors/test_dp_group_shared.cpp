// dp_group_shared: the hand-over between the worker actor (which learns of a newer roster)
// and the group's thread (which builds and uses one generation's links). Both orders of the
// two threads are played as tables: the roster first, or the build first. No sockets.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "actors/dp_group.hpp"
#include "runtime/step/dp_links.hpp"
#include "runtime/comm/build_abort.hpp"
#include "runtime/core/error.hpp"
#include "runtime/comm/communicator.hpp"
#include "runtime/net/kv_store.hpp"

using cohort::step::dp_group_shared;
using namespace cohort::comm;

namespace {

// A communicator that only records abort().
class fake_comm : public communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  const char* backend() const override { return "fake"; }
  void allreduce_sum(float*, std::size_t) override {}
  void allreduce_sum(std::int64_t*, std::size_t) override {}
  void allgather(const void*, void*, std::size_t) override {}
  void alltoall(const void*, void*, std::size_t) override {}
  void broadcast(void*, std::size_t, int) override {}
  void barrier() override {}
  void abort() override {
    ++aborts;
    if (abort_count != nullptr) ++*abort_count;
  }
  bool dead() const override { return aborts > 0; }
  bool stuck() const override { return abort_sticks && aborts > 0; }
  comm_traffic traffic() const override { return {}; }
  int aborts = 0;
  int* abort_count = nullptr;  ///< also counts here (it outlives the communicator)
  bool abort_sticks = false;  ///< its abort "did not return" (NCCL's hang, as nccl_comm reports it)
};

}  // namespace

TEST_CASE("a newer roster during a build aborts the build, then whatever it installs") {
  dp_group_shared s;
  auto cancel = s.begin_build(4);
  CHECK_FALSE(cancel->aborted());
  s.abort_below(5);  // the worker actor: generation 5 lost a member
  CHECK(cancel->aborted());
  CHECK(cancel->why().find("generation 4") != std::string::npos);
  // The build finished anyway (its last connect had completed): the link is aborted as it
  // is installed, and so is every extra link of the same generation.
  fake_comm c;
  s.install(&c, 4);
  CHECK(c.aborts == 1);
  int extra = 0;
  s.install_extra([&] { ++extra; });
  CHECK(extra == 1);
}

TEST_CASE("a roster that arrives before the group begins its build still ends that build") {
  dp_group_shared s;
  s.abort_below(7);  // the worker actor ran first
  CHECK(s.begin_build(6)->aborted());
  auto current = s.begin_build(7);  // the group's next try is for the current generation
  CHECK_FALSE(current->aborted());
  fake_comm c;
  s.install(&c, 7);
  CHECK(c.aborts == 0);
  s.abort_below(7);  // the same generation again (a roster that grew): nothing is over
  CHECK(c.aborts == 0);
  CHECK_FALSE(current->aborted());
  s.abort_below(8);
  CHECK(c.aborts == 1);
  CHECK(current->aborted());
}

TEST_CASE("abort_all (declared dead) ends the generation it knew, not the next one it joins") {
  dp_group_shared s;
  fake_comm c;
  s.begin_build(2);
  s.install(&c, 2);
  s.abort_all();
  CHECK(c.aborts == 1);
  CHECK(s.begin_build(2)->aborted());        // a late retry of the old generation
  CHECK_FALSE(s.begin_build(5)->aborted());  // the generation it rejoined in
}

TEST_CASE("shut ends what is installed and every later build (process exit)") {
  dp_group_shared s;
  fake_comm c;
  s.begin_build(2);
  s.install(&c, 2);
  s.shut();
  CHECK(c.aborts == 1);
  CHECK(s.begin_build(3)->aborted());
}

TEST_CASE("the collective timeout: 20 detection timeouts, at least 10 s, at most the store's") {
  using cohort::step::collective_timeout_ms;
  namespace kv = cohort::net::kv;
  CHECK(collective_timeout_ms(1) == 10000);
  CHECK(collective_timeout_ms(500) == 10000);
  CHECK(collective_timeout_ms(1000) == 20000);
  CHECK(collective_timeout_ms(90000) == 1800000);
  // Past the store's longest wait every rendezvous of the group was refused, and each new
  // generation failed the same way (fault_tolerance.timeout_ms 180000 ran no step).
  CHECK(collective_timeout_ms(180000) == kv::longest_wait.count());
  CHECK(collective_timeout_ms(3600000) == kv::longest_wait.count());  // the config's largest
  kv::store s;
  const auto at = [](int ms) { return kv::mono_time{} + std::chrono::milliseconds(ms); };
  CHECK(s.wait(1, 1, {"a"}, at(0), at(collective_timeout_ms(3600000))).code ==
        kv::status::pending);
}

TEST_CASE("the DP group's device: the seat's for nccl, the host's for every other backend") {
  using cohort::comm_backend;
  using cohort::step::link_device;
  CHECK(link_device(comm_backend::nccl, "cuda:1") == "cuda:1");
  CHECK(link_device(comm_backend::nccl, "cpu") == "cpu");  // the factory refuses it, clearly
  CHECK(link_device(comm_backend::automatic, "cuda:0") == "cpu");
  CHECK(link_device(comm_backend::gloo, "cuda:0") == "cpu");
  CHECK(link_device(comm_backend::automatic, "cpu") == "cpu");
}

TEST_CASE("links whose abort did not return go to the stuck handler, named, before anything joins") {
  cohort::step::dp_links l;
  dp_group_shared shared;
  auto dp = std::make_unique<fake_comm>();
  auto tp = std::make_unique<fake_comm>();
  tp->abort_sticks = true;
  l.comm = std::move(dp);
  l.tp_comm = std::move(tp);
  l.generation = 9;
  CHECK(l.stuck().empty());  // nothing aborted yet
  std::vector<std::string> seen;
  cohort::step::set_stuck_handler([&](const std::string& text) { seen.push_back(text); });
  l.drop(shared);
  cohort::step::set_stuck_handler(nullptr);
  REQUIRE(seen.size() == 1);
  CHECK(seen[0].find("generation 9") != std::string::npos);
  CHECK(seen[0].find("the TP group (fake)") != std::string::npos);
  CHECK(seen[0].find("the DP group") == std::string::npos);  // its abort returned
  CHECK(seen[0].find("ncclCommAbort") != std::string::npos);
  CHECK(l.comm == nullptr);  // dropped after the handler returned (a test's handler)
  // No stuck link: the handler is not called.
  cohort::step::dp_links quiet;
  quiet.comm = std::make_unique<fake_comm>();
  cohort::step::set_stuck_handler([&](const std::string& text) { seen.push_back(text); });
  quiet.drop(shared);
  cohort::step::set_stuck_handler(nullptr);
  CHECK(seen.size() == 1);
}

TEST_CASE("by default a worker with a stuck abort leaves at once with exit status 4") {
  // In a child process: the default handler ends it with exit_device_stuck, without
  // joining or destroying anything that might wait on the stuck thread.
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    cohort::step::dp_links l;
    dp_group_shared shared;
    auto c = std::make_unique<fake_comm>();
    c->abort_sticks = true;
    l.comm = std::move(c);
    l.drop(shared);
    ::_exit(0);  // not reached when the default handler works
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == cohort::exit_device_stuck);
  CHECK(cohort::exit_device_stuck == 4);
}

namespace {

// An NCCL-like communicator: interrupt() ends its calls but keeps it shrinkable; abort()
// does not (communicator.hpp).
class shrinkable_comm final : public fake_comm {
 public:
  const char* backend() const override { return "fake-nccl"; }
  void interrupt() override { ++interrupts; }
  bool can_shrink() const override { return aborts == 0 && shrinkable; }
  bool dead() const override { return aborts + interrupts > 0; }
  int interrupts = 0;
  bool shrinkable = true;
};

}  // namespace

TEST_CASE("a newer roster interrupts the DP group's communicators, a rejoin and an exit abort them") {
  shrinkable_comm c, lane;
  int other_aborts = 0;
  {
    dp_group_shared s;
    s.install(&c, 1);
    s.install_extra([&] { lane.abort(); }, [&] { lane.interrupt(); });
    s.install_extra([&] { ++other_aborts; });  // a TP group, a p2p channel: no interrupt
    s.abort_below(2);
    CHECK(c.interrupts == 1);
    CHECK(c.aborts == 0);
    CHECK(c.can_shrink());
    CHECK(lane.interrupts == 1);
    CHECK(lane.aborts == 0);
    CHECK(other_aborts == 1);
  }
  for (const bool exiting : {false, true}) {
    shrinkable_comm d, l2;
    dp_group_shared s;
    s.install(&d, 1);
    s.install_extra([&] { l2.abort(); }, [&] { l2.interrupt(); });
    if (exiting)
      s.shut();
    else
      s.abort_all();
    CHECK(d.aborts == 1);
    CHECK(d.interrupts == 0);
    CHECK(l2.aborts == 1);
    CHECK_FALSE(d.can_shrink());
  }
  // Installed below the floor: interrupted at once, as a roster that came first would.
  dp_group_shared s;
  s.abort_below(5);
  shrinkable_comm late;
  s.install(&late, 4);
  CHECK(late.interrupts == 1);
  CHECK(late.aborts == 0);
}

TEST_CASE("drop keeps an interrupted NCCL group for the next build's shrink, nothing else") {
  dp_group_shared shared;
  cohort::step::dp_links l;
  l.comm = std::make_unique<shrinkable_comm>();
  l.lanes.push_back(std::make_unique<shrinkable_comm>());
  l.params = std::make_unique<shrinkable_comm>();
  l.tp_comm = std::make_unique<shrinkable_comm>();
  l.generation = 3;
  l.rank = 1;
  l.size = 4;
  // The roster's news interrupts the group's communicators (abort_below), then the failed
  // step drops the links.
  l.comm->interrupt();
  l.lanes[0]->interrupt();
  l.params->interrupt();
  l.drop(shared);
  CHECK(l.comm == nullptr);
  REQUIRE(l.prior.comms.size() == 3);  // the group, its lane, the parameters' group, in order
  CHECK(l.prior.generation == 3);
  CHECK(l.prior.rank == 1);
  CHECK(l.prior.size == 4);
  CHECK(l.prior.holds());
  for (auto& c : l.prior.comms) {
    auto* s = dynamic_cast<shrinkable_comm*>(c.get());
    CHECK(s->interrupts >= 1);
    CHECK(s->aborts == 0);
  }
  CHECK(l.tp_comm == nullptr);  // aborted and dropped: another membership, never shrunk
  // A second drop (the failed step's, then the next build's) leaves the prior as it is.
  l.drop(shared);
  CHECK(l.prior.comms.size() == 3);

  // A group dropped for this worker's own failure (not interrupted): aborted, none kept, so
  // that its peers' calls fail too.
  {
    cohort::step::dp_links own;
    int aborted = 0;
    auto c = std::make_unique<shrinkable_comm>();
    c->abort_count = &aborted;
    own.comm = std::move(c);
    own.drop(shared);
    CHECK(own.prior.comms.empty());
    CHECK(aborted == 1);
  }
  // One communicator of the group that cannot shrink: all are aborted, none kept.
  cohort::step::dp_links m;
  auto a = std::make_unique<shrinkable_comm>();
  auto b = std::make_unique<shrinkable_comm>();
  b->shrinkable = false;
  a->interrupt();
  b->interrupt();
  m.comm = std::move(a);
  m.lanes.push_back(std::move(b));
  m.prior.generation = 1;  // an older prior is replaced by what this drop finds
  m.prior.comms.push_back(std::make_unique<shrinkable_comm>());
  m.drop(shared);
  CHECK(m.prior.comms.empty());
  CHECK_FALSE(m.prior.holds());
  // A host backend (fake_comm: no shrink) is dropped as before.
  cohort::step::dp_links h;
  h.comm = std::make_unique<fake_comm>();
  h.drop(shared);
  CHECK(h.prior.comms.empty());
}

TEST_CASE("abort_all marks the worker as rejoining once: its next build drops what it kept") {
  dp_group_shared s;
  CHECK_FALSE(s.take_rejoined());
  s.abort_below(3);  // a newer roster: the worker stays the member it was
  CHECK_FALSE(s.take_rejoined());
  s.abort_all();  // declared dead: it comes back as a new member
  CHECK(s.take_rejoined());
  CHECK_FALSE(s.take_rejoined());
}
