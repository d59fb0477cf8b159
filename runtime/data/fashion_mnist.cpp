#include "runtime/data/fashion_mnist.hpp"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <numeric>

#include "runtime/core/error.hpp"
#include "runtime/core/rng.hpp"
#include "runtime/data/decoded_cache.hpp"

namespace cohort {

namespace {

// IDX files hold at most a few hundred MB here; a larger header is corruption, and
// refusing it keeps a bad file from asking for an absurd allocation.
constexpr int64_t max_idx_bytes = int64_t{1} << 31;

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

// Closes the gzFile on every path out of read_idx_gz.
struct gz_closer {
  gzFile f;
  ~gz_closer() {
    if (f) gzclose(f);
  }
};

// Reads exactly n bytes or explains why not.
void gz_read_exact(gzFile f, const std::string& path, uint8_t* dst, int64_t n, const char* what) {
  int64_t done = 0;
  while (done < n) {
    const unsigned chunk = static_cast<unsigned>(std::min<int64_t>(n - done, 1 << 30));
    const int got = gzread(f, dst + done, chunk);
    if (got < 0) {
      int code = 0;
      const char* msg = gzerror(f, &code);
      throw data_error(path + ": corrupt gzip data while reading the " + what + " (" +
                       (msg ? msg : "zlib error") + ")");
    }
    if (got == 0) {
      throw data_error(path + ": file is truncated: the " + what + " needs " + std::to_string(n) +
                       " bytes, only " + std::to_string(done) +
                       " are there (reinstall dataset-fashion-mnist)");
    }
    done += got;
  }
}

std::string fmt_float(float v) {
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

}  // namespace

idx_file read_idx_gz(const std::string& path, int expected_dims) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    throw data_error("Fashion-MNIST file " + path +
                     " not found: install the data set with `apt-get install "
                     "dataset-fashion-mnist` or point data.dir at a folder holding it");
  }
  gz_closer g{gzopen(path.c_str(), "rb")};
  if (!g.f) throw data_error(path + ": cannot open: " + std::strerror(errno));
  gzbuffer(g.f, 1 << 17);

  uint8_t head[4];
  gz_read_exact(g.f, path, head, 4, "IDX magic number");
  const uint32_t magic =
      (uint32_t{head[0]} << 24) | (uint32_t{head[1]} << 16) | (uint32_t{head[2]} << 8) | head[3];
  const uint32_t want = 0x00000800u | static_cast<uint32_t>(expected_dims);
  if (magic != want) {
    throw data_error(path + ": bad IDX magic number " + hex32(magic) + " (expected " + hex32(want) +
                     ": unsigned bytes in " + std::to_string(expected_dims) + " dimensions)");
  }
  idx_file out;
  int64_t total = 1;
  for (int d = 0; d < expected_dims; ++d) {
    uint8_t b[4];
    gz_read_exact(g.f, path, b, 4, "IDX header");
    const int64_t dim = (int64_t{b[0]} << 24) | (int64_t{b[1]} << 16) | (int64_t{b[2]} << 8) | b[3];
    out.dims.push_back(dim);
    total *= std::max<int64_t>(dim, 1);
    if (total > max_idx_bytes) {
      throw data_error(path + ": IDX header announces more than " + std::to_string(max_idx_bytes) +
                       " bytes; the file is corrupt");
    }
  }
  for (int64_t dim : out.dims)
    if (dim == 0) total = 0;
  out.data.resize(static_cast<size_t>(total));
  gz_read_exact(g.f, path, out.data.data(), total, "IDX payload");
  uint8_t extra;
  const int more = gzread(g.f, &extra, 1);
  if (more < 0) {
    int code = 0;
    const char* msg = gzerror(g.f, &code);
    throw data_error(path + ": corrupt gzip data after the IDX payload (" +
                     (msg ? msg : "zlib error") + ")");
  }
  if (more > 0) {
    throw data_error(path + ": unexpected data after the " + std::to_string(total) +
                     "-byte IDX payload; the file is corrupt");
  }
  return out;
}

