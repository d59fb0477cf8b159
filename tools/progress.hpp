// Progress display for long runs: step, loss, throughput, ETA. On a terminal one line is
// redrawn in place (at most 10 times a second) with a bar; otherwise (logs, CI) one line
// every `every` steps. Owns only formatting; the caller measures.
#pragma once
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace cohort::cli {

/// "1h02m", "3m07s", "12s".
inline std::string format_duration(double s) {
  if (!(s >= 0) || s > 1e7) return "?";
  char buf[32];
  long v = static_cast<long>(s + 0.5);
  if (v >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", v / 3600, (v / 60) % 60);
  else if (v >= 60)
    std::snprintf(buf, sizeof buf, "%ldm%02lds", v / 60, v % 60);
  else
    std::snprintf(buf, sizeof buf, "%lds", v);
  return buf;
}

class progress_line {
 public:
  progress_line(int64_t total, std::string unit, bool quiet, int64_t every = 50)
      : total_(total),
        unit_(std::move(unit)),
        quiet_(quiet),
        every_(every > 0 ? every : 50),
        tty_(isatty(STDERR_FILENO) == 1),
        start_(clock::now()),
        last_draw_(start_) {}

  /// After `done` of `total` steps, with the latest loss and units/s; `extra` (e.g. the
  /// roster size of a distributed run) is appended to the line.
  void update(int64_t done, double loss, double rate, const std::string& extra = {}) {
    if (quiet_) return;
    auto now = clock::now();
    double elapsed = std::chrono::duration<double>(now - start_).count();
    steps_since_start_++;
    double per_step = elapsed / static_cast<double>(steps_since_start_);
    double eta = per_step * static_cast<double>(total_ - done);
    if (tty_) {
      if (done < total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
      last_draw_ = now;
      const int width = 24;
      int filled = total_ > 0 ? static_cast<int>(width * done / total_) : width;
      std::string bar(filled, '#');
      bar += std::string(width - filled, '.');
      std::fprintf(stderr, "\r[%s] step %lld/%lld | loss %.4f | %.0f %s%s | ETA %s   ", bar.c_str(),
                   static_cast<long long>(done), static_cast<long long>(total_), loss, rate,
                   unit_.c_str(), extra.c_str(), format_duration(eta).c_str());
      drawn_ = true;
    } else if (done % every_ == 0 || done == total_) {
      std::fprintf(stderr, "step %lld/%lld | loss %.4f | %.0f %s%s | elapsed %s | ETA %s\n",
                   static_cast<long long>(done), static_cast<long long>(total_), loss, rate,
                   unit_.c_str(), extra.c_str(), format_duration(elapsed).c_str(),
                   format_duration(eta).c_str());
    }
  }

  /// A message on its own line (e.g. an evaluation) without breaking the bar.
  void note(const std::string& msg) {
    if (quiet_) return;
    if (drawn_) std::fputc('\n', stderr);
    drawn_ = false;
    std::fprintf(stderr, "%s\n", msg.c_str());
  }

  void finish() {
    if (!quiet_ && drawn_) std::fputc('\n', stderr);
    drawn_ = false;
  }

 private:
  using clock = std::chrono::steady_clock;
  int64_t total_;
  std::string unit_;
  bool quiet_;
  int64_t every_;
  bool tty_;
  clock::time_point start_, last_draw_;
  int64_t steps_since_start_ = 0;
  bool drawn_ = false;
};

}  // namespace cohort::cli
