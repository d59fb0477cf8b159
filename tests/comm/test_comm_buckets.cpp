// The gradient bucket engine over real Gloo groups (ranks as threads): bucket planning in
// reverse order, exact sums with several buckets whatever the chunking of mark_ready,
// strict bucket order, the interval arithmetic of the overlap (closed forms) and the
// collectives' timestamps on a synthetic backward, failures.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <future>
#include <limits>
#include <mutex>
#include <random>

#include "runtime/comm/buckets.hpp"
#include "tests/comm/comm_test_util.hpp"
#include "tests/eventually.hpp"

using namespace cohort::comm;
using namespace cohort::comm::test;
using std::chrono::milliseconds;

namespace {

constexpr double kSlackSeconds = 15.0;
const double kMiB = double(1 << 20);

// Forwards to a real communicator and records what reached it: the ranges reduced (as
// offsets from `base`), whether any element was still unfinished (NaN) when its bucket
// went out, and an optional delay that stands for a slow network. `on_call` (optional) runs
// on the communication thread as a float allreduce starts, after it was recorded: tests
// hold a collective there, or learn that one is in flight.
class recording_comm : public communicator {
 public:
  recording_comm(communicator& inner, const float* base, milliseconds delay = milliseconds(0))
      : inner_(inner), base_(base), delay_(delay) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  const char* backend() const override { return "recording"; }
  void allreduce_sum(float* data, std::size_t n) override {
    {
      std::lock_guard<std::mutex> lock(m_);
      calls.push_back({std::size_t(data - base_), n});
      for (std::size_t i = 0; i < n; ++i)
        if (std::isnan(data[i])) unfinished_seen = true;
    }
    if (on_call) on_call(std::size_t(data - base_));
    std::this_thread::sleep_for(delay_);
    inner_.allreduce_sum(data, n);
  }
  void allreduce_sum(std::int64_t* data, std::size_t n) override { inner_.allreduce_sum(data, n); }
  void allgather(const void* s, void* r, std::size_t b) override { inner_.allgather(s, r, b); }
  void alltoall(const void* s, void* r, std::size_t b) override { inner_.alltoall(s, r, b); }
  void broadcast(void* d, std::size_t b, int root) override { inner_.broadcast(d, b, root); }
  void barrier() override { inner_.barrier(); }
  void abort() override { inner_.abort(); }
  bool dead() const override { return inner_.dead(); }
  comm_traffic traffic() const override { return inner_.traffic(); }

  std::vector<bucket_range> calls;
  bool unfinished_seen = false;
  std::function<void(std::size_t offset)> on_call;
  /// Calls so far (from any thread).
  std::size_t call_count() {
    std::lock_guard<std::mutex> lock(m_);
    return calls.size();
  }

 private:
  communicator& inner_;
  const float* base_;
  milliseconds delay_;
  std::mutex m_;
};

// Splits [0, n) into random chunks and returns them in a random order (seeded per rank).
std::vector<bucket_range> random_chunks(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<bucket_range> chunks;
  for (std::size_t at = 0; at < n;) {
    const std::size_t len = std::min<std::size_t>(n - at, 1 + rng() % 5000);
    chunks.push_back({at, len});
    at += len;
  }
  std::shuffle(chunks.begin(), chunks.end(), rng);
  return chunks;
}

// Arms an engine's before_wait seam: wait_done(k) returns once a lane, having run k
// collectives this step, looked at what is ready and went to wait, so the test knows every
// decision the engine could take from the ranges marked so far was taken.
class engine_idle {
 public:
  explicit engine_idle(bucket_engine& e) {
    e.set_before_wait([this](std::size_t done) {
      done_.store(done);
      ++waits_;
    });
  }
  bool wait_done(std::size_t k) {
    return cohort::test::eventually(milliseconds(30000), [&] { return done_.load() >= k; });
  }
  int waits() const { return waits_.load(); }

