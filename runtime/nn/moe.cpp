#include "runtime/nn/moe.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "runtime/core/error.hpp"

namespace cohort::nn {

namespace {

// A linear layer's gradient spans in the order linear::backward reports them, for an
// expert that got no token (nothing to add, but the spans are final all the same).
void report_untouched(linear& l, const grads_ready_span& report) {
  if (!report) return;
  if (!l.db.empty()) report(l.db.data(), l.out);
  const int step = l.dev->chunked_weight_grads() ? linear::dw_chunk_rows(l.out, l.in) : std::max(1, l.out);
  for (int r1 = l.out; r1 > 0;) {
    const int r0 = std::max(0, r1 - step);
    report(l.dw.data() + static_cast<int64_t>(r0) * l.in, static_cast<int64_t>(r1 - r0) * l.in);
    r1 = r0;
  }
}

// F(token, assignment, row) for each kept assignment, in token and choice order; ROW is its
// row in the experts' batches (expert * capacity + slot).
template <class F>
void for_each_kept(const moe_routing& r, F f) {
  for (int t = 0; t < r.tokens; ++t)
    for (int c = 0; c < r.top_k; ++c) {
      const std::size_t i = static_cast<std::size_t>(t) * r.top_k + c;
      if (r.slot[i] >= 0) f(t, i, static_cast<int64_t>(r.expert[i]) * r.capacity + r.slot[i]);
    }
}

}  // namespace

expert_place expert_group(int ep, int replicas, int rank) {
  expert_place p;
  const int width = std::max(1, ep);
  p.group = rank / width;
  p.rank = rank - p.group * width;
  p.size = std::min(replicas, (p.group + 1) * width) - p.group * width;
  return p;
}

int expert_of_param(const std::string& name) {
  static const std::string key = "mlp.experts.";
  const std::size_t at = name.find(key);
  if (at == std::string::npos) return -1;
  std::size_t i = at + key.size();
  int e = 0;
  bool digits = false;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i) {
    e = e * 10 + (name[i] - '0');
    digits = true;
  }
  return digits && i < name.size() && name[i] == '.' ? e : -1;
}

int moe_capacity(int tokens, int experts, int top_k, float capacity_factor) {
  const double c = std::ceil(static_cast<double>(capacity_factor) * tokens * top_k / experts);
  return static_cast<int>(std::max(1.0, c));
}

moe_routing moe_route(const float* probs, int tokens, int experts, int top_k,
                      float capacity_factor) {
  if (experts < 1 || top_k < 1 || top_k > 2 || top_k > experts)
    throw usage_error("moe: top_k must be 1 or 2, and at most the number of experts");
  moe_routing r;
  r.tokens = tokens;
  r.experts = experts;
  r.top_k = top_k;
  r.capacity = moe_capacity(tokens, experts, top_k, capacity_factor);
  const std::size_t n = static_cast<std::size_t>(tokens) * top_k;
  r.expert.assign(n, -1);
  r.gate.assign(n, 0.0f);
  r.slot.assign(n, -1);
  r.kept.assign(static_cast<std::size_t>(experts), 0);
  r.wanted.assign(static_cast<std::size_t>(experts), 0);
  for (int t = 0; t < tokens; ++t) {
    const float* p = probs + static_cast<int64_t>(t) * experts;
    int first = 0;
    for (int e = 1; e < experts; ++e)
      if (p[e] > p[first]) first = e;
    const std::size_t i = static_cast<std::size_t>(t) * top_k;
    r.expert[i] = first;
    if (top_k == 1) {
      r.gate[i] = p[first];
      continue;
    }
    int second = first == 0 ? 1 : 0;
    for (int e = 0; e < experts; ++e)
      if (e != first && p[e] > p[second]) second = e;
    r.expert[i + 1] = second;
    const float s = p[first] + p[second];
    r.gate[i] = p[first] / s;
    r.gate[i + 1] = p[second] / s;
  }
  // Every token's first choice, then every token's second: a second choice never takes the
  // place of another token's first.
  for (int c = 0; c < top_k; ++c)
    for (int t = 0; t < tokens; ++t) {
      const std::size_t i = static_cast<std::size_t>(t) * top_k + c;
      const int e = r.expert[i];
      ++r.wanted[static_cast<std::size_t>(e)];
      if (r.kept[static_cast<std::size_t>(e)] < r.capacity)
        r.slot[i] = r.kept[static_cast<std::size_t>(e)]++;
      else
        ++r.dropped;
    }
  return r;
}

