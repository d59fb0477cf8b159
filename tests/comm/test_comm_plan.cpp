// The transport plan record (runtime/comm/transport_plan.hpp) that rank 0 of a group with
// transport auto writes to the rendezvous store: every kind round-trips; a record of another
// version, another kind, a bad layout or no plan at all is refused with comm_error(invalid)
// that says what is wrong, and never crashes; and the factory refuses one it reads.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "runtime/comm/comm_error.hpp"
#include "runtime/comm/factory.hpp"
#include "runtime/comm/local_kv.hpp"
#include "runtime/comm/transport_plan.hpp"

using namespace cohort::comm;
using cohort::comm_backend;
using cohort::comm_transport;

namespace {

std::vector<char> bytes(const std::string& s) { return {s.begin(), s.end()}; }

// The message decode_plan refuses `record` with (for a group of `size` ranks).
std::string refusal(const std::string& record, int size) {
  try {
    decode_plan(bytes(record), size);
  } catch (const comm_error& e) {
    CHECK(e.kind() == comm_failure::invalid);
    return e.what();
  }
  FAIL("accepted: " << record);
  return "";
}

}  // namespace

TEST_CASE("a transport plan round-trips through its record, version and all") {
  transport_plan g;
  g.kind = plan_kind::gloo;
  CHECK(std::string(encode_plan(g).data(), encode_plan(g).size()) == "cohort.plan 1 gloo");
  CHECK(decode_plan(encode_plan(g), 3).kind == plan_kind::gloo);

  transport_plan s;
  s.kind = plan_kind::shm;
  CHECK(decode_plan(encode_plan(s), 2).kind == plan_kind::shm);

  transport_plan h;
  h.kind = plan_kind::hier;
  h.layout = host_layout::from_identities({"a", "a", "b", "c", "b"});
  const std::vector<char> rec = encode_plan(h);
  CHECK(std::string(rec.begin(), rec.end()) == "cohort.plan 1 hier 0,0,1,2,1");
  const transport_plan back = decode_plan(rec, 5);
  CHECK(back.kind == plan_kind::hier);
  CHECK(back.layout.host_of == h.layout.host_of);
}

TEST_CASE("a record that is not a plan of this version is refused with what is wrong") {
  // Another version, older or newer: the workers run different builds.
  CHECK(refusal("cohort.plan 2 gloo", 2).find("its version is '2', this build reads version 1") !=
        std::string::npos);
  CHECK(refusal("cohort.plan 0 shm", 2).find("version is '0'") != std::string::npos);
  CHECK(refusal("cohort.plan x1 shm", 2).find("version is 'x1'") != std::string::npos);
  // What the store held before plans had versions, and things that are no plan at all.
  CHECK(refusal("shm", 2).find("does not start with 'cohort.plan'") != std::string::npos);
  CHECK(refusal("hier:0,0,1,1", 4).find("does not start with 'cohort.plan'") != std::string::npos);
  CHECK(refusal("", 2).find("does not start with 'cohort.plan'") != std::string::npos);
  // A NUL in the record neither ends the message early nor reaches it.
  const std::string nul = refusal(std::string("cohort.plan\0 1 gloo", 19), 2);
  CHECK(nul.find("transport plan 'cohort.plan? 1 gloo' failed (invalid): it does not start with") !=
        std::string::npos);
  CHECK(refusal("cohort.plan", 2).find("version is ''") != std::string::npos);
  // An unknown kind, or a kind with what does not belong to it.
  CHECK(refusal("cohort.plan 1 nccl", 2).find("kind 'nccl' is not one of gloo, shm, hier") !=
        std::string::npos);
  CHECK(refusal("cohort.plan 1 shm 0,0", 2).find("a shm plan carries nothing after its kind") !=
        std::string::npos);
  CHECK(refusal("cohort.plan 1 gloo 0,1 x", 2).find("nothing after its kind") != std::string::npos);
  // A hier plan whose layout is missing, malformed or of another group size.
  CHECK(refusal("cohort.plan 1 hier", 4).find("needs the host of every rank") != std::string::npos);
  CHECK(refusal("cohort.plan 1 hier 0,0,1", 4).find("exactly 4 ranks") != std::string::npos);
  CHECK(refusal("cohort.plan 1 hier 0,x,1,1", 4).find("not a host number") != std::string::npos);
  CHECK(refusal("cohort.plan 1 hier 1,0,1,1", 4).find("not numbered in order") !=
        std::string::npos);
  CHECK(refusal("cohort.plan 1 hier 0,0,1,1 extra", 4).find("words after the layout") !=
        std::string::npos);
  // A record far larger than any plan is refused by its size, before it is read.
  CHECK(refusal("cohort.plan 1 hier " + std::string(1 << 20, '0'), 4).find("more than any plan") !=
        std::string::npos);
  // Every refusal says where the record comes from and what to do.
  CHECK(refusal("cohort.plan 9 shm", 2)
            .find("every worker of a job must run the same cohort "
                  "build") != std::string::npos);
}

TEST_CASE("a rank that reads a plan it cannot decode refuses to build the group") {
  // Rank 0 of this group is elsewhere; its record in the store is of a newer version.
  memory_kv kv;
  kv.set(generation_key(4, "dp/transport/kind"), bytes("cohort.plan 2 shm"));
  transport_options t;
  t.transport = comm_transport::automatic;
  t.host_id = "h0";
  t.rendezvous_timeout_ms = 5000;
  try {
    make_communicator(comm_backend::gloo, "cpu", kv, 1, 2, 4, 5000, t);
    FAIL("a group was built from a plan of another version");
  } catch (const comm_error& e) {
    CHECK(e.kind() == comm_failure::invalid);
    CHECK(std::string(e.what()).find("this build reads version 1") != std::string::npos);
  }
  // It said where it runs before it read the plan, as rank 0 expects.
  CHECK(kv.get(generation_key(4, "dp/transport/host/1"), std::chrono::milliseconds(10)) ==
        bytes("h0"));
}
