// GPT pipeline stages: the partition (closed-form and brute-force optima, explicit counts,
// errors), stage parameters equal to the full gpt's by name and value, and chained stages
// reproducing gpt::forward_backward bit for bit - in sequence, with micro-batches in
// flight under GPipe and 1F1B orders, and with activation checkpointing.
#include <doctest/doctest.h>

#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/core/error.hpp"
#include "runtime/core/rng.hpp"
#include "runtime/nn/gpt.hpp"
#include "runtime/nn/gpt_stage.hpp"
#include "tests/nn/grad_check.hpp"

using namespace cohort;
using namespace cohort::nn;
using cohort::nn::testing::lm_batch;

namespace {

// The small test GPT: vocab 65, context 16, 4 blocks, d_model 32, 2 heads.
const gpt_shape k_shape{65, 16, 4, 2, 32};
constexpr uint64_t k_seed = 1234;

/// Closed-form parameter counts of a GPT with d_model C: a block has ln_1, ln_2 (2C each),
/// c_attn (3C*C + 3C), attn.c_proj (C*C + C), mlp.c_fc (4C*C + 4C), mlp.c_proj (4C*C + C).
int64_t block_params(int64_t C) { return 12 * C * C + 13 * C; }
int64_t embedding_params(const gpt_shape& s) { return int64_t(s.vocab + s.context) * s.d_model; }
int64_t head_params(const gpt_shape& s) {
  return 2 * int64_t(s.d_model) + int64_t(s.vocab) * s.d_model;
}

std::vector<int> counts_of(const std::vector<stage_range>& r) {
  std::vector<int> c;
  for (const stage_range& s : r) c.push_back(s.layers());
  return c;
}

/// Largest stage (closed-form counts) of the cut given by `counts`.
int64_t largest_stage(const gpt_shape& s, const std::vector<int>& counts) {
  int64_t worst = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    int64_t n = counts[i] * block_params(s.d_model);
    if (i == 0) n += embedding_params(s);
    if (i + 1 == counts.size()) n += head_params(s);
    worst = std::max(worst, n);
  }
  return worst;
}

/// Every composition of `layers` into `parts` positive counts, in lexicographic order.
void compositions(int layers, int parts, std::vector<int>& cur,
                  const std::function<void(const std::vector<int>&)>& f) {
  if (parts == 1) {
    cur.push_back(layers);
    f(cur);
    cur.pop_back();
    return;
  }
  for (int c = 1; c <= layers - (parts - 1); ++c) {
    cur.push_back(c);
    compositions(layers - c, parts - 1, cur, f);
    cur.pop_back();
  }
}

/// Four micro-batches of 2 sequences; one is shorter than the context.
std::vector<batch> micro_batches() {
  return {lm_batch(2, 16, 65, 11), lm_batch(2, 16, 65, 12), lm_batch(2, 9, 65, 13),
          lm_batch(2, 16, 65, 14)};
}

using stages_t = std::vector<std::unique_ptr<gpt_stage>>;

stages_t make_stages(const std::vector<stage_range>& cut, std::function<int(int)> slots,
                     bool checkpointing, int max_batch = 2) {
  stages_t st;
  for (std::size_t s = 0; s < cut.size(); ++s) {
    gpt_stage_options o;
    o.slots = slots(static_cast<int>(s));
    o.max_batch = max_batch;
    o.activation_checkpointing = checkpointing;
    st.push_back(std::make_unique<gpt_stage>(k_shape, cut[s], o, k_seed));
  }
  return st;
}

/// One step of a schedule: forward or backward of micro-batch m on a stage.
struct op {
  bool fwd;
  int m;
};
using schedule = std::vector<std::vector<op>>;  // per stage, in execution order

/// Every micro-batch forward and backward on each stage before the next micro-batch.
schedule sequential_order(int P, int M) {
  schedule s(P);
  for (int p = 0; p < P; ++p)
    for (int m = 0; m < M; ++m) {
      s[p].push_back({true, m});
      s[p].push_back({false, m});
    }
  return s;
}

