// train::forwarding_seat (runtime/train/seat_forwarding.hpp): a wrapper that overrides nothing
// is the seat it holds. Every method of train::seat is called once through it, against a seat
// that records each call with its arguments and answers with values of its own.
#include <doctest/doctest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/train/checkpoint_writer.hpp"
#include "runtime/train/seat_forwarding.hpp"

using namespace cohort;

namespace {

struct recording_seat final : train::seat {
  mutable std::vector<std::string> log;
  train::stage_links links;
  float buf[3] = {};
  float state[5] = {};

  std::pair<int, int> position() const override {
    log.push_back("position");
    return {2, 1};
  }
  int micro_batches() const override {
    log.push_back("micro_batches");
    return 7;
  }
  comm::grad_type reduction_type() const override {
    log.push_back("reduction_type");
    return comm::grad_type::i64;
  }
  std::size_t elements() override {
    log.push_back("elements");
    return 3;
  }
  void set_links(train::stage_links l) override {
    log.push_back("set_links");
    links = std::move(l);
  }
  void begin_step() override { log.push_back("begin_step"); }
  double compute_gradients(int64_t step, const std::vector<int>& micro,
                           const nn::grads_ready_fn& ready) override {
    log.push_back("compute_gradients " + std::to_string(step) + " " + std::to_string(micro.size()));
    ready(1, 2);
    return 4.5;
  }
  void* reduction_buffer() override {
    log.push_back("reduction_buffer");
    return buf;
  }
  comm::wire_plan wire(int replicas, int rank) override {
    log.push_back("wire " + std::to_string(replicas) + " " + std::to_string(rank));
    comm::wire_plan p;
    p.plain = comm::plain_sum::rank_order;
    return p;
  }
  void finish_gradients(int64_t step) override {
    log.push_back("finish_gradients " + std::to_string(step));
  }
  void apply_step(int64_t step) override { log.push_back("apply_step " + std::to_string(step)); }
  bool speaks_for_loss() const override {
    log.push_back("speaks_for_loss");
    return false;
  }
  std::vector<std::pair<float*, std::size_t>> state_buffers() override {
    log.push_back("state_buffers");
    return {{state, 5}};
  }
  int64_t optimizer_steps() const override {
    log.push_back("optimizer_steps");
    return 11;
  }
  void set_optimizer_steps(int64_t s) override {
    log.push_back("set_optimizer_steps " + std::to_string(s));
  }
  int64_t load_checkpoint(const std::string& d) override {
    log.push_back("load_checkpoint " + d);
    return 13;
  }
  void save(train::checkpoint_writer&, int64_t next_step, uint64_t job_id) override {
    log.push_back("save " + std::to_string(next_step) + " " + std::to_string(job_id));
  }
  bool saves_every_rank() const override {
    log.push_back("saves_every_rank");
    return true;
  }
  train::evaluation evaluate(int64_t tag) override {
    log.push_back("evaluate " + std::to_string(tag));
    return {0.25, 0.5, 17};
  }
  train::seat_report report() override {
    log.push_back("report");
    train::seat_report r;
    r.params_sha256 = "abc";
    r.stage = 2;
    return r;
  }
  int64_t peak_pool_bytes() const override {
    log.push_back("peak_pool_bytes");
    return 19;
  }
};

/// A wrapper that changes nothing.
struct plain_wrapper final : train::forwarding_seat {
  using forwarding_seat::forwarding_seat;
};

}  // namespace

TEST_CASE("a forwarding seat that overrides nothing hands every call to the seat it holds") {
  auto owned = std::make_unique<recording_seat>();
  recording_seat& in = *owned;
  plain_wrapper w(std::move(owned));
  train::seat& s = w;
  CHECK(&w.inner() == &in);

  CHECK(s.position() == std::pair<int, int>{2, 1});
  CHECK(s.micro_batches() == 7);
  CHECK(s.reduction_type() == comm::grad_type::i64);
  CHECK(s.elements() == 3);
  bool linked = false;
  train::stage_links l;
  l.after_compute = [&](std::chrono::steady_clock::duration) { linked = true; };
  s.set_links(std::move(l));
  REQUIRE(in.links.after_compute);
  in.links.after_compute({});
  CHECK(linked);  // the links themselves, not a copy without their hooks
  s.begin_step();
  std::vector<std::pair<std::size_t, std::size_t>> ready;
  CHECK(s.compute_gradients(
            3, {0, 1}, [&](std::size_t o, std::size_t n) { ready.emplace_back(o, n); }) == 4.5);
  CHECK(ready == std::vector<std::pair<std::size_t, std::size_t>>{{1, 2}});
  CHECK(s.reduction_buffer() == in.buf);
  CHECK(s.wire(4, 2).plain == comm::plain_sum::rank_order);
  s.finish_gradients(3);
  s.apply_step(3);
  CHECK_FALSE(s.speaks_for_loss());
  const auto sb = s.state_buffers();
  REQUIRE(sb.size() == 1);
  CHECK(sb[0] == std::pair<float*, std::size_t>{in.state, 5});
  CHECK(s.optimizer_steps() == 11);
  s.set_optimizer_steps(12);
  CHECK(s.load_checkpoint("/x/step_1") == 13);
  {
    char dir[] = "/tmp/seat_fwd_XXXXXX";
    REQUIRE(::mkdtemp(dir) != nullptr);
    train::checkpoint_writer cw(dir, 1);
    s.save(cw, 14, 15);
  }
  CHECK(s.saves_every_rank());
  const train::evaluation e = s.evaluate(16);
  CHECK(e.count == 17);
  CHECK(e.loss == 0.25);
  const train::seat_report r = s.report();
  CHECK(r.params_sha256 == "abc");
  CHECK(r.stage == 2);
  CHECK(s.peak_pool_bytes() == 19);

  // Each of train::seat's methods reached the inner seat once, with its arguments.
  CHECK(in.log == std::vector<std::string>{"position",
                                           "micro_batches",
                                           "reduction_type",
                                           "elements",
                                           "set_links",
                                           "begin_step",
                                           "compute_gradients 3 2",
                                           "reduction_buffer",
                                           "wire 4 2",
                                           "finish_gradients 3",
                                           "apply_step 3",
                                           "speaks_for_loss",
                                           "state_buffers",
                                           "optimizer_steps",
                                           "set_optimizer_steps 12",
                                           "load_checkpoint /x/step_1",
                                           "save 14 15",
                                           "saves_every_rank",
                                           "evaluate 16",
                                           "report",
                                           "peak_pool_bytes"});
}
