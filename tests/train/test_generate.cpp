// `cohort generate`'s parts (runtime/nn/sampling, gpt::next_logits, runtime/train/generate):
// the sampler against closed forms, next_logits against the training forward's loss, the
// loop's determinism, and checkpoints loaded back into the same logits, or refused saying why.
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <random>

#include "runtime/ckpt/checkpoint.hpp"
#include "runtime/ckpt/checkpoint_dir.hpp"
#include "runtime/core/error.hpp"
#include "runtime/nn/gpt.hpp"
#include "runtime/nn/sampling.hpp"
#include "runtime/train/generate.hpp"
#include "tests/data/temp_dir.hpp"

using namespace cohort;
using cohort::nn::sampling;

namespace {

// How often each token is drawn in N draws of seed 7.
std::vector<int> counts(const std::vector<float>& logits, const sampling& s, int n) {
  std::mt19937_64 rng(7);
  std::vector<int> c(logits.size());
  for (int i = 0; i < n; ++i)
    ++c[nn::sample_next(logits.data(), static_cast<int>(logits.size()), s, rng)];
  return c;
}

// A small GPT with its values drawn from SEED.
std::unique_ptr<nn::gpt> small_gpt(uint64_t seed, int vocab = 11, int context = 8) {
  return std::make_unique<nn::gpt>(vocab, context, 2, 2, 16, 2, seed);
}

std::vector<int32_t> ids_of(std::initializer_list<int> v) { return {v.begin(), v.end()}; }

// A checkpoint of M in STEP_DIR as cohort writes one: its parameters by name, cut into
// `stages` shards by block (the pipeline's layout), with metadata EXTRA.
void write_gpt(nn::gpt& m, const std::string& step_dir,
               const std::map<std::string, std::string>& extra, int stages = 1) {
  std::vector<shard_snapshot> shards(static_cast<std::size_t>(stages));
  const std::size_t n = m.parameters().size();
  for (std::size_t i = 0; i < n; ++i) {
    const nn::parameter& p = m.parameters()[i];
    shard_snapshot& s = shards[i * static_cast<std::size_t>(stages) / n];
    s.layout.push_back({p.name, p.value.shape(), s.params.size()});
    const float* v = p.value.data();
    s.params.insert(s.params.end(), v, v + p.value.numel());
  }
  for (int k = 0; k < stages; ++k) {
    shards[k].stage = k;
    shards[k].meta.step = 40;
    shards[k].meta.config_hash = "cfg";
    shards[k].meta.extra = extra;
    shards[k].meta.extra["parallel.pp"] = std::to_string(stages);
  }
  write_training_checkpoint(step_dir, shards);
}

std::map<std::string, std::string> gpt_meta() {
  return {{"model.kind", "gpt"}, {"model.n_head", "2"}, {"data.vocab", "abcdefg .,\n"}};
}

}  // namespace

TEST_CASE("sampling: greedy takes the largest logit, the lowest id on a tie, and skips NaN") {
  std::mt19937_64 rng(1);
  const sampling greedy{0.0f, 1.0f};
  const std::vector<float> a{0.5f, 2.0f, -1.0f, 2.0f};
  CHECK(nn::sample_next(a.data(), 4, greedy, rng) == 1);
  const std::vector<float> b{NAN, -3.0f, INFINITY, -2.0f};  // inf is not finite: impossible
  CHECK(nn::sample_next(b.data(), 4, greedy, rng) == 3);
  CHECK(rng() == std::mt19937_64(1)());  // greedy draws nothing
  // A tiny nucleus keeps only the most likely token, whatever the draw.
  CHECK(counts(a, {1.0f, 1e-6f}, 200) == std::vector<int>{0, 200, 0, 0});
}

