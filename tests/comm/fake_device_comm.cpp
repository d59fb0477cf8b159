// The fake's streams and rendezvous. A collective completes when the last rank's stream
// arrives at its slot; that thread writes every rank's result under the group's mutex, and
// a rank that gives up (abort, timeout) poisons the group under the same mutex first, so no
// result is ever written into a buffer whose caller has returned.
#include "tests/comm/fake_device_comm.hpp"

#include <algorithm>
#include <cstring>

namespace cohort::comm::testing {

enum class fake_kind { allreduce_f32, allreduce_i64, allgather, alltoall, broadcast, barrier };
enum class fake_state { pending, done, failed };

struct fake_op {
  fake_kind kind = fake_kind::barrier;
  const char* name = "";
  const void* send = nullptr;
  void* recv = nullptr;  // in place ops: send == recv
  std::size_t amount = 0;
  int root = 0;
  std::size_t seq = 0;
  fake_state state = fake_state::pending;
};

void fake_nccl_group::hang_at(int rank, std::size_t seq) {
  std::lock_guard<std::mutex> lock(mutex_);
  hangs_.insert({rank, seq});
}
void fake_nccl_group::fail_at(int rank, std::size_t seq) {
  std::lock_guard<std::mutex> lock(mutex_);
  fails_.insert({rank, seq});
}
void fake_nccl_group::hang_abort(int rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  abort_hangs_.insert(rank);
}
void fake_nccl_group::hang_shrink(int rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  shrink_hangs_.insert(rank);
}
void fake_nccl_group::release_hangs() {
  std::lock_guard<std::mutex> lock(mutex_);
  released_ = true;
  changed_.notify_all();
}
void fake_nccl_group::wait_running(int n) {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return running_ >= n; });
}
void fake_nccl_group::wait_aborts_returned(int n) {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return aborts_returned_ >= n; });
}
bool fake_nccl_group::hang_here(int rank, std::size_t seq) const {
  return hangs_.count({rank, seq}) > 0 && !released_;
}

fake_device_comm::fake_device_comm(std::shared_ptr<fake_nccl_group> group, int rank,
                                   std::chrono::milliseconds timeout)
    : group_(std::move(group)), rank_(rank), timeout_(timeout) {
  stream_ = std::thread([this] { stream_loop(); });
}

fake_device_comm::~fake_device_comm() {
  {
    std::lock_guard<std::mutex> lock(group_->mutex_);
    stop_ = true;
    group_->changed_.notify_all();
  }
  stream_.join();
}

void fake_device_comm::complete(fake_nccl_group::slot& s) {
  const int n = group_->size();
  const fake_op& first = *s.ops[0];
  switch (first.kind) {
    case fake_kind::allreduce_f32:
    case fake_kind::allreduce_i64: {
      for (std::size_t i = 0; i < first.amount; ++i) {
        if (first.kind == fake_kind::allreduce_f32) {
          float acc = 0;  // rank order: the same bits on every rank
          for (int r = 0; r < n; ++r) acc += static_cast<const float*>(s.ops[r]->send)[i];
          for (int r = 0; r < n; ++r) static_cast<float*>(s.ops[r]->recv)[i] = acc;
        } else {
          std::int64_t acc = 0;
          for (int r = 0; r < n; ++r) acc += static_cast<const std::int64_t*>(s.ops[r]->send)[i];
          for (int r = 0; r < n; ++r) static_cast<std::int64_t*>(s.ops[r]->recv)[i] = acc;
        }
      }
      break;
    }
    case fake_kind::allgather:
      for (int to = 0; to < n; ++to)
        for (int from = 0; from < n; ++from)
          std::memcpy(static_cast<char*>(s.ops[to]->recv) + from * first.amount, s.ops[from]->send,
                      first.amount);
      break;
    case fake_kind::alltoall:
      for (int to = 0; to < n; ++to)
        for (int from = 0; from < n; ++from)
          std::memcpy(static_cast<char*>(s.ops[to]->recv) + from * first.amount,
                      static_cast<const char*>(s.ops[from]->send) + to * first.amount,
                      first.amount);
      break;
    case fake_kind::broadcast:
      for (int r = 0; r < n; ++r)
        if (r != first.root) std::memcpy(s.ops[r]->recv, s.ops[first.root]->send, first.amount);
      break;
    case fake_kind::barrier:
      break;
  }
}

