// The serving engine (runtime/train/serve_engine): requests decoded together, waiting for
// room, preempted when the KV cache runs out, and cancelled, each giving the text that
// `cohort generate`'s loop (the training forward, no cache) gives alone.
#include <doctest/doctest.h>

#include <condition_variable>
#include <map>
#include <mutex>

#include "runtime/nn/gpt.hpp"
#include "runtime/train/generate.hpp"
#include "runtime/train/serve_engine.hpp"

using namespace cohort;

namespace {

// Collects each request's tokens and end.
struct sink {
  std::mutex mu;
  std::condition_variable cv;
  std::map<int, std::vector<int32_t>> tokens;
  std::map<int, std::string> done;

  train::serve_request make(int id, std::vector<int32_t> prompt, int max_tokens, uint64_t seed,
                            int stop_after = -1) {
    train::serve_request r;
    r.prompt = std::move(prompt);
    r.max_tokens = max_tokens;
    r.seed = seed;
    r.sample.temperature = 1.0f;
    r.on_token = [this, id, stop_after](int32_t t) {
      std::lock_guard<std::mutex> lk(mu);
      tokens[id].push_back(t);
      return stop_after < 0 || static_cast<int>(tokens[id].size()) < stop_after;
    };
    r.on_done = [this, id](const std::string& why) {
      std::lock_guard<std::mutex> lk(mu);
      done[id] = why;
      cv.notify_all();
    };
    return r;
  }
  void wait(std::size_t n) {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return done.size() >= n; });
  }
};

std::vector<int32_t> alone(nn::gpt& m, const std::vector<int32_t>& prompt, int max_tokens,
                           uint64_t seed) {
  train::generate_options o;
  o.max_tokens = max_tokens;
  o.seed = seed;
  o.sample.temperature = 1.0f;
  return train::generate(m, prompt, o);
}

// Six requests (one of no tokens, two sliding past the context of 8) under LIM: each must
// end with the text it gets alone, every block back. Returns the engine's stats at the end.
train::serve_stats run_six(nn::gpt& m, const train::serve_limits& lim) {
  struct job {
    std::vector<int32_t> prompt;
    int max_tokens;
  };
  const std::vector<job> jobs = {{{1, 2, 3}, 12}, {{4}, 5},        {{5, 6, 7, 8, 9}, 9},
                                 {{2, 2}, 0},     {{10, 1, 0}, 7}, {{3, 1, 4, 1, 5, 9, 2, 6, 5}, 4}};
  sink s;
  train::serve_stats st;
  {
    train::serve_engine e(m, lim);
    for (std::size_t i = 0; i < jobs.size(); ++i)
      REQUIRE(e.submit(s.make(static_cast<int>(i), jobs[i].prompt, jobs[i].max_tokens, 100 + i)) ==
              "");
    s.wait(jobs.size());
    st = e.stats();
  }
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    CAPTURE(i);
    CHECK(s.done[static_cast<int>(i)] == "length");
    CHECK(s.tokens[static_cast<int>(i)] == alone(m, jobs[i].prompt, jobs[i].max_tokens, 100 + i));
  }
  CHECK(st.kv_blocks_used == 0);
  CHECK(st.requests_done == jobs.size());
  return st;
}

}  // namespace

TEST_CASE("serve engine: concurrent requests give the texts they give alone") {
  nn::gpt m(11, 8, 2, 2, 16, 1, 3);
  run_six(m, train::serve_limits{});
}

TEST_CASE("serve engine: two at a time in a small cache: waiting, preemption, same texts") {
  nn::gpt m(11, 8, 2, 2, 16, 1, 3);
  train::serve_limits lim;
  lim.max_batch = 2;
  lim.kv_blocks = 7;  // two windows of 8 positions need 8 blocks of 2: one is preempted
  lim.block_tokens = 2;
  CHECK(run_six(m, lim).preemptions > 0);
}

TEST_CASE("serve engine: refusals, and a cancelled request gives its blocks back") {
  nn::gpt m(11, 8, 2, 2, 16, 1, 3);
  train::serve_limits lim;
  lim.kv_blocks = 2;
  lim.block_tokens = 2;
  sink s;
  train::serve_engine e(m, lim);
  CHECK(e.submit(s.make(0, {}, 3, 1)) == "the prompt is empty");
  CHECK(e.submit(s.make(0, {1}, -1, 1)) == "max_tokens must be >= 0");
  const std::string big = e.submit(s.make(0, {1, 2, 3, 4}, 3, 1));  // 5 positions: 3 blocks
  CHECK(big.find("needs 3 KV blocks and the cache has 2") != std::string::npos);
  REQUIRE(e.submit(s.make(7, {1, 2}, 50, 1, 2)) == "");  // the client leaves after 2 tokens
  s.wait(1);
  CHECK(s.done[7] == "cancelled");
  CHECK(s.tokens[7].size() == 2);
  CHECK(e.stats().kv_blocks_used == 0);  // given back before the end was told
}
