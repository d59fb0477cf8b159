#include "runtime/nn/gpt_decode.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "runtime/core/error.hpp"
#include "runtime/cpu/kernels.hpp"

namespace cohort::nn {

gpt_decoder::gpt_decoder(const gpt& m) : m_(m), shape_(m.shape()) {
  if (!m.embed().dev->host_visible())
    throw usage_error("serving: the model must be on the host (train.device cpu)");
}

void gpt_decoder::forward(const std::vector<decode_item>& items, std::vector<float>& logits) {
  const int C = shape_.d_model, NH = shape_.n_head, V = shape_.vocab;
  int rows = 0;
  for (const decode_item& it : items) {
    if (it.n < 1) throw usage_error("decode: an item with no new token");
    if (it.seq->length() + it.n > shape_.context)
      throw usage_error("decode: position " + std::to_string(it.seq->length() + it.n - 1) +
                        " is past the context (" + std::to_string(shape_.context) + ")");
    if (it.seq->blocks_needed(it.n) > 0)
      throw usage_error("decode: the sequence has not reserved its new positions");
    for (int i = 0; i < it.n; ++i)
      if (it.ids[i] < 0 || it.ids[i] >= V)
        throw usage_error("decode: token id " + std::to_string(it.ids[i]) +
                          " is outside the vocabulary");
    rows += it.n;
  }
  logits.assign(static_cast<std::size_t>(items.size()) * V, 0.0f);
  if (rows == 0) return;
  auto fit = [](std::vector<float>& v, int64_t n) {
    if (v.size() < static_cast<std::size_t>(n)) v.resize(static_cast<std::size_t>(n));
  };
  fit(x_, int64_t{rows} * C);
  fit(ln_, int64_t{rows} * C);
  fit(qkv_, int64_t{rows} * 3 * C);
  fit(atty_, int64_t{rows} * C);
  fit(res_, int64_t{rows} * C);
  fit(fch_, int64_t{rows} * 4 * C);
  fit(fg_, int64_t{rows} * 4 * C);
  fit(mean_, rows);
  fit(rstd_, rows);
  fit(scores_, shape_.context);

  // Embedding: wte[id] + wpe[pos], the sum embedding_fwd computes.
  const embedding& e = m_.embed();
  {
    int r = 0;
    for (const decode_item& it : items)
      for (int i = 0; i < it.n; ++i, ++r) {
        const float* te = e.wte.data() + static_cast<int64_t>(it.ids[i]) * C;
        const float* pe = e.wpe.data() + static_cast<int64_t>(it.seq->length() + i) * C;
        float* out = x_.data() + static_cast<int64_t>(r) * C;
        for (int c = 0; c < C; ++c) out[c] = te[c] + pe[c];
      }
  }
  for (std::size_t l = 0; l < m_.layers().size(); ++l) {
    const gpt_block& b = m_.layers()[l];
    const int layer = static_cast<int>(l);
    b.ln_1.forward(ln_.data(), mean_.data(), rstd_.data(), x_.data(), rows);
    b.c_attn.forward(qkv_.data(), ln_.data(), rows);
    // Keys and values of the new positions into the cache, then attention row by row: a
    // prompt's row sees the rows before it, which are written already.
    int r = 0;
    for (const decode_item& it : items)
      for (int i = 0; i < it.n; ++i, ++r) {
        const float* q = qkv_.data() + static_cast<int64_t>(r) * 3 * C;
        std::copy(q + C, q + 2 * C, it.seq->at(layer, false, it.seq->length() + i));
        std::copy(q + 2 * C, q + 3 * C, it.seq->at(layer, true, it.seq->length() + i));
      }
    // Each row attends to its sequence's positions [0, pos]: their keys and values are
    // found in the block table once per item and layer, then cpu::attention_decode_row.
    r = 0;
    for (const decode_item& it : items) {
      const int n = it.seq->length() + it.n;
      kp_.resize(static_cast<std::size_t>(n));
      vp_.resize(static_cast<std::size_t>(n));
      for (int j = 0; j < n; ++j) {
        kp_[static_cast<std::size_t>(j)] = it.seq->at(layer, false, j);
        vp_[static_cast<std::size_t>(j)] = it.seq->at(layer, true, j);
      }
      for (int i = 0; i < it.n; ++i, ++r)
        cpu::attention_decode_row(atty_.data() + static_cast<int64_t>(r) * C,
                                  qkv_.data() + static_cast<int64_t>(r) * 3 * C, kp_.data(),
                                  vp_.data(), it.seq->length() + i + 1, C, NH, scores_.data());
    }
    b.attn_proj.forward(res_.data(), atty_.data(), rows);
    b.dev->add_inplace(res_.data(), x_.data(), static_cast<int64_t>(rows) * C);
    b.ln_2.forward(ln_.data(), mean_.data(), rstd_.data(), res_.data(), rows);
    b.c_fc.forward(fch_.data(), ln_.data(), rows);
    b.dev->gelu_fwd(fg_.data(), fch_.data(), static_cast<int64_t>(rows) * 4 * C);
    b.mlp_proj.forward(x_.data(), fg_.data(), rows);
    b.dev->add_inplace(x_.data(), res_.data(), static_cast<int64_t>(rows) * C);
  }
  // Only each item's last row goes through ln_f and lm_head.
  const int n_items = static_cast<int>(items.size());
  fit(last_, int64_t{n_items} * C);
  fit(lnf_, int64_t{n_items} * C);
  {
    int r = 0;
    for (int k = 0; k < n_items; ++k) {
      r += items[static_cast<std::size_t>(k)].n;
      std::copy(x_.data() + static_cast<int64_t>(r - 1) * C, x_.data() + static_cast<int64_t>(r) * C,
                last_.data() + static_cast<int64_t>(k) * C);
    }
  }
  m_.final_norm().forward(lnf_.data(), mean_.data(), rstd_.data(), last_.data(), n_items);
  m_.head().forward(logits.data(), lnf_.data(), n_items);
  for (const decode_item& it : items) it.seq->advance(it.n);
}

}  // namespace cohort::nn