/// GPipe: all forwards, then all backwards (ascending, so each stage accumulates its
/// gradients in the order the full model does).
schedule gpipe_order(int P, int M) {
  schedule s(P);
  for (int p = 0; p < P; ++p) {
    for (int m = 0; m < M; ++m) s[p].push_back({true, m});
    for (int m = 0; m < M; ++m) s[p].push_back({false, m});
  }
  return s;
}

/// 1F1B (PipeDream-Flush): stage p warms up with P - p - 1 forwards, then alternates one
/// forward and one backward, then drains the remaining backwards; at most P - p in flight.
schedule one_f_one_b_order(int P, int M) {
  schedule s(P);
  for (int p = 0; p < P; ++p) {
    const int warm = std::min(P - p - 1, M);
    int f = 0, b = 0;
    for (; f < warm; ++f) s[p].push_back({true, f});
    while (f < M) {
      s[p].push_back({true, f++});
      s[p].push_back({false, b++});
    }
    while (b < M) s[p].push_back({false, b++});
  }
  return s;
}

/// Runs `order` over the stages as a dependency-driven simulation of P workers:
/// forward m on stage p waits for stage p-1's output of m, backward m for stage p+1's input
/// gradient of m. Messages are copied, as a transport would. Each forward takes the
/// lowest free slot, so a stage's slot count bounds what the schedule may keep in flight.
/// Returns the loss of every micro-batch; the largest number in flight per stage goes to
/// `peak` when given.
std::vector<float> run(stages_t& st, const std::vector<batch>& mbs, const schedule& order,
                       std::vector<int>* peak = nullptr) {
  const int P = static_cast<int>(st.size()), M = static_cast<int>(mbs.size());
  const float scale = 1.0f / static_cast<float>(M);
  std::vector<std::map<int, std::vector<float>>> acts(P), grads(P);  // sent by stage p
  std::vector<std::map<int, int>> slot_of(P);
  std::vector<std::size_t> next(P, 0);
  std::vector<int> in_flight(P, 0);
  if (peak) peak->assign(P, 0);
  std::vector<float> losses(M, 0.0f);
  for (bool progress = true; progress;) {
    progress = false;
    for (int p = 0; p < P; ++p) {
      if (next[p] == order[p].size()) continue;
      const op o = order[p][next[p]];
      const int64_t n = static_cast<int64_t>(mbs[o.m].n) * mbs[o.m].t * k_shape.d_model;
      if (o.fwd) {
        if (p > 0 && !acts[p - 1].count(o.m)) continue;
        int slot = 0;
        while (slot < st[p]->options().slots && st[p]->busy(slot)) ++slot;
        REQUIRE(slot < st[p]->options().slots);
        slot_of[p][o.m] = slot;
        const stage_forward r =
            st[p]->forward(slot, mbs[o.m], p > 0 ? acts[p - 1][o.m].data() : nullptr);
        if (p + 1 < P)
          acts[p][o.m].assign(r.out, r.out + n);
        else
          losses[o.m] = r.loss;
        if (peak) (*peak)[p] = std::max((*peak)[p], ++in_flight[p]);
      } else {
        if (p + 1 < P && !grads[p + 1].count(o.m)) continue;
        const float* d_in =
            st[p]->backward(slot_of[p][o.m], p + 1 < P ? grads[p + 1][o.m].data() : nullptr, scale);
        if (p > 0) grads[p][o.m].assign(d_in, d_in + n);
        --in_flight[p];
      }
      ++next[p];
      progress = true;
    }
  }
  for (int p = 0; p < P; ++p) REQUIRE(next[p] == order[p].size());  // no deadlock
  return losses;
}

/// The reference: the full gpt's forward_backward over the micro-batches with scale 1/M.
struct reference {
  std::unique_ptr<gpt> model;
  std::vector<float> losses;
};

