// A GPT served across processes (runtime/train/serve_shards): the head and its T x P shards,
// here as threads of one process over the same shared-memory group and file rendezvous the
// processes use, against the whole model's decoder (runtime/nn/gpt_decode) on the same
// steps: prefill and decode in one batch, sequences of several blocks. Tensor-parallel sums
// add the shards' shares in another order than one product does, so the logits agree to
// float rounding, not bit for bit.
#include <doctest/doctest.h>

#include <cmath>
#include <exception>
#include <memory>
#include <thread>
#include <vector>

#include "runtime/core/error.hpp"
#include "runtime/nn/gpt.hpp"
#include "runtime/nn/gpt_decode.hpp"
#include "runtime/nn/kv_cache.hpp"
#include "runtime/train/serve_shards.hpp"
#include "tests/data/temp_dir.hpp"

using namespace cohort;

namespace {

train::loaded_gpt tiny_gpt() {
  train::loaded_gpt g;
  g.shape = {13, 12, 4, 4, 16};  // vocab, context, layers, heads, d_model
  g.model = std::make_unique<nn::gpt>(13, 12, 4, 4, 16, 1, 7);
  return g;
}

double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < b.size(); ++i)
    worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - b[i]) /
                                std::max(1.0, std::fabs(static_cast<double>(b[i]))));
  return worst;
}

// Runs the same steps through the whole model and through a head with LAYOUT's shards:
// two sequences, a prompt each (the second's with the first's next token), then a token of
// each per step up to the context. Returns the largest relative difference of the logits.
double sharded_against_whole(const train::shard_layout& layout) {
  const train::loaded_gpt g = tiny_gpt();
  const nn::gpt_shape& s = g.shape;
  test::temp_dir dir;
  const int kv_blocks = 8, block_tokens = 4;
  std::vector<std::thread> shards;
  std::vector<std::exception_ptr> failed(static_cast<std::size_t>(layout.world()));
  for (int r = 1; r < layout.world(); ++r)
    shards.emplace_back([&, r] {
      try {
        train::shard_options o;
        o.dir = dir.path();
        o.layout = layout;
        o.rank = r;
        o.kv_blocks = kv_blocks;
        o.block_tokens = block_tokens;
        o.timeout_ms = 60000;
        train::run_shard(g, o);
      } catch (...) {
        failed[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  double worst = 0;
  {
    train::shard_head head(train::shard_group(dir.path(), layout, 0, 60000), s, layout);
    nn::gpt_decoder whole(*g.model);
    nn::kv_blocks ids(kv_blocks, block_tokens, 0, s.d_model);  // numbers only, as the engine's
    nn::kv_blocks mine(kv_blocks, block_tokens, s.n_layer, s.d_model);
    nn::kv_sequence ha(ids), hb(ids), wa(mine), wb(mine);
    const std::vector<int32_t> ta = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8};
    const std::vector<int32_t> tb = {2, 7, 1, 8, 2, 8, 1, 8, 2, 8, 4, 5};
    std::vector<float> lh, lw;
    auto step = [&](std::vector<std::pair<int, int>> what) {  // (sequence 0|1, new tokens)
      std::vector<nn::decode_item> hi, wi;
      for (auto [k, n] : what) {
        nn::kv_sequence& h = k == 0 ? ha : hb;
        nn::kv_sequence& w = k == 0 ? wa : wb;
        const std::vector<int32_t>& t = k == 0 ? ta : tb;
        REQUIRE(h.reserve(n));
        REQUIRE(w.reserve(n));
        hi.push_back({&h, t.data() + h.length(), n});
        wi.push_back({&w, t.data() + w.length(), n});
      }
      head.forward(hi, lh);
      whole.forward(wi, lw);
      REQUIRE(lh.size() == lw.size());
      worst = std::max(worst, rel_diff(lh, lw));
    };
    step({{0, 5}});
    step({{0, 1}, {1, 3}});
    while (hb.length() < s.context) {
      if (ha.length() < s.context)
        step({{0, 1}, {1, 1}});
      else
        step({{1, 1}});
    }
    CHECK(ha.length() == s.context);
    CHECK(ha.table() == wa.table());  // the head numbered the blocks as the whole model's cache
  }  // the head tells the shards to stop
  for (auto& t : shards) t.join();
  for (const auto& e : failed)
    if (e) std::rethrow_exception(e);
  return worst;
}

}  // namespace

TEST_CASE("serve shards: tp 2 x pp 2 decode gives the whole model's logits") {
  const double d = sharded_against_whole({2, 2});
  MESSAGE("largest relative difference " << d);
  CHECK(d < 1e-5);
}

TEST_CASE("serve shards: tp 4 alone, and pp 4 alone (one block a stage)") {
  CHECK(sharded_against_whole({4, 1}) < 1e-5);
  CHECK(sharded_against_whole({1, 4}) < 1e-5);
}

TEST_CASE("serve shards: a cut the model does not allow is refused, saying why") {
  const train::loaded_gpt g = tiny_gpt();
  CHECK_THROWS_WITH_AS(train::check_shard_layout(g.shape, {3, 1}),
                       doctest::Contains("must divide the model's 4 heads"), usage_error);
  CHECK_THROWS_WITH_AS(train::check_shard_layout(g.shape, {1, 5}),
                       doctest::Contains("more stages than the model's 4 blocks"), usage_error);
}
