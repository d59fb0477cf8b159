// Training checkpoints: PyTorch parameter names, optimizer state under optim.<slot>.<param>,
// metadata round trip, and refusal of mismatched models without touching the buffers.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "runtime/ckpt/checkpoint.hpp"
#include "runtime/core/error.hpp"
#include "temp_dir.hpp"

using cohort::checkpoint_error;
using cohort::dtype;
using cohort::safetensors_file;
using cohort::test::temp_dir;

namespace {

struct tiny_model {
  std::vector<float> w1, b1, w2, b2, m_w1, m_b1, m_w2, m_b2, v_w1, v_b1, v_w2, v_b2;
  explicit tiny_model(float base) {
    auto fill = [&](std::vector<float>& v, size_t n, float k) {
      v.resize(n);
      for (size_t i = 0; i < n; ++i) v[i] = base + k + 0.001f * static_cast<float>(i);
    };
    fill(w1, 12, 1), fill(b1, 3, 2), fill(w2, 6, 3), fill(b2, 2, 4);
    fill(m_w1, 12, 5), fill(m_b1, 3, 6), fill(m_w2, 6, 7), fill(m_b2, 2, 8);
    fill(v_w1, 12, 9), fill(v_b1, 3, 10), fill(v_w2, 6, 11), fill(v_b2, 2, 12);
  }
  std::vector<cohort::tensor_view> params() const {
    return {{"fc1.weight", {3, 4}, w1.data()},
            {"fc1.bias", {3}, b1.data()},
            {"fc2.weight", {2, 3}, w2.data()},
            {"fc2.bias", {2}, b2.data()}};
  }
  std::vector<cohort::optimizer_state_view> state() const {
    return {{"exp_avg", {"fc1.weight", {3, 4}, m_w1.data()}},
            {"exp_avg", {"fc1.bias", {3}, m_b1.data()}},
            {"exp_avg", {"fc2.weight", {2, 3}, m_w2.data()}},
            {"exp_avg", {"fc2.bias", {2}, m_b2.data()}},
            {"exp_avg_sq", {"fc1.weight", {3, 4}, v_w1.data()}},
            {"exp_avg_sq", {"fc1.bias", {3}, v_b1.data()}},
            {"exp_avg_sq", {"fc2.weight", {2, 3}, v_w2.data()}},
            {"exp_avg_sq", {"fc2.bias", {2}, v_b2.data()}}};
  }
  std::vector<cohort::tensor_target> param_targets() {
    return {{"fc1.weight", {3, 4}, w1.data()},
            {"fc1.bias", {3}, b1.data()},
            {"fc2.weight", {2, 3}, w2.data()},
            {"fc2.bias", {2}, b2.data()}};
  }
  std::vector<cohort::optimizer_state_target> state_targets() {
    return {{"exp_avg", {"fc1.weight", {3, 4}, m_w1.data()}},
            {"exp_avg", {"fc1.bias", {3}, m_b1.data()}},
            {"exp_avg", {"fc2.weight", {2, 3}, m_w2.data()}},
            {"exp_avg", {"fc2.bias", {2}, m_b2.data()}},
            {"exp_avg_sq", {"fc1.weight", {3, 4}, v_w1.data()}},
            {"exp_avg_sq", {"fc1.bias", {3}, v_b1.data()}},
            {"exp_avg_sq", {"fc2.weight", {2, 3}, v_w2.data()}},
            {"exp_avg_sq", {"fc2.bias", {2}, v_b2.data()}}};
  }
  bool operator==(const tiny_model& o) const {
    return w1 == o.w1 && b1 == o.b1 && w2 == o.w2 && b2 == o.b2 && m_w1 == o.m_w1 &&
           m_b1 == o.m_b1 && m_w2 == o.m_w2 && m_b2 == o.m_b2 && v_w1 == o.v_w1 && v_b1 == o.v_b1 &&
           v_w2 == o.v_w2 && v_b2 == o.v_b2;
  }
};

cohort::training_metadata sample_meta() {
  cohort::training_metadata m;
  m.step = 250;
  m.config_hash = std::string(64, 'c');
  m.optimizer = "adamw";
  m.extra = {{"data.dataset", "fashion_mnist"},
             {"data.step", "250"},
             {"data.norm_mean", "0.286"},
             {"data.norm_std", "0.353"},
             {"model.kind", "mlp"}};
  return m;
}

}  // namespace