reference full_gpt(const std::vector<batch>& mbs) {
  reference r;
  r.model = std::make_unique<gpt>(k_shape.vocab, k_shape.context, k_shape.n_layer, k_shape.n_head,
                                  k_shape.d_model, 2, k_seed);
  r.model->zero_grad();
  for (const batch& b : mbs)
    r.losses.push_back(r.model->forward_backward(b, 1.0f / static_cast<float>(mbs.size())));
  return r;
}

/// Every stage parameter's gradient equals the full model's bit for bit, and the stages
/// cover every parameter of the model once.
void check_same_grads(const stages_t& st, const gpt& full) {
  std::size_t covered = 0;
  for (const auto& s : st)
    for (const parameter& p : s->parameters()) {
      INFO("parameter " << p.name);
      const parameter& q = full.param(p.name);
      REQUIRE(p.grad.numel() == q.grad.numel());
      CHECK(std::memcmp(p.grad.data(), q.grad.data(), p.grad.bytes()) == 0);
      ++covered;
    }
  CHECK(covered == full.parameters().size());
}

}  // namespace

TEST_CASE("gpt_param_specs is the gpt's parameter list: names, shapes, order, counts") {
  gpt g(k_shape.vocab, k_shape.context, k_shape.n_layer, k_shape.n_head, k_shape.d_model, 1, 1);
  const std::vector<gpt_param_spec> specs = gpt_param_specs(k_shape);
  REQUIRE(specs.size() == g.parameters().size());
  for (std::size_t i = 0; i < specs.size(); ++i) {
    CHECK(specs[i].name == g.parameters()[i].name);
    CHECK(specs[i].shape == g.parameters()[i].value.shape());
  }
  const int64_t C = k_shape.d_model;
  CHECK(g.num_params() ==
        embedding_params(k_shape) + k_shape.n_layer * block_params(C) + head_params(k_shape));
  CHECK(stage_param_count(k_shape, {0, 4, true, true}) == g.num_params());
  CHECK(stage_param_count(k_shape, {1, 3, false, false}) == 2 * block_params(C));
  CHECK(stage_param_count(k_shape, {0, 1, true, false}) ==
        embedding_params(k_shape) + block_params(C));
  CHECK(stage_param_count(k_shape, {3, 4, false, true}) == head_params(k_shape) + block_params(C));
  CHECK_THROWS_AS(gpt_param_specs({65, 16, 4, 3, 32}), usage_error);  // 32 % 3 != 0
}

TEST_CASE("partition_gpt: equal blocks split evenly, embedding and head counted") {
  // Here the embedding (2592) and head (2144) are small next to a block (12704).
  REQUIRE(embedding_params(k_shape) < block_params(32));
  CHECK(counts_of(partition_gpt(k_shape, 1)) == std::vector<int>{4});
  CHECK(counts_of(partition_gpt(k_shape, 2)) == std::vector<int>{2, 2});
  CHECK(counts_of(partition_gpt(k_shape, 4)) == std::vector<int>{1, 1, 1, 1});
  gpt_shape eight = k_shape;
  eight.n_layer = 8;
  CHECK(counts_of(partition_gpt(eight, 4)) == std::vector<int>{2, 2, 2, 2});
  // 5 blocks in 2: the embedding is larger than the head, so stage 0 takes 2 blocks.
  gpt_shape five = k_shape;
  five.n_layer = 5;
  REQUIRE(embedding_params(five) > head_params(five));
  CHECK(counts_of(partition_gpt(five, 2)) == std::vector<int>{2, 3});
  // A vocabulary of 800 makes the embedding (26112) and head (25664) about two blocks
  // each: 6 blocks in 3 stages is best as 1 | 4 | 1 (largest stage 4 blocks = 50816; 2|2|2
  // would be 2 blocks + embedding = 51520, 1|3|2 2 blocks + head = 51072).
  gpt_shape wide{800, 16, 6, 2, 32};
  const std::vector<stage_range> cut = partition_gpt(wide, 3);
  CHECK(counts_of(cut) == std::vector<int>{1, 4, 1});
  CHECK(largest_stage(wide, counts_of(cut)) == 4 * block_params(32));
  // Ranges are contiguous; the embedding sits on stage 0 and the head on the last.
  CHECK(cut[0] == stage_range{0, 1, true, false});
  CHECK(cut[1] == stage_range{1, 5, false, false});
  CHECK(cut[2] == stage_range{5, 6, false, true});
}