 private:
  std::atomic<std::size_t> done_{0};
  std::atomic<int> waits_{0};
};

}  // namespace

TEST_CASE("plan_buckets splits from the end of the buffer") {
  // 12 bytes per bucket = 3 floats: [7,10) [4,7) [1,4) [0,1).
  auto b = plan_buckets(10, sizeof(float), 12 / kMiB);
  REQUIRE(b.size() == 4);
  CHECK((b[0].offset == 7 && b[0].count == 3));
  CHECK((b[1].offset == 4 && b[1].count == 3));
  CHECK((b[2].offset == 1 && b[2].count == 3));
  CHECK((b[3].offset == 0 && b[3].count == 1));
  // The default 2 MiB: 524288 floats or 262144 int64 per bucket.
  auto f = plan_buckets(1200000, sizeof(float), 2.0);
  REQUIRE(f.size() == 3);
  CHECK((f[0].offset == 1200000 - 524288 && f[0].count == 524288));
  CHECK((f[2].offset == 0 && f[2].count == 1200000 - 2 * 524288));
  CHECK(plan_buckets(262144, sizeof(std::int64_t), 2.0).size() == 1);
  CHECK(plan_buckets(262145, sizeof(std::int64_t), 2.0).size() == 2);
  CHECK(plan_buckets(0, sizeof(float), 2.0).empty());
  CHECK(plan_buckets(5, sizeof(float), 1e-9).size() == 5);  // at least one element each
  CHECK_THROWS_AS(plan_buckets(5, sizeof(float), 0.0), cohort::usage_error);
  CHECK_THROWS_AS(plan_buckets(5, sizeof(float), -1.0), cohort::usage_error);
}

TEST_CASE("float buckets sum exactly whatever each rank's chunking for world sizes 1..4") {
  memory_kv kv;
  const std::size_t count = 300000;  // 1.2 MB of floats in 256 KiB buckets: 5 buckets
  for (int n = 1; n <= 4; ++n) {
    CAPTURE(n);
    auto comms = make_gloo_group(kv, n, n, milliseconds(10000));
    // Mean over ranks on the communication thread where 1/n is exact (n a power of two).
    const float scale = (n & (n - 1)) == 0 ? 1.0f / float(n) : 1.0f;
    std::vector<std::vector<float>> grads(n, std::vector<float>(count));
    std::vector<bucket_timing> timing(n);
    REQUIRE_NOTHROW(rethrow_first(run_ranks(n, [&](int r) {
      bucket_engine engine(*comms[r], count, grad_type::f32, 0.25, scale);
      for (int step = 0; step < 2; ++step) {  // the engine is reused across steps
        engine.begin(grads[r].data());
        for (const auto& c : random_chunks(count, 1000 * step + r)) {
          for (std::size_t i = c.offset; i < c.offset + c.count; ++i)
            grads[r][i] = float(r) + float(i % 3) + float(step);
          engine.mark_ready(c.offset, c.count);
        }
        timing[r] = engine.wait_all();
      }
    })));
    const float sum_r = float(n * (n - 1) / 2);
    for (int r = 0; r < n; ++r) {
      CHECK(timing[r].buckets == 5);
      CHECK(timing[r].bytes == count * sizeof(float));
      std::size_t bad = 0;
      for (std::size_t i = 0; i < count; ++i)
        if (grads[r][i] != (sum_r + float(n) * float(i % 3 + 1)) * scale) ++bad;
      CHECK_MESSAGE(bad == 0, "rank " << r << ": " << bad << " wrong sums");
    }
  }
}

