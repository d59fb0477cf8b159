// What a data-parallel worker asks of the trainer: its share of the micro-batches, gradients
// reported range by range as they become final (same bits as the plain path), the bitwise
// promise that replicas' fixed-point sums add up to the single-process sum exactly, and the
// state a joiner receives.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/config.hpp"
#include "runtime/core/error.hpp"
#include "runtime/train/fixed_point.hpp"
#include "runtime/train/trainer.hpp"

using namespace cohort;

namespace {

config small_mlp(const std::string& determinism, const std::string& optimizer = "adamw") {
  std::string y =
      "model: {kind: mlp, hidden: [24, 12]}\n"
      "train: {steps: 6, global_batch: 64, micro_batch: 16, lr: 0.003, seed: 9, "
      "optimizer: " +
      optimizer + ", determinism: " + determinism + ", log_every: 1000}\n";
  return load_config_text(y, "test.yaml");
}

std::vector<int> all_micro(int m) {
  std::vector<int> v;
  for (int i = 0; i < m; ++i) v.push_back(i);
  return v;
}

/// Bytes of the reduction buffer (float or int64 elements, both 8 or 4 bytes wide).
std::vector<unsigned char> buffer_bytes(train::trainer& tr) {
  const std::size_t n = static_cast<std::size_t>(tr.model().num_params());
  const std::size_t width = tr.bitwise() ? sizeof(int64_t) : sizeof(float);
  const auto* p = static_cast<const unsigned char*>(tr.reduction_buffer());
  return std::vector<unsigned char>(p, p + n * width);
}

/// Records every ready range with a copy of its bytes at report time.
struct recorder {
  train::trainer* tr = nullptr;
  std::vector<std::pair<std::size_t, std::size_t>> ranges;
  std::vector<std::vector<unsigned char>> at_report;

  nn::grads_ready_fn fn() {
    return [this](std::size_t off, std::size_t n) {
      ranges.emplace_back(off, n);
      const std::size_t width = tr->bitwise() ? sizeof(int64_t) : sizeof(float);
      const auto* p = static_cast<const unsigned char*>(tr->reduction_buffer());
      at_report.emplace_back(p + off * width, p + (off + n) * width);
    };
  }

  /// Ranges tile [0, elements) exactly once, reported from the end of the buffer down.
  void check_cover(std::size_t elements) const {
    CHECK(!ranges.empty());
    std::size_t end = elements;
    for (const auto& [off, n] : ranges) {
      CHECK(n > 0);
      CHECK(off + n == end);  // contiguous, descending, no overlap, no gap
      end = off;
    }
    CHECK(end == 0);
  }

  /// Each range already held its final bytes when it was reported.
  void check_final(train::trainer& t) const {
    const std::vector<unsigned char> now = buffer_bytes(t);
    const std::size_t width = t.bitwise() ? sizeof(int64_t) : sizeof(float);
    for (std::size_t k = 0; k < ranges.size(); ++k)
      CHECK(std::memcmp(at_report[k].data(), now.data() + ranges[k].first * width,
                        at_report[k].size()) == 0);
  }
};

}  // namespace

TEST_CASE("replica_micro_batches: round robin - disjoint - covers every micro-batch") {
  CHECK(train::replica_micro_batches(8, 3, 0) == std::vector<int>{0, 3, 6});
  CHECK(train::replica_micro_batches(8, 3, 1) == std::vector<int>{1, 4, 7});
  CHECK(train::replica_micro_batches(8, 3, 2) == std::vector<int>{2, 5});
  CHECK(train::replica_micro_batches(4, 1, 0) == std::vector<int>{0, 1, 2, 3});
  CHECK(train::replica_micro_batches(2, 4, 3).empty());
  CHECK(train::replica_micro_batches(0, 2, 1).empty());
  for (int m : {1, 4, 7, 16}) {
    for (int dp : {1, 2, 3, 5, 9}) {
      std::vector<int> owner(m, -1);
      for (int d = 0; d < dp; ++d) {
        const std::vector<int> mine = train::replica_micro_batches(m, dp, d);
        CHECK(std::is_sorted(mine.begin(), mine.end()));
        for (int i : mine) {
          REQUIRE(i >= 0);
          REQUIRE(i < m);
          CHECK(owner[i] == -1);
          owner[i] = d;
        }
      }
      INFO("M=" << m << " dp=" << dp);
      CHECK(std::count(owner.begin(), owner.end(), -1) == 0);
    }
  }
  CHECK_THROWS_AS(train::replica_micro_batches(8, 3, 3), usage_error);
  CHECK_THROWS_AS(train::replica_micro_batches(8, 3, -1), usage_error);
  CHECK_THROWS_AS(train::replica_micro_batches(8, 0, 0), usage_error);
}

