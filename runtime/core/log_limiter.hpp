// How often a warning that a stranger can trigger at will (a refused key, a peer of another
// protocol version) reaches the log: a few lines a period, then a count of what was left
// out. Owns the decision only; the caller writes the line (spdlog) and keeps the counters
// that ctl status shows.
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace cohort {

/// TEXT a stranger chose (an etcd key, a lease) for a log line: in single quotes, printable
/// ASCII as it is, every other byte and the quote itself as \xNN, cut after MAX bytes with
/// "..." so that a flood of long names cannot flood the log.
std::string log_quoted(const std::string& text, std::size_t max = std::string::npos);

/// Decides which occurrences of one repeated warning are logged: at most `burst` in each
/// `period`, the rest counted. The first line after some were left out says how many, so
/// the log grows by at most `burst` lines a period whatever a flood sends, and loses no
/// count. One thread (the one that logs the warning).
class log_limiter {
 public:
  using clock_fn = std::function<std::chrono::steady_clock::time_point()>;

  struct options {
    int burst = 5;
    std::chrono::milliseconds period{10000};
  };

  /// What to log with an occurrence that is logged.
  struct line {
    uint64_t left_out = 0;                        ///< occurrences not logged since the last line
    std::chrono::steady_clock::duration since{};  ///< time since that line (0 for the first)
  };

  /// Five lines per 10 s on steady_clock.
  log_limiter();
  /// CLOCK: steady_clock::now when null (tests pass a manual clock).
  explicit log_limiter(options o, clock_fn clock = nullptr);

  /// One occurrence now: the line to log, or nullopt when it is left out (and counted).
  std::optional<line> admit();

  /// "" when nothing was left out; else "; N more WHAT since the last line (S s ago), not
  /// logged", to append to the logged line.
  static std::string suffix(const line& l, const std::string& what);

 private:
  options opts_;
  clock_fn clock_;
  std::chrono::steady_clock::time_point window_start_{};
  std::chrono::steady_clock::time_point last_line_{};
  int in_window_ = 0;
  uint64_t left_out_ = 0;
  bool logged_any_ = false;
};

}  // namespace cohort
