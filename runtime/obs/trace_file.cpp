#include "runtime/obs/trace_file.hpp"

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "runtime/core/error.hpp"

namespace cohort::obs {

namespace {

// A JSON string. Span names and categories are nearly always plain ASCII without quotes or
// backslashes: those are wrapped as they are; anything else goes through the JSON library.
std::string json_quoted(const std::string& s) {
  for (const char c : s)
    if (c == '"' || c == '\\' || static_cast<unsigned char>(c) < 0x20 ||
        static_cast<unsigned char>(c) >= 0x80)
      return nlohmann::json(s).dump();
  std::string out;
  out.reserve(s.size() + 2);
  out += '"';
  out += s;
  out += '"';
  return out;
}

// Microseconds with three decimals: the format's unit, and nanoseconds kept.
std::string micros(int64_t ns) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%lld.%03lld", static_cast<long long>(ns / 1000),
                static_cast<long long>((ns < 0 ? -ns : ns) % 1000));
  if (ns < 0 && ns > -1000) return std::string("-") + buf;  // -0.5 us keeps its sign
  return buf;
}

}  // namespace

trace_file::trace_file(std::string path, int64_t zero_ns, std::size_t max_pending)
    : path_(std::move(path)), zero_ns_(zero_ns), max_pending_(max_pending) {
  const std::string partial = path_ + ".partial";
  out_ = std::fopen(partial.c_str(), "w");
  if (out_ == nullptr)
    throw usage_error("--trace " + path_ + ": cannot create " + partial + " (" +
                      std::strerror(errno) +
                      "); give a file in a folder that exists and is writable");
  std::fputs("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n", out_);
  writer_ = std::thread([this] { writer_loop(); });
}

trace_file::~trace_file() {
  try {
    close();
  } catch (const std::exception&) {
    // Destruction must not throw; close() said it already when called on purpose.
  }
}

std::string trace_file::format(int pid, const trace::event& e) const {
  std::string s = "{\"name\":" + json_quoted(e.name) + ",\"cat\":" + json_quoted(e.cat) + ",\"ph\":\"";
  s += e.ph;
  s += "\",\"ts\":" + micros(e.ts_ns - zero_ns_);
  if (e.ph == 'X') s += ",\"dur\":" + micros(e.dur_ns);
  if (e.ph == 'i') s += ",\"s\":\"t\"";  // an instant on its thread's row
  s += ",\"pid\":" + std::to_string(pid) + ",\"tid\":" + std::to_string(e.tid);
  if (!e.args.empty()) s += ",\"args\":{" + e.args + "}";
  s += "}";
  return s;
}

void trace_file::name_process(int pid, const std::string& name, int sort_index) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closing_) return;
  pending_.push_back({0,
                      {},
                      "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + std::to_string(pid) +
                          ",\"tid\":0,\"args\":{\"name\":" + json_quoted(name) + "}}"});
  pending_.push_back(
      {0,
       {},
       "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":" + std::to_string(pid) +
           ",\"tid\":0,\"args\":{\"sort_index\":" + std::to_string(sort_index) + "}}"});
  wake_.notify_one();
}

void trace_file::name_thread(int pid, uint32_t tid, const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closing_) return;
  pending_.push_back({0,
                      {},
                      "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" + std::to_string(pid) +
                          ",\"tid\":" + std::to_string(tid) +
                          ",\"args\":{\"name\":" + json_quoted(name) + "}}"});
  wake_.notify_one();
}

void trace_file::add(int pid, const trace::event& e) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closing_) return;
  if (pending_.size() >= max_pending_) {
    ++dropped_;
    return;
  }
  pending_.push_back({pid, e, {}});
  // The writer wakes by itself every 100 ms: a wake-up per event would cost the traced job's
  // processes more (context switches on shared cores) than writing the events.
  if (pending_.size() == 4096) wake_.notify_one();
}

void trace_file::set_meta(const std::string& key, nlohmann::json value) {
  std::lock_guard<std::mutex> lock(mu_);
  meta_[key] = std::move(value);
}

void trace_file::writer_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  std::vector<item> batch;
  for (;;) {
    wake_.wait_for(lock, std::chrono::milliseconds(100),
                   [this] { return closing_ || pending_.size() >= 4096; });
    if (pending_.empty() && closing_) return;
    batch.assign(std::make_move_iterator(pending_.begin()),
                 std::make_move_iterator(pending_.end()));
    pending_.clear();
    if (failed_) continue;  // what comes after a failure is dropped, and close() says so
    const bool first = written_ == 0;
    written_ += batch.size();
    lock.unlock();
    bool ok = true;
    try {
      for (std::size_t i = 0; i < batch.size(); ++i) {
        if (!(first && i == 0)) std::fputs(",\n", out_);
        const item& x = batch[i];
        std::fputs(x.line.empty() ? format(x.pid, x.e).c_str() : x.line.c_str(), out_);
      }
    } catch (const std::exception&) {
      ok = false;  // out of memory, or a name the JSON library refuses: the trace is broken
    }
    lock.lock();
    if (!ok) failed_ = true;
  }
}

void trace_file::abandon() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = closing_ = true;
  }
  wake_.notify_one();
  writer_.join();
  std::fclose(out_);
  out_ = nullptr;
  std::error_code ec;
  std::filesystem::remove(path_ + ".partial", ec);
}

void trace_file::close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = closing_ = true;
  }
  wake_.notify_one();
  writer_.join();
  nlohmann::json meta;
  {
    std::lock_guard<std::mutex> lock(mu_);
    meta = meta_;
    meta["events_written"] = written_;
    meta["events_dropped"] = dropped_;
    meta["clock_zero_ns"] = zero_ns_;
  }
  std::fputs("\n],\"otherData\":", out_);
  std::fputs(meta.dump().c_str(), out_);
  std::fputs("}\n", out_);
  const bool ok = !failed_ && std::fflush(out_) == 0 && std::ferror(out_) == 0;
  std::fclose(out_);
  out_ = nullptr;
  const std::string partial = path_ + ".partial";
  std::error_code ec;
  if (ok) std::filesystem::rename(partial, path_, ec);
  if (!ok || ec)
    throw cohort::error("--trace " + path_ + ": could not be written completely (" +
                        (ec ? ec.message() : std::string("write error, disk full?")) +
                        "); what was written is in " + partial);
}

uint64_t trace_file::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

}  // namespace cohort::obs
