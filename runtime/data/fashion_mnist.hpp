// Fashion-MNIST from the Debian package dataset-fashion-mnist: gzip IDX reading and
// validation, normalisation, and the per-epoch shuffled training order.
// Does not download anything and does not augment.
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "runtime/data/byte_view.hpp"
#include "runtime/data/dataset.hpp"

namespace cohort {

/// One IDX file (unsigned-byte payload) after its header was checked.
struct idx_file {
  std::vector<int64_t> dims;  ///< e.g. {60000, 28, 28} or {60000}
  std::vector<uint8_t> data;  ///< prod(dims) bytes, row-major
};

/// Reads a gzip-compressed IDX file of unsigned bytes with `expected_dims` dimensions
/// (uncompressed files are accepted too). Checks the magic number, the dimension count,
/// that the payload is exactly prod(dims) bytes (no truncation, no trailing data) and the
/// gzip stream itself. Throws data_error naming the file and what is wrong; a missing file
/// names the package to install.
idx_file read_idx_gz(const std::string& path, int expected_dims);

/// 60k training and 10k test images of 28x28 grey pixels in 10 classes.
///
/// Training order: global sample g = step * global_batch + micro * micro_batch + j lies in
/// epoch e = g / 60000 at position p = g % 60000 and is image perm_e[p], where perm_e is a
/// Fisher-Yates shuffle of 0..59999 driven by rng(hash_coords(seed, e, stream)). Each
/// epoch visits every image exactly once; nothing depends on call order or threads.
class fashion_mnist : public dataset {
 public:
  static constexpr float norm_mean = 0.2860f;  ///< mean of x/255 over the training set
  static constexpr float norm_std = 0.3530f;   ///< its standard deviation
  static constexpr int rows = 28, cols = 28, pixels = 784, classes = 10;
  static constexpr int64_t train_count = 60000, test_count = 10000;
  /// Where the Debian package puts the files.
  static constexpr const char* default_dir = "/usr/share/datasets/fashion-mnist";
  /// Mixed into the permutation seed so data order is independent of other streams
  /// (e.g. parameter initialisation) drawn from the same train.seed.
  static constexpr uint64_t permutation_stream = 0x46415348494f4e00ull;  // "FASHION"

  /// Loads and validates the four files in `dir`.
  explicit fashion_mnist(const std::string& dir = default_dir);

  std::string name() const override { return "fashion_mnist"; }
  bool is_language_model() const override { return false; }
  int num_classes() const override { return classes; }
  int features() const override { return pixels; }
  int context() const override { return 1; }
  int64_t train_size() const override { return train_count; }
  void train_micro_batch(uint64_t seed, int64_t step, int micro, int micro_batch, int global_batch,
                         batch& out) const override;
  int64_t eval_size(int64_t max_tokens = 0) const override { return test_count; }
  void eval_batch(int64_t first, int n, batch& out) const override;
  std::map<std::string, std::string> preprocessing_metadata() const override;

  /// (pixel / 255 - norm_mean) / norm_std, the input a model sees for a raw pixel.
  static float normalise(uint8_t pixel) {
    return (static_cast<float>(pixel) / 255.0f - norm_mean) / norm_std;
  }
  /// The training image index visited at position `pos` of epoch `epoch`.
  std::shared_ptr<const std::vector<uint32_t>> epoch_permutation(uint64_t seed,
                                                                 int64_t epoch) const;
  /// The training image index of global sample g (see the class comment).
  int64_t train_index(uint64_t seed, int64_t g) const;

  const byte_view& train_images() const { return train_images_; }  ///< [60000*784]
  const std::vector<uint8_t>& train_labels() const { return train_labels_; }  ///< [60000]
  const byte_view& test_images() const { return test_images_; }  ///< [10000*784]
  const std::vector<uint8_t>& test_labels() const { return test_labels_; }    ///< [10000]

 private:
  void fill(const byte_view& images, const std::vector<uint8_t>& labels,
            const std::vector<int64_t>& rows_idx, batch& out) const;

  /// The images mapped from the decoded-data cache where it holds them (decoded_cache.hpp).
  byte_view train_images_, test_images_;
  std::vector<uint8_t> train_labels_, test_labels_;
  float lut_[256];  ///< normalise() of every pixel value
  // A step may straddle two epochs and several threads may sample at once: keep the last
  // few permutations, keyed by (seed, epoch), under a mutex.
  mutable std::mutex perm_mutex_;
  mutable std::deque<
      std::pair<std::pair<uint64_t, int64_t>, std::shared_ptr<const std::vector<uint32_t>>>>
      perm_cache_;
};

}  // namespace cohort
