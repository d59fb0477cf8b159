// replica_step (runtime/step/replica_step.hpp): one DP replica's step driven message by
// message, with a fake seat (records what the step asks of the model) and a fake
// communicator (peers that contribute a known value, a donor whose state is known) under a
// real bucket engine; a fake clock. No sockets, no sleeps.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <deque>
#include <functional>
#include <string>
#include <variant>
#include <vector>

#include "runtime/ckpt/checkpoint_dir.hpp"
#include "runtime/comm/buckets.hpp"
#include "runtime/comm/comm_error.hpp"
#include "runtime/core/config.hpp"
#include "runtime/core/error.hpp"
#include "runtime/step/replica_step.hpp"
#include "runtime/train/seat.hpp"

using namespace cohort;
using step::replica_step;

namespace {

constexpr std::size_t n_elements = 4;

/// What the fake seat was asked to do, kept by the test (the step owns the seat).
struct seat_record {
  std::vector<int64_t> applied, saves, evals, begun;
  std::vector<std::string> loaded;
  std::vector<std::vector<int64_t>> sums;  ///< the DP sum each step's finish_gradients saw
  std::vector<float> params = std::vector<float>(n_elements, 0.0f);
  int64_t optimizer_steps = 0;
  int64_t load_returns = 0;  ///< next step a checkpoint load returns
  bool load_throws = false;
  bool saves_every_rank = false;
  bool nan_loss = false;
  int rank = 0;  ///< the DP rank the rig runs at
};

/// Rank r contributes (step + 1) * (r + 1) to every element; the loss is 2 per micro-batch.
class fake_seat final : public train::seat {
 public:
  explicit fake_seat(seat_record& r) : r_(r) {}
  std::pair<int, int> position() const override { return {0, 0}; }
  int micro_batches() const override { return 4; }
  comm::grad_type reduction_type() const override { return comm::grad_type::i64; }
  std::size_t elements() override { return buf_.size(); }
  void set_links(train::stage_links) override {}
  void begin_step() override { std::fill(buf_.begin(), buf_.end(), 0); }
  double compute_gradients(int64_t step, const std::vector<int>& micro,
                           const nn::grads_ready_fn& ready) override {
    r_.begun.push_back(step);
    for (auto& x : buf_) x = (step + 1) * (r_.rank + 1);
    ready(0, buf_.size());
    return r_.nan_loss ? std::nan("") : 2.0 * static_cast<double>(micro.size());
  }
  void* reduction_buffer() override { return buf_.data(); }
  comm::wire_plan wire(int, int) override { return {}; }
  void finish_gradients(int64_t) override { r_.sums.push_back(buf_); }
  void apply_step(int64_t step) override {
    r_.applied.push_back(step);
    for (std::size_t i = 0; i < n_elements; ++i) r_.params[i] += static_cast<float>(buf_[i]);
    ++r_.optimizer_steps;
  }
  bool speaks_for_loss() const override { return true; }
  std::vector<std::pair<float*, std::size_t>> state_buffers() override {
    return {{r_.params.data(), r_.params.size()}};
  }
  int64_t optimizer_steps() const override { return r_.optimizer_steps; }
  void set_optimizer_steps(int64_t s) override { r_.optimizer_steps = s; }
  int64_t load_checkpoint(const std::string& dir) override {
    r_.loaded.push_back(dir);
    if (r_.load_throws) throw std::runtime_error("no such checkpoint");
    return r_.load_returns;
  }
  void save(train::checkpoint_writer&, int64_t next_step, uint64_t) override {
    r_.saves.push_back(next_step);
  }
  bool saves_every_rank() const override { return r_.saves_every_rank; }
  train::evaluation evaluate(int64_t tag) override {
    r_.evals.push_back(tag);
    return {0.5, 0.75, 10};
  }
  train::seat_report report() override {
    train::seat_report s;
    for (float p : r_.params) s.params_sha256 += std::to_string(static_cast<int64_t>(p)) + ",";
    s.model_params = n_elements;
    return s;
  }
  int64_t peak_pool_bytes() const override { return 0; }

