// Windows are fixed, not sliding: a window opens at the first occurrence after the last one
// ended, so a quiet limiter logs the next occurrence at once, and a steady flood costs
// `burst` lines a period.
#include "runtime/core/log_limiter.hpp"

#include <cstdio>
#include <utility>

namespace cohort {

std::string log_quoted(const std::string& text, std::size_t max) {
  static const char* hex = "0123456789abcdef";
  std::string out = "'";
  for (const char c : text.substr(0, max)) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f && c != '\'') {
      out += c;
    } else {
      out += "\\x";
      out += hex[u >> 4];
      out += hex[u & 15];
    }
  }
  return out + (text.size() > max ? "'..." : "'");
}

log_limiter::log_limiter() : log_limiter(options{}) {}

log_limiter::log_limiter(options o, clock_fn clock) : opts_(o), clock_(std::move(clock)) {
  if (!clock_) clock_ = [] { return std::chrono::steady_clock::now(); };
}

std::optional<log_limiter::line> log_limiter::admit() {
  const auto now = clock_();
  if (!logged_any_ || now - window_start_ >= opts_.period) {
    window_start_ = now;
    in_window_ = 0;
  }
  if (in_window_ >= opts_.burst) {
    ++left_out_;
    return std::nullopt;
  }
  ++in_window_;
  line l;
  l.left_out = left_out_;
  l.since = logged_any_ ? now - last_line_ : std::chrono::steady_clock::duration{};
  left_out_ = 0;
  last_line_ = now;
  logged_any_ = true;
  return l;
}

std::string log_limiter::suffix(const line& l, const std::string& what) {
  if (l.left_out == 0) return {};
  char ago[32];
  std::snprintf(ago, sizeof ago, "%.1f", std::chrono::duration<double>(l.since).count());
  return "; " + std::to_string(l.left_out) + " more " + what + " since the last line (" + ago +
         " s ago), not logged";
}

}  // namespace cohort
