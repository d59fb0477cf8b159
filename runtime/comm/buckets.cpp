#include "runtime/comm/buckets.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iterator>

#include "runtime/core/trace.hpp"

namespace cohort::comm {

namespace {

using clock_type = std::chrono::steady_clock;

double seconds(clock_type::duration d) { return std::chrono::duration<double>(d).count(); }

std::size_t elements_per_bucket(std::size_t element_bytes, double bucket_mb) {
  if (!(bucket_mb > 0) || !std::isfinite(bucket_mb))
    throw usage_error("comm.bucket_mb must be a positive number of MiB (got " +
                      std::to_string(bucket_mb) + ")");
  const double elems = std::floor(bucket_mb * double(1 << 20) / double(element_bytes));
  return elems < 1 ? 1 : static_cast<std::size_t>(elems);
}

// Sorted by start and merged where they touch or overlap; empty intervals dropped.
std::vector<time_interval> merged(std::vector<time_interval> v) {
  v.erase(
      std::remove_if(v.begin(), v.end(), [](const time_interval& i) { return !(i.end > i.begin); }),
      v.end());
  std::sort(v.begin(), v.end(),
            [](const time_interval& x, const time_interval& y) { return x.begin < y.begin; });
  std::vector<time_interval> out;
  for (const time_interval& i : v) {
    if (!out.empty() && i.begin <= out.back().end)
      out.back().end = std::max(out.back().end, i.end);
    else
      out.push_back(i);
  }
  return out;
}

}  // namespace

double covered_seconds(std::vector<time_interval> a) {
  double s = 0;
  for (const time_interval& i : merged(std::move(a))) s += i.seconds();
  return s;
}

double overlap_seconds(std::vector<time_interval> a, std::vector<time_interval> b) {
  const std::vector<time_interval> x = merged(std::move(a)), y = merged(std::move(b));
  double s = 0;
  // Both lists are disjoint and sorted: walk them together, advancing the one ending first.
  for (std::size_t i = 0, j = 0; i < x.size() && j < y.size();) {
    const time_interval both{std::max(x[i].begin, y[j].begin), std::min(x[i].end, y[j].end)};
    s += both.seconds();
    if (x[i].end < y[j].end)
      ++i;
    else
      ++j;
  }
  return s;
}

bool wire_plan::operator==(const wire_plan& o) const {
  if (memory.worker != o.memory.worker || memory.server != o.memory.server || plain != o.plain ||
      compressed.size() != o.compressed.size())
    return false;
  for (std::size_t i = 0; i < compressed.size(); ++i)
    if (compressed[i].offset != o.compressed[i].offset ||
        compressed[i].count != o.compressed[i].count ||
        compressed[i].format != o.compressed[i].format)
      return false;
  return true;
}

std::vector<bucket_range> plan_buckets(std::size_t elements, std::size_t element_bytes,
                                       double bucket_mb,
                                       const std::vector<wire_segment>& compressed) {
  const std::size_t per = elements_per_bucket(element_bytes, bucket_mb);
  // The buffer as stretches of one format each, first to last.
  std::vector<bucket_range> stretches;
  std::size_t at = 0;
  for (const wire_segment& s : compressed) {
    if (s.offset < at || s.offset > elements || s.count > elements - s.offset)
      throw usage_error("compressed segment [" + std::to_string(s.offset) + ", " +
                        std::to_string(s.offset + s.count) + ") of a buffer of " +
                        std::to_string(elements) +
                        " elements is out of order, overlaps another or lies outside it");
    if (s.offset > at) stretches.push_back({at, s.offset - at, wire_format::f32});
    if (s.count > 0) stretches.push_back({s.offset, s.count, s.format});
    at = s.offset + s.count;
  }
  if (at < elements) stretches.push_back({at, elements - at, wire_format::f32});
  std::vector<bucket_range> out;
  for (auto st = stretches.rbegin(); st != stretches.rend(); ++st)
    for (std::size_t end = st->offset + st->count; end > st->offset;) {
      const std::size_t begin = end - st->offset > per ? end - per : st->offset;
      out.push_back({begin, end - begin, st->format});
      end = begin;
    }
  return out;
}

std::vector<std::vector<std::size_t>> plan_collectives(const std::vector<bucket_range>& buckets,
                                                       std::size_t per) {
  std::vector<std::vector<std::size_t>> out;
  const bool compressed = std::any_of(buckets.begin(), buckets.end(), [](const bucket_range& b) {
    return b.format != wire_format::f32;
  });
  std::map<wire_format, std::size_t> open;  // format -> its collective still taking buckets
  std::vector<std::size_t> size;
  for (std::size_t k = 0; k < buckets.size(); ++k) {
    const bucket_range& b = buckets[k];
    auto it = open.find(b.format);
    if (compressed && it != open.end() && size[it->second] + b.count <= per) {
      out[it->second].push_back(k);
      size[it->second] += b.count;
      continue;
    }
    open[b.format] = out.size();
    out.push_back({k});
    size.push_back(b.count);
  }
  return out;
}

bucket_engine::bucket_engine(communicator& comm, std::size_t elements, grad_type type,
                             double bucket_mb, float post_scale)
    : bucket_engine(std::vector<communicator*>{&comm}, elements, type, bucket_mb, post_scale) {}

bucket_engine::bucket_engine(const std::vector<communicator*>& lanes, std::size_t elements,
                             grad_type type, double bucket_mb, float post_scale)
    : lanes_(lanes),
      elements_(elements),
      type_(type),
      post_scale_(post_scale),
      bucket_mb_(bucket_mb) {
  const std::size_t element_bytes = type == grad_type::f32 ? sizeof(float) : sizeof(std::int64_t);
  // Fixed-point sums are converted back (and scaled) once by the caller, never here.
  COHORT_CHECK(type == grad_type::f32 || post_scale == 1.0f);
  COHORT_CHECK(!lanes_.empty());
  for (communicator* c : lanes_) COHORT_CHECK(c != nullptr);
  set_buckets(plan_buckets(elements, element_bytes, bucket_mb));
  next_.resize(lanes_.size());
  for (std::size_t l = 0; l < lanes_.size(); ++l) next_[l] = l;
  for (std::size_t l = 0; l < lanes_.size(); ++l)
    threads_.emplace_back([this, l] { comm_loop(l); });
}

void bucket_engine::set_buckets(std::vector<bucket_range> buckets) {
  buckets_ = std::move(buckets);
  const std::size_t element_bytes = type_ == grad_type::f32 ? sizeof(float) : sizeof(std::int64_t);
  collectives_ = plan_collectives(buckets_, elements_per_bucket(element_bytes, bucket_mb_));
  collective_of_.assign(buckets_.size(), 0);
  for (std::size_t c = 0; c < collectives_.size(); ++c)
    for (std::size_t k : collectives_[c]) collective_of_[k] = c;
  missing_.assign(collectives_.size(), 0);
  ran_.assign(collectives_.size(), time_interval{});
}

bucket_engine::~bucket_engine() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  for (std::thread& t : threads_) t.join();
}

