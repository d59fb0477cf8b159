// The MLP and GPT models: names and shapes as PyTorch, seeded initialisation, whole-model
// gradients against finite differences, micro-batch accumulation, eval leaving grads alone.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/core/config.hpp"
#include "runtime/core/error.hpp"
#include "runtime/nn/gpt.hpp"
#include "runtime/nn/mlp.hpp"
#include "tests/nn/grad_check.hpp"

using namespace cohort;
using namespace cohort::nn;
using namespace cohort::nn::testing;

namespace {

batch mlp_batch(int n, int features, int classes, uint64_t seed) {
  rng r(seed);
  batch b;
  b.n = n;
  b.features = features;
  for (int i = 0; i < n * features; ++i) b.x.push_back(r.normal());
  for (int i = 0; i < n; ++i) b.targets.push_back(static_cast<int32_t>(r.below(classes)));
  return b;
}

/// Rows [from, from + count) of a batch.
batch slice(const batch& b, int from, int count) {
  batch s = b;
  s.n = count;
  const std::size_t row_x = b.features, row_t = b.t;
  s.x.assign(b.x.begin() + from * row_x, b.x.begin() + (from + count) * row_x);
  if (!b.ids.empty())
    s.ids.assign(b.ids.begin() + from * row_t, b.ids.begin() + (from + count) * row_t);
  s.targets.assign(b.targets.begin() + from * row_t, b.targets.begin() + (from + count) * row_t);
  return s;
}

/// Every parameter's analytic gradient vs central differences of eval's loss.
void check_model_grads(model& m, const batch& b, float eps, double tol) {
  check_param_grads(m, b, [&] { return static_cast<double>(m.eval(b).loss); }, eps, tol);
}

std::vector<float> grads_of(model& m) {
  return std::vector<float>(m.flat_grads().data(), m.flat_grads().data() + m.flat_grads().numel());
}

}  // namespace

TEST_CASE("MLP: PyTorch names, shapes and blocks") {
  mlp m(784, {256, 128}, 10, 8, 1);
  const auto& ps = m.parameters();
  REQUIRE(ps.size() == 6);
  const std::vector<std::string> names{"net.0.weight", "net.0.bias",   "net.2.weight",
                                       "net.2.bias",   "net.4.weight", "net.4.bias"};
  const std::vector<shape_t> shapes{{256, 784}, {256}, {128, 256}, {128}, {10, 128}, {10}};
  for (std::size_t i = 0; i < 6; ++i) {
    CHECK(ps[i].name == names[i]);
    CHECK(ps[i].value.shape() == shapes[i]);
    CHECK(ps[i].grad.shape() == shapes[i]);
  }
  CHECK(m.num_params() == 256 * 784 + 256 + 128 * 256 + 128 + 10 * 128 + 10);
  CHECK(ps[2].offset == 256 * 784 + 256);
  REQUIRE(m.blocks().size() == 3);
  CHECK(m.blocks()[1].name == "net.2");
  CHECK(m.block_param_names(2) == std::vector<std::string>{"net.4.weight", "net.4.bias"});
  CHECK(m.param("net.2.bias").value.numel() == 128);
  CHECK_THROWS_AS(m.param("net.1.weight"), usage_error);
}

TEST_CASE("MLP init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), a pure function of the seed") {
  mlp a(784, {256, 128}, 10, 8, 7), b(784, {256, 128}, 10, 8, 7), c(784, {256, 128}, 10, 8, 8);
  CHECK(std::memcmp(a.flat_values().data(), b.flat_values().data(), a.flat_values().bytes()) == 0);
  CHECK(std::memcmp(a.flat_values().data(), c.flat_values().data(), a.flat_values().bytes()) != 0);
  for (const parameter& p : a.parameters()) {
    const double bound = 1.0 / std::sqrt(double(p.name.rfind("net.0", 0) == 0   ? 784
                                                : p.name.rfind("net.2", 0) == 0 ? 256
                                                                                : 128));
    double mx = 0;
    for (int64_t i = 0; i < p.value.numel(); ++i) mx = std::max(mx, std::fabs(double(p.value[i])));
    INFO(p.name);
    CHECK(mx <= bound);
    CHECK(mx > 0.8 * bound);
  }
  // Re-initialising reproduces the constructor's values.
  scramble(a, 3, 1.0f);
  a.init_parameters(7);
  CHECK(std::memcmp(a.flat_values().data(), b.flat_values().data(), a.flat_values().bytes()) == 0);
}

