// Megatron tensor parallelism in gpt_stage: T ranks run as T threads of one process, each
// with its own stage and an allreduce over a shared buffer (summed in rank order, so every
// rank gets the same bits). Checked against the full gpt: initial shards are slices of its
// parameters, losses and reassembled gradients match it, replicated gradients are
// bit-identical across ranks; also 2 pipeline stages x 2 TP ranks and the errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
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

// vocab 17, context 8, 2 blocks, 4 heads, d_model 16: T = 4 leaves one head of 4 channels.
const gpt_shape k_shape{17, 8, 2, 4, 16};
constexpr uint64_t k_seed = 4321;

/// Three micro-batches of 2 sequences, one shorter than the context.
std::vector<batch> micro_batches() {
  return {lm_batch(2, 8, 17, 31), lm_batch(2, 5, 17, 32), lm_batch(2, 8, 17, 33)};
}

/// A reusable barrier for n threads. A wait that lasts 30 s throws (and breaks the barrier
/// for the others), so a broken collective fails the test instead of hanging CI.
class barrier {
 public:
  explicit barrier(int n) : n_(n) {}
  void wait() {
    std::unique_lock<std::mutex> lk(m_);
    if (broken_) throw std::runtime_error("barrier broken");
    const uint64_t gen = gen_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++gen_;
      cv_.notify_all();
      return;
    }
    if (!cv_.wait_for(lk, std::chrono::seconds(30), [&] { return gen_ != gen || broken_; }) ||
        gen_ == gen) {
      broken_ = true;
      cv_.notify_all();
      throw std::runtime_error("barrier: a rank never arrived");
    }
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int n_, arrived_ = 0;
  uint64_t gen_ = 0;
  bool broken_ = false;
};

/// The TP group: allreduce publishes every rank's buffer, each rank sums all of them in
/// rank order 0..T-1 into its own temporary (so all ranks compute the same bits), and
/// writes the sum back only after everyone has read.
class tp_group {
 public:
  explicit tp_group(int T) : T_(T), bar_(T), ptrs_(T), counts_(T), calls_(T, 0) {}

  void allreduce(int rank, float* data, int64_t count) {
    ptrs_[rank] = data;
    counts_[rank] = count;
    ++calls_[rank];
    bar_.wait();
    for (int r = 0; r < T_; ++r)
      if (counts_[r] != count) throw std::runtime_error("allreduce: ranks disagree on count");
    std::vector<float> sum(ptrs_[0], ptrs_[0] + count);
    for (int r = 1; r < T_; ++r)
      for (int64_t i = 0; i < count; ++i) sum[i] += ptrs_[r][i];
    bar_.wait();
    std::copy(sum.begin(), sum.end(), data);
  }
  std::function<void(float*, int64_t)> fn(int rank) {
    return [this, rank](float* d, int64_t n) { allreduce(rank, d, n); };
  }
  /// Allreduce calls rank r has made.
  int calls(int r) const { return calls_[r]; }

 private:
  int T_;
  barrier bar_;
  std::vector<float*> ptrs_;
  std::vector<int64_t> counts_;
  std::vector<int> calls_;
};

/// Runs f(i) on n threads and rethrows the first exception in the caller.
void run_threads(int n, const std::function<void(int)>& f) {
  std::vector<std::exception_ptr> errs(n);
  std::vector<std::thread> th;
  for (int i = 0; i < n; ++i)
    th.emplace_back([&, i] {
      try {
        f(i);
      } catch (...) {
        errs[i] = std::current_exception();
      }
    });
  for (std::thread& t : th) t.join();
  for (const std::exception_ptr& e : errs)
    if (e) std::rethrow_exception(e);
}

std::unique_ptr<gpt_stage> make_rank(const stage_range& r, int T, int rank, tp_group& g,
                                     int slots = 1, bool ckpt = false) {
  gpt_stage_options o;
  o.max_batch = 2;
  o.slots = slots;
  o.activation_checkpointing = ckpt;
  o.tp_size = T;
  o.tp_rank = rank;
  if (T > 1) o.tp_allreduce = g.fn(rank);
  return std::make_unique<gpt_stage>(k_shape, r, o, k_seed);
}