float moe_layer::forward(moe_acts& a, float* y, const float* x, int rows) const {
  const int E = experts(), C = router.in, H = fc.empty() ? 0 : fc[0].out;
  a.probs.resize(static_cast<std::size_t>(rows) * E);
  if (rows > 0) router.forward(a.probs.data(), x, rows);
  // Softmax per row, in double for the sum (the logits are few).
  for (int t = 0; t < rows; ++t) {
    float* p = a.probs.data() + static_cast<int64_t>(t) * E;
    const float m = *std::max_element(p, p + E);
    double s = 0;
    for (int e = 0; e < E; ++e) s += (p[e] = std::exp(p[e] - m));
    for (int e = 0; e < E; ++e) p[e] = static_cast<float>(p[e] / s);
  }
  a.route = moe_route(a.probs.data(), rows, E, top_k, capacity_factor);
  const moe_routing& r = a.route;
  const int64_t cap = r.capacity;
  a.xin.assign(static_cast<std::size_t>(E * cap * C), 0.0f);
  a.h.resize(static_cast<std::size_t>(E * cap * H));
  a.hg.resize(static_cast<std::size_t>(E * cap * H));
  a.y.resize(static_cast<std::size_t>(E * cap * C));
  for_each_kept(r, [&](int t, std::size_t, int64_t row) {
    std::copy(x + static_cast<int64_t>(t) * C, x + static_cast<int64_t>(t + 1) * C,
              a.xin.data() + row * C);
  });
  if (ep != nullptr && ep->ranks > 1) {
    forward_experts_ep(a);
  } else {
    for (int e = 0; e < E; ++e) {
      const int n = r.kept[static_cast<std::size_t>(e)];
      if (n == 0) continue;
      const int64_t at = e * cap;
      fc[static_cast<std::size_t>(e)].forward(a.h.data() + at * H, a.xin.data() + at * C, n);
      dev->gelu_fwd(a.hg.data() + at * H, a.h.data() + at * H, static_cast<int64_t>(n) * H);
      proj[static_cast<std::size_t>(e)].forward(a.y.data() + at * C, a.hg.data() + at * H, n);
    }
  }
  // Each token's output: its kept assignments' outputs times their gates, in choice order.
  std::fill(y, y + static_cast<int64_t>(rows) * C, 0.0f);
  for_each_kept(r, [&](int t, std::size_t i, int64_t row) {
    const float* src = a.y.data() + row * C;
    float* dst = y + static_cast<int64_t>(t) * C;
    for (int k = 0; k < C; ++k) dst[k] += r.gate[i] * src[k];
  });
  // Switch's load-balancing loss: experts * sum_e f_e * P_e.
  a.aux = 0;
  if (rows == 0) return 0;
  double aux = 0;
  const double assignments = static_cast<double>(rows) * top_k;
  for (int e = 0; e < E; ++e) {
    double pe = 0;
    for (int t = 0; t < rows; ++t) pe += a.probs[static_cast<std::size_t>(t) * E + e];
    aux += (r.wanted[static_cast<std::size_t>(e)] / assignments) * (pe / rows);
  }
  a.aux = static_cast<float>(E * aux);
  return aux_coef * a.aux;
}