TEST_CASE("MLP forward matches a direct double computation - eval leaves gradients alone") {
  mlp m(6, {5, 4}, 3, 4, 11);
  batch b = mlp_batch(9, 6, 3, 12);  // larger than max_batch: re-allocates once
  // Independent forward in double.
  double loss = 0;
  int64_t correct = 0;
  for (int i = 0; i < b.n; ++i) {
    std::vector<double> h(b.x.begin() + i * 6, b.x.begin() + (i + 1) * 6);
    for (int l = 0; l < 3; ++l) {
      const tensor& w = m.parameters()[2 * l].value;
      const tensor& bias = m.parameters()[2 * l + 1].value;
      std::vector<double> o(w.dim(0));
      for (int64_t r = 0; r < w.dim(0); ++r) {
        double s = bias[r];
        for (int64_t c = 0; c < w.dim(1); ++c) s += w[r * w.dim(1) + c] * h[c];
        o[r] = l < 2 ? std::max(0.0, s) : s;
      }
      h = o;
    }
    double mx = *std::max_element(h.begin(), h.end()), z = 0;
    for (double v : h) z += std::exp(v - mx);
    loss += (std::log(z) + mx - h[b.targets[i]]) / b.n;
    correct += (std::max_element(h.begin(), h.end()) - h.begin()) == b.targets[i];
  }
  m.flat_grads().fill(0.25f);
  const eval_result r = m.eval(b);
  CHECK(r.loss == doctest::Approx(loss).epsilon(1e-5));
  CHECK(r.correct == correct);
  CHECK(r.count == 9);
  for (int64_t i = 0; i < m.flat_grads().numel(); ++i) REQUIRE(m.flat_grads()[i] == 0.25f);
  m.zero_grad();
  CHECK(m.forward_backward(b, 1.0f) == doctest::Approx(loss).epsilon(1e-5));
}

TEST_CASE("MLP gradients match finite differences") {
  mlp m(6, {5, 4}, 3, 4, 21);
  scramble(m, 22, 0.7f);
  check_model_grads(m, mlp_batch(4, 6, 3, 23), 3e-3f, 2e-2);
}

TEST_CASE("MLP rejects malformed batches") {
  mlp m(6, {5}, 3, 4, 1);
  batch b = mlp_batch(2, 6, 3, 2);
  b.targets[1] = 3;
  CHECK_THROWS_AS(m.forward_backward(b, 1.0f), usage_error);
  batch c = mlp_batch(2, 5, 3, 2);
  CHECK_THROWS_AS(m.eval(c), usage_error);
}

