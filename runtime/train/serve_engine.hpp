// The scheduler of `cohort serve` (docs/serving.md): requests wait in a queue, join the
// running batch at the next decode step while the paged KV cache has room for them
// (continuous batching), and leave it when done, freeing their blocks. One thread runs the
// model (runtime/nn/gpt_decode) for the whole batch per step: the prompts of new requests
// (prefill) and one token of each running one (decode). When the cache runs out, the newest
// running request is preempted: its blocks are freed and it waits at the head of the queue
// to be recomputed from its text so far. Callbacks carry the tokens out; HTTP is not here.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "runtime/nn/gpt.hpp"
#include "runtime/nn/gpt_decode.hpp"
#include "runtime/nn/kv_cache.hpp"
#include "runtime/nn/sampling.hpp"

namespace cohort::train {

struct serve_limits {
  int kv_blocks = 256;     ///< blocks in the KV cache
  int block_tokens = 16;   ///< positions per block
  int max_batch = 32;      ///< sequences decoded together at most
  int max_waiting = 1024;  ///< requests queued at most; submit() refuses beyond
};

/// One completion request.
struct serve_request {
  std::vector<int32_t> prompt;  ///< non-empty token ids
  int max_tokens = 16;
  nn::sampling sample;
  uint64_t seed = 0;
  /// Each new token, on the engine's thread, in order; false stops the request (the client
  /// went away) and frees its blocks.
  std::function<bool(int32_t)> on_token;
  /// Once, on the engine's thread, at the end: "length" (max_tokens made), "cancelled", or
  /// "error: ..." (the engine stopped).
  std::function<void(const std::string&)> on_done;
};

/// What the engine is doing, read at one instant.
struct serve_stats {
  int running = 0;
  int waiting = 0;
  int kv_blocks_used = 0;
  int kv_blocks_total = 0;
  uint64_t requests_done = 0;
  uint64_t tokens_out = 0;
  uint64_t decode_steps = 0;
  uint64_t preemptions = 0;
};

class serve_engine {
 public:
  /// M (on the host) must outlive the engine. Starts the engine's thread.
  serve_engine(const nn::gpt& m, const serve_limits& limits);
  /// The model behind D (a sharded model's head: runtime/train/serve_shards.hpp).
  serve_engine(std::unique_ptr<nn::decoder> d, const serve_limits& limits);
  /// Stops the thread; requests still queued or running end with on_done("error: ...").
  ~serve_engine();
  serve_engine(const serve_engine&) = delete;
  serve_engine& operator=(const serve_engine&) = delete;

  /// Queues R: empty on success, else why not (the queue is full, a prompt that can never
  /// fit in the cache, an empty prompt). Tokens past the context are cut from the left.
  std::string submit(serve_request r);

  serve_stats stats() const;
  const nn::gpt_shape& shape() const { return dec_->shape(); }

 private:
  struct active {
    serve_request req;
    std::vector<int32_t> text;  ///< prompt and the tokens made so far
    int made = 0;
    std::mt19937_64 rng;
    std::unique_ptr<nn::kv_sequence> seq;
  };
  void loop();
  /// One decode step over the running batch (the engine's thread, lock not held).
  void step(std::vector<std::unique_ptr<active>>& batch);

  std::unique_ptr<nn::decoder> dec_;
  serve_limits limits_;
  nn::kv_blocks blocks_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<active>> waiting_;
  bool stop_ = false;
  serve_stats stats_;
  std::vector<float> logits_;
  std::thread thread_;
};

}  // namespace cohort::train