TEST_CASE("partition_gpt: the exact optimum, ties to the fewest blocks early, vs brute force") {
  // 9 blocks in 4 stages: some stage needs 3 blocks, and 1|3|3|2, 2|3|2|2, 2|2|3|2 ... all
  // reach that; the rule gives early stages the fewest blocks.
  gpt_shape nine = k_shape;
  nine.n_layer = 9;
  CHECK(counts_of(partition_gpt(nine, 4)) == std::vector<int>{1, 3, 3, 2});
  for (const gpt_shape& s : {gpt_shape{65, 16, 7, 2, 32}, gpt_shape{800, 16, 7, 2, 32},
                             gpt_shape{3000, 64, 9, 2, 32}, gpt_shape{300, 8, 10, 4, 16}}) {
    for (int P = 1; P <= s.n_layer; ++P) {
      int64_t best = -1;
      std::vector<int> first_best;
      std::vector<int> cur;
      compositions(s.n_layer, P, cur, [&](const std::vector<int>& c) {
        const int64_t v = largest_stage(s, c);
        if (best < 0 || v < best) {
          best = v;
          first_best = c;
        }
      });
      INFO("vocab " << s.vocab << " layers " << s.n_layer << " stages " << P);
      const std::vector<stage_range> cut = partition_gpt(s, P);
      REQUIRE(cut.size() == static_cast<std::size_t>(P));
      CHECK(largest_stage(s, counts_of(cut)) == best);
      CHECK(counts_of(cut) == first_best);  // compositions come in lexicographic order
      int64_t total = 0;
      for (const stage_range& r : cut) total += stage_param_count(s, r);
      CHECK(total == stage_param_count(s, {0, s.n_layer, true, true}));
    }
  }
}

TEST_CASE("partition_gpt: explicit layer counts and errors") {
  const std::vector<stage_range> cut = partition_gpt(k_shape, 2, {1, 3});
  REQUIRE(cut.size() == 2);
  CHECK(cut[0] == stage_range{0, 1, true, false});
  CHECK(cut[1] == stage_range{1, 4, false, true});
  CHECK(counts_of(partition_gpt(k_shape, 3, {2, 1, 1})) == std::vector<int>{2, 1, 1});
  CHECK_THROWS_AS(partition_gpt(k_shape, 0), usage_error);
  CHECK_THROWS_AS(partition_gpt(k_shape, 5), usage_error);             // more stages than blocks
  CHECK_THROWS_AS(partition_gpt(k_shape, 2, {1, 2}), usage_error);     // sums to 3
  CHECK_THROWS_AS(partition_gpt(k_shape, 2, {4, 0}), usage_error);     // an empty stage
  CHECK_THROWS_AS(partition_gpt(k_shape, 2, {1, 1, 2}), usage_error);  // 3 counts, 2 stages
  CHECK_THROWS_AS(partition_gpt(k_shape, 3, {5, -1, 0}), usage_error);
}