TEST_CASE("GPT: nanoGPT names and shapes, untied lm_head, blocks") {
  gpt m(80, 16, 2, 4, 32, 2, 1);
  const int C = 32;
  CHECK(m.param("transformer.wte.weight").value.shape() == shape_t{80, C});
  CHECK(m.param("transformer.wpe.weight").value.shape() == shape_t{16, C});
  CHECK(m.param("transformer.h.1.ln_1.weight").value.shape() == shape_t{C});
  CHECK(m.param("transformer.h.0.attn.c_attn.weight").value.shape() == shape_t{3 * C, C});
  CHECK(m.param("transformer.h.0.attn.c_attn.bias").value.shape() == shape_t{3 * C});
  CHECK(m.param("transformer.h.0.attn.c_proj.weight").value.shape() == shape_t{C, C});
  CHECK(m.param("transformer.h.1.mlp.c_fc.weight").value.shape() == shape_t{4 * C, C});
  CHECK(m.param("transformer.h.1.mlp.c_proj.weight").value.shape() == shape_t{C, 4 * C});
  CHECK(m.param("transformer.ln_f.bias").value.shape() == shape_t{C});
  CHECK(m.param("lm_head.weight").value.shape() == shape_t{80, C});
  CHECK(m.param("lm_head.weight").value.data() != m.param("transformer.wte.weight").value.data());
  const auto& ps = m.parameters();
  REQUIRE(ps.size() == 2 + 2 * 12 + 3);
  CHECK(ps[2].name == "transformer.h.0.ln_1.weight");
  CHECK(ps[13].name == "transformer.h.0.mlp.c_proj.bias");
  CHECK(ps.back().name == "lm_head.weight");
  const int64_t per_layer = 12 * C * C + 13 * C;
  CHECK(m.num_params() == 80 * C + 16 * C + 2 * per_layer + 2 * C + 80 * C);
  REQUIRE(m.blocks().size() == 4);
  CHECK(m.blocks()[0].name == "embedding");
  CHECK(m.blocks()[2].name == "h.1");
  CHECK(m.blocks()[2].count == 12);
  CHECK(m.blocks()[3].name == "head");
  CHECK(m.block_param_names(3) == std::vector<std::string>{"transformer.ln_f.weight",
                                                           "transformer.ln_f.bias",
                                                           "lm_head.weight"});
  CHECK_THROWS_AS(gpt(80, 16, 2, 3, 32, 2, 1), usage_error);
}

TEST_CASE("GPT init: nanoGPT statistics, a pure function of the seed") {
  gpt a(64, 32, 2, 4, 128, 1, 5), b(64, 32, 2, 4, 128, 1, 5), c(64, 32, 2, 4, 128, 1, 6);
  CHECK(std::memcmp(a.flat_values().data(), b.flat_values().data(), a.flat_values().bytes()) == 0);
  CHECK(std::memcmp(a.flat_values().data(), c.flat_values().data(), a.flat_values().bytes()) != 0);
  auto stdev = [](const tensor& t) {
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < t.numel(); ++i) {
      s += t[i];
      s2 += double(t[i]) * t[i];
    }
    const double mean = s / t.numel();
    return std::sqrt(s2 / t.numel() - mean * mean);
  };
  CHECK(stdev(a.param("transformer.h.0.attn.c_attn.weight").value) ==
        doctest::Approx(0.02).epsilon(0.03));
  CHECK(stdev(a.param("transformer.h.1.mlp.c_fc.weight").value) ==
        doctest::Approx(0.02).epsilon(0.03));
  CHECK(stdev(a.param("transformer.h.1.mlp.c_proj.weight").value) ==
        doctest::Approx(0.02 / std::sqrt(4.0)).epsilon(0.03));
  CHECK(stdev(a.param("transformer.h.0.attn.c_proj.weight").value) ==
        doctest::Approx(0.02 / std::sqrt(4.0)).epsilon(0.05));
  const tensor& ln = a.param("transformer.h.1.ln_2.weight").value;
  const tensor& bias = a.param("transformer.h.0.mlp.c_fc.bias").value;
  for (int64_t i = 0; i < ln.numel(); ++i) REQUIRE(ln[i] == 1.0f);
  for (int64_t i = 0; i < bias.numel(); ++i) REQUIRE(bias[i] == 0.0f);
}

TEST_CASE("GPT gradients match finite differences (t shorter than the context)") {
  gpt m(7, 4, 2, 2, 8, 2, 31);
  scramble(m, 32, 0.5f);
  check_model_grads(m, lm_batch(2, 3, 7, 33), 3e-3f, 2e-2);
}

