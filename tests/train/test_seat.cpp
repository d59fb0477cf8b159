// The seat interface (runtime/train/seat.hpp): a pipeline stage hands its gradients to the
// data plane range by range during its last backward, exactly once and only when final, with
// the same bits as without reports; the whole model's seat does the same through trainer.
// The two stages of a pipeline run on two threads in this process, linked by in-memory
// mailboxes.
#include <doctest/doctest.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "runtime/core/config.hpp"
#include "runtime/train/seat.hpp"
#include "tests/train/mailboxes.hpp"

using namespace cohort;

namespace {

config gpt_config(const std::string& schedule, const std::string& determinism) {
  const std::string y =
      "model: {kind: gpt, n_layer: 2, n_head: 2, d_model: 16, context: 16}\n"
      "data: {dataset: kjv}\n"
      "parallel: {pp: 2, schedule: " +
      schedule +
      "}\n"
      "cluster: {workers: 2}\n"
      "train: {steps: 4, global_batch: 8, micro_batch: 2, optimizer: adamw, lr: 0.001, "
      "seed: 3, eval_every: 0, determinism: " +
      determinism + "}\n";
  return load_config_text(y, "test.yaml");
}

using test::mailboxes;

train::stage_links links_for(mailboxes& m, int stage) {
  train::stage_links l;
  l.send = [&m, stage](int peer, uint64_t tag, const void* d, std::size_t n) {
    m.send(stage, peer, tag, d, n);
  };
  l.recv = [&m, stage](int peer, uint64_t tag, void* d, std::size_t n) {
    m.recv(peer, stage, tag, d, n);
  };
  return l;
}

/// One report: the range and the bytes of the reduction buffer it held at that moment.
struct report {
  std::size_t offset, count;
  std::vector<char> bytes;
};

/// What one stage's step left: its reduction buffer, and the reports (when asked for).
struct stage_result {
  std::vector<char> buffer;
  std::vector<report> reports;
};

/// Step 0 of a fresh two-stage pipeline over every micro-batch; with REPORTS each stage
/// records its ready ranges.
std::vector<stage_result> run_pipeline(const config& c, bool reports) {
  std::vector<std::unique_ptr<train::seat>> seats;
  for (int s = 0; s < 2; ++s) seats.push_back(train::make_stage_seat(c, s, 0));
  mailboxes m;
  std::vector<stage_result> out(2);
  std::vector<std::thread> threads;
  for (int s = 0; s < 2; ++s) {
    threads.emplace_back([&, s] {
      train::seat& seat = *seats[static_cast<std::size_t>(s)];
      seat.set_links(links_for(m, s));
      seat.begin_step();
      const std::size_t esize = seat.reduction_type() == comm::grad_type::i64 ? sizeof(int64_t) : sizeof(float);
      const char* buf = static_cast<const char*>(seat.reduction_buffer());
      nn::grads_ready_fn ready;
      stage_result& r = out[static_cast<std::size_t>(s)];
      if (reports)
        ready = [&](std::size_t off, std::size_t n) {
          r.reports.push_back(
              {off, n, std::vector<char>(buf + off * esize, buf + (off + n) * esize)});
        };
      std::vector<int> micro(static_cast<std::size_t>(seat.micro_batches()));
      for (std::size_t i = 0; i < micro.size(); ++i) micro[i] = static_cast<int>(i);
      seat.compute_gradients(0, micro, ready);
      r.buffer.assign(buf, buf + seat.elements() * esize);
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

}  // namespace

TEST_CASE("a pipeline stage reports each gradient once, final, during its last backward") {
  for (const char* schedule : {"1f1b", "gpipe"}) {
    for (const char* det : {"bitwise", "fast"}) {
      CAPTURE(schedule);
      CAPTURE(det);
      const config c = gpt_config(schedule, det);
      const std::vector<stage_result> plain = run_pipeline(c, false);
      const std::vector<stage_result> hooked = run_pipeline(c, true);
      for (int s = 0; s < 2; ++s) {
        CAPTURE(s);
        const stage_result& p = plain[static_cast<std::size_t>(s)];
        const stage_result& h = hooked[static_cast<std::size_t>(s)];
        // Reporting changes no bit of the step's gradients.
        CHECK(h.buffer == p.buffer);
        REQUIRE(!h.reports.empty());
        const std::size_t esize = std::string(det) == "bitwise" ? 8 : 4;
        const std::size_t elements = h.buffer.size() / esize;
        // Descending and contiguous from the end: each range ends where the previous began,
        // so together they tile the buffer exactly once.
        std::size_t end = elements;
        for (const report& r : h.reports) {
          CHECK(r.count > 0);
          CHECK(r.offset + r.count == end);
          end = r.offset;
          // Final when reported: the bytes then are the bytes at the end of the step.
          CHECK(std::memcmp(r.bytes.data(), h.buffer.data() + r.offset * esize,
                            r.count * esize) == 0);
        }
        CHECK(end == 0);
        // More than one range: the data plane can start before the stage's backward ends.
        CHECK(h.reports.size() > 1);
      }
    }
  }
}

TEST_CASE("a replica with no micro-batches reports its zero gradients at once") {
  const config c = gpt_config("1f1b", "bitwise");
  std::unique_ptr<train::seat> seat = train::make_stage_seat(c, 1, 0);
  seat->begin_step();
  std::size_t covered = 0;
  seat->compute_gradients(0, {}, [&](std::size_t, std::size_t n) { covered += n; });
  CHECK(covered == seat->elements());
  const auto* b = static_cast<const int64_t*>(seat->reduction_buffer());
  CHECK(std::all_of(b, b + seat->elements(), [](int64_t x) { return x == 0; }));
}

TEST_CASE("seats say where they sit and who speaks for the loss") {
  const config c = gpt_config("1f1b", "bitwise");
  auto s0 = train::make_stage_seat(c, 0, 0);
  auto s1 = train::make_stage_seat(c, 1, 0);
  CHECK(s0->position() == std::make_pair(0, 0));
  CHECK(s1->position() == std::make_pair(1, 0));
  CHECK(!s0->speaks_for_loss());
  CHECK(s1->speaks_for_loss());
  // The two stages' parameters are the whole model's.
  config whole = c;
  whole.parallel.pp = 1;
  whole.cluster.workers = 1;
  auto w = train::make_whole_seat(whole);
  CHECK(w->position() == std::make_pair(0, 0));
  CHECK(w->speaks_for_loss());
  CHECK(s0->elements() + s1->elements() == w->elements());
  CHECK(s0->report().model_params == static_cast<int64_t>(w->elements()));
  CHECK(s0->report().staged);
  CHECK(!w->report().staged);
}
