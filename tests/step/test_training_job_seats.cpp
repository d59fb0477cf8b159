// The coordinator's seating of pipeline / tensor-parallel workers as tables of events: which
// seat (replica slot d, stage p, TP rank t) a member gets, which replicas are whole and
// train, how step_open numbers them, who donates to members behind, when a generation
// change aborts, when the job ends and what the summary merges. Pure: no sockets, no clock.
#include <doctest/doctest.h>

#include <array>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "runtime/step/training_job.hpp"
#include "runtime/core/config.hpp"
#include "runtime/core/sha256.hpp"
#include "runtime/train/param_stats.hpp"

using namespace cohort;
using namespace cohort::step;

namespace {

// A GPT split over pp x tp (pp and tp need model.kind gpt; n_layer 4 and n_head 4 hold
// pp <= 4 and tp | 4). min_workers 0 leaves the default (cluster.workers).
config grid_config(int workers, int pp, int tp, int steps, int min_workers = 0) {
  std::string y =
      "cluster:\n  workers: " + std::to_string(workers) +
      "\nparallel:\n  pp: " + std::to_string(pp) + "\n  tp: " + std::to_string(tp) +
      "\nmodel:\n  kind: gpt\n  n_layer: 4\n  n_head: 4\n  d_model: 32\n  context: 16\n" +
      "train:\n  steps: " + std::to_string(steps) + "\n  global_batch: 64\n  micro_batch: 16\n";
  if (min_workers > 0) y += "elastic:\n  min_workers: " + std::to_string(min_workers) + "\n";
  return load_config_text(y, "<test>");
}

// Live members IDS (alive), ranks dense in the given order, as the roster keeps them.
mb::roster roster_of(uint64_t generation, const std::vector<mb::member_id>& ids) {
  mb::roster r;
  r.generation = generation;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    mb::member m;
    m.id = ids[i];
    m.name = "w" + std::to_string(m.id);
    m.rank = static_cast<int>(i);
    m.state = mb::member_state::alive;
    r.members.push_back(m);
  }
  return r;
}

template <class T>
std::map<mb::member_id, T> sent_to(const job_actions& a) {
  std::map<mb::member_id, T> out;
  for (const auto& s : a.sends)
    if (const auto* x = std::get_if<T>(&s.m)) out[s.to] = *x;
  return out;
}

template <class T>
std::size_t count_sent(const job_actions& a) {
  std::size_t n = 0;
  for (const auto& s : a.sends) n += std::holds_alternative<T>(s.m) ? 1 : 0;
  return n;
}

std::set<mb::member_id> keys(const std::map<mb::member_id, net::step_open>& m) {
  std::set<mb::member_id> out;
  for (const auto& [id, o] : m) out.insert(id);
  return out;
}

net::step_vote ok_vote(mb::member_id id, uint64_t g, int64_t s) {
  net::step_vote v;
  v.member_id = id;
  v.generation = g;
  v.step = s;
  v.ok = true;
  v.loss_rows = 16.0;
  v.rows = 16;
  return v;
}

// Every member of IDS reports ready at NEXT; returns the actions of the last report.
job_actions ready(training_job& job, const mb::roster& r, const std::vector<mb::member_id>& ids,
                  int64_t next) {
  job_actions last;
  for (mb::member_id id : ids) last = job.on_ready(r, net::worker_ready{id, r.generation, next}, 0);
  return last;
}

// Every member of IDS votes ok for STEP of generation G; returns the actions of the last vote.
job_actions vote_all(training_job& job, const mb::roster& r, const std::vector<mb::member_id>& ids,
                     uint64_t g, int64_t step, double now_s = 0) {
  job_actions last;
  for (mb::member_id id : ids) last = job.on_vote(r, ok_vote(id, g, step), now_s);
  return last;
}

// The seat the rules give the I-th member (0-based) to join an empty grid of pp x tp seats
// per replica: replicas fill one after the other, seats in (p, t) order, t fastest.
std::array<int, 3> seat_in_join_order(int i, int pp, int tp) {
  const int k = i % (pp * tp);
  return {i / (pp * tp), k / tp, k % tp};
}