TEST_CASE("two half micro-batches with loss_scale 0.5 accumulate the full-batch gradient") {
  SUBCASE("mlp") {
    mlp m(20, {16, 8}, 5, 8, 41);
    batch b = mlp_batch(8, 20, 5, 42);
    m.zero_grad();
    const float full = m.forward_backward(b, 1.0f);
    auto g_full = grads_of(m);
    m.zero_grad();
    const float l1 = m.forward_backward(slice(b, 0, 4), 0.5f);
    const float l2 = m.forward_backward(slice(b, 4, 4), 0.5f);
    CHECK(0.5f * (l1 + l2) == doctest::Approx(full).epsilon(1e-5));
    CHECK(rel_error(grads_of(m), g_full) < 1e-5);
  }
  SUBCASE("gpt") {
    gpt m(11, 6, 2, 2, 16, 4, 43);
    batch b = lm_batch(4, 6, 11, 44);
    m.zero_grad();
    const float full = m.forward_backward(b, 1.0f);
    auto g_full = grads_of(m);
    m.zero_grad();
    const float l1 = m.forward_backward(slice(b, 0, 2), 0.5f);
    const float l2 = m.forward_backward(slice(b, 2, 2), 0.5f);
    CHECK(0.5f * (l1 + l2) == doctest::Approx(full).epsilon(1e-5));
    CHECK(rel_error(grads_of(m), g_full) < 1e-5);
  }
}

TEST_CASE("GPT eval counts argmax hits and rejects bad batches") {
  gpt m(9, 5, 1, 1, 8, 2, 51);
  batch b = lm_batch(2, 5, 9, 52);
  const eval_result r = m.eval(b);
  CHECK(r.count == 10);
  CHECK(r.correct <= r.count);
  CHECK(r.loss > 0.0f);
  // Make the model always predict token 4 by a huge lm_head row: every target 4 is a hit.
  tensor& head = m.parameters().back().value;
  head.zero();
  for (int c = 0; c < 8; ++c) head[4 * 8 + c] = 1.0f;
  m.param("transformer.ln_f.bias").value.fill(1.0f);
  for (auto& t : b.targets) t = 4;
  CHECK(m.eval(b).correct == 10);
  // Every other target elsewhere: exactly those are misses.
  for (std::size_t i = 0; i < b.targets.size(); i += 2) b.targets[i] = 3;
  CHECK(m.eval(b).correct == 5);
  batch bad = lm_batch(1, 6, 9, 53);  // t > context
  CHECK_THROWS_AS(m.forward_backward(bad, 1.0f), usage_error);
  bad = lm_batch(1, 3, 9, 53);
  bad.ids[0] = 9;
  CHECK_THROWS_AS(m.eval(bad), usage_error);
}

TEST_CASE("make_model builds what the config names") {
  model_config cfg;
  cfg.kind = "gpt";
  cfg.n_layer = 1;
  cfg.n_head = 2;
  cfg.d_model = 16;
  cfg.context = 8;
  auto g = make_model(cfg, 13, 2, 1);
  CHECK(g->kind() == "gpt");
  CHECK(g->param("lm_head.weight").value.shape() == shape_t{13, 16});
  cfg.kind = "mlp";
  cfg.hidden = {32};
  auto m = make_model(cfg, 0, 2, 1);
  CHECK(m->param("net.2.weight").value.shape() == shape_t{10, 32});
  cfg.kind = "rnn";
  CHECK_THROWS_AS(make_model(cfg, 0, 2, 1), usage_error);
}

