// Sharded parameters (train.zero: 3, docs/sharding.md "Stage 3"): between steps a member
// holds only its shards of the parameters (its own and its replica, as the optimizer state);
// forward and backward gather each block's values from the shards' owners just before they
// read them and give back what this member does not hold just after (the model's params
// hook), as FSDP does per wrapped module, the next block's gather running on a thread of its
// own while the current block computes (train.zero_prefetch). When the group changes, the
// parameters are re-cut with the optimizer state (trainer::reshard); a checkpoint, an
// evaluation or the final digest first gathers them whole (trainer::gather_params) and gives
// them back afterwards.
#include <algorithm>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/comm/communicator.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/host_pages.hpp"
#include "runtime/core/trace.hpp"
#include "runtime/train/trainer.hpp"
#include "runtime/train/zero_shards.hpp"

namespace cohort::train {

/// Gathers the blocks of one pass in their order, on its own thread, as far ahead as asked:
/// the compute thread asks for place K of the order (and K + 1, the prefetch) and waits for
/// K. One thread issues every gather, in the order's sequence, so that each member issues
/// the same collectives in the same order whatever its timing.
class block_prefetch {
 public:
  explicit block_prefetch(std::function<void(std::size_t place)> gather)
      : gather_(std::move(gather)), thread_([this] { run(); }) {}
  ~block_prefetch() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  block_prefetch(const block_prefetch&) = delete;
  block_prefetch& operator=(const block_prefetch&) = delete;

  /// Places [0, PLACE] of the pass are to be gathered.
  void ask(std::size_t place) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      wanted_ = std::max(wanted_, place + 1);
    }
    cv_.notify_all();
  }
  /// Until place PLACE is gathered; rethrows the gather's error (then every later wait too).
  void wait(std::size_t place) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_ > place || error_; });
    if (error_) std::rethrow_exception(error_);
  }
  /// A new pass: nothing asked, nothing done (call with nothing in flight: after the last
  /// place's wait, or after idle()).
  void restart() {
    std::lock_guard<std::mutex> lock(mu_);
    wanted_ = done_ = 0;
    error_ = nullptr;
  }
  /// Until nothing is in flight (a gather in flight ends with its communicator: abort it
  /// first to make this prompt); forgets what was asked.
  void idle() {
    std::unique_lock<std::mutex> lock(mu_);
    wanted_ = std::min(wanted_, done_ + (busy_ ? 1 : 0));
    cv_.wait(lock, [&] { return !busy_; });
    wanted_ = done_ = 0;
    error_ = nullptr;
  }
  bool busy() {
    std::lock_guard<std::mutex> lock(mu_);
    return busy_ || wanted_ > done_;
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || (wanted_ > done_ && !error_); });
      if (stop_) return;
      const std::size_t place = done_;
      busy_ = true;
      lock.unlock();
      std::exception_ptr failed;
      try {
        gather_(place);
      } catch (...) {
        failed = std::current_exception();
      }
      lock.lock();
      busy_ = false;
      if (failed)
        error_ = failed;
      else if (done_ == place)
        ++done_;
      cv_.notify_all();
    }
  }

  std::function<void(std::size_t)> gather_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::size_t wanted_ = 0, done_ = 0;
  bool busy_ = false, stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: starts once the rest is ready
};

trainer::~trainer() = default;

void trainer::set_params_comm(comm::communicator* c) {
  if (c == nullptr && prefetch_ && prefetch_->busy()) {
    // A step that ended half way (an error): its gather in flight ends with its group.
    if (params_comm_ != nullptr) params_comm_->abort();
    prefetch_->idle();
  }
  params_comm_ = c;
  params_at_ = 0;
  if (prefetch_) prefetch_->restart();
}

void trainer::gather_range(comm::communicator& c, int64_t begin, int64_t end) {
  // Each shard's piece of the range from its owner, in place: a member that holds the piece
  // (owner or replica holder) has the same bits already, so nothing it holds changes.
  float* values = model_->flat_values().data();
  const shard_cut cut = cut_of(c.size());
  for (int j = 0; j < c.size(); ++j)
    for (const elem_range& r : cut.shards[static_cast<std::size_t>(j)]) {
      const int64_t lo = std::max(r.begin, begin), hi = std::min(r.end, end);
      if (hi > lo)
        c.broadcast(values + lo, static_cast<std::size_t>(hi - lo) * sizeof(float), rank_at(j));
    }
}

void trainer::gather_block(comm::communicator& c, std::size_t block) {
  const auto [begin, count] = model_->block_elements(block);
  if (gather_block_experts(c, block)) return;  // expert parallelism: what each member reads
  trace::span s("gather block", "comm", trace::track::compute,
                trace::args({{"block", static_cast<int64_t>(block)}}));
  gather_range(c, begin, begin + count);
}

void trainer::on_params(std::size_t block, bool need) {
  comm::communicator* c = params_comm_;
  if (c == nullptr || values_whole_) return;  // all of them are here
  COHORT_CHECK(zero_->holds() && zero_->replicas() == c->size() &&
               zero_->rank() == position_of(c->rank()));
  if (!need) {
    const auto [begin, count] = model_->block_elements(block);
    if (cfg_.train.zero_release && count > 0) release_params_in(begin, begin + count);
    return;
  }
  if (!cfg_.train.zero_prefetch) {
    gather_block(*c, block);
  } else {
    if (!prefetch_)
      prefetch_ = std::make_unique<block_prefetch>([this](std::size_t place) {
        gather_block(*params_comm_, params_order_[place]);
      });
    // Every pass of a step needs the blocks in the same order (eval reads them whole).
    COHORT_CHECK(params_at_ < params_order_.size() && params_order_[params_at_] == block);
    prefetch_->ask(params_at_);
    if (params_at_ + 1 < params_order_.size()) prefetch_->ask(params_at_ + 1);
    {
      trace::span s("wait block", "comm", trace::track::compute,
                    trace::args({{"block", static_cast<int64_t>(block)}}));
      prefetch_->wait(params_at_);
    }
    if (++params_at_ == params_order_.size()) {  // the pass is over
      params_at_ = 0;
      prefetch_->restart();
    }
  }
  const nn::tensor& v = model_->flat_values();
  const long long here = resident_bytes(v.data(), static_cast<std::size_t>(v.bytes()));
  // (Whole pages: at most the buffer, whose ends share pages with other memory.)
  if (here >= 0) params_peak_ = std::max<int64_t>(params_peak_, std::min<int64_t>(here, v.bytes()));
}

void trainer::release_params_in(int64_t begin, int64_t end) {
  float* values = model_->flat_values().data();
  const auto give_back = [&](int64_t b, int64_t e) {
    if (e > b) release_pages(values + b, static_cast<std::size_t>(e - b) * sizeof(float));
  };
  // Whole pages only (release_pages keeps the partial ones at the ends), so a page shared
  // with a held range keeps its bytes. The held ranges, sorted: the sums' holders.
  int64_t at = begin;
  for (const auto& [b, e] : holding_of(zero_->replicas())->ranges[static_cast<std::size_t>(
           rank_at(zero_->rank()))]) {
    const auto hb = static_cast<int64_t>(b), he = static_cast<int64_t>(e);
    if (he <= at) continue;
    if (hb >= end) break;
    give_back(at, std::min(hb, end));
    at = std::max(at, he);
  }
  give_back(at, end);
}

void trainer::release_params() {
  if (!shards_params() || !zero_->holds() || zero_->replicas() < 2) return;
  if (cfg_.train.zero_release) release_params_in(0, model_->num_params());
  values_whole_ = false;
}

}  // namespace cohort::train