TEST_CASE("stage parameters: the full gpt's names, order, blocks and initial values") {
  gpt g(k_shape.vocab, k_shape.context, k_shape.n_layer, k_shape.n_head, k_shape.d_model, 1,
        k_seed);
  for (int P : {1, 2, 3}) {
    INFO(P << " stages");
    stages_t st = make_stages(
        partition_gpt(k_shape, P), [](int) { return 1; }, false);
    std::vector<std::string> names, block_names;
    for (const auto& s : st) {
      for (const parameter& p : s->parameters()) {
        names.push_back(p.name);
        const parameter& q = g.param(p.name);
        INFO(p.name);
        CHECK(p.value.shape() == q.value.shape());
        CHECK(std::memcmp(p.value.data(), q.value.data(), p.value.bytes()) == 0);
      }
      for (const block_info& b : s->blocks()) block_names.push_back(b.name);
    }
    std::vector<std::string> want, want_blocks;
    for (const parameter& p : g.parameters()) want.push_back(p.name);
    for (const block_info& b : g.blocks()) want_blocks.push_back(b.name);
    CHECK(names == want);
    CHECK(block_names == want_blocks);
  }
  // Another seed gives other values, as for gpt; init_like_gpt restores them.
  stages_t st = make_stages(
      partition_gpt(k_shape, 2), [](int) { return 1; }, false);
  gpt_stage other(k_shape, st[1]->range(), st[1]->options(), k_seed + 1);
  const tensor& a = st[1]->param("lm_head.weight").value;
  const tensor& b = other.param("lm_head.weight").value;
  CHECK(std::memcmp(a.data(), b.data(), a.bytes()) != 0);
  other.init_like_gpt(k_seed);
  CHECK(std::memcmp(other.flat_values().data(), st[1]->flat_values().data(),
                    other.flat_values().bytes()) == 0);
}

TEST_CASE("a whole-model stage is the gpt: forward_backward and eval bit for bit") {
  gpt_stage_options o;
  o.max_batch = 2;
  gpt_stage whole(k_shape, {0, 4, true, true}, o, k_seed);
  reference ref = full_gpt(micro_batches());
  whole.zero_grad();
  std::vector<batch> mbs = micro_batches();
  for (std::size_t m = 0; m < mbs.size(); ++m)
    CHECK(whole.forward_backward(mbs[m], 0.25f) == ref.losses[m]);
  CHECK(std::memcmp(whole.flat_grads().data(), ref.model->flat_grads().data(),
                    whole.flat_grads().bytes()) == 0);
  const eval_result a = whole.eval(mbs[2]), b = ref.model->eval(mbs[2]);
  CHECK(a.loss == b.loss);
  CHECK(a.correct == b.correct);
  CHECK(a.count == b.count);
  CHECK(a.count == 18);
}

TEST_CASE("chained stages (P = 1, 2, 3, 4 - balanced and explicit cuts) = gpt, bit for bit") {
  const std::vector<batch> mbs = micro_batches();
  reference ref = full_gpt(mbs);
  for (const std::vector<stage_range>& cut :
       {partition_gpt(k_shape, 1), partition_gpt(k_shape, 2), partition_gpt(k_shape, 3),
        partition_gpt(k_shape, 2, {3, 1}), partition_gpt(k_shape, 4)}) {
    INFO(cut.size() << " stages, first stage " << cut[0].layers() << " blocks");
    stages_t st = make_stages(
        cut, [](int) { return 1; }, false);
    const std::vector<float> losses = run(st, mbs, sequential_order(int(cut.size()), 4));
    CHECK(losses == ref.losses);
    check_same_grads(st, *ref.model);
  }
}

TEST_CASE("micro-batches in flight: GPipe and 1F1B orders accumulate the same bits") {
  const std::vector<batch> mbs = micro_batches();
  const int M = static_cast<int>(mbs.size());
  reference ref = full_gpt(mbs);
  for (int P : {2, 3}) {
    const std::vector<stage_range> cut = partition_gpt(k_shape, P);
    for (bool ckpt : {false, true}) {
      INFO(P << " stages, checkpointing " << ckpt);
      {  // GPipe: M slots

        stages_t st = make_stages(
            cut, [&](int) { return M; }, ckpt);
        std::vector<int> peak;
        CHECK(run(st, mbs, gpipe_order(P, M), &peak) == ref.losses);
        check_same_grads(st, *ref.model);
        for (int p = 0; p < P; ++p) CHECK(peak[p] == M);
      }
      {  // 1F1B: P - p slots

        stages_t st = make_stages(
            cut, [&](int p) { return P - p; }, ckpt);
        std::vector<int> peak;
        CHECK(run(st, mbs, one_f_one_b_order(P, M), &peak) == ref.losses);
        check_same_grads(st, *ref.model);
        for (int p = 0; p < P; ++p) CHECK(peak[p] == P - p);
      }
    }
  }
}