std::string digest_of(const std::string& text) { return sha256_hex(text); }

// The whole model's hash as param_stats documents it: SHA-256 over "name:digest\n" lines in
// name order (written out here rather than calling combine_param_digests).
std::string hash_of_lines(const std::map<std::string, std::string>& digests) {
  std::string lines;
  for (const auto& [name, d] : digests) lines += name + ":" + d + "\n";
  return sha256_hex(lines);
}

// A final report of one stage worker.
net::train_report stage_report(mb::member_id id, int64_t next_step, int replica, int stage,
                               const std::map<std::string, std::string>& digests,
                               uint64_t schedule_us, uint64_t compute_us, int micro_batches) {
  net::train_report rep;
  rep.member_id = id;
  rep.next_step = next_step;
  rep.param_digests = train::format_param_digests(digests);
  rep.stage.stage = stage;
  rep.stage.tp_rank = 0;
  rep.stage.replica = replica;
  rep.stage.schedule_us = schedule_us;
  rep.stage.compute_us = compute_us;
  rep.stage.micro_batches = micro_batches;
  return rep;
}

}  // namespace

TEST_CASE("dp 2 x pp 2: members take seats in join order and whole replicas are numbered d") {
  const int pp = 2, tp = 1;
  const config c = grid_config(4, pp, tp, 5);
  REQUIRE(c.parallel.dp == 2);
  training_job job(c, dump_config(c));
  const std::vector<mb::member_id> ids{1, 2, 3, 4};
  const mb::roster r = roster_of(1, ids);
  job.on_generation(r, 0);
  job_actions a = ready(job, r, ids, 0);
  const auto opens = sent_to<net::step_open>(a);
  REQUIRE(opens.size() == 4);
  for (int i = 0; i < 4; ++i) {
    const mb::member_id id = ids[static_cast<std::size_t>(i)];
    const std::array<int, 3> want = seat_in_join_order(i, pp, tp);
    CAPTURE(id);
    REQUIRE(job.seat_of(id).has_value());
    CHECK(*job.seat_of(id) == want);
    const net::step_open& o = opens.at(id);
    CHECK(o.generation == 1);
    CHECK(o.step == 0);
    CHECK(o.replicas == 2);
    CHECK(o.rank == want[0]);  // both replicas whole: the dense number is the slot
    CHECK(o.stage == want[1]);
    CHECK(o.tp_rank == want[2]);
    CHECK(o.donor_rank == -1);  // everybody holds step 0
  }
  // The expected seats spelled out: (0,0,0), (0,1,0), (1,0,0), (1,1,0).
  CHECK(*job.seat_of(2) == std::array<int, 3>{0, 1, 0});
  CHECK(*job.seat_of(3) == std::array<int, 3>{1, 0, 0});
  CHECK(job.replicas() == 2);
}

TEST_CASE("pp 2 x tp 2 x dp 1: one replica of four seats with the TP rank fastest") {
  const int pp = 2, tp = 2;
  const config c = grid_config(4, pp, tp, 5);
  REQUIRE(c.parallel.dp == 1);
  training_job job(c, dump_config(c));
  const std::vector<mb::member_id> ids{11, 12, 13, 14};
  const mb::roster r = roster_of(3, ids);
  // Three of four ready: the only replica is not ready, nothing opens.
  CHECK(count_sent<net::step_open>(ready(job, r, {11, 12, 13}, 0)) == 0);
  CHECK_FALSE(job.open_step().has_value());
  const auto opens = sent_to<net::step_open>(ready(job, r, {14}, 0));
  REQUIRE(opens.size() == 4);
  for (int i = 0; i < 4; ++i) {
    const mb::member_id id = ids[static_cast<std::size_t>(i)];
    const std::array<int, 3> want = seat_in_join_order(i, pp, tp);
    CAPTURE(id);
    CHECK(*job.seat_of(id) == want);
    const net::step_open& o = opens.at(id);
    CHECK(o.replicas == 1);
    CHECK(o.rank == 0);
    CHECK(o.stage == want[1]);
    CHECK(o.tp_rank == want[2]);
    CHECK(o.donor_rank == -1);
  }
  CHECK(*job.seat_of(12) == std::array<int, 3>{0, 0, 1});
  CHECK(*job.seat_of(13) == std::array<int, 3>{0, 1, 0});
}

