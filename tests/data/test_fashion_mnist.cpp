// Fashion-MNIST: the real package files (counts, classes, pixel statistics, known first
// labels) and every kind of broken IDX file.
#include <doctest/doctest.h>
#include <zlib.h>

#include <cmath>
#include <string>
#include <vector>

#include "fixtures.hpp"
#include "idx_files.hpp"
#include "runtime/core/error.hpp"

using cohort::data_error;
using cohort::fashion_mnist;
using cohort::read_idx_gz;
using cohort::test::be32;
using cohort::test::fashion;
using cohort::test::temp_dir;
using cohort::test::write_gz;

namespace {

// Runs fn, expects a data_error whose message contains every one of `parts`.
template <class Fn>
void expect_data_error(Fn fn, std::vector<std::string> parts) {
  try {
    fn();
    FAIL("no data_error thrown");
  } catch (const data_error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts) {
      INFO("message: " << msg);
      CHECK(msg.find(p) != std::string::npos);
    }
  }
}

}  // namespace

TEST_CASE("fashion: real files have 60k/10k samples, 6000/1000 per class") {
  const auto& ds = fashion();
  REQUIRE(ds.train_labels().size() == 60000);
  REQUIRE(ds.test_labels().size() == 10000);
  REQUIRE(ds.train_images().size() == 60000u * 784);
  REQUIRE(ds.test_images().size() == 10000u * 784);
  std::vector<int> train_count(10), test_count(10);
  for (uint8_t l : ds.train_labels()) train_count.at(l)++;
  for (uint8_t l : ds.test_labels()) test_count.at(l)++;
  for (int c = 0; c < 10; ++c) {
    CHECK(train_count[c] == 6000);
    CHECK(test_count[c] == 1000);
  }
  // First labels of the published files (ankle boot, T-shirt, T-shirt, dress, ...).
  const std::vector<int> train_head{9, 0, 0, 3, 0, 2, 7, 2, 5, 5};
  const std::vector<int> test_head{9, 2, 1, 1, 6, 1, 4, 6, 5, 7};
  for (int i = 0; i < 10; ++i) {
    CHECK(ds.train_labels()[i] == train_head[i]);
    CHECK(ds.test_labels()[i] == test_head[i]);
  }
}

TEST_CASE("fashion: normalisation constants match the training pixels") {
  const auto& px = fashion().train_images();
  double sum = 0, sum2 = 0;
  int lo = 255, hi = 0;
  for (uint8_t p : px) {
    const double v = p / 255.0;
    sum += v;
    sum2 += v * v;
    lo = std::min<int>(lo, p);
    hi = std::max<int>(hi, p);
  }
  const double mean = sum / px.size();
  const double sd = std::sqrt(sum2 / px.size() - mean * mean);
  CHECK(lo == 0);
  CHECK(hi == 255);
  CHECK(std::fabs(mean - fashion_mnist::norm_mean) < 1e-4);
  CHECK(std::fabs(sd - fashion_mnist::norm_std) < 1e-4);
  CHECK(fashion_mnist::normalise(0) == doctest::Approx(-0.2860 / 0.3530).epsilon(1e-6));
  CHECK(fashion_mnist::normalise(255) == doctest::Approx((1 - 0.2860) / 0.3530).epsilon(1e-6));
  const auto meta = fashion().preprocessing_metadata();
  CHECK(meta.at("data.norm_mean") == "0.286");
  CHECK(meta.at("data.norm_std") == "0.353");
  CHECK(std::stof(meta.at("data.norm_mean")) == fashion_mnist::norm_mean);
  CHECK(std::stof(meta.at("data.norm_std")) == fashion_mnist::norm_std);
}

TEST_CASE("fashion: evaluation batches are the test set in order") {
  const auto& ds = fashion();
  CHECK(ds.eval_size() == 10000);
  int64_t seen = 0, batches = 0;
  std::vector<int> count(10);
  bool pixels_ok = true;
  cohort::for_each_eval_batch(ds, 128, 0, [&](const cohort::batch& b) {
    CHECK(b.features == 784);
    CHECK(b.x.size() == static_cast<size_t>(b.n) * 784);
    for (int i = 0; i < b.n; ++i) {
      CHECK(b.targets[i] == ds.test_labels()[seen + i]);
      count[b.targets[i]]++;
      for (int p = 0; p < 784; p += 97) {
        const uint8_t raw = ds.test_images()[(seen + i) * 784 + p];
        pixels_ok &= b.x[i * 784 + p] == (raw / 255.0f - 0.2860f) / 0.3530f;
      }
    }
    seen += b.n;
    ++batches;
  });
  CHECK(pixels_ok);
  CHECK(seen == 10000);
  CHECK(batches == 79);  // 78 full batches of 128 and one of 16
  for (int c = 0; c < 10; ++c) CHECK(count[c] == 1000);
}

