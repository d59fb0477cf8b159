#include "runtime/train/serve_shards.hpp"

#include <spdlog/spdlog.h>

#include <functional>
#include <string>

#include "runtime/comm/factory.hpp"
#include "runtime/comm/local_kv.hpp"
#include "runtime/core/error.hpp"
#include "runtime/nn/gpt_stage.hpp"
#include "runtime/nn/kv_cache.hpp"

namespace cohort::train {

namespace {

constexpr int64_t op_step = 1, op_stop = 2;

// One step's header: what, how many items, how many ints of payload, how many rows.
struct step_header {
  int64_t op = 0, items = 0, payload = 0, rows = 0;
};

std::unique_ptr<comm::communicator> group_of(comm::kv_client& kv, const std::string& name,
                                             int rank, int size, int timeout_ms) {
  comm::transport_options t;
  t.group = name;
  t.transport = comm_transport::shm;
  t.host_id = "serve";
  return comm::make_communicator(comm_backend::gloo, "cpu", kv, rank, size, 1, timeout_ms, t);
}

}  // namespace

void check_shard_layout(const nn::gpt_shape& shape, const shard_layout& l) {
  if (l.tp < 1 || l.pp < 1) throw usage_error("serve: --tp and --pp must be >= 1");
  if (shape.n_head % l.tp != 0 || (4 * shape.d_model) % l.tp != 0)
    throw usage_error("serve: --tp " + std::to_string(l.tp) + " must divide the model's " +
                      std::to_string(shape.n_head) + " heads and its MLP width " +
                      std::to_string(4 * shape.d_model));
  if (l.pp > shape.n_layer)
    throw usage_error("serve: --pp " + std::to_string(l.pp) + " is more stages than the model's " +
                      std::to_string(shape.n_layer) + " blocks");
}

std::unique_ptr<comm::communicator> shard_group(const std::string& dir, const shard_layout& l,
                                                int rank, int timeout_ms) {
  comm::file_kv kv(dir);
  return group_of(kv, "serve", rank, l.world(), timeout_ms);
}

shard_head::shard_head(std::unique_ptr<comm::communicator> world, const nn::gpt_shape& shape,
                       const shard_layout& l)
    : world_(std::move(world)), shape_(shape), layout_(l) {}

shard_head::~shard_head() {
  try {
    step_header h{op_stop, 0, 0, 0};
    world_->broadcast(&h, sizeof h, 0);
  } catch (const std::exception& e) {
    spdlog::warn("serve: the shards could not be told to stop: {}", e.what());
  }
}

void shard_head::forward(const std::vector<nn::decode_item>& items, std::vector<float>& logits) {
  nn::check_decode_items(shape_, items);
  const int C = shape_.d_model, V = shape_.vocab;
  logits.assign(items.size() * static_cast<std::size_t>(V), 0.0f);
  // Per item: its new tokens, its filled positions, its block table; then every new id.
  payload_.clear();
  int rows = 0;
  for (const nn::decode_item& it : items) {
    payload_.push_back(it.n);
    payload_.push_back(it.seq->length());
    payload_.push_back(static_cast<int32_t>(it.seq->table().size()));
    payload_.insert(payload_.end(), it.seq->table().begin(), it.seq->table().end());
    rows += it.n;
  }
  if (rows == 0) return;
  for (const nn::decode_item& it : items) payload_.insert(payload_.end(), it.ids, it.ids + it.n);
  step_header h{op_step, static_cast<int64_t>(items.size()),
                static_cast<int64_t>(payload_.size()), rows};
  world_->broadcast(&h, sizeof h, 0);
  world_->broadcast(payload_.data(), payload_.size() * sizeof(int32_t), 0);
  x_.resize(static_cast<std::size_t>(rows) * C);
  for (int s = 0; s + 1 < layout_.pp; ++s)
    world_->broadcast(x_.data(), x_.size() * sizeof(float), layout_.first_of_stage(s));
  world_->broadcast(logits.data(), logits.size() * sizeof(float),
                    layout_.first_of_stage(layout_.pp - 1));
  for (const nn::decode_item& it : items) it.seq->advance(it.n);
}

void run_shard(const loaded_gpt& g, const shard_options& o, const std::function<void()>& loaded) {
  const shard_layout& l = o.layout;
  check_shard_layout(g.shape, l);
  if (o.rank < 1 || o.rank >= l.world())
    throw usage_error("serve shard: rank " + std::to_string(o.rank) + " outside [1, " +
                      std::to_string(l.world()) + ")");
  const int stage = l.stage_of(o.rank), tp_rank = l.tp_rank_of(o.rank);
  comm::file_kv kv(o.dir);
  auto world = group_of(kv, "serve", o.rank, l.world(), o.timeout_ms);
  std::unique_ptr<comm::communicator> tp;
  if (l.tp > 1)
    tp = group_of(kv, "serve-stage" + std::to_string(stage), tp_rank, l.tp, o.timeout_ms);

  nn::gpt_stage_options so;
  so.tp_size = l.tp;
  so.tp_rank = tp_rank;
  std::function<void(float*, int64_t)> sum;
  if (l.tp > 1)
    sum = [&tp](float* data, int64_t count) {
      tp->allreduce_sum(data, static_cast<std::size_t>(count));
    };
  so.tp_allreduce = sum;
  const nn::stage_range range = nn::partition_gpt(g.shape, l.pp).at(static_cast<std::size_t>(stage));
  nn::gpt_stage part(g.shape, range, so, 0);
  part.load_from(*g.model);
  if (loaded) loaded();
  nn::gpt_decoder dec(nn::gpt_part::of_stage(part, sum));
  const int cl = g.shape.d_model / l.tp;
  nn::kv_blocks blocks(o.kv_blocks, o.block_tokens, range.layers(), cl);

  const int C = g.shape.d_model, V = g.shape.vocab;
  std::vector<int32_t> payload;
  std::vector<nn::kv_view> views;
  std::vector<int> n;
  std::vector<float> x, logits;
  for (;;) {
    step_header h;
    world->broadcast(&h, sizeof h, 0);
    if (h.op == op_stop) return;
    if (h.op != op_step || h.items < 1 || h.rows < 1 || h.payload < 1)
      throw error("serve shard: a step header it cannot read (op " + std::to_string(h.op) + ")");
    payload.resize(static_cast<std::size_t>(h.payload));
    world->broadcast(payload.data(), payload.size() * sizeof(int32_t), 0);
    views.clear();
    n.clear();
    std::size_t at = 0;
    for (int64_t k = 0; k < h.items; ++k) {
      const int nk = payload.at(at), length = payload.at(at + 1), tables = payload.at(at + 2);
      n.push_back(nk);
      views.push_back({&blocks, payload.data() + at + 3, length});
      at += 3 + static_cast<std::size_t>(tables);
    }
    const int32_t* ids = payload.data() + at;
    x.resize(static_cast<std::size_t>(h.rows) * C);
    logits.resize(static_cast<std::size_t>(h.items) * V);
    for (int s = 0; s < l.pp; ++s) {
      if (s == stage)
        dec.run(views, n, ids, static_cast<int>(h.rows), x.data(), s + 1 == l.pp ? &logits : nullptr);
      if (s + 1 < l.pp)
        world->broadcast(x.data(), x.size() * sizeof(float), l.first_of_stage(s));
      else
        world->broadcast(logits.data(), logits.size() * sizeof(float), l.first_of_stage(s));
    }
  }
}

}  // namespace cohort::train
