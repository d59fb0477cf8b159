// The mixture-of-experts layer (runtime/nn/moe.hpp) and the GPT blocks that use it: routing
// and capacity as tables, a dropped token's output, and every parameter's gradient against
// central differences of the training loss (the load-balancing loss included).
#include <doctest/doctest.h>

#include <cmath>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/core/error.hpp"
#include "runtime/core/rng.hpp"
#include "runtime/nn/gpt.hpp"
#include "runtime/nn/moe.hpp"
#include "tests/nn/grad_check.hpp"

using namespace cohort;
using namespace cohort::nn;
using namespace cohort::nn::testing;

TEST_CASE("moe capacity: ceil(capacity_factor x tokens x top_k / experts), at least 1") {
  struct row {
    int tokens, experts, top_k;
    float factor;
    int capacity;
  };
  const std::vector<row> rows = {
      {8, 4, 1, 1.0f, 2}, {8, 4, 2, 1.0f, 4}, {8, 4, 1, 1.25f, 3},
      {10, 4, 1, 1.0f, 3}, {1, 8, 1, 1.0f, 1}, {64, 8, 2, 1.25f, 20},
  };
  for (const row& r : rows) {
    CAPTURE(r.tokens);
    CAPTURE(r.experts);
    CHECK(moe_capacity(r.tokens, r.experts, r.top_k, r.factor) == r.capacity);
  }
}

TEST_CASE("moe routing: top-k by probability (ties to the lowest expert), gates, capacity in "
          "choice order") {
  // Four tokens over three experts.
  const std::vector<float> probs = {
      0.6f, 0.3f, 0.1f,   // token 0: 0 then 1
      0.2f, 0.2f, 0.6f,   // token 1: 2, then 0 (a tie with 1: the lower)
      0.5f, 0.1f, 0.4f,   // token 2: 0 then 2
      0.7f, 0.2f, 0.1f};  // token 3: 0 then 1
  SUBCASE("top-1, capacity 2 (factor 1.5): the third token for expert 0 is dropped") {
    const moe_routing r = moe_route(probs.data(), 4, 3, 1, 1.5f);
    CHECK(r.capacity == 2);
    CHECK(r.expert == std::vector<int32_t>{0, 2, 0, 0});
    CHECK(r.slot == std::vector<int32_t>{0, 0, 1, -1});
    CHECK(r.gate == std::vector<float>{0.6f, 0.6f, 0.5f, 0.7f});
    CHECK(r.kept == std::vector<int32_t>{2, 0, 1});
    CHECK(r.wanted == std::vector<int32_t>{3, 0, 1});
    CHECK(r.dropped == 1);
  }
  SUBCASE("top-2, capacity 3 (factor 1.0): first choices first, so token 1's second choice "
          "(expert 0) finds it full") {
    const moe_routing r = moe_route(probs.data(), 4, 3, 2, 1.0f);
    CHECK(r.capacity == 3);
    CHECK(r.expert == std::vector<int32_t>{0, 1, 2, 0, 0, 2, 0, 1});
    // Expert 0: tokens 0, 2, 3 by their first choices; token 1's second comes after: dropped.
    CHECK(r.slot == std::vector<int32_t>{0, 0, 0, -1, 1, 1, 2, 1});
    CHECK(r.kept == std::vector<int32_t>{3, 2, 2});
    CHECK(r.wanted == std::vector<int32_t>{4, 2, 2});
    CHECK(r.dropped == 1);
    // Gates: the two probabilities normalised.
    CHECK(r.gate[0] == doctest::Approx(0.6 / 0.9));
    CHECK(r.gate[1] == doctest::Approx(0.3 / 0.9));
    CHECK(r.gate[2] == doctest::Approx(0.75));
    CHECK(r.gate[3] == doctest::Approx(0.25));
  }
  SUBCASE("bad top_k") {
    CHECK_THROWS_AS(moe_route(probs.data(), 4, 3, 3, 1.0f), usage_error);
    CHECK_THROWS_AS(moe_route(probs.data(), 4, 1, 2, 1.0f), usage_error);
  }
}

namespace {

gpt_shape moe_shape(int top_k, float capacity, int every) {
  gpt_shape s{7, 4, 2, 2, 8};
  s.moe_experts = 4;
  s.moe_top_k = top_k;
  s.moe_capacity_factor = capacity;
  s.moe_every = every;
  s.moe_aux_coef = 0.05f;
  return s;
}

// Every parameter's gradient from forward_backward against central differences of the loss
// forward_backward returns (the cross-entropy plus the load-balancing losses). The floor:
// experts that few tokens reach have gradients near float noise at this eps.
void check_grads(gpt& m, const batch& b, float eps, double tol) {
  check_param_grads(m, b, [&] { return static_cast<double>(m.forward_backward(b, 1.0f)); }, eps,
                    tol, 1e-3);
}

}  // namespace