void moe_layer::backward(moe_acts& a, float* dx, const float* dy, const float* x, int rows,
                         float aux_scale, const grads_ready_span& report) {
  const int E = experts(), C = router.in, H = fc.empty() ? 0 : fc[0].out;
  const moe_routing& r = a.route;
  const int64_t cap = r.capacity;
  a.dy.assign(static_cast<std::size_t>(E * cap * C), 0.0f);
  a.dhg.resize(static_cast<std::size_t>(E * cap * H));
  a.dh.resize(static_cast<std::size_t>(E * cap * H));
  a.dprobs.assign(static_cast<std::size_t>(rows) * E, 0.0f);
  // Each kept assignment: its expert's output gradient (gate * dy) and its gate's gradient
  // (dy . the expert's output), which goes to the router probabilities.
  std::vector<float>& dgate = a.dgate;
  dgate.assign(r.gate.size(), 0.0f);
  for_each_kept(r, [&](int t, std::size_t i, int64_t row) {
    const float* g = dy + static_cast<int64_t>(t) * C;
    const float* out = a.y.data() + row * C;
    float* d = a.dy.data() + row * C;
    double dot = 0;
    for (int k = 0; k < C; ++k) {
      d[k] = r.gate[i] * g[k];
      dot += static_cast<double>(g[k]) * out[k];
    }
    dgate[i] = static_cast<float>(dot);
  });
  for (int t = 0; t < rows; ++t) {
    const std::size_t i = static_cast<std::size_t>(t) * top_k;
    float* dp = a.dprobs.data() + static_cast<int64_t>(t) * E;
    const float* p = a.probs.data() + static_cast<int64_t>(t) * E;
    if (top_k == 1) {
      dp[r.expert[i]] += dgate[i];
      continue;
    }
    // g0 = p0 / s, g1 = p1 / s, s = p0 + p1.
    const int e0 = r.expert[i], e1 = r.expert[i + 1];
    const float s = p[e0] + p[e1];
    const float g0 = r.gate[i], g1 = r.gate[i + 1];
    const float common = (dgate[i] * g0 + dgate[i + 1] * g1) / s;
    dp[e0] += dgate[i] / s - common;
    dp[e1] += dgate[i + 1] / s - common;
  }
  // The load-balancing loss through P_e (f_e counts, no gradient).
  const double assignments = static_cast<double>(rows) * top_k;
  for (int e = 0; e < E && rows > 0; ++e) {
    const float d = static_cast<float>(aux_scale * aux_coef * E *
                                       (r.wanted[static_cast<std::size_t>(e)] / assignments) / rows);
    for (int t = 0; t < rows; ++t) a.dprobs[static_cast<std::size_t>(t) * E + e] += d;
  }
  // The experts, last first (descending addresses), each adding its inputs' gradient.
  std::fill(dx, dx + static_cast<int64_t>(rows) * C, 0.0f);
  a.dxin.resize(static_cast<std::size_t>(E * cap * C));
  if (ep != nullptr && ep->ranks > 1) backward_experts_ep(a, report);
  for (int e = E; e-- > 0 && !(ep != nullptr && ep->ranks > 1);) {
    const int n = r.kept[static_cast<std::size_t>(e)];
    linear& p = proj[static_cast<std::size_t>(e)];
    linear& f = fc[static_cast<std::size_t>(e)];
    if (n == 0) {
      report_untouched(p, report);
      report_untouched(f, report);
      continue;
    }
    const int64_t at = e * cap;
    p.backward(a.dhg.data() + at * H, a.dy.data() + at * C, a.hg.data() + at * H, n, report);
    dev->gelu_bwd(a.dh.data() + at * H, a.dhg.data() + at * H, a.h.data() + at * H,
                  static_cast<int64_t>(n) * H);
    f.backward(a.dxin.data() + at * C, a.dh.data() + at * H, a.xin.data() + at * C, n, report);
  }
  // Scattered back in token and choice order (the same order on every run).
  for_each_kept(r, [&](int t, std::size_t, int64_t row) {
    const float* src = a.dxin.data() + row * C;
    float* dst = dx + static_cast<int64_t>(t) * C;
    for (int k = 0; k < C; ++k) dst[k] += src[k];
  });
  // Softmax backward, then the router.
  a.dlogits.resize(static_cast<std::size_t>(rows) * E);
  for (int t = 0; t < rows; ++t) {
    const float* p = a.probs.data() + static_cast<int64_t>(t) * E;
    const float* dp = a.dprobs.data() + static_cast<int64_t>(t) * E;
    double s = 0;
    for (int e = 0; e < E; ++e) s += static_cast<double>(p[e]) * dp[e];
    float* dl = a.dlogits.data() + static_cast<int64_t>(t) * E;
    for (int e = 0; e < E; ++e) dl[e] = static_cast<float>(p[e] * (dp[e] - s));
  }
  a.drouter.resize(static_cast<std::size_t>(rows) * C);
  if (rows == 0) {  // a pass without tokens of its own (expert parallelism)
    report_untouched(router, report);
    return;
  }
  router.backward(a.drouter.data(), a.dlogits.data(), x, rows, report);
  for (std::size_t k = 0; k < a.drouter.size(); ++k) dx[k] += a.drouter[k];
}

namespace {

// Expert parallelism's blocks: rank r's block in BUF holds, for each of r's experts j in order,
// N(r, j) rows of C floats, packed; ROWS(r, j) says where each expert's rows lie locally.
template <class N, class Rows>
void pack_blocks(std::vector<float>& buf, int ranks, int per_rank, int64_t block_rows, int C,
                 N n, Rows rows) {
  buf.assign(static_cast<std::size_t>(ranks * block_rows * C), 0.0f);
  for (int r = 0; r < ranks; ++r) {
    float* dst = buf.data() + r * block_rows * C;
    for (int j = 0; j < per_rank; ++j) {
      const int64_t k = static_cast<int64_t>(n(r, j)) * C;
      if (k == 0) continue;
      std::copy(rows(r, j), rows(r, j) + k, dst);
      dst += k;
    }
  }
}

template <class N, class Rows>
void unpack_blocks(const std::vector<float>& buf, int ranks, int per_rank, int64_t block_rows,
                   int C, N n, Rows rows) {
  for (int r = 0; r < ranks; ++r) {
    const float* src = buf.data() + r * block_rows * C;
    for (int j = 0; j < per_rank; ++j) {
      const int64_t k = static_cast<int64_t>(n(r, j)) * C;
      if (k == 0) continue;
      std::copy(src, src + k, rows(r, j));
      src += k;
    }
  }
}

}  // namespace