/// Calls f(shard element, whole-tensor element) for every element a shard with slice `s`
/// holds, from what tp_slice documents (rows [begin, end) of each of `parts` equal row
/// blocks, or columns [begin, end) of every row).
void for_each_element(const gpt_stage::tp_slice& s,
                      const std::function<void(int64_t, int64_t)>& f) {
  const int64_t numel = shape_numel(s.full_shape);
  if (s.dim < 0) {
    for (int64_t i = 0; i < numel; ++i) f(i, i);
  } else if (s.dim == 0) {
    const int64_t row = numel / s.full_shape[0], part_rows = s.full_shape[0] / s.parts,
                  w = s.end - s.begin;
    for (int k = 0; k < s.parts; ++k)
      for (int64_t r = 0; r < w; ++r)
        for (int64_t c = 0; c < row; ++c)
          f((k * w + r) * row + c, (k * part_rows + s.begin + r) * row + c);
  } else {
    REQUIRE(s.dim == 1);
    const int64_t rows = s.full_shape[0], cols = s.full_shape[1], w = s.end - s.begin;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < w; ++c) f(r * w + c, r * cols + s.begin + c);
  }
}

/// Reassembles the whole tensor of parameter `i` from the T ranks' tensors `part(rank)`;
/// every element of the whole must be written by exactly one rank (else the test fails),
/// so the slices tile it. A replicated tensor is taken from rank 0.
std::vector<float> gather_full(const std::vector<gpt_stage*>& ranks, std::size_t i,
                               const std::function<const tensor&(const parameter&)>& part) {
  const gpt_stage::tp_slice& s0 = ranks[0]->tp_slices()[i];
  const int64_t numel = shape_numel(s0.full_shape);
  std::vector<float> full(numel, 0.0f);
  std::vector<int> written(numel, 0);
  for (gpt_stage* st : ranks) {
    const gpt_stage::tp_slice& s = st->tp_slices()[i];
    const tensor& src = part(st->parameters()[i]);
    REQUIRE(s.full_shape == s0.full_shape);
    REQUIRE(s.dim == s0.dim);
    REQUIRE(src.numel() ==
            (s.dim < 0 ? numel : numel / s.full_shape[s.dim] * s.parts * (s.end - s.begin)));
    for_each_element(s, [&](int64_t a, int64_t b) {
      full[b] = src[a];
      ++written[b];
    });
    if (s.dim < 0) return full;
  }
  CHECK(std::count(written.begin(), written.end(), 1) == numel);
  return full;
}

/// Sets every parameter of `st` to its part of the same-named parameter of `full`.
void load_from(gpt_stage& st, const gpt& full) {
  for (std::size_t i = 0; i < st.parameters().size(); ++i) {
    parameter& p = st.parameters()[i];
    const tensor& w = full.param(p.name).value;
    for_each_element(st.tp_slices()[i], [&](int64_t a, int64_t b) { p.value[a] = w[b]; });
  }
}

/// max |a - b| / max |b| (0 when both are all zero).
double scaled_diff(const std::vector<float>& a, const tensor& b) {
  REQUIRE(static_cast<int64_t>(a.size()) == b.numel());
  double d = 0, m = 0;
  for (int64_t i = 0; i < b.numel(); ++i) {
    d = std::max(d, std::fabs(double(a[i]) - b[i]));
    m = std::max(m, std::fabs(double(b[i])));
  }
  return m > 0 ? d / m : d;
}

bool same_bits(const tensor& a, const tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.data(), b.data(), a.bytes()) == 0;
}