TEST_CASE("fashion: read_idx_gz reads a well-formed file") {
  temp_dir dir;
  const std::string path = dir.file("ok.gz");
  write_gz(path, be32(0x803) + be32(2) + be32(2) + be32(3) + std::string("abcdefghijkl"));
  const auto f = read_idx_gz(path, 3);
  CHECK(f.dims == std::vector<int64_t>{2, 2, 3});
  CHECK(std::string(f.data.begin(), f.data.end()) == "abcdefghijkl");
}

TEST_CASE("fashion: broken IDX files are data errors naming the file and the fault") {
  temp_dir dir;
  const std::string path = dir.file("bad.gz");
  SUBCASE("missing file names the package") {
    expect_data_error([&] { read_idx_gz(dir.file("nope.gz"), 1); },
                      {"nope.gz", "apt-get install dataset-fashion-mnist"});
  }
  SUBCASE("wrong magic") {
    write_gz(path, be32(0x801) + be32(3) + "abc");
    expect_data_error([&] { read_idx_gz(path, 3); }, {path, "magic", "0x00000801", "0x00000803"});
  }
  SUBCASE("wrong element type") {
    write_gz(path, be32(0xD01) + be32(3) + "abc");
    expect_data_error([&] { read_idx_gz(path, 1); }, {path, "magic"});
  }
  SUBCASE("truncated header") {
    write_gz(path, be32(0x803) + be32(5));
    expect_data_error([&] { read_idx_gz(path, 3); }, {path, "truncated", "header"});
  }
  SUBCASE("truncated payload") {
    write_gz(path, be32(0x801) + be32(10) + "abc");
    expect_data_error([&] { read_idx_gz(path, 1); }, {path, "truncated", "10 bytes"});
  }
  SUBCASE("trailing data") {
    write_gz(path, be32(0x801) + be32(3) + "abcd");
    expect_data_error([&] { read_idx_gz(path, 1); }, {path, "after"});
  }
  SUBCASE("absurd dimensions") {
    write_gz(path, be32(0x803) + be32(0xFFFFFFFF) + be32(0xFFFFFFFF) + be32(0xFFFFFFFF));
    expect_data_error([&] { read_idx_gz(path, 3); }, {path, "corrupt"});
  }
  SUBCASE("corrupt gzip stream") {
    // Compress a payload, then damage the deflate data (after the 10-byte gzip header).
    std::string payload = be32(0x801) + be32(4000);
    for (int i = 0; i < 4000; ++i) payload.push_back(static_cast<char>((i * 7919) % 251));
    write_gz(path, payload);
    std::string gz = cohort::test::read_all(path);
    for (size_t i = 12; i < gz.size() - 8; i += 5) gz[i] = static_cast<char>(gz[i] ^ 0x5A);
    cohort::test::write_all(path, gz);
    expect_data_error([&] { read_idx_gz(path, 1); }, {path});
  }
}

TEST_CASE("fashion: a folder with one corrupt file fails naming that file") {
  temp_dir dir;
  namespace fs = std::filesystem;
  for (const char* f :
       {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz"}) {
    fs::create_symlink(fs::path(fashion_mnist::default_dir) / f, dir.path() / f);
  }
  SUBCASE("missing test labels") {
    expect_data_error([&] { fashion_mnist ds(dir.path().string()); },
                      {"t10k-labels-idx1-ubyte.gz", "apt-get install dataset-fashion-mnist"});
  }
  SUBCASE("test labels with the wrong count") {
    write_gz(dir.file("t10k-labels-idx1-ubyte.gz"), be32(0x801) + be32(3) + std::string(3, 1));
    expect_data_error([&] { fashion_mnist ds(dir.path().string()); },
                      {"t10k-labels-idx1-ubyte.gz", "dimensions are 3, expected 10000"});
  }
  SUBCASE("a label out of range") {
    std::string labels(10000, 2);
    labels[1234] = 10;
    write_gz(dir.file("t10k-labels-idx1-ubyte.gz"), be32(0x801) + be32(10000) + labels);
    expect_data_error([&] { fashion_mnist ds(dir.path().string()); },
                      {"t10k-labels-idx1-ubyte.gz", "label 10 at index 1234"});
  }
}