 private:
  seat_record& r_;
  std::vector<int64_t> buf_ = std::vector<int64_t>(n_elements, 0);
};

/// What crossed the fake communicator, and the donor's state it hands out.
struct comm_record {
  std::deque<std::vector<char>> donor;  ///< what each broadcast from another rank yields
  std::vector<std::vector<char>> sent;  ///< what this rank broadcast as the root
  int64_t peer_value = 0;               ///< the other ranks' sum, added by each allreduce
};

class fake_comm final : public comm::communicator {
 public:
  fake_comm(comm_record& r, int rank, int size) : r_(r), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "fake"; }
  void allreduce_sum(float* d, std::size_t n) override {
    for (std::size_t i = 0; i < n; ++i) d[i] += static_cast<float>(r_.peer_value);
  }
  void allreduce_sum(std::int64_t* d, std::size_t n) override {
    for (std::size_t i = 0; i < n; ++i) d[i] += r_.peer_value;
  }
  void allgather(const void*, void*, std::size_t) override { unused(); }
  void alltoall(const void*, void*, std::size_t) override { unused(); }
  void broadcast(void* data, std::size_t bytes, int root) override {
    if (root == rank_) {
      r_.sent.emplace_back(static_cast<char*>(data), static_cast<char*>(data) + bytes);
      return;
    }
    REQUIRE(!r_.donor.empty());
    REQUIRE(r_.donor.front().size() == bytes);
    std::memcpy(data, r_.donor.front().data(), bytes);
    r_.donor.pop_front();
  }
  void barrier() override {}
  void abort() override { dead_ = true; }
  bool dead() const override { return dead_; }
  comm::comm_traffic traffic() const override { return {}; }

 private:
  [[noreturn]] static void unused() {
    throw comm::comm_error(comm::comm_failure::invalid, "fake", "not used by the step");
  }
  comm_record& r_;
  int rank_, size_;
  std::atomic<bool> dead_{false};
};