/// Per pipeline stage, its T TP ranks. Checks: every replicated gradient is bit-identical
/// across the ranks of its stage and within 1e-5 of the gpt's; every shard gradient,
/// reassembled, within 1e-5 (scaled by the largest magnitude) of the gpt's; the stages
/// cover every gpt parameter once.
void check_grads(const std::vector<std::vector<gpt_stage*>>& stages, const gpt& ref) {
  std::size_t covered = 0;
  for (const std::vector<gpt_stage*>& ranks : stages) {
    for (std::size_t i = 0; i < ranks[0]->parameters().size(); ++i) {
      const parameter& p = ranks[0]->parameters()[i];
      INFO("parameter " << p.name);
      const parameter& q = ref.param(p.name);
      if (ranks[0]->tp_replicated()[i])
        for (gpt_stage* st : ranks) CHECK(same_bits(st->parameters()[i].grad, p.grad));
      const std::vector<float> g =
          gather_full(ranks, i, [](const parameter& x) -> const tensor& { return x.grad; });
      CHECK(scaled_diff(g, q.grad) <= 1e-5);
      ++covered;
    }
  }
  CHECK(covered == ref.parameters().size());
}

struct reference {
  std::unique_ptr<gpt> model;
  std::vector<float> losses;
};

/// The gpt's forward_backward over the micro-batches with scale 1/M, after giving every
/// bias and LayerNorm parameter random values (they start at 0 and 1, which would hide a
/// row-parallel bias added on every rank instead of once, or a LayerNorm weight ignored).
reference full_gpt(const std::vector<batch>& mbs) {
  reference r;
  r.model = std::make_unique<gpt>(k_shape.vocab, k_shape.context, k_shape.n_layer, k_shape.n_head,
                                  k_shape.d_model, 2, k_seed);
  rng noise(99);
  for (parameter& p : r.model->parameters())
    if (p.value.ndim() == 1)
      for (int64_t i = 0; i < p.value.numel(); ++i) p.value[i] += 0.1f * noise.normal();
  r.model->zero_grad();
  for (const batch& b : mbs)
    r.losses.push_back(r.model->forward_backward(b, 1.0f / static_cast<float>(mbs.size())));
  return r;
}

bool close_rel(float a, float b) { return std::fabs(a - b) <= 1e-5f * std::fabs(b); }

}  // namespace