void fake_device_comm::stream_loop() {
  fake_nccl_group& g = *group_;
  std::unique_lock<std::mutex> lock(g.mutex_);
  for (;;) {
    g.changed_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    std::shared_ptr<fake_op> op = queue_.front();
    ++g.running_;
    g.changed_.notify_all();
    if (g.hang_here(rank_, op->seq)) g.changed_.wait(lock, [&] { return g.released_ || stop_; });
    if (g.fails_.count({rank_, op->seq}) == 0 && !stop_ && !g.poisoned_) {
      fake_nccl_group::slot& s = g.slots_[op->seq];
      if (s.ops.empty()) s.ops.resize(g.size());
      s.ops[rank_] = op;
      if (++s.arrived == g.size() && !g.stalled_) {
        complete(s);
        s.done = true;
        g.changed_.notify_all();
      }
      g.changed_.wait(lock, [&] { return s.done || g.poisoned_ || stop_; });
      if (s.done) {
        op->state = fake_state::done;
        events_.push_back(fake_event{op->seq, op->name, op->amount});
      }
    }
    if (op->state != fake_state::done) {
      op->state = fake_state::failed;
      g.poisoned_ = true;  // a member failed mid-collective: no later collective completes
    }
    --g.running_;
    queue_.pop_front();
    g.changed_.notify_all();
  }
}

void fake_device_comm::run(std::shared_ptr<fake_op> op) {
  fake_nccl_group& g = *group_;
  std::unique_lock<std::mutex> lock(g.mutex_);
  if (dead_)
    throw comm_error(comm_failure::invalid, op->name,
                     "the communicator is dead after an earlier failure; build a new one");
  op->seq = next_seq_++;
  queue_.push_back(op);
  g.changed_.notify_all();
  g.changed_.wait_until(lock, std::chrono::steady_clock::now() + timeout_, [&] {
    return op->state != fake_state::pending || abort_requested_ || interrupt_requested_;
  });
  if (op->state == fake_state::done) return;
  dead_ = true;
  // This rank gives up: its buffer must not be written any more. An interrupt (no NCCL call
  // on a GPU) ends no peer's call: nothing completes, the peers wait on until their own
  // interrupt, timeout or a shrink with NCCL_SHRINK_ABORT. Anything else fails the peers too.
  if (interrupt_requested_ && !abort_requested_ && op->state == fake_state::pending)
    g.stalled_ = true;
  else
    g.poisoned_ = true;
  g.changed_.notify_all();
  const std::string where =
      "rank " + std::to_string(rank_) + ", collective " + std::to_string(op->seq);
  if (abort_requested_) throw comm_error(comm_failure::aborted, op->name, where + ": abort()");
  if (interrupt_requested_)
    throw comm_error(comm_failure::aborted, op->name, where + ": interrupt()");
  failed_ = true;  // a failure of its own: NCCL's communicator is aborted, never shrunk
  if (op->state == fake_state::failed)
    throw comm_error(comm_failure::peer_lost, op->name,
                     where + ": a member failed or aborted the communicator");
  throw comm_error(comm_failure::timeout, op->name,
                   where + ": not complete after " + std::to_string(timeout_.count()) + " ms");
}

void fake_device_comm::allreduce_sum(float* data, std::size_t n) {
  auto op = std::make_shared<fake_op>();
  *op = fake_op{fake_kind::allreduce_f32, "allreduce_f32", data, data, n};
  run(op);
}
void fake_device_comm::allreduce_sum(std::int64_t* data, std::size_t n) {
  auto op = std::make_shared<fake_op>();
  *op = fake_op{fake_kind::allreduce_i64, "allreduce_i64", data, data, n};
  run(op);
}
void fake_device_comm::allgather(const void* send, void* recv, std::size_t bytes) {
  auto op = std::make_shared<fake_op>();
  *op = fake_op{fake_kind::allgather, "allgather", send, recv, bytes};
  run(op);
}
void fake_device_comm::alltoall(const void* send, void* recv, std::size_t bytes) {
  auto op = std::make_shared<fake_op>();
  *op = fake_op{fake_kind::alltoall, "alltoall", send, recv, bytes};
  run(op);
}
void fake_device_comm::broadcast(void* data, std::size_t bytes, int root) {
  if (root < 0 || root >= size())
    throw comm_error(
        comm_failure::invalid, "broadcast",
        "root " + std::to_string(root) + " is not a rank of " + std::to_string(size()));
  auto op = std::make_shared<fake_op>();
  *op = fake_op{fake_kind::broadcast, "broadcast", data, data, bytes, root};
  run(op);
}
void fake_device_comm::barrier() {
  auto op = std::make_shared<fake_op>();
  *op = fake_op{fake_kind::barrier, "barrier"};
  run(op);
}

void fake_device_comm::abort() {
  fake_nccl_group& g = *group_;
  std::unique_lock<std::mutex> lock(g.mutex_);
  if (g.abort_hangs_.count(rank_)) g.changed_.wait(lock, [&] { return g.released_; });
  abort_requested_ = true;
  dead_ = true;
  g.poisoned_ = true;
  ++g.aborts_returned_;
  g.changed_.notify_all();
}

void fake_device_comm::interrupt() {
  fake_nccl_group& g = *group_;
  std::lock_guard<std::mutex> lock(g.mutex_);
  interrupt_requested_ = true;
  dead_ = true;
  g.changed_.notify_all();
}