TEST_CASE(
    "a lost voter aborts and the whole replica trains alone until a joiner fills the orphan's "
    "seat") {
  // dp 2 x pp 2, min_workers 2: one whole replica (2 workers) is enough to train.
  const config c = grid_config(4, 2, 1, 10, 2);
  training_job job(c, dump_config(c));
  const mb::roster r1 = roster_of(1, {1, 2, 3, 4});
  job.on_generation(r1, 0);
  ready(job, r1, {1, 2, 3, 4}, 0);
  REQUIRE(job.open_step() == std::make_pair(uint64_t{1}, int64_t{0}));
  job.on_vote(r1, ok_vote(1, 1, 0), 0.1);

  // Member 2 (replica 0, stage 1) dies: a voter is lost, step 0 aborts for the survivors
  // that were asked to vote; step 0 runs again with replica 1 alone, renumbered rank 0.
  const mb::roster r2 = roster_of(2, {1, 3, 4});
  job_actions a = job.on_generation(r2, 1.0);
  const auto aborted = sent_to<net::step_result>(a);
  CHECK(aborted.size() == 3);
  for (mb::member_id id : {1, 3, 4}) {
    CAPTURE(id);
    REQUIRE(aborted.count(id) == 1);
    CHECK_FALSE(aborted.at(id).commit);
    CHECK(aborted.at(id).generation == 1);
  }
  CHECK(job.report().aborted_steps() == 1);
  auto opens = sent_to<net::step_open>(a);
  CHECK(keys(opens) == std::set<mb::member_id>{3, 4});  // the orphan (member 1) gets nothing
  for (const auto& [id, o] : opens) {
    CAPTURE(id);
    CHECK(o.generation == 2);
    CHECK(o.step == 0);
    CHECK(o.replicas == 1);
    CHECK(o.rank == 0);
    CHECK(o.stage == (*job.seat_of(id))[1]);
    CHECK(o.donor_rank == -1);  // both hold step 0
  }
  CHECK(*job.seat_of(1) == std::array<int, 3>{0, 0, 0});  // seats are kept for life
  CHECK_FALSE(job.seat_of(2).has_value());
  // The orphan's vote is not asked for: it changes nothing.
  CHECK(job.on_vote(r2, ok_vote(1, 2, 0), 1.1).sends.empty());
  a = vote_all(job, r2, {3, 4}, 2, 0, 1.2);
  CHECK(a.committed);
  CHECK(job.next_step() == 1);
  CHECK(job.replicas() == 1);
  CHECK(keys(sent_to<net::step_open>(a)) == std::set<mb::member_id>{3, 4});  // step 1, alone
  REQUIRE(job.open_step() == std::make_pair(uint64_t{2}, int64_t{1}));

  // Member 5 joins while step 1 is open: no voter lost, nothing aborted.
  const mb::roster r3 = roster_of(3, {1, 3, 4, 5});
  a = job.on_generation(r3, 2.0);
  CHECK(count_sent<net::step_result>(a) == 0);
  CHECK(job.open_step() == std::make_pair(uint64_t{2}, int64_t{1}));
  CHECK(job.on_ready(r3, net::worker_ready{5, 3, 0}, 2.1).sends.empty());  // step still open
  a = vote_all(job, r3, {3, 4}, 2, 1, 2.5);
  CHECK(a.committed);
  CHECK(job.next_step() == 2);
  // Replica 0 is the most nearly whole: the joiner takes its free seat, stage 1.
  REQUIRE(job.seat_of(5).has_value());
  CHECK(*job.seat_of(5) == std::array<int, 3>{0, 1, 0});
  // Step 2 runs on both replicas: replica 0 = {1, 5} is rank 0, replica 1 = {3, 4} rank 1.
  // Members 1 (step 0's state) and 5 (fresh) are behind; in each DP group the first whole
  // replica holding step 2 is replica 1, so every member is told donor 1.
  opens = sent_to<net::step_open>(a);
  CHECK(keys(opens) == std::set<mb::member_id>{1, 3, 4, 5});
  const std::map<mb::member_id, std::array<int, 2>> want{
      {1, {0, 0}}, {5, {0, 1}}, {3, {1, 0}}, {4, {1, 1}}};  // rank, stage
  for (const auto& [id, o] : opens) {
    CAPTURE(id);
    CHECK(o.generation == 3);
    CHECK(o.step == 2);
    CHECK(o.replicas == 2);
    CHECK(o.rank == want.at(id)[0]);
    CHECK(o.stage == want.at(id)[1]);
    CHECK(o.tp_rank == 0);
    CHECK(o.donor_rank == 1);
  }
  CHECK(job.replicas() == 2);
}