TEST_CASE("TP shards: Megatron slices, full names, initial values sliced from the gpt") {
  gpt full(k_shape.vocab, k_shape.context, k_shape.n_layer, k_shape.n_head, k_shape.d_model, 1,
           k_seed);
  const int64_t C = k_shape.d_model;
  for (int T : {1, 2, 4}) {
    INFO("T = " << T);
    tp_group g(T);
    std::vector<std::unique_ptr<gpt_stage>> own;
    std::vector<gpt_stage*> ranks;
    for (int r = 0; r < T; ++r) {
      own.push_back(make_rank({0, 2, true, true}, T, r, g));
      ranks.push_back(own.back().get());
    }
    REQUIRE(ranks[0]->parameters().size() == full.parameters().size());
    int64_t total = 0;
    for (int r = 0; r < T; ++r) {
      const gpt_stage& st = *ranks[r];
      REQUIRE(st.tp_slices().size() == st.parameters().size());
      REQUIRE(st.tp_replicated().size() == st.parameters().size());
      for (std::size_t i = 0; i < st.parameters().size(); ++i) {
        const parameter& p = st.parameters()[i];
        const gpt_stage::tp_slice& s = st.tp_slices()[i];
        INFO(p.name);
        CHECK(p.name == full.parameters()[i].name);
        CHECK(s.full_shape == full.parameters()[i].value.shape());
        CHECK(st.tp_replicated()[i] == (s.dim < 0));
        if (!st.tp_replicated()[i]) total += p.value.numel();
      }
      // Closed form, Megatron's split of block 1: c_attn the rows of heads [r*4/T, ...) of q,
      // k and v; c_fc rows [r*4C/T, ...); both c_proj the matching input columns.
      auto shard = [&](const std::string& name) {
        for (std::size_t i = 0; i < st.parameters().size(); ++i)
          if (st.parameters()[i].name == name) return std::make_pair(i, st.tp_slices()[i]);
        FAIL("no parameter " << name);
        return std::make_pair(std::size_t{0}, gpt_stage::tp_slice{});
      };
      const std::string h = "transformer.h.1.";
      const auto [qi, q] = shard(h + "attn.c_attn.weight");
      const auto [pi, pr] = shard(h + "attn.c_proj.weight");
      const auto [fi, fc] = shard(h + "mlp.c_fc.weight");
      const auto [mi, mp] = shard(h + "mlp.c_proj.weight");
      CHECK(st.parameters()[qi].value.shape() == shape_t{3 * C / T, C});
      CHECK(st.parameters()[pi].value.shape() == shape_t{C, C / T});
      CHECK(st.parameters()[fi].value.shape() == shape_t{4 * C / T, C});
      CHECK(st.parameters()[mi].value.shape() == shape_t{C, 4 * C / T});
      CHECK(st.param(h + "attn.c_attn.bias").value.shape() == shape_t{3 * C / T});
      CHECK(st.param(h + "mlp.c_fc.bias").value.shape() == shape_t{4 * C / T});
      CHECK(st.param(h + "attn.c_proj.bias").value.shape() == shape_t{C});  // row parallel: whole
      CHECK(st.param(h + "mlp.c_proj.bias").value.shape() == shape_t{C});
      CHECK(st.param("lm_head.weight").value.shape() == shape_t{k_shape.vocab, C});
      if (T > 1) {
        CHECK((q.dim == 0 && q.parts == 3 && q.begin == r * C / T && q.end == (r + 1) * C / T));
        CHECK((pr.dim == 1 && pr.begin == r * C / T && pr.end == (r + 1) * C / T));
        CHECK((fc.dim == 0 && fc.parts == 1 && fc.begin == r * 4 * C / T));
        CHECK((mp.dim == 1 && mp.begin == r * 4 * C / T && mp.end == (r + 1) * 4 * C / T));
        // The first row of this rank's k slice is row C + r*C/T of the whole weight.
        const float* kw = st.parameters()[qi].value.data() + (C / T) * C;
        CHECK(std::memcmp(kw,
                          full.param(h + "attn.c_attn.weight").value.data() + (C + r * C / T) * C,
                          C * sizeof(float)) == 0);
      } else {
        CHECK(q.dim == -1);
        CHECK(mp.dim == -1);
      }
    }
    // Shards of one weight across the ranks hold the whole weight exactly once; replicated
    // tensors are whole everywhere.
    if (T > 1) {
      int64_t sharded_full = 0;
      for (std::size_t i = 0; i < full.parameters().size(); ++i)
        if (!ranks[0]->tp_replicated()[i]) sharded_full += full.parameters()[i].value.numel();
      CHECK(total == sharded_full);
    }
    // Reassembled initial values are the gpt's, bit for bit.
    for (std::size_t i = 0; i < full.parameters().size(); ++i) {
      INFO(full.parameters()[i].name);
      const std::vector<float> v =
          gather_full(ranks, i, [](const parameter& x) -> const tensor& { return x.value; });
      const tensor& want = full.parameters()[i].value;
      CHECK(std::memcmp(v.data(), want.data(), want.bytes()) == 0);
    }
  }
}