TEST_CASE("checkpoint: parameters keep PyTorch names, optimizer state is optim.<slot>.<param>") {
  temp_dir dir;
  const std::string path = dir.file("step-250.safetensors");
  const tiny_model saved(0.0f);
  cohort::save_training_checkpoint(path, saved.params(), saved.state(), sample_meta());

  const auto f = safetensors_file::read(path);
  std::vector<std::string> names;
  for (const auto& t : f.tensors()) names.push_back(t.name);
  std::sort(names.begin(), names.end());
  const std::vector<std::string> want{"fc1.bias",
                                      "fc1.weight",
                                      "fc2.bias",
                                      "fc2.weight",
                                      "optim.exp_avg.fc1.bias",
                                      "optim.exp_avg.fc1.weight",
                                      "optim.exp_avg.fc2.bias",
                                      "optim.exp_avg.fc2.weight",
                                      "optim.exp_avg_sq.fc1.bias",
                                      "optim.exp_avg_sq.fc1.weight",
                                      "optim.exp_avg_sq.fc2.bias",
                                      "optim.exp_avg_sq.fc2.weight"};
  CHECK(names == want);
  CHECK(f.metadata().at("format") == "cohort.training_checkpoint");
  CHECK(f.metadata().at("format_version") == "1");
  CHECK(f.metadata().at("step") == "250");
  CHECK(f.metadata().at("optimizer") == "adamw");
  CHECK(f.find("optim.exp_avg_sq.fc1.weight")->shape == std::vector<int64_t>{3, 4});
  CHECK(f.find("fc2.weight")->type == dtype::f32);
}

TEST_CASE("checkpoint: round trip restores every buffer bit for bit and the metadata") {
  temp_dir dir;
  const std::string path = dir.file("c.safetensors");
  const tiny_model saved(0.5f);
  cohort::save_training_checkpoint(path, saved.params(), saved.state(), sample_meta());
  tiny_model loaded(-9.0f);
  CHECK_FALSE(loaded == saved);
  const auto meta =
      cohort::load_training_checkpoint(path, loaded.param_targets(), loaded.state_targets());
  CHECK(loaded == saved);
  CHECK(meta.step == 250);
  CHECK(meta.config_hash == std::string(64, 'c'));
  CHECK(meta.optimizer == "adamw");
  CHECK(meta.extra == sample_meta().extra);

  const auto peek = cohort::read_training_metadata(path);
  CHECK(peek.step == 250);
  CHECK(peek.extra.at("data.norm_std") == "0.353");
}

TEST_CASE("checkpoint: a different model is refused and nothing is overwritten") {
  temp_dir dir;
  const std::string path = dir.file("c.safetensors");
  const tiny_model saved(0.5f);
  cohort::save_training_checkpoint(path, saved.params(), saved.state(), sample_meta());

  tiny_model other(7.0f);
  const tiny_model pristine(7.0f);
  auto targets = other.param_targets();
  targets[2].shape = {3, 2};  // fc2.weight transposed
  CHECK_THROWS_WITH_AS(cohort::load_training_checkpoint(path, targets, other.state_targets()),
                       doctest::Contains("'fc2.weight' has shape [2, 3], expected [3, 2]"),
                       checkpoint_error);
  CHECK(other == pristine);

  // Loading without the optimizer state the file holds: the file does not match the model.
  CHECK_THROWS_WITH_AS(cohort::load_training_checkpoint(path, other.param_targets(), {}),
                       doctest::Contains("unexpected tensor 'optim.exp_avg.fc1.bias'"),
                       checkpoint_error);
  CHECK(other == pristine);

  // A file saved without optimizer state cannot restore one.
  const std::string params_only = dir.file("p.safetensors");
  cohort::save_training_checkpoint(params_only, saved.params(), {}, sample_meta());
  CHECK_THROWS_WITH_AS(
      cohort::load_training_checkpoint(params_only, other.param_targets(), other.state_targets()),
      doctest::Contains("'optim.exp_avg.fc1.weight' is missing"), checkpoint_error);
  CHECK(other == pristine);
}

TEST_CASE("checkpoint: reserved names and foreign files") {
  temp_dir dir;
  const std::string path = dir.file("c.safetensors");
  const tiny_model m(0.0f);
  auto meta = sample_meta();
  meta.extra["step"] = "1";
  CHECK_THROWS_WITH_AS(cohort::save_training_checkpoint(path, m.params(), m.state(), meta),
                       doctest::Contains("'step' is reserved"), checkpoint_error);
  auto params = m.params();
  params[0].name = "optim.x";
  CHECK_THROWS_WITH_AS(cohort::save_training_checkpoint(path, params, {}, sample_meta()),
                       doctest::Contains("reserved for optimizer state"), checkpoint_error);

  // A plain safetensors file (no format marker) is not a training checkpoint.
  cohort::write_safetensors(path, m.params(), {{"step", "3"}});
  tiny_model t(0.0f);
  CHECK_THROWS_WITH_AS(cohort::load_training_checkpoint(path, t.param_targets(), {}),
                       doctest::Contains("not a cohort training checkpoint"), checkpoint_error);
  // A future layout version is refused by name.
  cohort::write_safetensors(path, m.params(),
                            {{"format", "cohort.training_checkpoint"},
                             {"format_version", "2"},
                             {"step", "3"},
                             {"config_hash", ""},
                             {"optimizer", ""}});
  CHECK_THROWS_WITH_AS(cohort::read_training_metadata(path),
                       doctest::Contains("format_version 2 is not supported"), checkpoint_error);
}