namespace {

/// One report of the grads-ready hook with the values its range held at that moment.
struct report {
  int64_t offset, count;
  std::vector<float> values;
};

/// Runs forward_backward from a known non-zero gradient and checks the grads-ready hook
/// against what backward really did: the reports tile the flat gradient exactly once,
/// from the end of the buffer down without gaps (the order a bucket engine reduces in);
/// at each call the reported range already holds its final gradient (bitwise) and every
/// element not yet reported still holds its value from before forward_backward. Returns
/// the reports for further checks.
std::vector<report> check_ready_hook(model& m, const batch& b) {
  rng r(99);
  tensor& g = m.flat_grads();
  for (int64_t i = 0; i < g.numel(); ++i) g[i] = r.normal();
  const std::vector<float> before = grads_of(m);
  const int64_t total = m.num_params();
  std::vector<report> reports;
  std::vector<char> reported(total, 0);
  int64_t repeats = 0, out_of_range = 0;
  int64_t early_changes = 0;  // elements not yet reported already touched
  m.set_grads_ready_hook([&](int64_t off, int64_t n) {
    if (off < 0 || n <= 0 || off + n > total) {
      ++out_of_range;
      return;
    }
    for (int64_t k = off; k < off + n; ++k) {
      repeats += reported[k];
      reported[k] = 1;
    }
    reports.push_back({off, n, std::vector<float>(g.data() + off, g.data() + off + n)});
    for (int64_t k = 0; k < total; ++k)
      if (!reported[k]) early_changes += std::memcmp(&g[k], &before[k], 4) != 0;
  });
  CHECK(m.has_grads_ready_hook());
  m.forward_backward(b, 1.0f);
  m.set_grads_ready_hook(nullptr);
  CHECK(!m.has_grads_ready_hook());

  CHECK(out_of_range == 0);
  CHECK(repeats == 0);
  CHECK(early_changes == 0);
  CHECK(std::count(reported.begin(), reported.end(), 0) == 0);
  // Descending and contiguous: each range ends where the previous one began.
  int64_t end = total;
  for (const report& rep : reports) {
    CHECK(rep.offset + rep.count == end);
    end = rep.offset;
  }
  CHECK(end == 0);
  const std::vector<float> after = grads_of(m);
  for (const report& rep : reports) {
    INFO("range [" << rep.offset << ", +" << rep.count << ")");
    CHECK(std::memcmp(rep.values.data(), after.data() + rep.offset, rep.count * 4) == 0);
    // The range did change, so the comparison above is not vacuous.
    CHECK(std::memcmp(before.data() + rep.offset, after.data() + rep.offset, rep.count * 4) != 0);
  }

  // eval never calls the hook; an empty hook is no hook.
  int calls = 0;
  m.set_grads_ready_hook([&](int64_t, int64_t) { ++calls; });
  m.eval(b);
  CHECK(calls == 0);
  m.set_grads_ready_hook(nullptr);
  m.forward_backward(b, 1.0f);
  CHECK(calls == 0);
  return reports;
}

/// The reports that fall inside parameter `name`, in report order.
std::vector<report> reports_in(const model& m, const std::vector<report>& all,
                               const std::string& name) {
  const parameter& p = m.param(name);
  std::vector<report> out;
  for (const report& rep : all)
    if (rep.offset >= p.offset && rep.offset + rep.count <= p.offset + p.grad.numel())
      out.push_back(rep);
  return out;
}

/// Checks that parameter `name`, a weight [out, in], came in dw_chunk_rows-row chunks
/// from the last rows down (the lowest chunk takes the remainder).
void check_weight_chunks(const model& m, const std::vector<report>& all, const std::string& name) {
  const parameter& p = m.param(name);
  const int out = static_cast<int>(p.grad.dim(0)), in = static_cast<int>(p.grad.dim(1));
  const int rows = linear::dw_chunk_rows(out, in);
  const std::vector<report> got = reports_in(m, all, name);
  INFO("parameter " << name << " [" << out << ", " << in << "], chunks of " << rows << " rows");
  REQUIRE(got.size() == static_cast<std::size_t>((out + rows - 1) / rows));
  int r1 = out;
  for (const report& rep : got) {
    const int r0 = std::max(0, r1 - rows);
    CHECK(rep.offset == p.offset + static_cast<int64_t>(r0) * in);
    CHECK(rep.count == static_cast<int64_t>(r1 - r0) * in);
    r1 = r0;
  }
}

/// Two models built alike, one with a hook and one without, accumulate the same bits.
template <class Make>
void check_same_bits_with_hook(Make make, const batch& b) {
  auto plain = make(), hooked = make();
  rng r(5);
  for (int64_t i = 0; i < plain->flat_grads().numel(); ++i)
    plain->flat_grads()[i] = hooked->flat_grads()[i] = r.normal();
  int64_t seen = 0;
  hooked->set_grads_ready_hook([&](int64_t, int64_t n) { seen += n; });
  for (int rep = 0; rep < 2; ++rep) {
    CHECK(plain->forward_backward(b, 0.5f) == hooked->forward_backward(b, 0.5f));
  }
  CHECK(seen == 2 * hooked->num_params());
  CHECK(std::memcmp(plain->flat_grads().data(), hooked->flat_grads().data(),
                    plain->flat_grads().bytes()) == 0);
}

}  // namespace