TEST_CASE("TP over T = 2 and 4 threads matches the gpt: losses, gradients, eval") {
  const std::vector<batch> mbs = micro_batches();
  const int M = static_cast<int>(mbs.size());
  reference ref = full_gpt(mbs);
  for (int T : {2, 4}) {
    INFO("T = " << T);
    tp_group g(T);
    std::vector<std::unique_ptr<gpt_stage>> own;
    std::vector<gpt_stage*> ranks;
    for (int r = 0; r < T; ++r) {
      own.push_back(make_rank({0, 2, true, true}, T, r, g));
      load_from(*own.back(), *ref.model);
      ranks.push_back(own.back().get());
    }
    std::vector<std::vector<float>> losses(T);
    std::vector<int> hook_bad(T, 0);
    std::vector<int64_t> hook_end(T);
    run_threads(T, [&](int r) {
      gpt_stage& st = *ranks[r];
      // The grads-ready hook still walks the shard's buffer from its end down, once each.
      hook_end[r] = st.num_params();
      st.set_grads_ready_hook([&, r](int64_t off, int64_t n) {
        hook_bad[r] += off + n != hook_end[r];
        hook_end[r] = off;
      });
      st.zero_grad();
      for (const batch& b : mbs) {
        hook_end[r] = st.num_params();
        losses[r].push_back(st.forward_backward(b, 1.0f / static_cast<float>(M)));
        hook_bad[r] += hook_end[r] != 0;
      }
      st.set_grads_ready_hook({});
    });
    for (int r = 0; r < T; ++r) {
      INFO("rank " << r);
      CHECK(losses[r] == losses[0]);  // the whole loss on every rank, same bits
      CHECK(hook_bad[r] == 0);
      // Megatron's pattern: 2 allreduces per block in forward, 2 in backward.
      CHECK(g.calls(r) == 4 * k_shape.n_layer * M);
    }
    for (int m = 0; m < M; ++m) CHECK(close_rel(losses[0][m], ref.losses[m]));
    check_grads({ranks}, *ref.model);

    // eval: forward only (2 allreduces a block), gradients untouched.
    const batch b = lm_batch(2, 8, 17, 40);
    const eval_result want = ref.model->eval(b);
    std::vector<eval_result> got(T);
    const std::vector<float> g0(ranks[0]->flat_grads().data(),
                                ranks[0]->flat_grads().data() + ranks[0]->num_params());
    run_threads(T, [&](int r) { got[r] = ranks[r]->eval(b); });
    for (int r = 0; r < T; ++r) {
      CHECK(got[r].loss == got[0].loss);
      CHECK(got[r].correct == got[0].correct);
      CHECK(g.calls(r) == 4 * k_shape.n_layer * M + 2 * k_shape.n_layer);
    }
    CHECK(close_rel(got[0].loss, want.loss));
    CHECK(got[0].correct == want.correct);
    CHECK(got[0].count == want.count);
    CHECK(std::memcmp(g0.data(), ranks[0]->flat_grads().data(), g0.size() * sizeof(float)) == 0);
  }
}