TEST_CASE("int64 buckets sum exactly") {
  memory_kv kv;
  const int n = 3;
  const std::size_t count = 100001;
  auto comms = make_gloo_group(kv, n, 1, milliseconds(10000));
  std::vector<std::vector<std::int64_t>> grads(n, std::vector<std::int64_t>(count));
  const std::int64_t big = std::int64_t(1) << 50;
  std::vector<std::size_t> bucket_counts(n);
  REQUIRE_NOTHROW(rethrow_first(run_ranks(n, [&](int r) {
    bucket_engine engine(*comms[r], count, grad_type::i64, 0.1);
    engine.begin(grads[r].data());
    for (const auto& c : random_chunks(count, 77 + r)) {
      for (std::size_t i = c.offset; i < c.offset + c.count; ++i)
        grads[r][i] = big * r - std::int64_t(i);
      engine.mark_ready(c.offset, c.count);
    }
    engine.wait_all();
    bucket_counts[r] = engine.buckets().size();
  })));
  for (int r = 0; r < n; ++r) {
    std::size_t bad = 0;
    for (std::size_t i = 0; i < count; ++i)
      if (grads[r][i] != big * 3 - 3 * std::int64_t(i)) ++bad;
    CHECK(bad == 0);
    CHECK(bucket_counts[r] == 8);  // 0.1 MiB = 13107 int64 per bucket
  }
}

TEST_CASE("buckets go out in reverse order and each only once its whole range is final") {
  memory_kv kv;
  auto comms = make_gloo_group(kv, 1, 1, milliseconds(10000));
  const std::size_t count = 1000;
  std::vector<float> grads(count, std::numeric_limits<float>::quiet_NaN());
  recording_comm rec(*comms[0], grads.data());
  // Bucket 0's collective is held until the test lets it go.
  std::promise<void> entered, release;
  std::shared_future<void> released = release.get_future().share();
  rec.on_call = [&, released](std::size_t offset) {
    if (offset != 700) return;
    entered.set_value();
    released.wait();
  };
  bucket_engine engine(rec, count, grad_type::f32, 300 * sizeof(float) / kMiB);
  engine_idle idle(engine);
  // Buckets: [700,1000) [400,700) [100,400) [0,100).
  engine.begin(grads.data());
  auto finish = [&](std::size_t off, std::size_t n) {
    for (std::size_t i = off; i < off + n; ++i) grads[i] = 1.0f;
    engine.mark_ready(off, n);
  };
  finish(700, 300);  // bucket 0 complete: it goes out
  entered.get_future().wait();
  // While bucket 0 is in flight, buckets 2 and 3 complete (one range across their edge) and
  // bucket 1 all but 400..450.
  finish(450, 250);
  finish(0, 400);
  release.set_value();
  // Bucket 0 done, the lane looked again: buckets 2 and 3 are ready, 1 is not, so nothing
  // more may have gone out.
  REQUIRE(idle.wait_done(1));
  CHECK(rec.call_count() == 1);
  finish(400, 50);
  engine.wait_all();
  REQUIRE(rec.calls.size() == 4);
  CHECK((rec.calls[0].offset == 700 && rec.calls[0].count == 300));
  CHECK((rec.calls[1].offset == 400 && rec.calls[1].count == 300));
  CHECK((rec.calls[2].offset == 100 && rec.calls[2].count == 300));
  CHECK((rec.calls[3].offset == 0 && rec.calls[3].count == 100));
  CHECK_FALSE(rec.unfinished_seen);
}