template <class T>
std::vector<char> bytes_of(const std::vector<T>& v) {
  std::vector<char> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

/// STEPS steps of 4 micro-batches, checkpoints every 2, an evaluation every 3.
std::string job_yaml(int steps = 6) {
  return "model:\n  kind: mlp\n  hidden: [8]\n"
         "data:\n  dataset: fashion_mnist\n  dir: /usr/share/datasets/fashion-mnist\n"
         "train:\n  steps: " +
         std::to_string(steps) +
         "\n  global_batch: 128\n  micro_batch: 32\n  eval_every: 3\n"
         "fault_tolerance:\n  checkpoint_every: 2\n  checkpoint_dir: /nonexistent/ckpt\n";
}

/// One replica's step with every outside piece faked; RANK of SIZE in every generation.
struct rig {
  seat_record seat;
  comm_record comm;
  std::vector<net::message> sent;
  std::vector<std::string> fatals;
  std::deque<net::step_open> window;  ///< continue_window's queue (the mailbox)
  std::vector<uint64_t> builds;       ///< generations whose links were built
  std::function<void()> links_fault;  ///< when set, the build of the links runs it first
  std::chrono::steady_clock::time_point t{};
  std::shared_ptr<step::dp_group_shared> shared = std::make_shared<step::dp_group_shared>();
  std::unique_ptr<replica_step> step;
  int rank = 0, size = 1;

  rig(int rank_ = 0, int size_ = 1) : rank(rank_), size(size_) {
    seat.rank = rank;
    step::replica_io io;
    io.send = [this](const net::message& m) { sent.push_back(m); };
    io.fatal = [this](const std::string& why) { fatals.push_back(why); };
    io.make_seat = [this](const config&, bool, int, int) {
      ++seats_made;
      return std::make_unique<fake_seat>(seat);
    };
    io.data_host = [](const config&) { return std::string("127.0.0.1"); };
    io.build_links = [this](step::dp_links& l, const step::link_request& q) {
      l.drop(*shared);
      if (links_fault) links_fault();
      builds.push_back(q.open.generation);
      l.comm = std::make_unique<fake_comm>(comm, q.rank, q.open.replicas);
      l.generation = q.open.generation;
      l.rank = q.rank;
      l.size = q.open.replicas;
      shared->install(l.comm.get(), q.open.generation);
      l.engine = std::make_unique<comm::bucket_engine>(*l.comm, q.seat.elements(),
                                                       q.seat.reduction_type(), 1.0);
    };
    io.continue_window = [this](const net::step_open& o, uint64_t, int) { window.push_back(o); };
    io.now = [this] { return t += std::chrono::microseconds(10); };
    step = std::make_unique<replica_step>(std::move(io), shared);
  }

  void job(const std::string& yaml = job_yaml(), const std::string& resume = "",
           uint64_t member = 7) {
    net::job_spec s;
    s.config_yaml = yaml;
    s.resume_checkpoint = resume;
    step->on_job(s, member, 1);
  }
  int seats_made = 0;
  net::step_open open_of(int64_t s, int64_t through = -1, uint64_t g = 1) const {
    net::step_open o;
    o.generation = g;
    o.step = s;
    o.replicas = size;
    o.rank = rank;
    o.through = through;
    return o;
  }
  void open(const net::step_open& o) { step->on_open(o, 7, rank); }
  void open(int64_t s, int64_t through = -1) { open(open_of(s, through)); }
  void result(int64_t s, bool commit, uint64_t g = 1) {
    net::step_result r;
    r.generation = g;
    r.step = s;
    r.commit = commit;
    step->on_result(r);
  }
  /// The mailbox: the window's queued steps, in order.
  void drain() {
    while (!window.empty()) {
      const net::step_open o = window.front();
      window.pop_front();
      step->on_next(o, 7, rank);
    }
  }
  template <class M>
  std::vector<M> all() const {
    std::vector<M> out;
    for (const auto& m : sent)
      if (const M* x = std::get_if<M>(&m)) out.push_back(*x);
    return out;
  }
  net::step_vote last_vote() const {
    const auto v = all<net::step_vote>();
    REQUIRE(!v.empty());
    return v.back();
  }
};

/// What the step did to the model and said to the coordinator over a run: equal whichever
/// side opened the steps.
struct outcome {
  std::vector<int64_t> applied, saves, evals;
  std::vector<std::vector<int64_t>> sums;
  std::vector<float> params;
  std::string params_sha256, checkpoint;
  int64_t next_step = 0, steps_computed = 0, eval_step = -1;
  bool has_eval = false;
  bool operator==(const outcome& o) const {
    return applied == o.applied && saves == o.saves && evals == o.evals && sums == o.sums &&
           params == o.params && params_sha256 == o.params_sha256 && checkpoint == o.checkpoint &&
           next_step == o.next_step && steps_computed == o.steps_computed &&
           has_eval == o.has_eval && eval_step == o.eval_step;
  }
};

outcome outcome_of(const rig& r) {
  outcome o;
  o.applied = r.seat.applied;
  o.saves = r.seat.saves;
  o.evals = r.seat.evals;
  o.sums = r.seat.sums;
  o.params = r.seat.params;
  const auto reps = r.all<net::train_report>();
  REQUIRE(reps.size() == 1);
  o.params_sha256 = reps[0].params_sha256;
  o.checkpoint = reps[0].checkpoint;
  o.next_step = reps[0].next_step;
  o.steps_computed = reps[0].steps_computed;
  o.has_eval = reps[0].has_eval;
  for (const auto& t : r.all<net::telemetry>())
    if (t.eval_step >= 0) o.eval_step = t.eval_step;
  return o;
}

}  // namespace