TEST_CASE("activation memory is measured: what the schedule holds, not the slots it has") {
  const std::vector<stage_range> cut = partition_gpt(k_shape, 2);
  const std::vector<batch> mbs = micro_batches();
  const int P = 2, M = 4;
  reference ref = full_gpt(mbs);
  // Closed form of one slot's buffers for max_batch = 2 sequences of the context (rows =
  // 2 * 16): the input copy [rows, C]; per block ln1, atty, res2, ln2, out [rows, C], qkv
  // [rows, 3C], fch and fch_gelu [rows, 4C] (16C a row), four LayerNorm statistics a row
  // and the attention probabilities [B, NH, T, T]; on the last stage also ln_f [rows, C],
  // its two statistics and probs [rows, V].
  const int64_t B = 2, T = k_shape.context, C = k_shape.d_model, rows = B * T;
  const int64_t input = rows * C * 4;
  const int64_t block = (rows * 16 * C + 4 * rows + B * k_shape.n_head * T * T) * 4;
  const int64_t head = (rows * C + 2 * rows + rows * k_shape.vocab) * 4;
  auto per_slot = [&](const stage_range& r) {
    return input + r.layers() * block + (r.has_head ? head : 0);
  };
  for (bool ckpt : {false, true}) {
    INFO("checkpointing " << ckpt);
    // Every stage gets M slots either way: the measurement must follow the schedule.
    for (bool gpipe : {true, false}) {
      INFO("schedule " << (gpipe ? "gpipe" : "1f1b"));
      stages_t st = make_stages(
          cut, [&](int) { return M; }, ckpt);
      for (int p = 0; p < P; ++p) {
        const pool_stats a = st[p]->activation_stats();
        const int64_t shared = ckpt ? per_slot(cut[p]) - input : 0;
        CHECK(int64_t(st[p]->activation_bytes_per_slot()) == (ckpt ? input : per_slot(cut[p])));
        CHECK(int64_t(a.bytes_in_use) == shared);  // nothing forwarded yet
      }
      std::vector<int> held;
      CHECK(run(st, mbs, gpipe ? gpipe_order(P, M) : one_f_one_b_order(P, M), &held) == ref.losses);
      check_same_grads(st, *ref.model);
      for (int p = 0; p < P; ++p) {
        INFO("stage " << p);
        // GPipe holds all M micro-batches; 1F1B at most min(P - p, M).
        const int expect_held = gpipe ? M : std::min(P - p, M);
        CHECK(held[p] == expect_held);
        const pool_stats a = st[p]->activation_stats();
        const int64_t one = int64_t(st[p]->activation_bytes_per_slot());
        const int64_t shared = ckpt ? per_slot(cut[p]) - input : 0;
        CHECK(int64_t(a.peak_bytes) == shared + expect_held * one);
        CHECK(int64_t(a.bytes_in_use) == shared);  // every micro-batch was backwarded
        if (!ckpt) CHECK(a.allocations == 0);
      }
    }
  }
  // A dropped slot gives its memory back too (an aborted step, evaluation).
  stages_t st = make_stages(
      cut, [](int) { return 2; }, false);
  st[0]->forward(0, mbs[0]);
  st[0]->forward(1, mbs[1]);
  CHECK(st[0]->activation_stats().bytes_in_use == 2 * st[0]->activation_bytes_per_slot());
  st[0]->drop(0);
  st[0]->drop(1);
  CHECK(st[0]->activation_stats().bytes_in_use == 0);
  CHECK(st[0]->activation_stats().peak_bytes == 2 * st[0]->activation_bytes_per_slot());
}

