// The paged KV cache (runtime/nn/kv_cache) as tables: which blocks a sequence takes as it
// grows, what it gives back, a full cache refusing without taking anything; and the
// decoder over it (runtime/nn/gpt_decode) against the training forward's next-token logits,
// token by token, prefill and decode mixed in one batch.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>

#include "runtime/core/error.hpp"
#include "runtime/nn/gpt.hpp"
#include "runtime/nn/gpt_decode.hpp"
#include "runtime/nn/kv_cache.hpp"

using namespace cohort;

TEST_CASE("kv cache: blocks are taken as a sequence grows and given back when it ends") {
  nn::kv_blocks blocks(5, 4, 2, 8);  // 5 blocks of 4 positions
  nn::kv_sequence a(blocks), b(blocks);
  struct row {
    nn::kv_sequence* seq;
    int add;                 // positions to reserve and fill
    bool ok;                 // reserve's answer
    std::vector<int> table;  // the sequence's blocks after it
    int free_after;
  };
  const std::vector<row> rows = {
      {&a, 1, true, {0}, 4},           // one position: one block
      {&a, 3, true, {0}, 4},           // fills block 0 exactly
      {&a, 1, true, {0, 1}, 3},        // position 4 opens block 1
      {&b, 9, true, {2, 3, 4}, 0},     // nine positions: three blocks
      {&b, 3, true, {2, 3, 4}, 0},     // 12 fit in three blocks
      {&b, 1, false, {2, 3, 4}, 0},    // a 13th needs a fourth: refused, nothing taken
      {&a, 3, true, {0, 1}, 0},        // a's block 1 still has room
  };
  for (std::size_t i = 0; i < rows.size(); ++i) {
    CAPTURE(i);
    const row& r = rows[i];
    CHECK(r.seq->reserve(r.add) == r.ok);
    if (r.ok) r.seq->advance(r.add);
    CHECK(r.seq->table() == r.table);
    CHECK(blocks.free_blocks() == r.free_after);
  }
  CHECK(a.length() == 8);
  CHECK(b.length() == 12);
  b.release();  // b ends: its three blocks are free, and the lowest is taken first again
  CHECK(blocks.free_blocks() == 3);
  CHECK(b.length() == 0);
  nn::kv_sequence c(blocks);
  CHECK(c.reserve(5));
  CHECK(c.table() == std::vector<int>{2, 3});
  CHECK_THROWS_AS(blocks.give(4), usage_error);   // free already
  CHECK_THROWS_AS(blocks.give(99), usage_error);  // no such block
  CHECK(blocks.blocks_for(0) == 0);
  CHECK(blocks.blocks_for(4) == 1);
  CHECK(blocks.blocks_for(5) == 2);
  CHECK_THROWS_AS(nn::kv_blocks(0, 4, 2, 8), usage_error);
}

TEST_CASE("kv cache: a sequence's destructor gives its blocks back") {
  nn::kv_blocks blocks(3, 2, 1, 4);
  {
    nn::kv_sequence s(blocks);
    REQUIRE(s.reserve(6));
    CHECK(blocks.free_blocks() == 0);
  }
  CHECK(blocks.free_blocks() == 3);
}

namespace {

// The largest relative difference between A and B (over max(|b|, 1)).
double rel_diff(const float* a, const std::vector<float>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < b.size(); ++i)
    worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - b[i]) /
                                std::max(1.0, std::fabs(static_cast<double>(b[i]))));
  return worst;
}

}  // namespace

TEST_CASE("decode over the cache gives the training forward's next-token logits") {
  const int vocab = 13, context = 12;
  nn::gpt m(vocab, context, 2, 2, 16, 2, 5);
  nn::gpt_decoder dec(m);
  nn::kv_blocks blocks(8, 4, 2, 16);
  nn::kv_sequence a(blocks), b(blocks);
  const std::vector<int32_t> ta = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8};
  const std::vector<int32_t> tb = {2, 7, 1, 8, 2, 8, 1, 8, 2, 8, 4, 5};
  std::vector<float> logits;
  // a's prompt (5 tokens) alone, then b's prompt (3) with a's next token: prefill and decode
  // in one batch; then one token of each per call up to the context.
  REQUIRE(a.reserve(5));
  dec.forward({{&a, ta.data(), 5}}, logits);
  CHECK(rel_diff(logits.data(), m.next_logits({ta.begin(), ta.begin() + 5})) < 1e-5);
  REQUIRE(a.reserve(1));
  REQUIRE(b.reserve(3));
  dec.forward({{&a, ta.data() + 5, 1}, {&b, tb.data(), 3}}, logits);
  CHECK(rel_diff(logits.data(), m.next_logits({ta.begin(), ta.begin() + 6})) < 1e-5);
  CHECK(rel_diff(logits.data() + vocab, m.next_logits({tb.begin(), tb.begin() + 3})) < 1e-5);
  for (int n = 3; n < context; ++n) {
    CAPTURE(n);
    std::vector<nn::decode_item> items;
    if (a.length() < context) {
      REQUIRE(a.reserve(1));
      items.push_back({&a, ta.data() + a.length(), 1});
    }
    REQUIRE(b.reserve(1));
    items.push_back({&b, tb.data() + n, 1});
    dec.forward(items, logits);
    std::size_t k = 0;
    if (items.size() == 2) {
      CHECK(rel_diff(logits.data(), m.next_logits({ta.begin(), ta.begin() + a.length()})) < 1e-5);
      k = 1;
    }
    CHECK(rel_diff(logits.data() + k * vocab, m.next_logits({tb.begin(), tb.begin() + n + 1})) <
          1e-5);
  }
  CHECK(a.length() == context);
  CHECK(b.length() == context);
  // Past the context, an id outside the vocabulary, an unreserved position: refused.
  CHECK_THROWS_AS(dec.forward({{&a, ta.data(), 1}}, logits), usage_error);
  nn::kv_sequence c(blocks);
  const int32_t bad = vocab;
  REQUIRE(c.reserve(1));
  CHECK_THROWS_AS(dec.forward({{&c, &bad, 1}}, logits), usage_error);
  const int32_t ok = 1;
  c.advance(1);
  CHECK_THROWS_AS(dec.forward({{&c, &ok, 4}}, logits), usage_error);
}