TEST_CASE("an idle member of a broken replica leaving does not abort the open step") {
  const config c = grid_config(4, 2, 1, 10, 2);
  training_job job(c, dump_config(c));
  const mb::roster r1 = roster_of(1, {1, 2, 3, 4});
  job.on_generation(r1, 0);
  ready(job, r1, {1, 2, 3, 4}, 0);
  // Member 1 (replica 0, stage 0) dies before voting: step 0 aborts, replica 1 runs it.
  const mb::roster r2 = roster_of(2, {2, 3, 4});
  job_actions a = job.on_generation(r2, 1.0);
  CHECK(count_sent<net::step_result>(a) == 3);
  CHECK(keys(sent_to<net::step_open>(a)) == std::set<mb::member_id>{3, 4});
  REQUIRE(job.open_step() == std::make_pair(uint64_t{2}, int64_t{0}));
  // Member 2, idle in broken replica 0, leaves: it was not asked to vote, the step stays.
  const mb::roster r3 = roster_of(3, {3, 4});
  a = job.on_generation(r3, 1.5);
  CHECK(count_sent<net::step_result>(a) == 0);
  CHECK(count_sent<net::step_open>(a) == 0);
  CHECK(job.report().aborted_steps() == 1);
  CHECK(job.open_step() == std::make_pair(uint64_t{2}, int64_t{0}));
  a = vote_all(job, r3, {3, 4}, 2, 0, 2.0);
  CHECK(a.committed);
  CHECK(job.next_step() == 1);
  // Replica 0 is empty now: a joiner starts it again from its first seat.
  const mb::roster r4 = roster_of(4, {3, 4, 7});
  job.on_generation(r4, 2.5);
  vote_all(job, r4, {3, 4}, 3, 1, 3.0);  // step 1 opened for generation 3 after the commit
  REQUIRE(job.seat_of(7).has_value());
  CHECK(*job.seat_of(7) == std::array<int, 3>{0, 0, 0});
}

TEST_CASE("a DP group with members behind and no live holder of the step fails the job") {
  const config c = grid_config(4, 2, 1, 10, 2);
  training_job job(c, dump_config(c));
  const mb::roster r1 = roster_of(1, {1, 2, 3, 4});
  job.on_generation(r1, 0);
  ready(job, r1, {1, 2, 3, 4}, 0);
  // Member 2 dies; replica 1 runs step 0 alone and opens step 1.
  const mb::roster r2 = roster_of(2, {1, 3, 4});
  job.on_generation(r2, 1.0);
  REQUIRE(vote_all(job, r2, {3, 4}, 2, 0, 1.5).committed);
  REQUIRE(job.open_step() == std::make_pair(uint64_t{2}, int64_t{1}));
  // Replica 1 dies whole: nobody alive holds step 1's state.
  const mb::roster r3 = roster_of(3, {1});
  job_actions a = job.on_generation(r3, 2.0);
  CHECK(count_sent<net::step_result>(a) == 0);  // both voters are gone; the orphan never voted
  CHECK(job.report().aborted_steps() == 2);
  CHECK(a.failed.empty());  // no whole replica: it waits
  // A joiner completes replica 0; both its members hold step 0 only, step 1 is next.
  const mb::roster r4 = roster_of(4, {1, 8});
  job.on_generation(r4, 3.0);
  a = job.on_ready(r4, net::worker_ready{8, 4, 0}, 3.1);
  CHECK(*job.seat_of(8) == std::array<int, 3>{0, 1, 0});
  CHECK(count_sent<net::step_open>(a) == 0);
  CHECK(a.failed.find("stage 0") != std::string::npos);
  CHECK(a.failed.find("step 1") != std::string::npos);
  CHECK(job.finished());
}