TEST_CASE("linear::dw_chunk_rows: ~k_chunk_elements a chunk in whole multiples of rows") {
  const int64_t e = linear::k_chunk_elements;
  const int m = linear::k_chunk_row_multiple;
  // The shapes that matter: the Fashion-MNIST MLP and the bench GPT (d_model 128).
  CHECK(linear::dw_chunk_rows(256, 784) == (e / 784 / m + 1) * m);  // 32768/784 = 41.8
  CHECK(linear::dw_chunk_rows(512, 128) == 256);                    // c_fc: 2 chunks
  CHECK(linear::dw_chunk_rows(10, 128) == 10);                      // all rows
  CHECK(linear::dw_chunk_rows(1, 1) == 1);
  for (int out : {1, 5, 16, 17, 100, 256, 512, 3000}) {
    for (int in : {1, 8, 128, 784, 4096, 100000}) {
      const int rows = linear::dw_chunk_rows(out, in);
      const int64_t want = (e + in - 1) / in;  // rows for the target size, before rounding
      INFO("out " << out << " in " << in << " rows " << rows << " want " << want);
      CHECK(rows == linear::dw_chunk_rows(out, in));
      REQUIRE(rows >= 1);
      CHECK(rows <= out);
      if (rows == out) {
        CHECK(out <= (want + m - 1) / m * m);
        continue;
      }
      CHECK(rows % m == 0);
      CHECK(rows >= want);
      CHECK(rows < std::max<int64_t>(want, 1) + m);
    }
  }
}

TEST_CASE("linear backward in row chunks: the same maths as one dW, reports bias then rows down") {
  // 100 x 700: several chunks, the lowest one a remainder.
  const int in = 700, out = 100, rows = 6;
  REQUIRE(linear::dw_chunk_rows(out, in) < out);
  std::vector<float> w = randn(out * in, 1, 0.1f), dw0 = randn(out * in, 2), bias = randn(out, 3),
                     db0 = randn(out, 4), x = randn(rows * in, 5), dy = randn(rows * out, 6);
  pool p;
  tensor tw({out, in}, p), tdw({out, in}, p), tb({out}, p), tdb({out}, p);
  std::copy(w.begin(), w.end(), tw.data());
  std::copy(dw0.begin(), dw0.end(), tdw.data());
  std::copy(bias.begin(), bias.end(), tb.data());
  std::copy(db0.begin(), db0.end(), tdb.data());
  linear l{tw, tb, tdw, tdb, in, out};
  std::vector<float> dx(rows * in, -7.0f);
  std::vector<std::pair<const float*, int64_t>> seen;
  l.backward(dx.data(), dy.data(), x.data(), rows,
             [&](const float* first, int64_t n) { seen.emplace_back(first, n); });
  // Independent double sums.
  std::vector<double> want_dw(out * in), want_db(out), want_dx(rows * in);
  std::vector<float> got_dw(tdw.data(), tdw.data() + out * in),
      got_db(tdb.data(), tdb.data() + out);
  for (int j = 0; j < out; ++j) {
    double sb = db0[j];
    for (int r = 0; r < rows; ++r) sb += dy[r * out + j];
    want_db[j] = sb;
    for (int i = 0; i < in; ++i) {
      double s = dw0[j * in + i];
      for (int r = 0; r < rows; ++r) s += double(dy[r * out + j]) * x[r * in + i];
      want_dw[j * in + i] = s;
    }
  }
  for (int r = 0; r < rows; ++r)
    for (int i = 0; i < in; ++i) {
      double s = 0;
      for (int j = 0; j < out; ++j) s += double(dy[r * out + j]) * w[j * in + i];
      want_dx[r * in + i] = s;
    }
  CHECK(rel_error(got_dw, want_dw) < 1e-6);
  CHECK(rel_error(got_db, want_db) < 1e-6);
  CHECK(rel_error(dx, want_dx) < 1e-6);
  // Bias first, then the weight from its end down, contiguous.
  REQUIRE(seen.size() >= 3);
  CHECK(seen[0].first == tdb.data());
  CHECK(seen[0].second == out);
  const float* end = tdw.data() + out * in;
  for (std::size_t k = 1; k < seen.size(); ++k) {
    CHECK(seen[k].first + seen[k].second == end);
    end = seen[k].first;
  }
  CHECK(end == tdw.data());
  // Without a reporter the bits are the same.
  std::copy(dw0.begin(), dw0.end(), tdw.data());
  std::copy(db0.begin(), db0.end(), tdb.data());
  std::vector<float> dx2(rows * in, 3.0f);
  l.backward(dx2.data(), dy.data(), x.data(), rows);
  CHECK(std::memcmp(got_dw.data(), tdw.data(), got_dw.size() * 4) == 0);
  CHECK(std::memcmp(got_db.data(), tdb.data(), got_db.size() * 4) == 0);
  CHECK(std::memcmp(dx.data(), dx2.data(), dx.size() * 4) == 0);
}