bool fake_device_comm::can_shrink() const {
  std::lock_guard<std::mutex> lock(group_->mutex_);
  return !abort_requested_ && !failed_;
}

std::unique_ptr<communicator> fake_device_comm::shrink(const std::vector<int>& excluded,
                                                       bool abort_parent, int timeout_ms) {
  (void)timeout_ms;  // the fake's waits use the communicator's own timeout
  if (!can_shrink())
    throw comm_error(comm_failure::invalid, "shrink",
                     "rank " + std::to_string(rank_) + ": the communicator was aborted or failed");
  std::shared_ptr<fake_device_comm> child = shrink(excluded, abort_parent);
  // The interface hands out sole ownership: the child's group keeps the child's peers alive.
  struct owned : communicator {
    std::shared_ptr<fake_device_comm> c;
    explicit owned(std::shared_ptr<fake_device_comm> x) : c(std::move(x)) {}
    int rank() const override { return c->rank(); }
    int size() const override { return c->size(); }
    const char* backend() const override { return c->backend(); }
    void allreduce_sum(float* d, std::size_t n) override { c->allreduce_sum(d, n); }
    void allreduce_sum(std::int64_t* d, std::size_t n) override { c->allreduce_sum(d, n); }
    void allgather(const void* s, void* r, std::size_t b) override { c->allgather(s, r, b); }
    void alltoall(const void* s, void* r, std::size_t b) override { c->alltoall(s, r, b); }
    void broadcast(void* d, std::size_t b, int root) override { c->broadcast(d, b, root); }
    void barrier() override { c->barrier(); }
    void abort() override { c->abort(); }
    void interrupt() override { c->interrupt(); }
    bool can_shrink() const override { return c->can_shrink(); }
    std::unique_ptr<communicator> shrink(const std::vector<int>& e, bool a, int t) override {
      return c->shrink(e, a, t);
    }
    bool dead() const override { return c->dead(); }
    comm_traffic traffic() const override { return c->traffic(); }
  };
  return std::make_unique<owned>(std::move(child));
}

bool fake_device_comm::dead() const {
  std::lock_guard<std::mutex> lock(group_->mutex_);
  return dead_;
}

std::vector<fake_event> fake_device_comm::events() const {
  std::lock_guard<std::mutex> lock(group_->mutex_);
  return events_;
}

std::size_t fake_device_comm::enqueued() const {
  std::lock_guard<std::mutex> lock(group_->mutex_);
  return next_seq_;
}

std::shared_ptr<fake_device_comm> fake_device_comm::shrink(const std::vector<int>& excluded,
                                                           bool abort_parent) {
  fake_nccl_group& g = *group_;
  std::unique_lock<std::mutex> lock(g.mutex_);
  if (g.shrink_hangs_.count(rank_)) {
    g.changed_.wait(lock, [&] { return g.released_; });
    throw comm_error(comm_failure::timeout, "shrink", "released after its deadline");
  }
  std::vector<int> key = excluded;
  std::sort(key.begin(), key.end());
  key.erase(std::unique(key.begin(), key.end()), key.end());
  for (int r : key)
    if (r < 0 || r >= g.size() || r == rank_)
      throw comm_error(comm_failure::invalid, "shrink",
                       "rank " + std::to_string(rank_) + " cannot exclude rank " +
                           std::to_string(r) + " of " + std::to_string(g.size()));
  if (!abort_parent && (g.running_ > 0 || !queue_.empty() || g.poisoned_))
    throw comm_error(comm_failure::invalid, "shrink",
                     "the parent has collectives in flight or failed; NCCL_SHRINK_ABORT ends them");
  if (abort_parent) {
    g.poisoned_ = true;  // NCCL_SHRINK_ABORT: operations in flight on the parent end
    abort_requested_ = true;
    dead_ = true;
  }
  fake_nccl_group::shrink_slot& s = g.shrinks_[key];
  const int survivors = g.size() - static_cast<int>(key.size());
  if (!s.child) s.child = std::make_shared<fake_nccl_group>(survivors);
  ++s.arrived;
  g.changed_.notify_all();
  if (!g.changed_.wait_until(lock, std::chrono::steady_clock::now() + timeout_,
                             [&] { return s.arrived >= survivors; }))
    throw comm_error(comm_failure::timeout, "shrink",
                     "rank " + std::to_string(rank_) + ": " + std::to_string(s.arrived) + " of " +
                         std::to_string(survivors) + " survivors came");
  const int below =
      static_cast<int>(std::count_if(key.begin(), key.end(), [&](int r) { return r < rank_; }));
  std::shared_ptr<fake_nccl_group> child = s.child;
  lock.unlock();
  return std::make_shared<fake_device_comm>(child, rank_ - below, timeout_);
}

}  // namespace cohort::comm::testing
