#include "runtime/nn/gpt_decode.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "runtime/core/error.hpp"
#include "runtime/cpu/kernels.hpp"
#include "runtime/nn/gpt_stage.hpp"

namespace cohort::nn {

void check_decode_items(const gpt_shape& shape, const std::vector<decode_item>& items) {
  for (const decode_item& it : items) {
    if (it.n < 1) throw usage_error("decode: an item with no new token");
    if (it.seq->length() + it.n > shape.context)
      throw usage_error("decode: position " + std::to_string(it.seq->length() + it.n - 1) +
                        " is past the context (" + std::to_string(shape.context) + ")");
    if (it.seq->blocks_needed(it.n) > 0)
      throw usage_error("decode: the sequence has not reserved its new positions");
    for (int i = 0; i < it.n; ++i)
      if (it.ids[i] < 0 || it.ids[i] >= shape.vocab)
        throw usage_error("decode: token id " + std::to_string(it.ids[i]) +
                          " is outside the vocabulary");
  }
}

gpt_part gpt_part::whole(const gpt& m) {
  if (!m.embed().dev->host_visible())
    throw usage_error("serving: the model must be on the host (train.device cpu)");
  gpt_part p;
  p.shape = m.shape();
  p.embed = &m.embed();
  p.blocks = &m.layers();
  p.final_norm = &m.final_norm();
  p.head = &m.head();
  return p;
}

gpt_part gpt_part::of_stage(const gpt_stage& s, std::function<void(float*, int64_t)> tp_allreduce) {
  if (!s.final_norm().dev->host_visible())
    throw usage_error("serving: the model must be on the host (train.device cpu)");
  gpt_part p;
  p.shape = s.shape();
  p.embed = s.range().has_embedding ? &s.embed() : nullptr;
  p.blocks = &s.layers();
  p.final_norm = s.range().has_head ? &s.final_norm() : nullptr;
  p.head = s.range().has_head ? &s.head() : nullptr;
  p.tp_size = s.options().tp_size;
  p.tp_allreduce = std::move(tp_allreduce);
  if (p.tp_size > 1 && !p.tp_allreduce)
    throw usage_error("decode: a tensor-parallel part needs its group's allreduce");
  return p;
}

gpt_decoder::gpt_decoder(const gpt& m) : part_(gpt_part::whole(m)) {}

gpt_decoder::gpt_decoder(gpt_part p) : part_(std::move(p)) {}

void gpt_decoder::forward(const std::vector<decode_item>& items, std::vector<float>& logits) {
  check_decode_items(part_.shape, items);
  logits.assign(items.size() * static_cast<std::size_t>(part_.shape.vocab), 0.0f);
  views_.clear();
  n_.clear();
  ids_.clear();
  int rows = 0;
  for (const decode_item& it : items) {
    views_.push_back({nullptr, nullptr, it.seq->length()});
    n_.push_back(it.n);
    ids_.insert(ids_.end(), it.ids, it.ids + it.n);
    rows += it.n;
  }
  if (rows == 0) return;
  // The whole model's views read the sequences' own blocks through their tables.
  for (std::size_t k = 0; k < items.size(); ++k) {
    views_[k].blocks = items[k].seq->blocks();
    views_[k].table = items[k].seq->table().data();
  }
  x_.resize(static_cast<std::size_t>(rows) * part_.shape.d_model);
  run(views_, n_, ids_.data(), rows, x_.data(), &logits);
  for (const decode_item& it : items) it.seq->advance(it.n);
}

void gpt_decoder::run(const std::vector<kv_view>& kv, const std::vector<int>& n, const int32_t* ids,
                      int rows, float* x, std::vector<float>* logits) {
  const int C = part_.shape.d_model;
  auto fit = [](std::vector<float>& v, int64_t k) {
    if (v.size() < static_cast<std::size_t>(k)) v.resize(static_cast<std::size_t>(k));
  };
  const int n_items = static_cast<int>(kv.size());
  if (rows == 0) return;
  fit(ln_, int64_t{rows} * C);
  fit(res_, int64_t{rows} * C);
  fit(mean_, rows);
  fit(rstd_, rows);
  fit(scores_, part_.shape.context);

  // Embedding: wte[id] + wpe[pos], the sum embedding_fwd computes.
  if (part_.embed != nullptr) {
    const embedding& e = *part_.embed;
    int r = 0;
    for (int k = 0; k < n_items; ++k)
      for (int i = 0; i < n[static_cast<std::size_t>(k)]; ++i, ++r) {
        const float* te = e.wte.data() + static_cast<int64_t>(ids[r]) * C;
        const float* pe = e.wpe.data() + static_cast<int64_t>(kv[static_cast<std::size_t>(k)].length + i) * C;
        float* out = x + static_cast<int64_t>(r) * C;
        for (int c = 0; c < C; ++c) out[c] = te[c] + pe[c];
      }
  }
  const bool tp = part_.tp_size > 1;
  // A row-parallel product of a TP shard: this rank's share, summed over the group, then
  // the (whole) bias once; with one rank, the layer's own forward.
  auto row_parallel = [&](const linear& l, float* y, const float* in) {
    if (!tp) return l.forward(y, in, rows);
    l.dev->linear_fwd(y, in, l.w.data(), nullptr, rows, l.in, l.out);
    part_.tp_allreduce(y, static_cast<int64_t>(rows) * l.out);
    if (l.b.empty()) return;
    for (int r = 0; r < rows; ++r) {
      float* row = y + static_cast<int64_t>(r) * l.out;
      for (int c = 0; c < l.out; ++c) row[c] += l.b.data()[c];
    }
  };
  for (std::size_t l = 0; l < part_.blocks->size(); ++l) {
    const gpt_block& b = (*part_.blocks)[l];
    const int layer = static_cast<int>(l);
    const int cl = b.attn_proj.in, fl = b.c_fc.out;  // this shard's width (C, 4C: whole)
    fit(qkv_, int64_t{rows} * 3 * cl);
    fit(atty_, int64_t{rows} * cl);
    fit(fch_, int64_t{rows} * fl);
    fit(fg_, int64_t{rows} * fl);
    b.ln_1.forward(ln_.data(), mean_.data(), rstd_.data(), x, rows);
    b.c_attn.forward(qkv_.data(), ln_.data(), rows);
    // Keys and values of the new positions into the cache, then attention row by row: a
    // prompt's row sees the rows before it, which are written already.
    int r = 0;
    for (int k = 0; k < n_items; ++k) {
      const kv_view& v = kv[static_cast<std::size_t>(k)];
      for (int i = 0; i < n[static_cast<std::size_t>(k)]; ++i, ++r) {
        const float* q = qkv_.data() + static_cast<int64_t>(r) * 3 * cl;
        std::copy(q + cl, q + 2 * cl, v.at(layer, false, v.length + i));
        std::copy(q + 2 * cl, q + 3 * cl, v.at(layer, true, v.length + i));
      }
    }
    // Each row attends to its sequence's positions [0, pos]: their keys and values are
    // found in the block table once per item and layer, then cpu::attention_decode_row.
    r = 0;
    for (int k = 0; k < n_items; ++k) {
      const kv_view& v = kv[static_cast<std::size_t>(k)];
      const int nk = n[static_cast<std::size_t>(k)];
      const int total = v.length + nk;
      kp_.resize(static_cast<std::size_t>(total));
      vp_.resize(static_cast<std::size_t>(total));
      for (int j = 0; j < total; ++j) {
        kp_[static_cast<std::size_t>(j)] = v.at(layer, false, j);
        vp_[static_cast<std::size_t>(j)] = v.at(layer, true, j);
      }
      for (int i = 0; i < nk; ++i, ++r)
        cpu::attention_decode_row(atty_.data() + static_cast<int64_t>(r) * cl,
                                  qkv_.data() + static_cast<int64_t>(r) * 3 * cl, kp_.data(),
                                  vp_.data(), v.length + i + 1, cl, b.n_head, scores_.data());
    }
    row_parallel(b.attn_proj, res_.data(), atty_.data());
    b.dev->add_inplace(res_.data(), x, static_cast<int64_t>(rows) * C);
    b.ln_2.forward(ln_.data(), mean_.data(), rstd_.data(), res_.data(), rows);
    b.c_fc.forward(fch_.data(), ln_.data(), rows);
    b.dev->gelu_fwd(fg_.data(), fch_.data(), static_cast<int64_t>(rows) * fl);
    row_parallel(b.mlp_proj, x, fg_.data());
    b.dev->add_inplace(x, res_.data(), static_cast<int64_t>(rows) * C);
  }
  if (part_.head == nullptr || logits == nullptr) return;
  // Only each item's last row goes through ln_f and lm_head.
  fit(last_, int64_t{n_items} * C);
  fit(lnf_, int64_t{n_items} * C);
  {
    int r = 0;
    for (int k = 0; k < n_items; ++k) {
      r += n[static_cast<std::size_t>(k)];
      std::copy(x + static_cast<int64_t>(r - 1) * C, x + static_cast<int64_t>(r) * C,
                last_.data() + static_cast<int64_t>(k) * C);
    }
  }
  logits->resize(static_cast<std::size_t>(n_items) * part_.shape.vocab);
  part_.final_norm->forward(lnf_.data(), mean_.data(), rstd_.data(), last_.data(), n_items);
  part_.head->forward(logits->data(), lnf_.data(), n_items);
}

}  // namespace cohort::nn