TEST_CASE("moe GPT: names and shapes, the router and each expert in every every-th block") {
  gpt m(moe_shape(2, 2.0f, 2), 2, 1);
  CHECK(m.param("transformer.h.0.mlp.c_fc.weight").value.shape() == shape_t{32, 8});
  CHECK_THROWS_AS(m.param("transformer.h.0.mlp.router.weight"), usage_error);
  CHECK(m.param("transformer.h.1.mlp.router.weight").value.shape() == shape_t{4, 8});
  CHECK(m.param("transformer.h.1.mlp.experts.3.c_fc.weight").value.shape() == shape_t{32, 8});
  CHECK(m.param("transformer.h.1.mlp.experts.3.c_proj.bias").value.shape() == shape_t{8});
  CHECK_THROWS_AS(m.param("transformer.h.1.mlp.c_fc.weight"), usage_error);
}

TEST_CASE("moe: a parameter's expert from its name, -1 for a dense one") {
  struct row {
    const char* name;
    int expert;
  };
  for (const row& r : {row{"transformer.h.1.mlp.experts.3.c_fc.weight", 3},
                       row{"transformer.h.11.mlp.experts.12.c_proj.bias", 12},
                       row{"transformer.h.1.mlp.experts.0.c_fc.bias", 0},
                       row{"transformer.h.1.mlp.router.weight", -1},
                       row{"transformer.h.0.mlp.c_fc.weight", -1},
                       row{"transformer.h.1.mlp.experts.x.c_fc.weight", -1},
                       row{"transformer.h.1.mlp.experts.3", -1}, row{"lm_head.weight", -1}}) {
    CAPTURE(r.name);
    CHECK(expert_of_param(r.name) == r.expert);
  }
  // Every expert parameter of a model, and nothing else.
  gpt m(moe_shape(2, 2.0f, 2), 2, 1);
  int experts = 0;
  for (const parameter& p : m.parameters()) experts += expert_of_param(p.name) >= 0 ? 1 : 0;
  CHECK(experts == 4 * 4);  // one MoE block of 4 experts, 4 tensors each
}

TEST_CASE("moe GPT gradients match finite differences, top-1 and top-2, with the "
          "load-balancing loss") {
  for (int top_k : {1, 2}) {
    CAPTURE(top_k);
    // Capacity for every token (no drop can appear or vanish between the two sides of a
    // difference); routing choices are far apart at this scale.
    gpt m(moe_shape(top_k, 4.0f, 1), 2, 3);
    scramble(m, 40 + top_k, 0.5f);
    check_grads(m, lm_batch(2, 3, 7, 50 + top_k), 3e-3f, 3e-2);
  }
}

TEST_CASE("moe: a token over every expert's capacity gets no MoE output (the residual "
          "carries it), and is counted") {
  gpt m(moe_shape(1, 0.25f, 1), 2, 5);  // capacity ceil(0.25 * 6 / 4) = 1 of 6 tokens
  scramble(m, 6, 0.5f);
  m.forward_backward(lm_batch(2, 3, 7, 7), 1.0f);
  const gpt::moe_stats st = m.last_moe();
  int64_t kept = 0;
  for (int64_t t : st.tokens) kept += t;
  // Two MoE blocks, 6 tokens each: every expert takes at most one a block.
  CHECK(kept <= 8);
  CHECK(st.dropped == 12 - kept);
  CHECK(st.dropped >= 4);
  CHECK(st.aux_loss > 0);

  // The layer alone: rows it dropped come out zero.
  const moe_layer& layer = *m.layers()[0].moe;
  moe_acts a;
  const std::vector<float> x = randn(6 * 8, 9);
  std::vector<float> y(6 * 8, 1.0f);
  layer.forward(a, y.data(), x.data(), 6);
  int zero_rows = 0;
  for (int t = 0; t < 6; ++t) {
    if (a.route.slot[static_cast<std::size_t>(t)] >= 0) continue;
    bool all_zero = true;
    for (int k = 0; k < 8; ++k) all_zero = all_zero && y[static_cast<std::size_t>(t * 8 + k)] == 0.0f;
    zero_rows += all_zero;
    CHECK(all_zero);
  }
  CHECK(zero_rows == a.route.dropped);
}

namespace {

// An all-to-all among threads (ranks of one process), with communicator::alltoall's contract.
class thread_group {
 public:
  explicit thread_group(int n) : n_(n), send_(static_cast<std::size_t>(n)) {}
  void alltoall(int rank, const void* send, void* recv, std::size_t bytes) {
    {
      std::lock_guard<std::mutex> g(mu_);
      send_[static_cast<std::size_t>(rank)] = static_cast<const char*>(send);
    }
    wait();
    for (int q = 0; q < n_; ++q)
      std::memcpy(static_cast<char*>(recv) + q * bytes,
                  send_[static_cast<std::size_t>(q)] + static_cast<std::size_t>(rank) * bytes, bytes);
    wait();  // nobody reuses its send buffer before every rank has read it
  }

 private:
  void wait() {
    std::unique_lock<std::mutex> g(mu_);
    const uint64_t gen = gen_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(g, [&] { return gen_ != gen; });
    }
  }
  int n_;
  std::vector<const char*> send_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t gen_ = 0;
};