TEST_CASE("overlap_seconds: the wall time two sets of intervals share, in closed form") {
  using clk = std::chrono::steady_clock;
  auto iv = [](double a_ms, double b_ms) {
    auto at = [](double ms) {
      return clk::time_point(
          std::chrono::duration_cast<clk::duration>(std::chrono::duration<double, std::milli>(ms)));
    };
    return time_interval{at(a_ms), at(b_ms)};
  };
  const double ms = 1e-3;
  // Two collectives [0,2] and [3,5] against a backward [1,4]: [1,2] and [3,4].
  CHECK(overlap_seconds({iv(0, 2), iv(3, 5)}, {iv(1, 4)}) == doctest::Approx(2 * ms));
  // Order does not matter, and the function is symmetric.
  CHECK(overlap_seconds({iv(3, 5), iv(0, 2)}, {iv(1, 4)}) == doctest::Approx(2 * ms));
  CHECK(overlap_seconds({iv(1, 4)}, {iv(0, 2), iv(3, 5)}) == doctest::Approx(2 * ms));
  // Entirely inside, entirely after, touching at one instant.
  CHECK(overlap_seconds({iv(2, 3)}, {iv(0, 10)}) == doctest::Approx(1 * ms));
  CHECK(overlap_seconds({iv(11, 12)}, {iv(0, 10)}) == 0.0);
  CHECK(overlap_seconds({iv(10, 12)}, {iv(0, 10)}) == 0.0);
  // Overlapping intervals within one set count once: [0,3] u [2,6] = [0,6]; with [1,7]: 5.
  CHECK(overlap_seconds({iv(0, 3), iv(2, 6)}, {iv(1, 7)}) == doctest::Approx(5 * ms));
  CHECK(covered_seconds({iv(0, 3), iv(2, 6), iv(8, 9)}) == doctest::Approx(7 * ms));
  // Several backward windows (micro-batches) against several collectives.
  CHECK(overlap_seconds({iv(0, 10)}, {iv(1, 2), iv(4, 6), iv(9, 12)}) == doctest::Approx(4 * ms));
  // Empty and reversed intervals are nothing.
  CHECK(overlap_seconds({iv(5, 5), iv(7, 6)}, {iv(0, 10)}) == 0.0);
  CHECK(overlap_seconds({}, {iv(0, 10)}) == 0.0);
  CHECK(covered_seconds({}) == 0.0);
}

TEST_CASE("collective timestamps: hidden behind a slow backward, none when backward is done") {
  using clk = std::chrono::steady_clock;
  memory_kv kv;
  auto comms = make_gloo_group(kv, 1, 1, milliseconds(10000));
  const std::size_t count = 4000;  // 4 buckets of 1000 floats
  const milliseconds net(40);      // every bucket's allreduce takes at least this long
  std::vector<float> grads(count, 1.0f);
  recording_comm slow(*comms[0], grads.data(), net);
  bucket_engine engine(slow, count, grad_type::f32, 1000 * sizeof(float) / kMiB);

  auto check_identities = [&](const bucket_timing& t, double wall_wait_s) {
    REQUIRE(t.bucket_s.size() == 4);
    REQUIRE(t.collectives.size() == 4);
    double sum = 0;
    for (std::size_t k = 0; k < 4; ++k) {
      CHECK(t.bucket_s[k] >= 0.040);  // the delay is a lower bound on each bucket's time
      CHECK(t.bucket_s[k] == t.collectives[k].seconds());
      // Strict bucket order on one thread: each starts after the previous one ended.
      if (k > 0) CHECK(t.collectives[k].begin >= t.collectives[k - 1].end);
      sum += t.bucket_s[k];
    }
    CHECK(t.allreduce_s == doctest::Approx(sum));
    CHECK(t.wait_s >= 0.0);
    CHECK(t.wait_s <= wall_wait_s);
  };

  // Backward already finished: everything is marked after it, nothing can hide.
  engine.begin(grads.data());
  const auto bw0 = clk::now();
  std::this_thread::sleep_for(milliseconds(50));
  const auto bw1 = clk::now();
  engine.mark_ready(0, count);
  auto t0 = clk::now();
  const bucket_timing exposed = engine.wait_all();
  check_identities(exposed, seconds_since(t0));
  CHECK(exposed.collectives.front().begin >= bw1);
  CHECK(overlap_seconds(exposed.collectives, {{bw0, bw1}}) == 0.0);

  // A backward that hands over buckets 0-2 one at a time, last layers first, each only
  // after the previous one's collective ended and the lane looked for the next (the seam, not
  // a sleep, so the order holds however loaded the machine is); bucket 3 after backward.
  engine_idle idle(engine);
  engine.begin(grads.data());
  const auto start = clk::now();
  for (int k = 0; k < 3; ++k) {
    engine.mark_ready(count - 1000 * (k + 1), 1000);
    REQUIRE(idle.wait_done(k + 1));
  }
  const auto last_mark = clk::now();
  engine.mark_ready(0, 1000);
  t0 = clk::now();
  const bucket_timing hidden = engine.wait_all();
  check_identities(hidden, seconds_since(t0));
  // Buckets 0-2 ran inside backward, bucket 3 after it. Closed form: overlap =
  // (b0 + b1 + b2) / (b0 + .. + b3).
  const double overlap =
      overlap_seconds(hidden.collectives, {{start, last_mark}}) / hidden.allreduce_s;
  const auto& b = hidden.bucket_s;
  CHECK(overlap == doctest::Approx((b[0] + b[1] + b[2]) / hidden.allreduce_s).epsilon(1e-9));
  CHECK(hidden.collectives[2].end <= last_mark);
  CHECK(hidden.collectives.back().begin >= last_mark);
}