fashion_mnist::fashion_mnist(const std::string& dir) {
  auto load = [&](const std::string& file, int ndims, const std::vector<int64_t>& dims) {
    const std::string path = (std::filesystem::path(dir) / file).string();
    cached_idx f = read_idx_cached(path, ndims, data_cache_dir());
    if (f.dims != dims) {
      std::string got, want;
      for (int64_t d : f.dims) got += (got.empty() ? "" : "x") + std::to_string(d);
      for (int64_t d : dims) want += (want.empty() ? "" : "x") + std::to_string(d);
      throw data_error(path + ": IDX dimensions are " + got + ", expected " + want);
    }
    return std::move(f.data);
  };
  auto check_labels = [&](const std::vector<uint8_t>& labels, const std::string& file) {
    for (size_t i = 0; i < labels.size(); ++i) {
      if (labels[i] >= classes) {
        throw data_error((std::filesystem::path(dir) / file).string() + ": label " +
                         std::to_string(labels[i]) + " at index " + std::to_string(i) +
                         " is not a class 0..9");
      }
    }
  };
  // Small files first: a broken install is reported before 47 MB are decompressed.
  const auto bytes = [](const byte_view& v) { return std::vector<uint8_t>(v.begin(), v.end()); };
  train_labels_ = bytes(load("train-labels-idx1-ubyte.gz", 1, {train_count}));
  check_labels(train_labels_, "train-labels-idx1-ubyte.gz");
  test_labels_ = bytes(load("t10k-labels-idx1-ubyte.gz", 1, {test_count}));
  check_labels(test_labels_, "t10k-labels-idx1-ubyte.gz");
  test_images_ = load("t10k-images-idx3-ubyte.gz", 3, {test_count, rows, cols});
  train_images_ = load("train-images-idx3-ubyte.gz", 3, {train_count, rows, cols});
  for (int p = 0; p < 256; ++p) lut_[p] = normalise(static_cast<uint8_t>(p));
}

std::shared_ptr<const std::vector<uint32_t>> fashion_mnist::epoch_permutation(uint64_t seed,
                                                                              int64_t epoch) const {
  const auto key = std::make_pair(seed, epoch);
  {
    std::lock_guard<std::mutex> lock(perm_mutex_);
    for (const auto& e : perm_cache_)
      if (e.first == key) return e.second;
  }
  // Computed outside the lock: two threads may both compute the same permutation, which is
  // harmless because it is a pure function of (seed, epoch).
  auto perm = std::make_shared<std::vector<uint32_t>>(train_count);
  std::iota(perm->begin(), perm->end(), 0u);
  rng r(hash_coords(seed, static_cast<uint64_t>(epoch), permutation_stream));
  for (int64_t i = train_count - 1; i > 0; --i) {
    const uint64_t j = r.below(static_cast<uint64_t>(i) + 1);
    std::swap((*perm)[i], (*perm)[j]);
  }
  std::lock_guard<std::mutex> lock(perm_mutex_);
  for (const auto& e : perm_cache_)
    if (e.first == key) return e.second;
  perm_cache_.emplace_back(key, perm);
  // A step straddles at most two epochs; a few extra entries cover concurrent callers.
  while (perm_cache_.size() > 4) perm_cache_.pop_front();
  return perm;
}

int64_t fashion_mnist::train_index(uint64_t seed, int64_t g) const {
  COHORT_CHECK(g >= 0);
  return (*epoch_permutation(seed, g / train_count))[g % train_count];
}

void fashion_mnist::fill(const byte_view& images, const std::vector<uint8_t>& labels,
                         const std::vector<int64_t>& rows_idx, batch& out) const {
  const int n = static_cast<int>(rows_idx.size());
  out.n = n;
  out.t = 1;
  out.features = pixels;
  out.x.resize(static_cast<size_t>(n) * pixels);
  out.targets.resize(n);
  out.ids.clear();
  for (int i = 0; i < n; ++i) {
    const uint8_t* src = images.data() + rows_idx[i] * pixels;
    float* dst = out.x.data() + static_cast<size_t>(i) * pixels;
    for (int p = 0; p < pixels; ++p) dst[p] = lut_[src[p]];
    out.targets[i] = labels[rows_idx[i]];
  }
}

void fashion_mnist::train_micro_batch(uint64_t seed, int64_t step, int micro, int micro_batch,
                                      int global_batch, batch& out) const {
  COHORT_CHECK(step >= 0);
  const int n = micro_batch_rows(micro, micro_batch, global_batch);
  const int64_t g0 = step * global_batch + static_cast<int64_t>(micro) * micro_batch;
  std::vector<int64_t> idx(n);
  std::shared_ptr<const std::vector<uint32_t>> perm;
  int64_t perm_epoch = -1;
  for (int j = 0; j < n; ++j) {
    const int64_t g = g0 + j;
    if (g / train_count != perm_epoch) {
      perm_epoch = g / train_count;
      perm = epoch_permutation(seed, perm_epoch);
    }
    idx[j] = (*perm)[g % train_count];
  }
  fill(train_images_, train_labels_, idx, out);
}

void fashion_mnist::eval_batch(int64_t first, int n, batch& out) const {
  COHORT_CHECK(first >= 0 && n >= 0 && first + n <= test_count);
  std::vector<int64_t> idx(n);
  std::iota(idx.begin(), idx.end(), first);
  fill(test_images_, test_labels_, idx, out);
}

std::map<std::string, std::string> fashion_mnist::preprocessing_metadata() const {
  return {{"data.input", "(pixel/255 - norm_mean) / norm_std, pixels row-major 28x28"},
          {"data.norm_mean", fmt_float(norm_mean)},
          {"data.norm_std", fmt_float(norm_std)},
          {"data.features", std::to_string(pixels)},
          {"data.classes", std::to_string(classes)}};
}

}  // namespace cohort