int64_t to_fixed(float v) { return std::llrint(static_cast<double>(v) * 1099511627776.0); }  // 2^40

}  // namespace

TEST_CASE("moe expert parallelism: experts shared out over 3 ranks (uneven counts, an idle rank) "
          "give each rank the outputs and loss of its own run, and the same fixed-point gradient "
          "sum") {
  const int R = 3;
  gpt_shape s = moe_shape(2, 1.0f, 1);  // 4 experts over 3 ranks: 0 and 3, 1, 2; drops
  // Rank 0: 6 tokens, rank 1: none (a pass without a micro-batch), rank 2: 12 tokens.
  const std::vector<int> n = {2, 0, 3}, t = {3, 0, 4};
  std::vector<std::unique_ptr<gpt>> alone, ep;
  for (int r = 0; r < R; ++r) {
    alone.push_back(std::make_unique<gpt>(s, 3, 11));
    ep.push_back(std::make_unique<gpt>(s, 3, 11));
    scramble(*alone.back(), 12, 0.5f);
    scramble(*ep.back(), 12, 0.5f);
    alone.back()->zero_grad();
    ep.back()->zero_grad();
  }
  const int64_t P = alone[0]->num_params();
  std::vector<float> loss_alone(R, 0.0f), loss_ep(R, 0.0f);
  for (int r = 0; r < R; ++r)
    if (n[static_cast<std::size_t>(r)] > 0)
      loss_alone[static_cast<std::size_t>(r)] =
          alone[static_cast<std::size_t>(r)]->forward_backward(
              lm_batch(n[static_cast<std::size_t>(r)], t[static_cast<std::size_t>(r)], 7, 60 + r), 0.5f);

  for (bool bitwise : {true, false}) {
    CAPTURE(bitwise);
    thread_group g(R);
    std::vector<std::vector<int64_t>> settled(static_cast<std::size_t>(R), std::vector<int64_t>(static_cast<std::size_t>(P), 0));
    std::vector<moe_exchange> ex(static_cast<std::size_t>(R));
    for (int r = 0; r < R; ++r) {
      gpt& m = *ep[static_cast<std::size_t>(r)];
      m.zero_grad();
      moe_exchange& e = ex[static_cast<std::size_t>(r)];
      e.ranks = R;
      e.rank = r;
      e.alltoall = [&g, r](const void* a, void* b, std::size_t bytes) { g.alltoall(r, a, b, bytes); };
      if (bitwise)
        e.settle = [&m, &settled, r](linear& fc, linear& proj) {
          float* base = m.flat_grads().data();
          for (tensor* x : {&proj.db, &proj.dw, &fc.db, &fc.dw}) {
            for (int64_t i = 0; i < x->numel(); ++i) {
              settled[static_cast<std::size_t>(r)][static_cast<std::size_t>(x->data() - base + i)] += to_fixed(x->data()[i]);
              x->data()[i] = 0.0f;
            }
          }
        };
      m.set_moe_exchange(&e);
    }
    std::vector<std::thread> ranks;
    for (int r = 0; r < R; ++r)
      ranks.emplace_back([&, r] {
        gpt& m = *ep[static_cast<std::size_t>(r)];
        if (n[static_cast<std::size_t>(r)] == 0)
          m.moe_pass();
        else
          loss_ep[static_cast<std::size_t>(r)] = m.forward_backward(
              lm_batch(n[static_cast<std::size_t>(r)], t[static_cast<std::size_t>(r)], 7, 60 + r), 0.5f);
      });
    for (auto& th : ranks) th.join();
    for (int r = 0; r < R; ++r) ep[static_cast<std::size_t>(r)]->set_moe_exchange(nullptr);
    CHECK(loss_ep == loss_alone);  // the same outputs, bit for bit
    // The group's sum: in bitwise mode each rank's float gradients converted (what the
    // micro-batch stage does) plus what it settled equals the ranks' own runs converted.
    int64_t differ = 0;
    double worst = 0;
    for (int64_t i = 0; i < P; ++i) {
      int64_t want = 0, got = 0;
      double fwant = 0, fgot = 0;
      for (int r = 0; r < R; ++r) {
        const float a = alone[static_cast<std::size_t>(r)]->flat_grads().data()[i];
        const float b = ep[static_cast<std::size_t>(r)]->flat_grads().data()[i];
        want += to_fixed(a);
        got += to_fixed(b) + settled[static_cast<std::size_t>(r)][static_cast<std::size_t>(i)];
        fwant += a;
        fgot += b;
      }
      if (bitwise)
        differ += want != got;
      else
        worst = std::max(worst, std::abs(fwant - fgot) / (std::abs(fwant) + 1e-6));
    }
    CHECK(differ == 0);
    CHECK(worst < 1e-5);
  }
  // Evaluation after the step runs every expert here again (the exchange was taken back).
  const batch b = lm_batch(2, 3, 7, 60);
  CHECK(ep[0]->eval(b).loss == alone[0]->eval(b).loss);
}