TEST_CASE("a failed bucket surfaces from wait_all as comm_error and kills the engine") {
  memory_kv kv;
  auto comms = make_gloo_group(kv, 2, 1, milliseconds(300));
  const std::size_t count = 5000;
  std::vector<float> grads(count, 1.0f);
  bucket_engine engine(*comms[0], count, grad_type::f32, 1000 * sizeof(float) / kMiB);
  engine.begin(grads.data());
  engine.mark_ready(0, count);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    engine.wait_all();  // rank 1 never reduces anything
    FAIL("wait_all succeeded without rank 1");
  } catch (const comm_error& e) {
    CHECK((e.kind() == comm_failure::timeout || e.kind() == comm_failure::peer_lost));
  }
  CHECK(seconds_since(t0) < kSlackSeconds);
  try {
    engine.begin(grads.data());
    FAIL("a failed engine started a step");
  } catch (const comm_error& e) {
    CHECK(e.kind() == comm_failure::invalid);
  }
}

TEST_CASE("abort() ends a step blocked on a silent peer at once") {
  memory_kv kv;
  auto comms = make_gloo_group(kv, 2, 1, milliseconds(60000));
  const std::size_t count = 5000;
  std::vector<float> grads(count, 1.0f);
  // The wrapper says when the collective is in flight (rank 1 never joins it).
  recording_comm rec(*comms[0], grads.data());
  std::promise<void> in_flight;
  rec.on_call = [&](std::size_t) { in_flight.set_value(); };
  bucket_engine engine(rec, count, grad_type::f32, 2.0);
  engine.begin(grads.data());
  engine.mark_ready(0, count);
  std::thread aborter([&] {
    in_flight.get_future().wait();
    engine.abort();
  });
  const auto t0 = std::chrono::steady_clock::now();
  comm_failure kind = comm_failure::invalid;
  try {
    engine.wait_all();
  } catch (const comm_error& e) {
    kind = e.kind();
  }
  aborter.join();
  CHECK(kind == comm_failure::aborted);
  CHECK(seconds_since(t0) < kSlackSeconds);  // the timeout is 60 s
  CHECK(rec.call_count() == 1);              // aborted inside the collective
}