TEST_CASE("replica_step: the coordinator's commit applies the step, an abort drops it") {
  rig r(0, 2);
  r.comm.peer_value = 100;
  r.job();
  REQUIRE(r.all<net::worker_ready>().size() == 1);
  CHECK(r.all<net::worker_ready>()[0].next_step == 0);
  r.open(0);
  net::step_vote v = r.last_vote();
  CHECK(v.ok);
  CHECK(!v.applied);
  CHECK(v.member_id == 7);
  CHECK(v.loss_rows == 4.0);  // rank 0 of 2: micro-batches 0 and 1, 2 each
  CHECK(v.rows == 64);
  CHECK(r.seat.applied.empty());  // nothing applied before the decision
  // The DP sum went through the engine: own (0 + 1) * 1 plus the peers' 100.
  REQUIRE(r.seat.sums.size() == 1);
  CHECK(r.seat.sums[0] == std::vector<int64_t>(n_elements, 101));
  r.result(0, true);
  CHECK(r.seat.applied == std::vector<int64_t>{0});
  CHECK(r.step->next_step() == 1);

  r.open(1);
  CHECK(r.last_vote().ok);
  r.result(1, false);
  CHECK(r.seat.applied == std::vector<int64_t>{0});
  const auto ready = r.all<net::worker_ready>();
  REQUIRE(ready.size() == 2);
  CHECK(ready[1].next_step == 1);               // says where it stands after the abort
  CHECK(r.builds == std::vector<uint64_t>{1});  // the links of generation 1 were reused
}

TEST_CASE("replica_step: a spare loads the job ahead, silently, and is ready once seated") {
  rig r(0, 2);
  r.job(job_yaml(), "", 0);  // member 0: a spare waiting for a seat
  CHECK(r.seats_made == 1);
  CHECK(r.sent.empty());
  CHECK(r.fatals.empty());
  r.job();  // seated as member 7: the job again, built already
  CHECK(r.seats_made == 1);
  const auto ready = r.all<net::worker_ready>();
  REQUIRE(ready.size() == 1);
  CHECK(ready[0].member_id == 7);
  CHECK(ready[0].next_step == 0);
}

TEST_CASE("replica_step: a commit window applies each step before its vote and runs on") {
  rig r(0, 2);
  r.job();
  r.open(0, 2);
  CHECK(r.seat.applied == std::vector<int64_t>{0});
  CHECK(r.last_vote().applied);
  REQUIRE(r.window.size() == 1);
  CHECK(r.window.front().step == 1);
  r.drain();
  CHECK(r.seat.applied == std::vector<int64_t>{0, 1, 2});
  const auto votes = r.all<net::step_vote>();
  REQUIRE(votes.size() == 3);
  for (const auto& v : votes) CHECK(v.applied);
  CHECK(r.step->next_step() == 3);
  CHECK(r.window.empty());  // the window ended at its through

  SUBCASE("an abort between two steps of a window stops it") {
    r.open(3, 5);
    REQUIRE(r.window.size() == 1);
    r.result(3, false);  // arrives before the queued step 4
    r.drain();
    CHECK(r.seat.applied == std::vector<int64_t>{0, 1, 2, 3});
    CHECK(r.seat.begun.back() == 3);  // step 4 never ran
  }
}

TEST_CASE("replica_step: one commit path whichever side opens the step") {
  // Six steps on rank 0 of 2: opened one by one and committed by the coordinator, opened as
  // one commit window, and opened one by one with every step_result lost (each next open
  // commits the last step first; the last step's commit arrives).
  rig coordinator(0, 2), window(0, 2), lost(0, 2);
  for (rig* r : {&coordinator, &window, &lost}) {
    r->comm.peer_value = 5;
    r->job();
  }
  for (int64_t s = 0; s < 6; ++s) {
    coordinator.open(s);
    coordinator.result(s, true);
  }
  window.open(0, 5);
  window.drain();
  for (int64_t s = 0; s < 6; ++s) lost.open(s);
  lost.result(5, true);

  const outcome a = outcome_of(coordinator), b = outcome_of(window), c = outcome_of(lost);
  CHECK(a.applied == std::vector<int64_t>{0, 1, 2, 3, 4, 5});
  CHECK(a.next_step == 6);
  CHECK(a.steps_computed == 6);
  // Own (s + 1) plus the peer's 5, summed over s = 0..5.
  CHECK(a.params == std::vector<float>(n_elements, 51.0f));
  CHECK(a.params_sha256 == "51,51,51,51,");
  CHECK(a == b);
  CHECK(a == c);
}

