#include "runtime/core/trace.hpp"

#include <algorithm>
#include <chrono>
#include <mutex>

namespace cohort::trace {

namespace {

struct buffer {
  std::mutex mu;
  std::vector<event> events;
  std::size_t capacity = 0;
  uint64_t dropped = 0;
};

buffer& the_buffer() {
  static buffer b;
  return b;
}

void record(event&& e) {
  buffer& b = the_buffer();
  std::lock_guard<std::mutex> lock(b.mu);
  if (b.events.size() >= b.capacity) {
    ++b.dropped;
    return;
  }
  b.events.push_back(std::move(e));
}

}  // namespace

const char* track_name(uint32_t t) {
  switch (t) {
    case track::compute:
      return "compute";
    case track::comm:
      return "comm";
    case track::p2p:
      return "p2p";
    case track::control:
      return "control";
  }
  return "other";
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void enable(bool on, std::size_t capacity) {
  buffer& b = the_buffer();
  {
    std::lock_guard<std::mutex> lock(b.mu);
    b.capacity = capacity;
  }
  enabled_flag().store(on, std::memory_order_relaxed);
}

void complete(const char* name, const char* cat, int64_t start_ns, int64_t end_ns, uint32_t tid,
              std::string args) {
  if (!enabled()) return;
  record(event{name, cat, 'X', start_ns, end_ns > start_ns ? end_ns - start_ns : 0, tid,
               std::move(args)});
}

void instant(const char* name, const char* cat, int64_t at_ns, uint32_t tid, std::string args) {
  if (!enabled()) return;
  record(event{name, cat, 'i', at_ns, 0, tid, std::move(args)});
}

std::vector<event> take() {
  buffer& b = the_buffer();
  std::lock_guard<std::mutex> lock(b.mu);
  std::vector<event> out;
  out.swap(b.events);
  b.events.reserve(std::min<std::size_t>(b.capacity, 1024));
  return out;
}

uint64_t dropped() {
  buffer& b = the_buffer();
  std::lock_guard<std::mutex> lock(b.mu);
  return b.dropped;
}

namespace {
thread_local std::string t_context;
}  // namespace

const std::string& context() { return t_context; }

context_scope::context_scope(std::string args) : previous_(std::move(t_context)) {
  t_context = std::move(args);
}

context_scope::~context_scope() { t_context = std::move(previous_); }

std::string args(std::initializer_list<std::pair<const char*, int64_t>> kv) {
  std::string out;
  if (!enabled()) return out;  // nothing will be recorded: no string to build
  for (const auto& [k, v] : kv) {
    if (!out.empty()) out += ',';
    out += '"';
    out += k;
    out += "\":";
    out += std::to_string(v);
  }
  return out;
}

}  // namespace cohort::trace
