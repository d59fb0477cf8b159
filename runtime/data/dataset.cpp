#include "runtime/data/dataset.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "runtime/core/error.hpp"
#include "runtime/data/fashion_mnist.hpp"
#include "runtime/data/kjv.hpp"

namespace cohort {

namespace {

int64_t parse_i64(const std::map<std::string, std::string>& m, const std::string& key) {
  auto it = m.find(key);
  if (it == m.end()) throw data_error("data position: metadata key '" + key + "' is missing");
  const std::string& s = it->second;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || errno != 0 || end != s.c_str() + s.size())
    throw data_error("data position: metadata key '" + key + "' is not an integer: '" + s + "'");
  return v;
}

}  // namespace

std::map<std::string, std::string> data_position::to_metadata() const {
  return {{"data.dataset", dataset},
          {"data.seed", std::to_string(seed)},
          {"data.step", std::to_string(step)},
          {"data.global_batch", std::to_string(global_batch)},
          {"data.samples_seen", std::to_string(samples_seen)},
          {"data.epoch", std::to_string(epoch)},
          {"data.train_size", std::to_string(train_size)}};
}

data_position data_position::from_metadata(const std::map<std::string, std::string>& m) {
  data_position p;
  auto it = m.find("data.dataset");
  if (it == m.end()) throw data_error("data position: metadata key 'data.dataset' is missing");
  p.dataset = it->second;
  p.seed = static_cast<uint64_t>(parse_i64(m, "data.seed"));
  p.step = parse_i64(m, "data.step");
  p.global_batch = static_cast<int>(parse_i64(m, "data.global_batch"));
  p.samples_seen = parse_i64(m, "data.samples_seen");
  p.epoch = parse_i64(m, "data.epoch");
  p.train_size = parse_i64(m, "data.train_size");
  return p;
}

data_position dataset::position(uint64_t seed, int64_t step, int global_batch) const {
  data_position p;
  p.dataset = name();
  p.seed = seed;
  p.step = step;
  p.global_batch = global_batch;
  p.samples_seen = step * global_batch;
  p.train_size = train_size();
  // Passes over the training data: samples for Fashion, characters (tokens) for KJV.
  p.epoch = p.samples_seen * context() / std::max<int64_t>(1, p.train_size);
  return p;
}

int micro_batch_rows(int micro, int micro_batch, int global_batch) {
  COHORT_CHECK(micro_batch > 0 && global_batch > 0 && micro >= 0);
  const int64_t first = static_cast<int64_t>(micro) * micro_batch;
  COHORT_CHECK(first < global_batch);
  return static_cast<int>(std::min<int64_t>(micro_batch, global_batch - first));
}

void for_each_eval_batch(const dataset& ds, int batch_size, int64_t max_tokens,
                         const std::function<void(const batch&)>& fn) {
  COHORT_CHECK(batch_size > 0);
  const int64_t total = ds.eval_size(max_tokens);
  batch b;
  for (int64_t first = 0; first < total; first += batch_size) {
    const int n = static_cast<int>(std::min<int64_t>(batch_size, total - first));
    ds.eval_batch(first, n, b);
    fn(b);
  }
}

std::unique_ptr<dataset> make_dataset(const config& c) {
  if (c.data.dataset == "fashion_mnist") return std::make_unique<fashion_mnist>(c.data.dir);
  if (c.data.dataset == "kjv")
    return std::make_unique<kjv>(kjv::load_text(c.data.cache_dir), c.model.context);
  throw usage_error("data.dataset: unknown data set '" + c.data.dataset +
                    "' (use fashion_mnist or kjv)");
}

}  // namespace cohort