void moe_layer::forward_experts_ep(moe_acts& a) const {
  const int E = experts(), C = router.in, H = fc.empty() ? 0 : fc[0].out;
  const int R = ep->ranks, me = ep->rank;
  const moe_routing& r = a.route;
  const int64_t cap = r.capacity;
  const int P = a.per_rank = (E + R - 1) / R;
  // Counts first: rank d's block is the rows this rank sends each of d's experts (d + j*R),
  // then the most rows this rank sends any rank. Every rank receives every rank's most, so all
  // agree on the largest block of the pass, the size every payload exchange below pads to.
  const auto expert_of = [&](int d, int j) { return d + j * R; };
  std::vector<int32_t> counts(static_cast<std::size_t>(R * (P + 1)), 0), got(counts.size());
  a.send_n.assign(static_cast<std::size_t>(R * P), 0);
  int32_t most = 0;
  for (int d = 0; d < R; ++d) {
    int32_t sum = 0;
    for (int j = 0; j < P; ++j) {
      const int e = expert_of(d, j);
      const int32_t n = e < E ? r.kept[static_cast<std::size_t>(e)] : 0;
      a.send_n[static_cast<std::size_t>(d * P + j)] = counts[static_cast<std::size_t>(d * (P + 1) + j)] = n;
      sum += n;
    }
    most = std::max(most, sum);
  }
  for (int d = 0; d < R; ++d) counts[static_cast<std::size_t>(d * (P + 1) + P)] = most;
  ep->alltoall(counts.data(), got.data(), static_cast<std::size_t>(P + 1) * sizeof(int32_t));
  a.recv_n.assign(static_cast<std::size_t>(R * P), 0);
  a.block_rows = 0;
  a.served_at.assign(static_cast<std::size_t>(R * P + 1), 0);
  for (int s = 0; s < R; ++s) {
    const int32_t its_most = got[static_cast<std::size_t>(s * (P + 1) + P)];
    for (int j = 0; j < P; ++j) {
      const int32_t n = got[static_cast<std::size_t>(s * (P + 1) + j)];
      if (n < 0 || n > its_most || (n > 0 && expert_of(me, j) >= E))
        throw cohort::error("moe: rank " + std::to_string(s) + " sent a count of " +
                            std::to_string(n) + " rows for an expert of rank " + std::to_string(me));
      a.recv_n[static_cast<std::size_t>(s * P + j)] = n;
      a.served_at[static_cast<std::size_t>(s * P + j + 1)] = a.served_at[static_cast<std::size_t>(s * P + j)] + n;
    }
    a.block_rows = std::max<int64_t>(a.block_rows, its_most);
  }
  const int64_t served = a.served_at.back();
  a.sxin.resize(static_cast<std::size_t>(served * C));
  a.sh.resize(static_cast<std::size_t>(served * H));
  a.shg.resize(static_cast<std::size_t>(served * H));
  a.sy.resize(static_cast<std::size_t>(served * C));
  if (a.block_rows == 0) return;  // no token anywhere in the group (every rank agrees)
  const int64_t bytes = a.block_rows * C * static_cast<int64_t>(sizeof(float));
  const auto sent = [&](int d, int j) { return a.send_n[static_cast<std::size_t>(d * P + j)]; };
  const auto recvd = [&](int s, int j) { return a.recv_n[static_cast<std::size_t>(s * P + j)]; };
  const auto at = [&](int s, int j) { return a.served_at[static_cast<std::size_t>(s * P + j)]; };
  pack_blocks(a.out, R, P, a.block_rows, C, sent,
              [&](int d, int j) { return a.xin.data() + expert_of(d, j) * cap * C; });
  a.in.resize(a.out.size());
  ep->alltoall(a.out.data(), a.in.data(), static_cast<std::size_t>(bytes));
  unpack_blocks(a.in, R, P, a.block_rows, C, recvd,
                [&](int s, int j) { return a.sxin.data() + at(s, j) * C; });
  // This rank's experts for every source, one source's rows at a time: the products the source
  // would compute alone.
  for (int s = 0; s < R; ++s)
    for (int j = 0; j < P; ++j) {
      const int n = recvd(s, j);
      if (n == 0) continue;
      const auto e = static_cast<std::size_t>(expert_of(me, j));
      const int64_t o = at(s, j);
      fc[e].forward(a.sh.data() + o * H, a.sxin.data() + o * C, n);
      dev->gelu_fwd(a.shg.data() + o * H, a.sh.data() + o * H, static_cast<int64_t>(n) * H);
      proj[e].forward(a.sy.data() + o * C, a.shg.data() + o * H, n);
    }
  pack_blocks(a.out, R, P, a.block_rows, C, recvd,
              [&](int s, int j) { return a.sy.data() + at(s, j) * C; });
  ep->alltoall(a.out.data(), a.in.data(), static_cast<std::size_t>(bytes));
  unpack_blocks(a.in, R, P, a.block_rows, C, sent,
                [&](int d, int j) { return a.y.data() + expert_of(d, j) * cap * C; });
}

