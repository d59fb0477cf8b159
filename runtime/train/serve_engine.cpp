#include "runtime/train/serve_engine.hpp"

#include <algorithm>

namespace cohort::train {

serve_engine::serve_engine(const nn::gpt& m, const serve_limits& limits)
    : serve_engine(std::make_unique<nn::gpt_decoder>(m), limits) {}

serve_engine::serve_engine(std::unique_ptr<nn::decoder> d, const serve_limits& limits)
    : dec_(std::move(d)),
      limits_(limits),
      blocks_(limits.kv_blocks, limits.block_tokens, dec_->cache_layers(), dec_->shape().d_model) {
  stats_.kv_blocks_total = blocks_.capacity();
  thread_ = std::thread([this] { loop(); });
}

serve_engine::~serve_engine() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::string serve_engine::submit(serve_request r) {
  if (r.prompt.empty()) return "the prompt is empty";
  if (r.max_tokens < 0) return "max_tokens must be >= 0";
  const int window = std::min(static_cast<int>(r.prompt.size()), shape().context);
  // The window and the next position must fit in the cache even when it is otherwise empty.
  if (blocks_.blocks_for(window + 1) > blocks_.capacity())
    return "the prompt needs " + std::to_string(blocks_.blocks_for(window + 1)) +
           " KV blocks and the cache has " + std::to_string(blocks_.capacity()) +
           " (cohort serve --kv-blocks)";
  auto a = std::make_unique<active>();
  a->text = r.prompt;
  a->rng.seed(r.seed);
  a->req = std::move(r);
  a->seq = std::make_unique<nn::kv_sequence>(blocks_);
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stop_) return "the server is stopping";
    if (static_cast<int>(waiting_.size()) >= limits_.max_waiting)
      return "the server is busy: " + std::to_string(waiting_.size()) +
             " requests are waiting; try again later";
    waiting_.push_back(std::move(a));
    stats_.waiting = static_cast<int>(waiting_.size());
  }
  cv_.notify_one();
  return {};
}

serve_stats serve_engine::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

void serve_engine::loop() {
  std::vector<std::unique_ptr<active>> running;
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !waiting_.empty() || !running.empty(); });
      if (stop_) break;
      // Admission in arrival order, while the batch has room and the cache has the blocks
      // of the next one's prompt (a request never overtakes an earlier one).
      int free = blocks_.free_blocks();
      while (!waiting_.empty() && static_cast<int>(running.size()) < limits_.max_batch) {
        const active& a = *waiting_.front();
        const int window = std::min(static_cast<int>(a.text.size()), shape().context);
        const int need = blocks_.blocks_for(window);
        if (need > free) break;
        free -= need;
        running.push_back(std::move(waiting_.front()));
        waiting_.pop_front();
      }
      stats_.waiting = static_cast<int>(waiting_.size());
    }
    step(running);
    std::lock_guard<std::mutex> lk(mu_);
    stats_.running = static_cast<int>(running.size());
    stats_.kv_blocks_used = blocks_.used_blocks();
  }
  // Stopping: whatever is left ends with an error.
  std::deque<std::unique_ptr<active>> left;
  {
    std::lock_guard<std::mutex> lk(mu_);
    left.swap(waiting_);
  }
  for (auto& a : running)
    if (a->req.on_done) a->req.on_done("error: the server stopped");
  for (auto& a : left)
    if (a->req.on_done) a->req.on_done("error: the server stopped");
}

void serve_engine::step(std::vector<std::unique_ptr<active>>& batch) {
  const int context = shape().context, vocab = shape().vocab;
  // Its blocks back and counted before its end is told, so that whoever hears it sees them.
  auto finish = [&](std::size_t i, const std::string& why) {
    std::unique_ptr<active> a = std::move(batch[i]);
    batch.erase(batch.begin() + static_cast<std::ptrdiff_t>(i));
    a->seq->release();
    {
      std::lock_guard<std::mutex> lk(mu_);
      ++stats_.requests_done;
      stats_.running = static_cast<int>(batch.size());
      stats_.kv_blocks_used = blocks_.used_blocks();
    }
    if (a->req.on_done) a->req.on_done(why);
  };
  for (std::size_t i = 0; i < batch.size();) {
    if (batch[i]->made >= batch[i]->req.max_tokens)
      finish(i, "length");
    else
      ++i;
  }
  // Each sequence's rows: its whole window when it has no cache (new, preempted, or past the
  // context: the window of the last `context` tokens again), else its newest token.
  std::vector<nn::decode_item> items;
  for (std::size_t i = 0; i < batch.size();) {
    active& a = *batch[i];
    const int len = a.seq->length();
    if (len > 0 && len + 1 > context) a.seq->release();
    const int n = a.seq->length() == 0 ? std::min(static_cast<int>(a.text.size()), context) : 1;
    if (a.seq->reserve(n)) {
      items.push_back({a.seq.get(), a.text.data() + a.text.size() - n, n});
      ++i;
      continue;
    }
    // Out of blocks: the newest request leaves the batch for the head of the queue and is
    // recomputed from its text when there is room. It is this one or one after it, so none
    // of its rows is listed yet; the loop then tries this one again.
    std::unique_ptr<active> newest = std::move(batch.back());
    batch.pop_back();
    newest->seq->release();
    std::lock_guard<std::mutex> lk(mu_);
    ++stats_.preemptions;
    waiting_.push_front(std::move(newest));
  }
  if (items.empty()) return;
  dec_->forward(items, logits_);
  uint64_t made = 0;
  for (std::size_t i = 0, k = 0; i < batch.size(); ++k) {
    active& a = *batch[i];
    const int32_t tok = nn::sample_next(logits_.data() + k * static_cast<std::size_t>(vocab), vocab,
                                        a.req.sample, a.rng);
    a.text.push_back(tok);
    ++a.made;
    ++made;
    const bool keep = !a.req.on_token || a.req.on_token(tok);
    if (!keep)
      finish(i, "cancelled");
    else
      ++i;
  }
  std::lock_guard<std::mutex> lk(mu_);
  stats_.tokens_out += made;
  ++stats_.decode_steps;
}

}  // namespace cohort::train