TEST_CASE("lanes: bucket k goes to lane k % L in order on each lane, and the sums are exact") {
  // Two ranks, three lanes each (three Gloo groups); 7 buckets of 1000 floats.
  memory_kv kv;
  const int n = 2, lanes = 3;
  std::vector<std::vector<std::unique_ptr<gloo_comm>>> groups;
  for (int l = 0; l < lanes; ++l)
    groups.push_back(make_gloo_group(kv, n, 1, milliseconds(10000), "lane" + std::to_string(l)));
  const std::size_t count = 6500;
  std::vector<std::vector<float>> grads(n, std::vector<float>(count));
  std::vector<std::vector<std::unique_ptr<recording_comm>>> rec(n);
  std::vector<bucket_timing> timing(n);
  REQUIRE_NOTHROW(rethrow_first(run_ranks(n, [&](int r) {
    std::vector<communicator*> mine;
    for (int l = 0; l < lanes; ++l) {
      rec[r].push_back(std::make_unique<recording_comm>(*groups[l][r], grads[r].data()));
      mine.push_back(rec[r].back().get());
    }
    bucket_engine engine(mine, count, grad_type::f32, 1000 * sizeof(float) / kMiB, 0.5f);
    CHECK(engine.lanes() == 3);
    REQUIRE(engine.buckets().size() == 7);
    engine.begin(grads[r].data());
    // Marked from the front of the buffer (the last buckets first): every lane waits for
    // its lower-numbered buckets, so the order on each lane is not the marking order.
    for (const auto& c : random_chunks(count, 7 + r)) {
      for (std::size_t i = c.offset; i < c.offset + c.count; ++i)
        grads[r][i] = float(r + 1) * float(i % 4);
      engine.mark_ready(c.offset, c.count);
    }
    timing[r] = engine.wait_all();
  })));
  for (int r = 0; r < n; ++r) {
    for (std::size_t i = 0; i < count; ++i) REQUIRE(grads[r][i] == 1.5f * float(i % 4));
    const std::vector<bucket_range> plan = plan_buckets(count, sizeof(float), 1000 * 4 / kMiB);
    for (int l = 0; l < lanes; ++l) {
      CAPTURE(l);
      const auto& calls = rec[r][l]->calls;
      std::vector<std::size_t> want;
      for (std::size_t k = l; k < plan.size(); k += lanes) want.push_back(plan[k].offset);
      REQUIRE(calls.size() == want.size());
      for (std::size_t j = 0; j < want.size(); ++j) CHECK(calls[j].offset == want[j]);
    }
    CHECK(timing[r].buckets == 7);
    CHECK(timing[r].collectives.size() == 7);
    // allreduce_s is the union of the buckets' intervals: never more than their sum.
    double sum = 0;
    for (double s : timing[r].bucket_s) sum += s;
    CHECK(timing[r].allreduce_s <= sum + 1e-9);
    CHECK(timing[r].allreduce_s == doctest::Approx(covered_seconds(timing[r].collectives)));
  }
}

TEST_CASE("lanes: a failure on one lane ends the others' waits and wait_all reports it") {
  // Rank 0 alone with two lanes, rank 1 never reduces: lane 1's group has a short timeout,
  // lane 0's a long one. Lane 1 fails first; its abort must end lane 0's 60 s wait.
  memory_kv kv;
  auto slow = make_gloo_group(kv, 2, 1, milliseconds(60000), "slow");
  auto fast = make_gloo_group(kv, 2, 1, milliseconds(300), "fast");
  const std::size_t count = 4000;
  std::vector<float> grads(count, 1.0f);
  bucket_engine engine({slow[0].get(), fast[0].get()}, count, grad_type::f32,
                       1000 * sizeof(float) / kMiB);
  engine.begin(grads.data());
  engine.mark_ready(0, count);
  const auto t0 = std::chrono::steady_clock::now();
  comm_failure kind = comm_failure::invalid;
  try {
    engine.wait_all();
    FAIL("wait_all succeeded without rank 1");
  } catch (const comm_error& e) {
    kind = e.kind();
  }
  CHECK(seconds_since(t0) < kSlackSeconds);
  // The cause is lane 1's timeout (or its peer seen gone), not the abort it caused.
  CHECK((kind == comm_failure::timeout || kind == comm_failure::peer_lost));
  CHECK(slow[0]->dead());
  CHECK(fast[0]->dead());
}

