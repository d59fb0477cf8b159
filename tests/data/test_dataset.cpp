// Deterministic sampling: micro-batches are pure functions of (seed, step, micro,
// micro_batch, global_batch), epochs are permutations, positions and the factory.
#include <doctest/doctest.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "fixtures.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/rng.hpp"

using cohort::batch;
using cohort::fashion_mnist;
using cohort::kjv;
using cohort::test::fashion;
using cohort::test::kjv_text;

namespace {

bool same(const batch& a, const batch& b) {
  return a.n == b.n && a.t == b.t && a.features == b.features && a.x == b.x && a.ids == b.ids &&
         a.targets == b.targets;
}

batch sample(const cohort::dataset& ds, uint64_t seed, int64_t step, int micro, int mb, int gb) {
  batch b;
  ds.train_micro_batch(seed, step, micro, mb, gb, b);
  return b;
}

// Concatenation of a step's micro-batches.
batch whole_step(const cohort::dataset& ds, uint64_t seed, int64_t step, int mb, int gb) {
  batch all;
  for (int m = 0; m * mb < gb; ++m) {
    batch b = sample(ds, seed, step, m, mb, gb);
    all.n += b.n;
    all.t = b.t;
    all.features = b.features;
    all.x.insert(all.x.end(), b.x.begin(), b.x.end());
    all.ids.insert(all.ids.end(), b.ids.begin(), b.ids.end());
    all.targets.insert(all.targets.end(), b.targets.begin(), b.targets.end());
  }
  return all;
}

}  // namespace

TEST_CASE("fashion sampling: pure, order-free, split-free") {
  const auto& ds = fashion();
  const batch a = sample(ds, 7, 3, 1, 32, 128);
  CHECK(a.n == 32);
  CHECK(a.features == 784);
  CHECK(a.x.size() == 32u * 784);
  CHECK(a.targets.size() == 32u);
  // Far-away epochs in between evict the permutation cache; the answer stays the same.
  for (int64_t step : {100000, 5000, 0, 999999}) sample(ds, 7, step, 0, 32, 128);
  CHECK(same(a, sample(ds, 7, 3, 1, 32, 128)));
  // A fresh object (no cache at all) agrees too.
  const fashion_mnist other(fashion_mnist::default_dir);
  CHECK(same(a, sample(other, 7, 3, 1, 32, 128)));

  // Different micro-batch splits of one step hold the same samples in the same order.
  const batch one = whole_step(ds, 7, 3, 128, 128);
  CHECK(same(one, whole_step(ds, 7, 3, 32, 128)));
  CHECK(same(one, whole_step(ds, 7, 3, 48, 128)));  // 48 + 48 + 32 (short last micro-batch)
  CHECK(sample(ds, 7, 3, 2, 48, 128).n == 32);

  CHECK_FALSE(same(a, sample(ds, 7, 3, 2, 32, 128)));  // other micro-batch
  CHECK_FALSE(same(a, sample(ds, 7, 4, 1, 32, 128)));  // other step
  CHECK_FALSE(same(a, sample(ds, 8, 3, 1, 32, 128)));  // other seed
}

TEST_CASE("fashion sampling: samples are the permuted images with normalised pixels") {
  const auto& ds = fashion();
  // global_batch 7000: step 8 covers g = 56000..62999 and straddles epochs 0 and 1.
  const int gb = 7000, mb = 1000;
  for (int micro = 3; micro <= 4; ++micro) {
    const batch b = sample(ds, 11, 8, micro, mb, gb);
    bool ok = true;
    for (int j = 0; j < b.n; ++j) {
      const int64_t g = int64_t{8} * gb + micro * mb + j;
      const auto perm = ds.epoch_permutation(11, g / 60000);
      const int64_t img = (*perm)[g % 60000];
      ok &= b.targets[j] == ds.train_labels()[img];
      for (int p = 0; p < 784; p += 31)
        ok &= b.x[j * 784 + p] == fashion_mnist::normalise(ds.train_images()[img * 784 + p]);
    }
    CHECK(ok);
  }
}

TEST_CASE("fashion sampling: each epoch visits every image exactly once") {
  const auto& ds = fashion();
  for (int64_t epoch : {0, 1, 17}) {
    std::vector<int> seen(60000, 0);
    for (int64_t g = epoch * 60000; g < (epoch + 1) * 60000; ++g) seen[ds.train_index(5, g)]++;
    CHECK(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
  }
  // Epochs are shuffled differently, and not left in file order.
  const auto p0 = ds.epoch_permutation(5, 0), p1 = ds.epoch_permutation(5, 1);
  CHECK(*p0 != *p1);
  int fixed = 0;
  for (uint32_t i = 0; i < 60000; ++i) fixed += (*p0)[i] == i;
  CHECK(fixed < 20);  // a uniform permutation has about one fixed point

  // The permutation is the documented Fisher-Yates over rng(hash_coords(seed, e, stream)).
  std::vector<uint32_t> want(60000);
  for (uint32_t i = 0; i < 60000; ++i) want[i] = i;
  cohort::rng r(cohort::hash_coords(5, 1, fashion_mnist::permutation_stream));
  for (int64_t i = 59999; i > 0; --i) std::swap(want[i], want[r.below(i + 1)]);
  CHECK(*p1 == want);
}

TEST_CASE("fashion sampling: one class balance over an epoch of micro-batches") {
  const auto& ds = fashion();
  std::vector<int> count(10);
  for (int64_t step = 0; step < 60000 / 600; ++step) {
    const batch b = sample(ds, 3, step, 0, 600, 600);
    for (int32_t t : b.targets) count.at(t)++;
  }
  for (int c = 0; c < 10; ++c) CHECK(count[c] == 6000);
}

TEST_CASE("fashion sampling: threads get what a single thread gets") {
  const auto& ds = fashion();
  std::vector<batch> serial;
  for (int i = 0; i < 16; ++i) serial.push_back(sample(ds, 9, i * 131, i % 4, 16, 64));
  std::vector<batch> parallel(16);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 15 - t; i >= 0; i -= 4) parallel[i] = sample(ds, 9, i * 131, i % 4, 16, 64);
    });
  }
  for (auto& th : threads) th.join();
  for (int i = 0; i < 16; ++i) CHECK(same(serial[i], parallel[i]));
}