TEST_CASE(
    "TP x pipeline: 2 stages x 2 TP ranks on 4 threads, 1F1B, with and without checkpointing") {
  const std::vector<batch> mbs = micro_batches();
  const int M = static_cast<int>(mbs.size()), P = 2, T = 2;
  const int64_t C = k_shape.d_model;
  reference ref = full_gpt(mbs);
  const std::vector<stage_range> cut = partition_gpt(k_shape, P);
  REQUIRE(cut.size() == 2);
  for (bool ckpt : {false, true}) {
    INFO("checkpointing " << ckpt);
    std::vector<std::unique_ptr<tp_group>> groups;  // one TP group per stage
    std::vector<std::vector<std::unique_ptr<gpt_stage>>> own(P);
    std::vector<std::vector<gpt_stage*>> stages(P);
    for (int p = 0; p < P; ++p) {
      groups.push_back(std::make_unique<tp_group>(T));
      for (int r = 0; r < T; ++r) {
        own[p].push_back(make_rank(cut[p], T, r, *groups[p], P - p, ckpt));
        load_from(*own[p].back(), *ref.model);
        stages[p].push_back(own[p].back().get());
      }
    }
    // Messages between stages: TP rank t of stage p talks to rank t of p +- 1, as Megatron
    // does. Kept after delivery so the ranks' messages can be compared afterwards.
    std::mutex mu;
    std::condition_variable cv;
    std::map<std::tuple<bool, int, int, int>, std::vector<float>> box;  // fwd?, from stage, rank, m
    auto send = [&](bool fwd, int p, int r, int m, const float* d, int64_t n) {
      std::lock_guard<std::mutex> lk(mu);
      box[{fwd, p, r, m}].assign(d, d + n);
      cv.notify_all();
    };
    auto recv = [&](bool fwd, int p, int r, int m) {
      std::unique_lock<std::mutex> lk(mu);
      if (!cv.wait_for(lk, std::chrono::seconds(30), [&] { return box.count({fwd, p, r, m}) > 0; }))
        throw std::runtime_error("pipeline message never arrived");
      return box.at({fwd, p, r, m});
    };
    std::vector<float> losses(M * T, 0.0f);
    run_threads(P * T, [&](int id) {
      const int p = id / T, r = id % T;
      gpt_stage& st = *stages[p][r];
      st.zero_grad();
      // 1F1B: P - p - 1 warm-up forwards, then one forward one backward, then the drain.
      std::vector<std::pair<bool, int>> order;
      const int warm = std::min(P - p - 1, M);
      int f = 0, b = 0;
      for (; f < warm; ++f) order.push_back({true, f});
      while (f < M) {
        order.push_back({true, f++});
        order.push_back({false, b++});
      }
      while (b < M) order.push_back({false, b++});
      std::map<int, int> slot_of;
      for (const auto& [fwd, m] : order) {
        const int64_t n = int64_t{mbs[m].n} * mbs[m].t * C;
        if (fwd) {
          int slot = 0;
          while (st.busy(slot)) ++slot;
          slot_of[m] = slot;
          std::vector<float> x;
          if (p > 0) x = recv(true, p - 1, r, m);
          const stage_forward out = st.forward(slot, mbs[m], p > 0 ? x.data() : nullptr);
          if (p + 1 < P)
            send(true, p, r, m, out.out, n);
          else
            losses[m * T + r] = out.loss;
        } else {
          std::vector<float> d;
          if (p + 1 < P) d = recv(false, p + 1, r, m);
          const float* d_in =
              st.backward(slot_of[m], p + 1 < P ? d.data() : nullptr, 1.0f / static_cast<float>(M));
          if (p > 0) send(false, p, r, m, d_in, n);
        }
      }
    });
    for (int m = 0; m < M; ++m) {
      INFO("micro-batch " << m);
      CHECK(losses[m * T + 1] == losses[m * T]);
      CHECK(close_rel(losses[m * T], ref.losses[m]));
      // What both TP ranks send between the stages is the same whole tensor.
      CHECK(box.at({true, 0, 0, m}) == box.at({true, 0, 1, m}));
      CHECK(box.at({false, 1, 0, m}) == box.at({false, 1, 1, m}));
    }
    for (int p = 0; p < P; ++p) {
      // Each block calls 2 allreduces in forward and 2 in backward; checkpointing reruns
      // the forward (and its 2) in backward.
      const int per_block = ckpt ? 6 : 4;
      for (int r = 0; r < T; ++r) CHECK(groups[p]->calls(r) == per_block * cut[p].layers() * M);
    }
    check_grads(stages, *ref.model);
  }
}

TEST_CASE("TP refuses what it cannot split, with the fix in the message") {
  tp_group g(3);
  auto message = [&](int T, int rank, bool with_allreduce) -> std::string {
    gpt_stage_options o;
    o.tp_size = T;
    o.tp_rank = rank;
    if (with_allreduce) o.tp_allreduce = g.fn(0);
    try {
      gpt_stage s(k_shape, {0, 2, true, true}, o, 1);
    } catch (const usage_error& e) {
      return e.what();
    }
    return "";
  };
  // 4 heads over 3 ranks.
  const std::string heads = message(3, 0, true);
  CHECK(heads.find("n_head = 4") != std::string::npos);
  CHECK(heads.find("divisor of n_head") != std::string::npos);
  CHECK(message(8, 0, true).find("divisor of n_head") != std::string::npos);  // 8 > 4 heads
  CHECK(message(2, 2, true).find("tp_rank 2") != std::string::npos);
  CHECK(message(2, -1, true).find("tp_rank") != std::string::npos);
  CHECK(message(0, 0, true).find("tp_size") != std::string::npos);
  CHECK(message(2, 0, false).find("tp_allreduce") != std::string::npos);
  CHECK(message(2, 1, true).empty());   // a valid rank builds
  CHECK(message(1, 0, false).empty());  // tp_size 1 needs no allreduce
}