TEST_CASE(
    "the job ends when the last step's voters reported and the summary merges stage digests") {
  // dp 2 x pp 2, 2 steps, min_workers 2. Replica 0 breaks after step 0: its stage-0 member
  // sits out step 1, never reaches the end and never reports.
  const config c = grid_config(4, 2, 1, 2, 2);
  training_job job(c, dump_config(c));
  const mb::roster r1 = roster_of(1, {1, 2, 3, 4});
  job.on_generation(r1, 0);
  ready(job, r1, {1, 2, 3, 4}, 0);
  REQUIRE(vote_all(job, r1, {1, 2, 3, 4}, 1, 0, 1.0).committed);
  REQUIRE(job.open_step() == std::make_pair(uint64_t{1}, int64_t{1}));
  const mb::roster r2 = roster_of(2, {1, 3, 4});
  job.on_generation(r2, 1.5);
  job_actions a = vote_all(job, r2, {3, 4}, 2, 1, 2.0);
  REQUIRE(a.committed);
  CHECK(job.next_step() == 2);
  CHECK(count_sent<net::step_open>(a) == 0);  // no step after the last

  const std::map<std::string, std::string> stage0{{"wte", digest_of("wte")},
                                                  {"blocks.0.attn", digest_of("b0")}};
  const std::map<std::string, std::string> stage1{{"blocks.1.attn", digest_of("b1")},
                                                  {"lm_head", digest_of("head")}};
  // M = 4 micro-batches; stage 0 idles 200 of 1000 us, stage 1 400 of 1000 us.
  CHECK_FALSE(job.on_report(r2, stage_report(3, 2, 0, 0, stage0, 1000, 800, 4), 2.5).finished);
  CHECK_FALSE(job.finished());
  a = job.on_report(r2, stage_report(4, 2, 0, 1, stage1, 1000, 600, 4), 2.6);
  CHECK(a.finished);  // member 1 never reported: it was not a voter of step 1
  CHECK(job.finished());

  const nlohmann::json j = job.report().summary(3.0);
  std::map<std::string, std::string> all = stage0;
  all.insert(stage1.begin(), stage1.end());
  CHECK(j["params_sha256"] == train::combine_param_digests(all));
  CHECK(j["params_sha256"] == hash_of_lines(all));
  CHECK(j["params_consistent"] == true);
  CHECK(j["dp"] == 1);
  CHECK(j["steps_completed"] == 2);
  CHECK(j["workers"].size() == 2);
  const nlohmann::json& p = j["pipeline"];
  CHECK(p["pp"] == 2);
  CHECK(p["tp"] == 1);
  CHECK(p["schedule"] == c.parallel.schedule);
  CHECK(p["micro_batches"] == 4);
  CHECK(p["theoretical_bubble"].get<double>() == doctest::Approx((2.0 - 1) / (4 + 2 - 1)));
  CHECK(p["bubble_fraction"].get<double>() == doctest::Approx((0.2 + 0.4) / 2));
  REQUIRE(p["stages"].size() == 2);
  CHECK(p["stages"][0]["stage"] == 0);
  CHECK(p["stages"][0]["bubble_fraction"].get<double>() == doctest::Approx(0.2));
  CHECK(p["stages"][1]["stage"] == 1);
  CHECK(p["stages"][1]["bubble_fraction"].get<double>() == doctest::Approx(0.4));
}