TEST_CASE("plan_buckets keeps each bucket inside one wire format") {
  // 10 elements, 3 per bucket, [2, 7) compressed as fp8.
  const double mb = 3 * sizeof(float) / kMiB;
  const auto b = plan_buckets(10, sizeof(float), mb, {{2, 5, wire_format::fp8}});
  // From the end: [7, 10) plain; [4, 7), [2, 4) fp8; [0, 2) plain.
  REQUIRE(b.size() == 4);
  CHECK((b[0].offset == 7 && b[0].count == 3 && b[0].format == wire_format::f32));
  CHECK((b[1].offset == 4 && b[1].count == 3 && b[1].format == wire_format::fp8));
  CHECK((b[2].offset == 2 && b[2].count == 2 && b[2].format == wire_format::fp8));
  CHECK((b[3].offset == 0 && b[3].count == 2 && b[3].format == wire_format::f32));
  // The whole buffer compressed, and segments that touch.
  CHECK(plan_buckets(10, sizeof(float), mb, {{0, 10, wire_format::sign}}).size() == 4);
  const auto t =
      plan_buckets(6, sizeof(float), mb, {{0, 3, wire_format::bf16}, {3, 3, wire_format::fp8}});
  REQUIRE(t.size() == 2);
  CHECK(t[0].format == wire_format::fp8);
  CHECK(t[1].format == wire_format::bf16);
  CHECK_THROWS_AS(
      plan_buckets(10, sizeof(float), mb, {{4, 2, wire_format::fp8}, {3, 2, wire_format::fp8}}),
      cohort::usage_error);
  CHECK_THROWS_AS(plan_buckets(10, sizeof(float), mb, {{8, 3, wire_format::fp8}}),
                  cohort::usage_error);
}

TEST_CASE("a wire plan: compressed buckets carry their error memory, plain ones sum exactly") {
  // Two ranks, two lanes; elements [1000, 3000) travel as fp8 with error memory, the rest as
  // floats; the post-scale halves every bucket.
  memory_kv kv;
  const int n = 2;
  auto a = make_gloo_group(kv, n, 1, milliseconds(10000), "wa");
  auto b = make_gloo_group(kv, n, 1, milliseconds(10000), "wb");
  const std::size_t count = 4000;
  std::vector<std::vector<float>> grads(n, std::vector<float>(count));
  std::vector<std::vector<float>> worker(n, std::vector<float>(count, 0.0f)), server = worker;
  REQUIRE_NOTHROW(rethrow_first(run_ranks(n, [&](int r) {
    bucket_engine engine({a[r].get(), b[r].get()}, count, grad_type::f32,
                         700 * sizeof(float) / kMiB, 0.5f);
    wire_plan plan;
    plan.compressed.push_back({1000, 2000, wire_format::fp8});
    plan.memory = {worker[r].data(), server[r].data()};
    engine.set_wire(plan);
    for (const bucket_range& k : engine.buckets())
      CHECK(k.format ==
            (k.offset >= 1000 && k.offset < 3000 ? wire_format::fp8 : wire_format::f32));
    engine.begin(grads[r].data());
    // 17 needs more than fp8's 3 mantissa bits (it rounds to 16): the memory keeps the 1.
    for (std::size_t i = 0; i < count; ++i) grads[r][i] = 17.0f;
    engine.mark_ready(0, count);
    engine.wait_all();
  })));
  for (int r = 0; r < n; ++r)
    for (std::size_t i = 0; i < count; ++i) {
      CAPTURE(i);
      const bool compressed = i >= 1000 && i < 3000;
      // Plain: (17 + 17) / 2. fp8: each rank sends 16 (keeping 1), the owner's 32 is exact.
      REQUIRE(grads[r][i] == (compressed ? 16.0f : 17.0f));
      REQUIRE(worker[r][i] == (compressed ? 1.0f : 0.0f));
      REQUIRE(server[r][i] == 0.0f);
    }
}