std::size_t bucket_engine::bucket_of(std::size_t element) const {
  // Buckets run from the end of the buffer to its start: offsets descend.
  COHORT_CHECK(!buckets_.empty());
  std::size_t lo = 0, hi = buckets_.size() - 1;
  while (lo < hi) {
    const std::size_t mid = (lo + hi) / 2;
    if (buckets_[mid].offset > element)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

void bucket_engine::set_wire(const wire_plan& plan) {
  std::lock_guard<std::mutex> lock(mutex_);
  COHORT_CHECK(!in_step_);
  COHORT_CHECK(type_ == grad_type::f32 || plan.compressed.empty());
  COHORT_CHECK(!holders_ || plan.compressed.empty());
  // The memory may move between steps (the seat keeps a committed copy and a working one);
  // the buckets follow the segments only.
  wire_plan segments_only = plan;
  segments_only.memory = wire_.memory;
  if (segments_only == wire_) {
    wire_.memory = plan.memory;
    return;
  }
  set_buckets(plan_buckets(elements_, sizeof(float), bucket_mb_, plan.compressed));
  wire_ = plan;
}

void bucket_engine::set_holders(std::shared_ptr<const holding> h,
                                std::function<void(std::size_t, std::size_t)> on_reduced) {
  std::lock_guard<std::mutex> lock(mutex_);
  COHORT_CHECK(!in_step_);
  COHORT_CHECK(!h || wire_.compressed.empty());
  holders_ = std::move(h);
  on_reduced_ = holders_ ? std::move(on_reduced) : nullptr;
}

void bucket_engine::begin(float* grads) { begin_step(grads, grad_type::f32); }
void bucket_engine::begin(std::int64_t* grads) { begin_step(grads, grad_type::i64); }

void bucket_engine::begin_step(void* grads, grad_type type) {
  COHORT_CHECK(type == type_);
  COHORT_CHECK(grads != nullptr || elements_ == 0);
  std::lock_guard<std::mutex> lock(mutex_);
  COHORT_CHECK(!in_step_);  // wait_all of the previous step first
  if (error_)
    throw comm_error(comm_failure::invalid, "bucket engine begin",
                     "an earlier step failed and the communicator is dead; build a new "
                     "communicator and engine");
  grads_ = grads;
  std::fill(missing_.begin(), missing_.end(), 0);
  for (std::size_t k = 0; k < buckets_.size(); ++k)
    missing_[collective_of_[k]] += buckets_[k].count;
  std::fill(ran_.begin(), ran_.end(), time_interval{});
  marked_.clear();
  marked_total_ = 0;
  for (std::size_t l = 0; l < lanes_.size(); ++l) next_[l] = l;
  done_ = 0;
  in_step_ = true;
}

void bucket_engine::wait_pending(std::size_t most) {
  std::unique_lock<std::mutex> lock(mutex_);
  COHORT_CHECK(in_step_);
  // Only the collectives a lane can run now count: each lane's complete ones in a row from
  // its next. One behind a collective that still waits for backward would keep backward
  // waiting for itself.
  auto runnable = [&] {
    std::size_t n = 0;
    const std::size_t stride = lanes_.size();
    for (std::size_t l = 0; l < stride; ++l)
      for (std::size_t c = next_[l]; c < collectives_.size() && missing_[c] == 0; c += stride) ++n;
    return n;
  };
  changed_.wait(lock, [&] { return error_ || stop_ || runnable() <= most; });
}

void bucket_engine::mark_ready(std::size_t offset, std::size_t count) {
  if (count == 0) return;
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    COHORT_CHECK(in_step_);
    COHORT_CHECK(offset <= elements_ && count <= elements_ - offset);
    const std::size_t end = offset + count;
    // A range marked twice would be reduced with half-final values: refuse overlaps.
    auto next = marked_.upper_bound(offset);
    COHORT_CHECK(next == marked_.end() || next->first >= end);
    if (next != marked_.begin()) COHORT_CHECK(std::prev(next)->second <= offset);
    // Insert, merging with touching neighbours so the map stays small.
    std::size_t lo = offset, hi = end;
    if (next != marked_.end() && next->first == end) {
      hi = next->second;
      next = marked_.erase(next);
    }
    if (next != marked_.begin() && std::prev(next)->second == offset) {
      auto prev = std::prev(next);
      lo = prev->first;
      marked_.erase(prev);
    }
    marked_[lo] = hi;
    marked_total_ += count;

    for (std::size_t k = bucket_of(end - 1);; ++k) {
      const bucket_range& b = buckets_[k];
      const std::size_t from = std::max(offset, b.offset);
      const std::size_t to = std::min(end, b.offset + b.count);
      const std::size_t c = collective_of_[k];
      missing_[c] -= to - from;
      if (missing_[c] == 0 && c == next_[c % lanes_.size()]) wake = true;
      if (b.offset <= offset) break;
    }
  }
  if (wake) changed_.notify_all();
}

void bucket_engine::run_collective(communicator& comm, const std::vector<std::size_t>& members,
                                   void* grads, const error_memory& memory, plain_sum plain,
                                   std::vector<float>& staging) {
  const bucket_range first = buckets_[members.front()];
  if (holders_) {
    // Sharded gradients: one plain bucket per collective, summed to its holders only.
    COHORT_CHECK(members.size() == 1 && first.format == wire_format::f32);
    if (type_ == grad_type::i64) {
      comm.holders_sum(static_cast<std::int64_t*>(grads), first.offset, first.count, *holders_);
    } else {
      float* base = static_cast<float*>(grads);
      comm.holders_sum(base, first.offset, first.count, *holders_);
      if (post_scale_ != 1.0f)
        for (const auto& [b, e] : holders_->inside(comm.rank(), first.offset, first.count))
          for (std::size_t i = b; i < e; ++i) base[i] *= post_scale_;
    }
    if (on_reduced_) on_reduced_(first.offset, first.count);
    return;
  }
  if (type_ == grad_type::i64) {
    COHORT_CHECK(members.size() == 1);
    comm.allreduce_sum(static_cast<std::int64_t*>(grads) + first.offset, first.count);
    return;
  }
  float* base = static_cast<float*>(grads);
  auto sum = [&](float* p, float* worker, float* server, std::size_t n) {
    if (first.format == wire_format::f32 && plain == plain_sum::rank_order)
      ordered_allreduce_sum(comm, p, n);
    else if (first.format == wire_format::f32)
      comm.allreduce_sum(p, n);
    else
      compressed_allreduce_sum(comm, p, n, first.format, {worker, server});
    if (post_scale_ != 1.0f)
      for (std::size_t i = 0; i < n; ++i) p[i] *= post_scale_;
  };
  if (members.size() == 1) {
    sum(base + first.offset, memory.worker ? memory.worker + first.offset : nullptr,
        memory.server ? memory.server + first.offset : nullptr, first.count);
    return;
  }
  // Several buckets in one call: gathered into one stretch (values, then the two error
  // memories beside them, which the sum reads and writes like the values), summed, and put
  // back. The same buckets in the same order every step: chunk j of the stretch, and so the
  // server memory's positions, mean the same elements each time.
  std::size_t n = 0;
  for (std::size_t k : members) n += buckets_[k].count;
  const int arrays = 1 + (memory.worker ? 1 : 0) + (memory.server ? 1 : 0);
  staging.resize(n * static_cast<std::size_t>(arrays));
  float* const values = staging.data();
  float* const worker = memory.worker ? values + n : nullptr;
  float* const server = memory.server ? values + n * (memory.worker ? 2 : 1) : nullptr;
  auto move = [&](bool in) {
    std::size_t at = 0;
    for (std::size_t k : members) {
      const bucket_range& b = buckets_[k];
      const auto copy = [&](float* buffer, float* stretch) {
        if (in)
          std::copy(buffer + b.offset, buffer + b.offset + b.count, stretch + at);
        else
          std::copy(stretch + at, stretch + at + b.count, buffer + b.offset);
      };
      copy(base, values);
      if (worker) copy(memory.worker, worker);
      if (server) copy(memory.server, server);
      at += b.count;
    }
  };
  move(true);
  sum(values, worker, server, n);
  move(false);
}

void bucket_engine::comm_loop(std::size_t lane) {
  communicator& comm = *lanes_[lane];
  const std::size_t stride = lanes_.size();
  std::vector<float> staging;  // this lane's stretch for collectives of several buckets
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    auto go = [&] {
      return stop_ || (in_step_ && !error_ && next_[lane] < collectives_.size() &&
                       missing_[next_[lane]] == 0);
    };
    while (!go()) {
      if (before_wait_) before_wait_(done_);
      changed_.wait(lock);
    }
    if (stop_) return;
    const std::size_t c = next_[lane];
    const std::vector<std::size_t> members = collectives_[c];
    const error_memory memory = wire_.memory;
    const plain_sum plain = wire_.plain;
    void* grads = grads_;
    lock.unlock();

    std::exception_ptr failure;
    const auto t0 = clock_type::now();
    try {
      run_collective(comm, members, grads, memory, plain, staging);
    } catch (const comm_error&) {
      failure = std::current_exception();
    } catch (const std::exception& e) {
      failure = std::make_exception_ptr(comm_error(
          comm_failure::peer_lost, "bucket " + std::to_string(c) + " allreduce", e.what()));
    }
    const auto t1 = clock_type::now();
    if (trace::enabled()) {
      std::size_t elements = 0;
      for (std::size_t k : members) elements += buckets_[k].count;
      const std::size_t width = type_ == grad_type::f32 ? sizeof(float) : sizeof(std::int64_t);
      const bool compressed = buckets_[members.front()].format != wire_format::f32;
      trace::complete(failure ? "allreduce (failed)" : "allreduce", "comm", trace::ns(t0),
                      trace::ns(t1), trace::track::comm,
                      trace::args({{"bucket", static_cast<int64_t>(c)},
                                   {"bytes", static_cast<int64_t>(elements * width)},
                                   {"compressed", compressed ? 1 : 0}}));
    }

    lock.lock();
    if (failure) {
      // The first failure is the cause; the other lanes then fail of the abort below.
      const bool first = !error_;
      if (first) error_ = failure;
      if (first && stride > 1) {
        // The other lanes' collectives may wait on peers that will now never send.
        lock.unlock();
        for (communicator* x : lanes_) x->abort();
        lock.lock();
      }
    } else {
      ran_[c] = time_interval{t0, t1};
      next_[lane] += stride;
      ++done_;
    }
    changed_.notify_all();
  }
}

void bucket_engine::set_before_wait(std::function<void(std::size_t)> hook) {
  std::lock_guard<std::mutex> lock(mutex_);
  before_wait_ = std::move(hook);
}

bucket_timing bucket_engine::wait_all() {
  const auto t0 = clock_type::now();
  std::unique_lock<std::mutex> lock(mutex_);
  COHORT_CHECK(in_step_);
  // Waiting with unmarked elements would never end: a caller bug.
  COHORT_CHECK(marked_total_ == elements_);
  changed_.wait(lock, [&] { return error_ || done_ == collectives_.size(); });
  const double waited = seconds(clock_type::now() - t0);
  in_step_ = false;
  grads_ = nullptr;
  if (error_) std::rethrow_exception(error_);

  bucket_timing t;
  t.wait_s = waited;
  t.buckets = collectives_.size();
  t.bytes = elements_ * (type_ == grad_type::f32 ? sizeof(float) : sizeof(std::int64_t));
  t.collectives = ran_;
  for (const time_interval& r : ran_) t.bucket_s.push_back(r.seconds());
  t.allreduce_s = covered_seconds(ran_);
  return t;
}

void bucket_engine::abort() {
  for (communicator* c : lanes_) c->abort();
}

}  // namespace cohort::comm