TEST_CASE("replica_step: checkpoint and evaluation cadence") {
  // steps 6, checkpoint_every 2, eval_every 3: checkpoints before steps 2, 4 and 6 (the
  // last); an evaluation before step 3 (not at the end: the report carries that one, tagged
  // steps + 1); evaluations by replica 0 alone; checkpoints by rank 0, or every rank when
  // the seat writes a part on each.
  rig r0(0, 2), r1(1, 2), every(1, 2);
  every.seat.saves_every_rank = true;
  for (rig* r : {&r0, &r1, &every}) {
    r->job();
    r->open(0, 5);
    r->drain();
  }
  CHECK(r0.seat.saves == std::vector<int64_t>{2, 4, 6});
  CHECK(r0.seat.evals == std::vector<int64_t>{3, 7});
  CHECK(r1.seat.saves.empty());
  CHECK(r1.seat.evals.empty());
  CHECK(every.seat.saves == std::vector<int64_t>{2, 4, 6});
  CHECK(every.seat.evals.empty());
  const auto rep0 = r0.all<net::train_report>(), rep1 = r1.all<net::train_report>();
  REQUIRE(rep0.size() == 1);
  REQUIRE(rep1.size() == 1);
  CHECK(rep0[0].has_eval);
  CHECK(rep0[0].eval_count == 10);
  CHECK(!rep1[0].has_eval);
}

TEST_CASE("replica_step: an evaluation is told to the coordinator after the next vote") {
  rig r(0, 1);
  r.job();
  for (int64_t s = 0; s < 3; ++s) {
    r.open(s);
    r.result(s, true);
  }
  CHECK(r.seat.evals == std::vector<int64_t>{3});
  CHECK(r.all<net::telemetry>().empty());  // nothing yet: the evaluation waits for a vote
  r.open(3);
  const auto t = r.all<net::telemetry>();
  REQUIRE(t.size() == 1);
  CHECK(t[0].eval_step == 3);
  CHECK(t[0].eval_loss == 0.5);
  CHECK(t[0].eval_accuracy == 0.75);
  CHECK(std::holds_alternative<net::step_vote>(r.sent[r.sent.size() - 2]));
}

TEST_CASE("replica_step: a joiner takes the donor's parameters, counters and step") {
  rig r(1, 2);
  r.job();
  r.comm.donor.push_back(bytes_of(std::vector<float>{1, 2, 3, 4}));
  r.comm.donor.push_back(bytes_of(std::vector<int64_t>{9, 3}));  // optimizer steps, step
  net::step_open o = r.open_of(3);
  o.donor_rank = 0;
  r.open(o);
  const net::step_vote v = r.last_vote();
  CHECK(v.ok);
  CHECK(v.timing.state_bytes == 4 * sizeof(float) + 2 * sizeof(int64_t));
  CHECK(v.timing.state_us > 0);
  CHECK(r.seat.optimizer_steps == 9);
  CHECK(r.comm.donor.empty());
  r.result(3, true);
  // Rank 1 contributes (3 + 1) * 2 = 8 over the donor's parameters.
  CHECK(r.seat.params == std::vector<float>{9, 10, 11, 12});
  CHECK(r.step->next_step() == 4);
}

TEST_CASE("replica_step: the donor sends its state, one that lacks the step is refused") {
  rig donor(0, 2);
  donor.job();
  donor.open(0);
  donor.result(0, true);
  net::step_open o = donor.open_of(1);
  o.donor_rank = 0;
  donor.open(o);
  CHECK(donor.last_vote().ok);
  CHECK(donor.last_vote().timing.state_bytes == 0);  // the joiner's figure is reported
  REQUIRE(donor.comm.sent.size() == 2);
  CHECK(donor.comm.sent[0] == bytes_of(std::vector<float>(n_elements, 1.0f)));
  CHECK(donor.comm.sent[1] == bytes_of(std::vector<int64_t>{1, 1}));

  rig stale(0, 2);
  stale.job();
  net::step_open s = stale.open_of(3);
  s.donor_rank = 0;
  stale.open(s);
  CHECK(!stale.last_vote().ok);
  CHECK(stale.last_vote().reason.find("named the donor of step 3, but this worker holds the "
                                      "state of step 0") != std::string::npos);
  CHECK(stale.comm.sent.empty());
}