TEST_CASE("params_consistent: replicas of one stage must agree on every parameter's digest") {
  for (const bool agree : {true, false}) {
    CAPTURE(agree);
    const config c = grid_config(4, 2, 1, 1);
    training_job job(c, dump_config(c));
    const mb::roster r = roster_of(1, {1, 2, 3, 4});
    job.on_generation(r, 0);
    ready(job, r, {1, 2, 3, 4}, 0);
    REQUIRE(vote_all(job, r, {1, 2, 3, 4}, 1, 0, 1.0).committed);
    const std::map<std::string, std::string> s0{{"wte", digest_of("wte")}};
    const std::map<std::string, std::string> s1{{"lm_head", digest_of("head")}};
    // Replica 1's stage 0 holds other bits for "wte" when they disagree.
    const std::map<std::string, std::string> s0_r1{
        {"wte", agree ? digest_of("wte") : digest_of("wte drifted")}};
    job.on_report(r, stage_report(1, 1, 0, 0, s0, 1000, 900, 4), 2.0);
    job.on_report(r, stage_report(2, 1, 0, 1, s1, 1000, 900, 4), 2.0);
    job.on_report(r, stage_report(3, 1, 1, 0, s0_r1, 1000, 900, 4), 2.0);
    CHECK_FALSE(job.finished());
    CHECK(job.on_report(r, stage_report(4, 1, 1, 1, s1, 1000, 900, 4), 2.0).finished);
    const nlohmann::json j = job.report().summary(3.0);
    CHECK(j["params_consistent"] == agree);
    CHECK(j["dp"] == 2);
    if (agree) {
      std::map<std::string, std::string> all = s0;
      all.insert(s1.begin(), s1.end());
      CHECK(j["params_sha256"] == hash_of_lines(all));
    }
    // Stages sorted by (replica, stage): 0/0, 0/1, 1/0, 1/1.
    const nlohmann::json& st = j["pipeline"]["stages"];
    REQUIRE(st.size() == 4);
    for (int i = 0; i < 4; ++i) {
      CHECK(st[i]["replica"] == i / 2);
      CHECK(st[i]["stage"] == i % 2);
    }
  }
}

TEST_CASE("min_workers 4 with pp 2: one whole replica is not enough so training waits") {
  const config c = grid_config(4, 2, 1, 10);  // min_workers defaults to cluster.workers = 4
  REQUIRE(c.elastic.min_workers == 4);
  training_job job(c, dump_config(c));
  // At the start only replica 0 is there: nothing opens.
  const mb::roster r0 = roster_of(1, {1, 2});
  job.on_generation(r0, 0);
  CHECK(count_sent<net::step_open>(ready(job, r0, {1, 2}, 0)) == 0);
  CHECK_FALSE(job.open_step().has_value());
  // Replica 1 arrives: 2 whole replicas = 4 / 2 needed, step 0 runs and commits.
  const mb::roster r1 = roster_of(2, {1, 2, 3, 4});
  job.on_generation(r1, 0.5);
  CHECK(count_sent<net::step_open>(ready(job, r1, {3, 4}, 0)) == 4);
  job_actions a = vote_all(job, r1, {1, 2, 3, 4}, 2, 0, 1.0);
  REQUIRE(a.committed);
  REQUIRE(job.open_step() == std::make_pair(uint64_t{2}, int64_t{1}));
  // Member 4 dies: step 1 aborts and one whole replica is left, below max(1, 4 / 2) = 2.
  const mb::roster r2 = roster_of(3, {1, 2, 3});
  a = job.on_generation(r2, 2.0);
  CHECK(count_sent<net::step_result>(a) == 3);
  CHECK(count_sent<net::step_open>(a) == 0);
  CHECK_FALSE(job.open_step().has_value());
  bool noted = false;
  for (const auto& n : a.notes)
    noted = noted || n.find("waiting for replicas: 1 whole, 2 needed") != std::string::npos;
  CHECK(noted);
  CHECK(count_sent<net::step_open>(job.on_tick(r2, 2.5)) == 0);
}