TEST_CASE(
    "MLP grads-ready hook: every element once - end of the buffer first - exactly when final") {
  SUBCASE("small layers, one chunk each") {
    mlp m(20, {16, 12, 8}, 5, 8, 61);
    scramble(m, 62, 0.5f);
    const std::vector<report> reps = check_ready_hook(m, mlp_batch(8, 20, 5, 63));
    // One range per parameter: net.6.bias, net.6.weight, net.4.bias, ... net.0.weight.
    CHECK(reps.size() == m.parameters().size());
  }
  SUBCASE("a wide first layer comes in row chunks") {
    mlp m(500, {200, 40}, 5, 8, 64);
    scramble(m, 65, 0.2f);
    const std::vector<report> reps = check_ready_hook(m, mlp_batch(8, 500, 5, 66));
    REQUIRE(linear::dw_chunk_rows(200, 500) < 200);
    check_weight_chunks(m, reps, "net.0.weight");
    check_weight_chunks(m, reps, "net.2.weight");
    CHECK(reports_in(m, reps, "net.0.bias").size() == 1);
  }
  check_same_bits_with_hook(
      [] {
        return std::make_unique<mlp>(500, std::vector<int>{200, 40}, 5, 8, 67);
      },
      mlp_batch(8, 500, 5, 68));
}

TEST_CASE("GPT grads-ready hook: lm_head .. wte in descending offsets - exactly when final") {
  SUBCASE("small") {
    gpt m(11, 6, 3, 2, 16, 4, 71);
    scramble(m, 72, 0.3f);
    const std::vector<report> reps = check_ready_hook(m, lm_batch(3, 5, 11, 73));
    // One range per parameter, except that each LayerNorm (2 per layer, plus ln_f) and the
    // embedding (wte, wpe) are written by one kernel and come as one range.
    CHECK(reps.size() == m.parameters().size() - (2 * 3 + 1) - 1);
  }
  SUBCASE("d_model 128: c_fc, mlp.c_proj and c_attn come in row chunks") {
    gpt m(11, 4, 1, 2, 128, 2, 74);
    scramble(m, 75, 0.05f);
    const std::vector<report> reps = check_ready_hook(m, lm_batch(2, 4, 11, 76));
    for (const char* name : {"transformer.h.0.mlp.c_proj.weight", "transformer.h.0.mlp.c_fc.weight",
                             "transformer.h.0.attn.c_proj.weight",
                             "transformer.h.0.attn.c_attn.weight", "lm_head.weight"})
      check_weight_chunks(m, reps, name);
    CHECK(reports_in(m, reps, "transformer.h.0.mlp.c_fc.weight").size() > 1);
  }
  check_same_bits_with_hook([] { return std::make_unique<gpt>(11, 4, 1, 2, 128, 2, 77); },
                            lm_batch(2, 4, 11, 78));
}