TEST_CASE("compute_gradients with readiness gives the plain path's bits and reports once") {
  for (const char* mode : {"fast", "bitwise"}) {
    INFO("mode " << mode);
    train::trainer plain(small_mlp(mode)), hooked(small_mlp(mode));
    REQUIRE(plain.micro_batches() == 4);
    CHECK(hooked.bitwise() == (std::string(mode) == "bitwise"));
    const std::size_t n = static_cast<std::size_t>(hooked.model().num_params());
    for (int64_t step = 0; step < 3; ++step) {
      // Step 1 takes a middle slice (what one replica of two might get); others take all.
      const int first = step == 1 ? 1 : 0, last = step == 1 ? 3 : 4;
      std::vector<int> micro;
      for (int i = first; i < last; ++i) micro.push_back(i);
      plain.begin_step();
      hooked.begin_step();
      const double lp = plain.compute_gradients(step, first, last);
      recorder rec;
      rec.tr = &hooked;
      const double lh = hooked.compute_gradients(step, micro, rec.fn());
      CHECK(lp == lh);
      CHECK(!hooked.model().has_grads_ready_hook());
      rec.check_cover(n);
      rec.check_final(hooked);
      // Finer than blocks: at least one range per parameter.
      CHECK(rec.ranges.size() >= hooked.model().parameters().size());
      CHECK(buffer_bytes(plain) == buffer_bytes(hooked));
      CHECK(std::memcmp(plain.model().flat_grads().data(), hooked.model().flat_grads().data(),
                        plain.model().flat_grads().bytes()) == 0);
      plain.apply_step(step);
      hooked.apply_step(step);
      CHECK(plain.params_sha256() == hooked.params_sha256());
    }
  }
}

TEST_CASE("bitwise: replicas' fixed-point sums add up to the single-process sum exactly") {
  // Five replica trainers stay in step with one single-process trainer; each pair of steps
  // uses a different dp: 2, then 3 ({0,3} {1} {2}), then 5 (replica 4 gets no micro-batch).
  // Every replica applies the summed gradients, so all six stay identical throughout.
  train::trainer one(small_mlp("bitwise"));
  std::vector<std::unique_ptr<train::trainer>> reps;
  for (int d = 0; d < 5; ++d)
    reps.push_back(std::make_unique<train::trainer>(small_mlp("bitwise")));
  const std::size_t n = static_cast<std::size_t>(one.model().num_params());
  const int dps[] = {2, 2, 3, 3, 5, 5};
  for (int64_t step = 0; step < 6; ++step) {
    const int dp = dps[step];
    INFO("step " << step << " dp " << dp);
    one.begin_step();
    one.compute_gradients(step, all_micro(one.micro_batches()), nn::grads_ready_fn{});
    std::vector<int64_t> sum(n, 0);
    // Add the replicas in reverse order: integer sums do not care.
    for (int d = dp; d-- > 0;) {
      train::trainer& r = *reps[d];
      r.begin_step();
      recorder rec;
      rec.tr = &r;
      r.compute_gradients(step, train::replica_micro_batches(r.micro_batches(), dp, d), rec.fn());
      rec.check_cover(n);
      rec.check_final(r);
      REQUIRE(train::fixed_add(sum.data(), r.fixed_grads().data(), static_cast<int64_t>(n)) == -1);
    }
    CHECK(sum == one.fixed_grads());
    one.apply_step(step);
    for (auto& r : reps) {
      std::copy(sum.begin(), sum.end(), static_cast<int64_t*>(r->reduction_buffer()));
      r->apply_step(step);
      CHECK(r->params_sha256() == one.params_sha256());
    }
  }
}

TEST_CASE("an empty micro-batch list reports every element once at once - zeros") {
  for (const char* mode : {"fast", "bitwise"}) {
    INFO("mode " << mode);
    train::trainer tr(small_mlp(mode));
    tr.begin_step();
    recorder rec;
    rec.tr = &tr;
    CHECK(tr.compute_gradients(0, std::vector<int>{}, rec.fn()) == 0.0);
    rec.check_cover(static_cast<std::size_t>(tr.model().num_params()));
    const std::vector<unsigned char> bytes = buffer_bytes(tr);
    CHECK(std::all_of(bytes.begin(), bytes.end(), [](unsigned char c) { return c == 0; }));
  }
}

TEST_CASE("compute_gradients rejects a micro-batch list that is not ascending or out of range") {
  train::trainer tr(small_mlp("fast"));
  const nn::grads_ready_fn none;
  tr.begin_step();
  CHECK_THROWS_AS(tr.compute_gradients(0, std::vector<int>{2, 1}, none), usage_error);
  CHECK_THROWS_AS(tr.compute_gradients(0, std::vector<int>{1, 1}, none), usage_error);
  CHECK_THROWS_AS(tr.compute_gradients(0, std::vector<int>{4}, none), usage_error);
  CHECK_THROWS_AS(tr.compute_gradients(0, std::vector<int>{-1}, none), usage_error);
}