TEST_CASE(
    "plan_collectives: compressed plans gather the buckets of one format, plain ones do not") {
  // From the end: [9,10) f32, [6,9) fp8, [5,6) f32, [2,5) fp8, [0,2) f32: five buckets.
  const double mb = 3 * sizeof(float) / kMiB;
  const auto b =
      plan_buckets(10, sizeof(float), mb, {{2, 3, wire_format::fp8}, {6, 3, wire_format::fp8}});
  REQUIRE(b.size() == 5);
  using plan = std::vector<std::vector<std::size_t>>;
  // Up to 6 elements a collective: the fp8 buckets together, the three plain ones together.
  CHECK(plan_collectives(b, 6) == plan{{0, 2, 4}, {1, 3}});
  // Up to 3: each fp8 bucket alone; the plain ones (1 + 1 + 2 elements) still fit one.
  CHECK(plan_collectives(b, 3) == plan{{0, 2}, {1}, {3}, {4}});
  // The plain wire keeps one collective per bucket, however large the limit.
  const auto p = plan_buckets(10, sizeof(float), mb);
  CHECK(plan_collectives(p, 100) == plan{{0}, {1}, {2}, {3}});
}

TEST_CASE("gathered collectives sum exactly and keep each element's error memory in place") {
  // Two ranks, one lane, buckets of 400; fp8 on [100, 300) and [400, 600), floats elsewhere: two
  // collectives a step (all fp8 buckets, all plain ones). Plain elements: rank r sends 17 + r. fp8
  // elements: rank 0 sends 16, rank 1 sends 32, all exact in fp8 and so is their sum 48;
  // but rank 0 sends 17 at element 450, which fp8 rounds to 16 (a tie, to even): its
  // memory keeps the 1 at element 450 and nowhere else.
  memory_kv kv;
  const int n = 2;
  auto g = make_gloo_group(kv, n, 1, milliseconds(10000), "gc");
  const std::size_t count = 700;
  auto fp8 = [](std::size_t i) { return (i >= 100 && i < 300) || (i >= 400 && i < 600); };
  std::vector<std::vector<float>> grads(n, std::vector<float>(count));
  std::vector<std::vector<float>> worker(n, std::vector<float>(count, 0.0f)), server = worker;
  std::vector<std::size_t> collectives(n), ran(n);
  REQUIRE_NOTHROW(rethrow_first(run_ranks(n, [&](int r) {
    bucket_engine engine(*g[r], count, grad_type::f32, 400 * sizeof(float) / kMiB, 1.0f);
    wire_plan plan;
    plan.compressed = {{100, 200, wire_format::fp8}, {400, 200, wire_format::fp8}};
    plan.memory = {worker[r].data(), server[r].data()};
    engine.set_wire(plan);
    collectives[r] = engine.collectives().size();
    engine.begin(grads[r].data());
    for (std::size_t i = 0; i < count; ++i)
      grads[r][i] = fp8(i) ? (r == 0 ? 16.0f : 32.0f) : 17.0f + static_cast<float>(r);
    if (r == 0) grads[r][450] = 17.0f;
    // Backward's order: from the end, in uneven pieces.
    for (std::size_t end = count; end > 0;) {
      const std::size_t len = std::min<std::size_t>(end, 77);
      engine.mark_ready(end - len, len);
      end -= len;
    }
    ran[r] = engine.wait_all().buckets;
  })));
  CHECK(collectives == std::vector<std::size_t>{2, 2});
  CHECK(ran == std::vector<std::size_t>{2, 2});
  for (int r = 0; r < n; ++r)
    for (std::size_t i = 0; i < count; ++i) {
      CAPTURE(r);
      CAPTURE(i);
      REQUIRE(grads[r][i] == (fp8(i) ? 48.0f : 35.0f));
      REQUIRE(worker[r][i] == (r == 0 && i == 450 ? 1.0f : 0.0f));
      REQUIRE(server[r][i] == 0.0f);
    }
}