TEST_CASE("kjv sampling: windows at hashed offsets, pure and split-free") {
  const int T = 32;
  const kjv ds(kjv_text(), T);
  const std::string train(ds.train_text());
  const int64_t range = static_cast<int64_t>(train.size()) - T - 1;
  const batch b = sample(ds, 42, 10, 2, 8, 32);
  CHECK(b.n == 8);
  CHECK(b.t == T);
  REQUIRE(b.ids.size() == 8u * T);
  for (int j = 0; j < 8; ++j) {
    const int64_t off =
        static_cast<int64_t>(cohort::hash_coords(42, 10, 2 * 8 + j) % static_cast<uint64_t>(range));
    CHECK(ds.window_offset(42, 10, 2 * 8 + j) == off);
    const auto want_ids = ds.encode(train.substr(off, T));
    const auto want_tg = ds.encode(train.substr(off + 1, T));
    CHECK(std::equal(want_ids.begin(), want_ids.end(), b.ids.begin() + j * T));
    CHECK(std::equal(want_tg.begin(), want_tg.end(), b.targets.begin() + j * T));
  }
  CHECK(same(b, sample(ds, 42, 10, 2, 8, 32)));
  CHECK(same(whole_step(ds, 42, 10, 8, 32), whole_step(ds, 42, 10, 32, 32)));
  CHECK(same(whole_step(ds, 42, 10, 8, 32), whole_step(ds, 42, 10, 12, 32)));
  CHECK_FALSE(same(b, sample(ds, 42, 10, 1, 8, 32)));
  CHECK_FALSE(same(b, sample(ds, 42, 11, 2, 8, 32)));
  CHECK_FALSE(same(b, sample(ds, 43, 10, 2, 8, 32)));

  // Every window lies inside the training text: none reaches validation characters.
  int64_t max_end = 0;
  for (int64_t step = 0; step < 2000; ++step)
    for (int i = 0; i < 64; ++i) max_end = std::max(max_end, ds.window_offset(1, step, i) + T + 1);
  CHECK(max_end <= static_cast<int64_t>(train.size()));
}

TEST_CASE("data position: metadata round trip and epochs") {
  const auto& ds = fashion();
  const auto p = ds.position(7, 1000, 128);
  CHECK(p.dataset == "fashion_mnist");
  CHECK(p.samples_seen == 128000);
  CHECK(p.epoch == 2);  // 128000 / 60000
  CHECK(p.train_size == 60000);
  const auto m = p.to_metadata();
  CHECK(m.at("data.step") == "1000");
  const auto q = cohort::data_position::from_metadata(m);
  CHECK(q.dataset == p.dataset);
  CHECK(q.seed == 7);
  CHECK(q.step == 1000);
  CHECK(q.global_batch == 128);
  CHECK(q.samples_seen == 128000);
  CHECK(q.epoch == 2);
  auto broken = m;
  broken["data.step"] = "12x";
  CHECK_THROWS_AS(cohort::data_position::from_metadata(broken), cohort::data_error);
  broken.erase("data.step");
  CHECK_THROWS_WITH_AS(cohort::data_position::from_metadata(broken), doctest::Contains("data.step"),
                       cohort::data_error);

  const kjv lm(kjv_text(), 100);
  const auto k = lm.position(1, 50, 64);
  CHECK(k.epoch == 50 * 64 * 100 / lm.train_size());
}

TEST_CASE("make_dataset: from the config") {
  cohort::config c;
  c.data.dataset = "kjv";
  c.model.context = 16;
  cohort::test::temp_dir dir;
  c.data.cache_dir = dir.path().string();
  auto ds = cohort::make_dataset(c);
  CHECK(ds->name() == "kjv");
  CHECK(ds->is_language_model());
  CHECK(ds->context() == 16);
  CHECK(ds->num_classes() == static_cast<int>(dynamic_cast<const kjv&>(*ds).vocab().size()));

  c.data.dataset = "mnist";
  CHECK_THROWS_AS(cohort::make_dataset(c), cohort::usage_error);

  c.data.dataset = "fashion_mnist";
  c.data.dir = dir.file("no-such-folder");
  CHECK_THROWS_WITH_AS(cohort::make_dataset(c), doctest::Contains("dataset-fashion-mnist"),
                       cohort::data_error);
}