TEST_CASE("bitwise overflow in the per-range path names the global element and unhooks") {
  train::trainer tr(small_mlp("bitwise"));
  nn::model& m = tr.model();
  const nn::parameter& w = m.param("net.4.weight");
  const nn::parameter& bias = m.param("net.4.bias");
  // The last layer's weight is small enough for one dW chunk: one range, converted at once.
  REQUIRE(nn::linear::dw_chunk_rows(static_cast<int>(w.grad.dim(0)),
                                    static_cast<int>(w.grad.dim(1))) == w.grad.dim(0));
  // A huge bias before the last ReLU makes the last layer's weight gradient ~1e12/64, far
  // beyond the fixed-point range, while its bias gradient (column sums of the softmax
  // gradient) stays small. (A NaN would not do: the vector exp clamps it.) Backward reports
  // net.4.bias first, then net.4.weight, whose conversion fails: the error names an element
  // of it, counted in the whole buffer.
  m.param("net.2.bias").value.fill(1e12f);
  tr.begin_step();
  std::vector<std::pair<std::size_t, std::size_t>> reports;
  std::string message;
  try {
    tr.compute_gradients(3, std::vector<int>{2},
                         [&](std::size_t off, std::size_t n) { reports.emplace_back(off, n); });
  } catch (const error& e) {
    message = e.what();
  }
  REQUIRE(!message.empty());
  // Only one micro-batch, so the error came from the hook. Backward stopped right after the
  // weight's gradient, which stays in flat_grads: its first out-of-range element is the one the
  // message must name.
  const float* g = m.flat_grads().data();
  int64_t bad = -1;
  for (int64_t k = w.offset; k < w.offset + w.grad.numel() && bad < 0; ++k)
    if (!std::isfinite(g[k]) || std::fabs(g[k]) > train::fixed_point_max_value) bad = k;
  REQUIRE(bad >= w.offset);
  const std::string want = "gradient element " + std::to_string(bad) + " of step 3";
  CHECK(message.find(want) != std::string::npos);
  // Only the bias went through; the fixed-point sum holds it and nothing else.
  REQUIRE(reports.size() == 1);
  CHECK(reports[0].first == static_cast<std::size_t>(bias.offset));
  CHECK(reports[0].second == static_cast<std::size_t>(bias.grad.numel()));
  const std::vector<int64_t>& fixed = tr.fixed_grads();
  for (std::size_t k = 0; k < fixed.size(); ++k) {
    const bool in_bias = k >= reports[0].first && k < reports[0].first + reports[0].second;
    if (!in_bias) REQUIRE(fixed[k] == 0);
  }
  CHECK(std::any_of(fixed.begin() + bias.offset, fixed.begin() + bias.offset + bias.grad.numel(),
                    [](int64_t v) { return v != 0; }));
  CHECK(!m.has_grads_ready_hook());
}

TEST_CASE("state_buffers: parameters then optimizer slots - copying them makes a twin") {
  for (const char* opt : {"adamw", "sgd"}) {
    INFO("optimizer " << opt);
    const std::size_t slots = std::string(opt) == "adamw" ? 2 : 1;
    train::trainer donor(small_mlp("fast", opt)), joiner(small_mlp("fast", opt)),
        straight(small_mlp("fast", opt));
    const std::size_t n = static_cast<std::size_t>(donor.model().num_params());
    auto bufs = donor.state_buffers();
    REQUIRE(bufs.size() == 1 + slots);
    std::size_t total = 0;
    for (const auto& [p, count] : bufs) total += count;
    CHECK(total == n * (1 + slots));
    CHECK(bufs[0].first == donor.model().flat_values().data());

    auto step = [](train::trainer& t, int64_t s) {
      t.begin_step();
      t.compute_gradients(s, 0, t.micro_batches());
      t.apply_step(s);
    };
    // The joiner's own init differs from the donor's trained state until the copy.
    for (int64_t s = 0; s < 3; ++s) {
      step(donor, s);
      step(straight, s);
    }
    CHECK(donor.optimizer_steps() == 3);
    CHECK(joiner.params_sha256() != donor.params_sha256());
    auto dst = joiner.state_buffers();
    REQUIRE(dst.size() == bufs.size());
    for (std::size_t k = 0; k < bufs.size(); ++k) {
      REQUIRE(dst[k].second == bufs[k].second);
      std::memcpy(dst[k].first, bufs[k].first, bufs[k].second * sizeof(float));
    }
    joiner.set_optimizer_steps(donor.optimizer_steps());
    CHECK(joiner.params_sha256() == donor.params_sha256());
    for (int64_t s = 3; s < 5; ++s) {
      step(joiner, s);
      step(straight, s);
    }
    CHECK(joiner.params_sha256() == straight.params_sha256());
  }
}