TEST_CASE("replica_step: a rollback loads the named checkpoint before the step") {
  rig r(0, 1);
  r.job();
  r.seat.load_returns = 2;
  net::step_open o = r.open_of(2);
  o.restore = 2;
  r.open(o);
  CHECK(r.last_vote().ok);
  CHECK(r.seat.loaded == std::vector<std::string>{checkpoint_path("/nonexistent/ckpt", 2)});
  CHECK(r.seat.begun == std::vector<int64_t>{2});

  SUBCASE("a checkpoint that cannot be loaded fails the vote with its folder") {
    r.seat.load_throws = true;
    o.step = 3;
    o.restore = 3;
    r.result(2, true);
    r.open(o);
    CHECK(!r.last_vote().ok);
    CHECK(r.last_vote().reason.find("cannot roll back to " +
                                    checkpoint_path("/nonexistent/ckpt", 3) +
                                    ": no such checkpoint") != std::string::npos);
  }
}

TEST_CASE("replica_step: repeats get the same answers, refusals are votes and not crashes") {
  rig r(0, 1);
  r.job(job_yaml(2));
  r.open(0);
  r.open(0);  // the vote was lost: sent again, the step not run again
  CHECK(r.seat.begun == std::vector<int64_t>{0});
  REQUIRE(r.all<net::step_vote>().size() == 2);
  r.result(0, true);
  r.open(1);
  r.result(1, true);
  REQUIRE(r.all<net::train_report>().size() == 1);
  r.result(1, true);  // the report was lost
  const auto reps = r.all<net::train_report>();
  REQUIRE(reps.size() == 2);
  CHECK(reps[1].params_sha256 == reps[0].params_sha256);
  CHECK(r.seat.applied == std::vector<int64_t>{0, 1});

  SUBCASE("a step this worker does not hold") {
    r.open(5);
    CHECK(!r.last_vote().ok);
    CHECK(r.last_vote().reason.find("holds the state of step 2, not 5") != std::string::npos);
  }
  SUBCASE("a loss that is not finite is fatal") {
    rig n(0, 1);
    n.job();
    n.seat.nan_loss = true;
    n.open(0);
    CHECK(!n.last_vote().ok);
    CHECK(n.last_vote().fatal);
    CHECK(n.last_vote().reason.find("loss is not finite") != std::string::npos);
  }
  SUBCASE("a group that refuses to form (usage_error) is fatal, a missing peer is not") {
    rig n(0, 1);
    n.job();
    n.links_fault = [] {
      throw usage_error("group 'dp' mixes devices: on cpu: member 7 (rank 0, cpu); ...");
    };
    n.open(0);
    CHECK(!n.last_vote().ok);
    CHECK(n.last_vote().fatal);
    CHECK(n.last_vote().reason.find("group 'dp' mixes devices") == 0);
    CHECK(n.seat.begun.empty());
    rig p(0, 1);
    p.job();
    p.links_fault = [] {
      throw comm::comm_error(comm::comm_failure::timeout, "rendezvous", "rank 1 never came");
    };
    p.open(0);
    CHECK(!p.last_vote().ok);
    CHECK_FALSE(p.last_vote().fatal);  // the next generation may well form
  }
  SUBCASE("a job that cannot be built") {
    rig bad(0, 1);
    bad.job("model: [");
    REQUIRE(bad.fatals.size() == 1);
    CHECK(bad.fatals[0].find("cannot build the job") == 0);
    bad.open(0);
    CHECK(bad.last_vote().reason.find("no job loaded yet") != std::string::npos);
  }
}