void moe_layer::backward_experts_ep(moe_acts& a, const grads_ready_span& report) {
  const int E = experts(), C = router.in, H = fc.empty() ? 0 : fc[0].out;
  const int R = ep->ranks, me = ep->rank, P = a.per_rank;
  const int64_t cap = a.route.capacity;
  const auto expert_of = [&](int d, int j) { return d + j * R; };
  const auto sent = [&](int d, int j) { return a.send_n[static_cast<std::size_t>(d * P + j)]; };
  const auto recvd = [&](int s, int j) { return a.recv_n[static_cast<std::size_t>(s * P + j)]; };
  const auto at = [&](int s, int j) { return a.served_at[static_cast<std::size_t>(s * P + j)]; };
  const int64_t served = a.served_at.back();
  a.sdy.resize(static_cast<std::size_t>(served * C));
  a.sdhg.resize(static_cast<std::size_t>(served * H));
  a.sdh.resize(static_cast<std::size_t>(served * H));
  a.sdxin.resize(static_cast<std::size_t>(served * C));
  const int64_t bytes = a.block_rows * C * static_cast<int64_t>(sizeof(float));
  if (a.block_rows > 0) {
    pack_blocks(a.out, R, P, a.block_rows, C, sent,
                [&](int d, int j) { return a.dy.data() + expert_of(d, j) * cap * C; });
    ep->alltoall(a.out.data(), a.in.data(), static_cast<std::size_t>(bytes));
    unpack_blocks(a.in, R, P, a.block_rows, C, recvd,
                  [&](int s, int j) { return a.sdy.data() + at(s, j) * C; });
  }
  // Experts from the last (descending addresses). This rank's: the other ranks' rows first,
  // each settled on its own (bitwise mode), then its own rows, whose backward reports the
  // final gradients; the others' experts get nothing here.
  for (int e = E; e-- > 0;) {
    linear& p = proj[static_cast<std::size_t>(e)];
    linear& f = fc[static_cast<std::size_t>(e)];
    bool reported = false;
    if (ep->owns(e)) {
      const int j = (e - me) / R;
      for (int k = 1; k <= R; ++k) {
        const int s = (me + k) % R;  // the own rank last
        const int n = recvd(s, j);
        if (n == 0) continue;
        const bool own = s == me;
        const grads_ready_span none;
        const grads_ready_span& rep = own ? report : none;
        const int64_t o = at(s, j);
        p.backward(a.sdhg.data() + o * H, a.sdy.data() + o * C, a.shg.data() + o * H, n, rep);
        dev->gelu_bwd(a.sdh.data() + o * H, a.sdhg.data() + o * H, a.sh.data() + o * H,
                      static_cast<int64_t>(n) * H);
        f.backward(a.sdxin.data() + o * C, a.sdh.data() + o * H, a.sxin.data() + o * C, n, rep);
        if (own)
          reported = true;
        else if (ep->settle)
          ep->settle(f, p);
      }
    }
    if (!reported) {
      report_untouched(p, report);
      report_untouched(f, report);
    }
  }
  if (a.block_rows > 0) {
    pack_blocks(a.out, R, P, a.block_rows, C, recvd,
                [&](int s, int j) { return a.sdxin.data() + at(s, j) * C; });
    ep->alltoall(a.out.data(), a.in.data(), static_cast<std::size_t>(bytes));
    unpack_blocks(a.in, R, P, a.block_rows, C, sent,
                  [&](int d, int j) { return a.dxin.data() + expert_of(d, j) * cap * C; });
  }
}

}  // namespace cohort::nn