TEST_CASE("sampling: draws follow softmax(logits / T), cut to the top-p nucleus") {
  // Probabilities 0.5, 0.3, 0.15, 0.05 at temperature 1.
  const std::vector<float> l{std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  const int n = 40000;
  const auto all = counts(l, {1.0f, 1.0f}, n);
  const double want[] = {0.5, 0.3, 0.15, 0.05};
  for (int i = 0; i < 4; ++i) CHECK(all[i] / double(n) == doctest::Approx(want[i]).epsilon(0.05));
  // top_p 0.75: tokens 0 and 1 only (0.5 falls short, 0.8 reaches it), in the ratio 0.5 : 0.3.
  const auto nucleus = counts(l, {1.0f, 0.75f}, n);
  CHECK(nucleus[2] + nucleus[3] == 0);
  CHECK(nucleus[0] / double(n) == doctest::Approx(0.625).epsilon(0.05));
  // Temperature 2: probabilities proportional to sqrt(p).
  const auto warm = counts(l, {2.0f, 1.0f}, n);
  double z = 0;
  for (double p : want) z += std::sqrt(p);
  for (int i = 0; i < 4; ++i)
    CHECK(warm[i] / double(n) == doctest::Approx(std::sqrt(want[i]) / z).epsilon(0.05));
  CHECK_THROWS_AS(nn::check_sampling({-1.0f, 1.0f}), usage_error);
  CHECK_THROWS_AS(nn::check_sampling({1.0f, 0.0f}), usage_error);
  CHECK_THROWS_AS(nn::check_sampling({1.0f, 1.5f}), usage_error);
  CHECK_NOTHROW(nn::check_sampling({0.0f, 1.0f}));
}

TEST_CASE("gpt::next_logits gives each prefix's next-token logits: their loss is the forward's") {
  auto m = small_gpt(3);
  batch b;
  b.n = 1;
  b.t = 8;
  b.ids = ids_of({1, 4, 2, 9, 0, 7, 7, 3});
  b.targets = ids_of({4, 2, 9, 0, 7, 7, 3, 10});
  const double want = m->eval(b).loss;
  double sum = 0;
  for (int k = 1; k <= b.t; ++k) {
    const std::vector<float> l = m->next_logits({b.ids.begin(), b.ids.begin() + k});
    REQUIRE(l.size() == 11);
    double mx = l[0], z = 0;
    for (float v : l) mx = std::max<double>(mx, v);
    for (float v : l) z += std::exp(v - mx);
    sum += -(l[b.targets[k - 1]] - mx - std::log(z));
  }
  CHECK(sum / b.t == doctest::Approx(want).epsilon(1e-5));
  CHECK_THROWS_AS(m->next_logits({}), usage_error);
  CHECK_THROWS_AS(m->next_logits(ids_of({1, 2, 3, 4, 5, 6, 7, 8, 9})), usage_error);  // > context
  CHECK_THROWS_AS(m->next_logits(ids_of({11})), usage_error);                         // >= vocab
}

TEST_CASE("generate: greedy and seeded runs repeat, a longer text keeps the last context") {
  auto m = small_gpt(5);
  train::generate_options o;
  o.max_tokens = 20;  // prompt 3 + 20 > context 8: the window slides
  o.sample = {0.0f, 1.0f};
  const auto prompt = ids_of({1, 2, 3});
  std::vector<int32_t> streamed;
  const auto g1 = train::generate(*m, prompt, o, [&](int32_t id) { streamed.push_back(id); });
  REQUIRE(g1.size() == 20);
  CHECK(streamed == g1);
  CHECK(train::generate(*m, prompt, o) == g1);
  // Greedy: every token is the argmax of the logits of the (cropped) text before it.
  std::vector<int32_t> text = prompt;
  for (int32_t id : g1) {
    const auto from = text.size() > 8 ? text.end() - 8 : text.begin();
    const auto l = m->next_logits({from, text.end()});
    CHECK(id == std::max_element(l.begin(), l.end()) - l.begin());
    text.push_back(id);
  }
  o.sample = {1.0f, 1.0f};
  o.seed = 11;
  const auto s1 = train::generate(*m, prompt, o);
  CHECK(train::generate(*m, prompt, o) == s1);
  o.seed = 12;
  CHECK(train::generate(*m, prompt, o) != s1);
  o.max_tokens = 0;
  CHECK(train::generate(*m, prompt, o).empty());
  CHECK_THROWS_AS(train::generate(*m, {}, o), usage_error);
}

TEST_CASE("generate: text to ids through the checkpoint's vocabulary, or the byte it lacks") {
  CHECK(train::encode_text("abc\n", "cab\n") == ids_of({2, 0, 1, 3}));
  CHECK_THROWS_WITH_AS(train::encode_text("abc", "abx"),
                       doctest::Contains("byte 0x78 at offset 2 is not in the model's vocabulary"),
                       usage_error);
}

TEST_CASE("generate: a whole-model or pipeline checkpoint loads into the same logits") {
  test::temp_dir dir;
  auto m = small_gpt(9);
  const auto ids = ids_of({3, 1, 4, 1, 5});
  const std::vector<float> want = m->next_logits(ids);
  for (int stages : {1, 2}) {
    CAPTURE(stages);
    const std::string step_dir = dir.file("ck" + std::to_string(stages) + "/step_00000040");
    write_gpt(*m, step_dir, gpt_meta(), stages);
    // The folder itself, or the run's checkpoint directory (its newest).
    for (const std::string& path : {step_dir, dir.file("ck" + std::to_string(stages))}) {
      train::loaded_gpt g = train::load_gpt_checkpoint(path);
      CHECK(g.step == 40);
      CHECK(g.shape.vocab == 11);
      CHECK(g.shape.context == 8);
      CHECK(g.shape.n_layer == 2);
      CHECK(g.shape.n_head == 2);
      CHECK(g.shape.d_model == 16);
      CHECK(g.vocab == "abcdefg .,\n");
      CHECK(g.model->next_logits(ids) == want);
    }
  }
}

TEST_CASE("generate: checkpoints it cannot use are refused, saying why and what to do") {
  test::temp_dir dir;
  auto m = small_gpt(9);
  auto refused = [&](const std::string& tag, std::map<std::string, std::string> meta,
                     const std::string& why, int n_head = 0) {
    CAPTURE(tag);
    const std::string step_dir = dir.file(tag + "/step_00000040");
    write_gpt(*m, step_dir, meta);
    CHECK_THROWS_WITH_AS(train::load_gpt_checkpoint(step_dir, n_head),
                         doctest::Contains(why.c_str()), usage_error);
  };
  auto meta = gpt_meta();
  meta.erase("model.n_head");
  refused("old", meta, "pass --n-head N");
  // An older checkpoint with --n-head given loads.
  CHECK(train::load_gpt_checkpoint(dir.file("old/step_00000040"), 2).shape.n_head == 2);
  refused("wrong-heads", gpt_meta(), "was trained with model.n_head 2", 4);
  meta = gpt_meta();
  meta["model.kind"] = "mlp";
  refused("mlp", meta, "generate needs a GPT");
  meta = gpt_meta();
  meta["parallel.tp"] = "2";
  refused("tp", meta, "tensor-parallel run");
  meta = gpt_meta();
  meta.erase("data.vocab");
  refused("novocab", meta, "no tokenizer");
  CHECK_THROWS_WITH_AS(train::load_gpt_checkpoint(dir.file("nothing")),
                       doctest::Contains("no such folder"), usage_error);
  std::filesystem::create_directories(dir.file("empty"));
  CHECK_THROWS_WITH_AS(train::load_gpt_checkpoint(dir.file("empty")),
                       doctest::Contains("CKPT: no complete checkpoint"), usage_error);
}