TEST_CASE("stage grads-ready hook: the stage's buffer from its end down, each element once") {
  for (const stage_range& r : partition_gpt(k_shape, 3)) {
    INFO("stage layers " << r.first_layer << ".." << r.end_layer);
    gpt_stage_options o;
    o.max_batch = 2;
    gpt_stage s(k_shape, r, o, k_seed);
    const batch b = lm_batch(2, 16, 65, 21);
    const int64_t rows_c = 2 * 16 * 32;
    std::vector<float> x(rows_c), d(rows_c);
    rng g(22);
    for (float& v : x) v = g.normal();
    for (float& v : d) v = g.normal() * 1e-3f;
    int64_t end = s.num_params();
    int bad = 0;
    s.set_grads_ready_hook([&](int64_t off, int64_t n) {
      bad += off + n != end;
      end = off;
    });
    s.forward(0, b, r.has_embedding ? nullptr : x.data());
    const float* d_in = s.backward(0, r.has_head ? nullptr : d.data(), 1.0f);
    CHECK(bad == 0);
    CHECK(end == 0);
    CHECK((d_in == nullptr) == r.has_embedding);
  }
}

TEST_CASE("gpt_stage rejects misuse with messages") {
  const std::vector<stage_range> cut = partition_gpt(k_shape, 2);
  gpt_stage_options o;
  o.max_batch = 2;
  o.slots = 2;
  gpt_stage first(k_shape, cut[0], o, 1), last(k_shape, cut[1], o, 1);
  const batch b = lm_batch(2, 16, 65, 5);
  std::vector<float> x(2 * 16 * 32, 0.1f);
  CHECK_THROWS_AS(first.forward(0, b, x.data()), usage_error);             // first stage embeds ids
  CHECK_THROWS_AS(last.forward(0, b), usage_error);                        // later stages need x_in
  CHECK_THROWS_AS(first.forward(2, b), usage_error);                       // no slot 2
  CHECK_THROWS_AS(first.backward(0, x.data()), usage_error);               // nothing forwarded
  CHECK_THROWS_AS(first.forward(0, lm_batch(3, 16, 65, 6)), usage_error);  // n > max_batch
  CHECK_THROWS_AS(first.forward(0, lm_batch(1, 17, 65, 6)), usage_error);  // t > context
  first.forward(0, b);
  CHECK(first.busy(0));
  CHECK_THROWS_AS(first.forward(0, b), usage_error);         // slot still busy
  CHECK_THROWS_AS(first.backward(0, nullptr), usage_error);  // needs d_out
  first.drop(0);
  CHECK_FALSE(first.busy(0));
  last.forward(1, b, x.data());
  CHECK_THROWS_AS(last.backward(1, x.data()), usage_error);  // the last stage starts from the loss
  batch bad = b;
  bad.targets[3] = 65;
  CHECK_THROWS_AS(last.forward(0, bad, x.data()), usage_error);
  CHECK_THROWS_AS(first.forward_backward(b, 1.0f), usage_error);  // partial stage
  CHECK_THROWS_AS(last.eval(b), usage_error);
  CHECK_THROWS_AS(gpt_stage(k_shape, {1, 4, true, true}, o, 1), usage_error);    // embedding at 1
  CHECK_THROWS_AS(gpt_stage(k_shape, {0, 3, true, true}, o, 1), usage_error);    // head before 4
  CHECK_THROWS_AS(gpt_stage(k_shape, {2, 2, false, false}, o, 1), usage_error);  // empty
  CHECK_THROWS_AS(gpt_stage(k_shape, {3, 5, false, true}, o, 1), usage_error);   // past n_layer
  o.slots = 0;
  CHECK_THROWS_AS(gpt_stage(k_shape, cut[0], o, 1), usage_error);
}
