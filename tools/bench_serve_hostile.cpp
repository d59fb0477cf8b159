// Hostile requests for `cohort bench serve`: the attack kinds and their weights, the seeded
// generator (make_attack: the same seed, the same bytes, with any C++ library), the raw-socket
// client that sends one and reads its status, and the counting of what came back by kind and
// class. It never looks at the server itself (cmd_bench_serve.cpp does, after the attack).
#include "tools/bench_serve_hostile.hpp"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tools/bench_serve_client.hpp"

namespace cohort::cli {
namespace {

using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr int hostile_timeout_s = 30;        // a hostile request unanswered this long: "timeout"
constexpr std::size_t body_limit = 1 << 20;  // cohort serve's 413 bound
const std::string kjv_sentence = "And God said, Let there be light: and there was light. ";

enum class attack_kind {
  garbled_json,
  truncated_json,
  wrong_type,
  huge_number,
  deep_nesting,
  invalid_utf8,
  oversized_body,
  long_prompt,
  unknown_route,
  bad_http,
  slow_client,
  stream_disconnect,
};

struct attack_kind_info {
  attack_kind kind;
  const char* name;
  int weight;  // out of the sum of all weights
};

constexpr std::array<attack_kind_info, 12> attack_kinds = {{
    {attack_kind::garbled_json, "garbled_json", 12},
    {attack_kind::truncated_json, "truncated_json", 10},
    {attack_kind::wrong_type, "wrong_type", 12},
    {attack_kind::huge_number, "huge_number", 10},
    {attack_kind::deep_nesting, "deep_nesting", 5},
    {attack_kind::invalid_utf8, "invalid_utf8", 10},
    {attack_kind::oversized_body, "oversized_body", 3},
    {attack_kind::long_prompt, "long_prompt", 3},
    {attack_kind::unknown_route, "unknown_route", 10},
    {attack_kind::bad_http, "bad_http", 10},
    {attack_kind::slow_client, "slow_client", 5},
    {attack_kind::stream_disconnect, "stream_disconnect", 10},
}};

/// One hostile request as it goes on the wire, and how its client behaves.
struct attack {
  attack_kind kind = attack_kind::garbled_json;
  std::string bytes;            ///< the whole request
  std::size_t send_bytes = 0;   ///< sent of it: fewer for a slow client
  int trickle_ms = 0;           ///< slow client: a pause after each byte
  int hold_ms = 0;              ///< slow client: then this long before it closes
  bool half_close = false;      ///< shutdown(SHUT_WR) once sent
  bool leave_at_event = false;  ///< a stream's client that closes at its first event
  bool leave_at_head = false;   ///< ... or as soon as the response head is in
  bool reset = false;           ///< close with an RST (SO_LINGER 0) instead of a FIN
};

// The generator: rng() % n rather than a std distribution, so that a seed gives the same
// requests with any C++ library.
struct draw {
  std::mt19937_64 rng;
  uint64_t below(uint64_t n) { return n == 0 ? 0 : rng() % n; }
  bool coin() { return (rng() & 1) != 0; }
  template <class T>
  const T& pick(const std::vector<T>& v) {
    return v[below(v.size())];
  }
  // Log-uniform in [lo, hi]: short and long sizes alike.
  std::size_t size_between(std::size_t lo, std::size_t hi) {
    const double u = static_cast<double>(rng() >> 11) / 9007199254740992.0;
    const double v =
        static_cast<double>(lo) * std::pow(static_cast<double>(hi) / static_cast<double>(lo), u);
    return std::min(hi, std::max(lo, static_cast<std::size_t>(v)));
  }
  std::string bytes(std::size_t n) {
    std::string s(n, '\0');
    for (char& c : s) c = static_cast<char>(rng() & 0xff);
    return s;
  }
};

std::string http_request(const std::string& method, const std::string& path,
                         const std::string& body, const std::string& extra_headers = "") {
  return method + " " + path +
         " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\nConnection: close\r\n" + extra_headers + "\r\n" + body;
}

std::string quoted(const std::string& s) { return json(s).dump(); }

// A well-formed body's fields as raw JSON text (a field can then take any raw value).
using fields = std::vector<std::pair<std::string, std::string>>;

fields valid_fields(draw& d, bool stream) {
  fields f = {{"prompt", quoted(d.pick(kjv_prompts))},
              {"max_tokens", std::to_string(1 + d.below(8))},
              {"temperature", d.coin() ? "0" : "0.8"},
              {"seed", std::to_string(d.below(1000))}};
  if (stream) f.push_back({"stream", "true"});
  return f;
}

void set_field(fields& f, const std::string& key, const std::string& raw) {
  for (auto& kv : f)
    if (kv.first == key) {
      kv.second = raw;
      return;
    }
  f.push_back({key, raw});
}

std::string join(const fields& f) {
  std::string s = "{";
  for (std::size_t i = 0; i < f.size(); ++i)
    s += (i > 0 ? ", " : "") + quoted(f[i].first) + ": " + f[i].second;
  return s + "}";
}

std::string completion_request(const std::string& body) {
  return http_request("POST", "/v1/completions", body);
}

attack make_attack(uint64_t seed, uint64_t index) {
  std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                    static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32)};
  draw d{std::mt19937_64(seq)};
  int total = 0;
  for (const auto& k : attack_kinds) total += k.weight;
  int roll = static_cast<int>(d.below(static_cast<uint64_t>(total)));
  attack a;
  for (const auto& k : attack_kinds) {
    if (roll < k.weight) {
      a.kind = k.kind;
      break;
    }
    roll -= k.weight;
  }
  switch (a.kind) {
    case attack_kind::garbled_json: {
      std::string body;
      const uint64_t how = d.below(3);
      if (how == 0) {
        body = d.bytes(d.size_between(1, 4096));
      } else if (how == 1) {
        static const std::string alphabet = "{}[]\":,0123456789.eE-+truefalsn \\u\t\n";
        body.resize(d.size_between(1, 512));
        for (char& c : body) c = alphabet[d.below(alphabet.size())];
      } else {
        body = join(valid_fields(d, d.coin()));
        for (uint64_t m = 1 + d.below(8); m > 0; --m) {
          const std::size_t at = d.below(body.size());
          const uint64_t op = d.below(3);
          const char c = static_cast<char>(d.rng() & 0xff);
          if (op == 0) body[at] = c;
          if (op == 1) body.insert(body.begin() + static_cast<std::ptrdiff_t>(at), c);
          if (op == 2 && body.size() > 1) body.erase(at, 1);
        }
      }
      a.bytes = completion_request(body);
      break;
    }
    case attack_kind::truncated_json: {
      const std::string body = join(valid_fields(d, d.coin()));
      a.bytes = completion_request(body.substr(0, d.below(body.size())));
      break;
    }
    case attack_kind::wrong_type: {
      static const std::vector<std::string> top = {
          "\"In the\"", "123", "null", "true", "[]", "[{\"prompt\": \"In\"}]", "\"\"", "{}"};
      static const std::vector<std::string> keys = {"prompt", "max_tokens", "temperature", "top_p",
                                                    "seed",   "n",          "stream"};
      static const std::vector<std::string> values = {
          "\"x\"", "\"16\"", "1.5",        "-3",   "true", "false",    "null",     "[]",
          "{}",    "[1, 2]", "{\"a\": 1}", "\"\"", "0",    "[\"In\"]", "\"true\"", "1e2"};
      if (d.below(8) == 0) {
        a.bytes = completion_request(d.pick(top));
      } else {
        fields f = valid_fields(d, d.coin());
        set_field(f, d.pick(keys), d.pick(values));
        a.bytes = completion_request(join(f));
      }
      break;
    }
    case attack_kind::huge_number: {
      static const std::vector<std::string> keys = {"max_tokens", "temperature", "top_p", "seed",
                                                    "n"};
      static const std::vector<std::string> numbers = {"1e400",
                                                       "-1e400",
                                                       "1e308",
                                                       "-1e308",
                                                       "99999999999999999999999999",
                                                       "18446744073709551615",
                                                       "18446744073709551616",
                                                       "9223372036854775807",
                                                       "-9223372036854775808",
                                                       "4097",
                                                       "2147483648",
                                                       "-2147483649",
                                                       "-0",
                                                       "0",
                                                       "1e-400",
                                                       "4.9e-324",
                                                       "1e39",
                                                       "1e-40",
                                                       "3.4028235e38",
                                                       "1" + std::string(400, '0'),
                                                       "0." + std::string(400, '0') + "1",
                                                       "-1",
                                                       "1.0000000000000002",
                                                       "0.1e1"};
      fields f = valid_fields(d, d.coin());
      set_field(f, d.pick(keys), d.pick(numbers));
      a.bytes = completion_request(join(f));
      break;
    }
    case attack_kind::deep_nesting: {
      const std::size_t depth = d.size_between(16, 500000);
      std::string body;
      const uint64_t how = d.below(4);
      auto nest = [&](const std::string& open, const std::string& close, const std::string& in) {
        const std::size_t n = std::min(depth, (body_limit - 64) / (open.size() + close.size()));
        std::string s;
        s.reserve(n * (open.size() + close.size()) + in.size());
        for (std::size_t i = 0; i < n; ++i) s += open;
        s += in;
        for (std::size_t i = 0; i < n; ++i) s += close;
        return s;
      };
      if (how == 0) body = nest("[", "]", "");
      if (how == 1) body = "{\"prompt\": " + nest("[", "]", "\"In\"") + "}";
      if (how == 2) body = nest("{\"a\":", "}", "1");
      if (how == 3) body = nest("[", "", "");  // never closed
      a.bytes = completion_request(body);
      break;
    }
    case attack_kind::invalid_utf8: {
      static const std::vector<std::string> bad = {
          "\xff",     "\xfe\xfe",        "\xc3\x28",
          "\xa0\xa1", "\xe2\x28\xa1",    "\xf0\x28\x8c\xbc",
          "\xc0\xaf", "\xed\xa0\x80",    "\xf8\xa1\xa1\xa1\xa1",
          "\xe2\x82", "\xf4\x90\x80\x80"};
      static const std::vector<std::string> escaped = {"\\ud800", "\\udc00x", "\\ud83d",
                                                       "\\u0000", "\\uZZZZ",  "\\"};
      static const std::vector<std::string> foreign = {"caf\xc3\xa9", "\xe6\x97\xa5\xe6\x9c\xac",
                                                       "\xf0\x9f\x98\x80", "\xc2\xa0"};
      const std::string p = d.pick(kjv_prompts);
      fields f = valid_fields(d, d.coin());
      const uint64_t how = d.below(4);
      if (how == 0) set_field(f, "prompt", "\"" + p + d.pick(bad) + p + "\"");
      if (how == 1) set_field(f, "prompt", "\"" + p + d.pick(escaped) + "\"");
      if (how == 2) set_field(f, "prompt", "\"" + p + d.pick(foreign) + "\"");
      std::string body = join(f);
      if (how == 3) body.insert(body.size() - 1, ", \"k" + d.pick(bad) + "\": 1" + d.pick(bad));
      a.bytes = completion_request(body);
      break;
    }
    case attack_kind::oversized_body: {
      std::string prompt;
      const std::size_t n = body_limit + 1 + d.below(65536);
      while (prompt.size() < n) prompt += kjv_sentence;
      a.bytes = completion_request("{\"prompt\": \"" + prompt + "\", \"max_tokens\": 1}");
      break;
    }
    case attack_kind::long_prompt: {
      std::string prompt;
      const std::size_t n = d.size_between(256, body_limit - 256);
      while (prompt.size() < n) prompt += kjv_sentence;
      prompt.resize(n);
      a.bytes = completion_request("{\"prompt\": \"" + prompt + "\", \"max_tokens\": " +
                                   std::to_string(1 + d.below(4)) + ", \"temperature\": 0}");
      break;
    }
    case attack_kind::unknown_route: {
      static const std::vector<std::string> methods = {
          "GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "BREW", "CONNECT", "get"};
      static const std::vector<std::string> paths = {"/",
                                                     "/v1",
                                                     "/v1/completions/",
                                                     "/v1/chat/completions",
                                                     "/v2/completions",
                                                     "/../../etc/passwd",
                                                     "/health/../metrics",
                                                     "/%00",
                                                     "/%ff%fe",
                                                     "/v1/completions?x=%zz",
                                                     "/V1/COMPLETIONS",
                                                     "//v1//completions",
                                                     "*",
                                                     "/health%20",
                                                     "/metrics/x"};
      std::string method = d.pick(methods), path = d.pick(paths);
      if (d.below(4) == 0) {  // a long path: under, near and over the 16 KiB head bound
        path = "/";
        for (std::size_t n = d.size_between(16, 24000); n > 0; --n)
          path += static_cast<char>('!' + d.below(94));
      }
      // The two routes that exist, asked with the other method: still no route.
      if (d.below(8) == 0) {
        method = "POST";
        path = d.coin() ? "/health" : "/metrics";
      } else if (d.below(8) == 0) {
        method = "GET";
        path = "/v1/completions";
      }
      a.bytes = http_request(method, path, d.coin() ? "" : join(valid_fields(d, false)));
      break;
    }
    case attack_kind::bad_http: {
      const std::string body = join(valid_fields(d, false));
      std::string chunked_ok;
      {
        std::ostringstream c;
        c << std::hex << body.size() << "\r\n" << body << "\r\n0\r\n\r\n";
        chunked_ok = c.str();
      }
      const std::string head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\n";
      switch (d.below(14)) {
        case 0:
          a.bytes = d.bytes(d.size_between(1, 2048)) + "\r\n\r\n";
          break;
        case 1:
          a.bytes = "POST /v1/completions\r\n\r\n" + body;
          break;
        case 2:
          a.bytes =
              "POST /v1/completions HTTP/9.9\r\nContent-Length: " + std::to_string(body.size()) +
              "\r\n\r\n" + body;
          break;
        case 3:
          a.bytes = head + "no colon here\r\n\r\n";
          break;
        case 4: {
          std::string many;
          for (int i = 0; i < 1000; ++i) many += "X-H" + std::to_string(i) + ": v\r\n";
          a.bytes = head + many + "\r\n";
          break;
        }
        case 5:
          a.bytes = head + "X-Big: " + std::string(d.size_between(1000, 40000), 'a') + "\r\n\r\n";
          break;
        case 6:
          a.bytes = head + "Content-Length: -1\r\n\r\n" + body;
          break;
        case 7:
          a.bytes = head + "Content-Length: abc\r\n\r\n" + body;
          break;
        case 8:
          a.bytes = head + "Content-Length: 18446744073709551616\r\n\r\n" + body;
          break;
        case 9:
          a.bytes = head + "Content-Length: 5\r\nContent-Length: " + std::to_string(body.size()) +
                    "\r\n\r\n" + body;
          break;
        case 10:  // a body shorter than announced, then the client's half of the socket ends
          a.bytes =
              head + "Content-Length: " + std::to_string(body.size() + 100) + "\r\n\r\n" + body;
          a.half_close = true;
          break;
        case 11:
          a.bytes = head + "Transfer-Encoding: chunked\r\n\r\nzz\r\n" + body + "\r\n";
          a.half_close = true;
          break;
        case 12:
          a.bytes = head + "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + chunked_ok;
          break;
        default:  // control bytes and a NUL inside a header name
          a.bytes = head + "Bad" + std::string(1, '\0') +
                    "Header: \x01\x02\r\nContent-Length: " + std::to_string(body.size()) +
                    "\r\n\r\n" + body;
          break;
      }
      break;
    }
    case attack_kind::slow_client: {
      a.bytes = completion_request(join(valid_fields(d, d.coin())));
      if (d.coin()) {
        a.send_bytes = 1 + d.below(20);
        a.trickle_ms = static_cast<int>(5 + d.below(25));
      } else {
        a.send_bytes = 1 + d.below(a.bytes.size() - 1);
      }
      a.hold_ms = static_cast<int>(20 + d.below(480));
      a.reset = d.below(4) == 0;
      return a;
    }
    case attack_kind::stream_disconnect: {
      fields f = valid_fields(d, true);
      set_field(f, "max_tokens", std::to_string(16 + d.below(240)));
      a.bytes = completion_request(join(f));
      if (d.below(4) == 0)
        a.leave_at_head = true;
      else
        a.leave_at_event = true;
      a.reset = d.coin();
      break;
    }
  }
  a.send_bytes = a.bytes.size();
  return a;
}

// What a hostile request got: an HTTP status, or one of these.
constexpr int no_answer = 0;   // the connection ended without a status line
constexpr int timed_out = -1;  // nothing for hostile_timeout_s
constexpr int refused = -2;    // no connection

class socket_fd {
 public:
  explicit socket_fd(int fd) : fd_(fd) {}
  ~socket_fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  socket_fd(const socket_fd&) = delete;
  socket_fd& operator=(const socket_fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

int connect_local(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  timeval tv{hostile_timeout_s, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

int status_of(const std::string& got) {
  if (got.size() < 12 || got.compare(0, 7, "HTTP/1.") != 0) return no_answer;
  return std::atoi(got.c_str() + 9);
}

// Sends A on a fresh connection and reads what comes back: the status it got.
int run_attack(int port, const attack& a) {
  socket_fd s(connect_local(port));
  if (s.get() < 0) return refused;
  if (a.reset) {
    const linger hard{1, 0};
    ::setsockopt(s.get(), SOL_SOCKET, SO_LINGER, &hard, sizeof hard);
  }
  std::size_t sent = 0;
  while (sent < a.send_bytes) {
    const std::size_t n = a.trickle_ms > 0 ? 1 : a.send_bytes - sent;
    const ssize_t w = ::send(s.get(), a.bytes.data() + sent, n, MSG_NOSIGNAL);
    if (w <= 0) break;  // the server may have answered (413) and closed: read on
    sent += static_cast<std::size_t>(w);
    if (a.trickle_ms > 0) std::this_thread::sleep_for(milliseconds(a.trickle_ms));
  }
  std::string got;
  char buf[65536];
  if (a.send_bytes < a.bytes.size()) {  // a slow client: wait, take whatever came, go
    std::this_thread::sleep_for(milliseconds(a.hold_ms));
    const ssize_t n = ::recv(s.get(), buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) got.assign(buf, static_cast<std::size_t>(n));
    return status_of(got);
  }
  if (a.half_close) ::shutdown(s.get(), SHUT_WR);
  while (true) {
    const ssize_t n = ::recv(s.get(), buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return got.empty() ? timed_out : status_of(got);
    if (n <= 0) return status_of(got);
    if (got.size() < 65536) got.append(buf, static_cast<std::size_t>(n));
    const std::size_t head_end = got.find("\r\n\r\n");
    if (head_end == std::string::npos || status_of(got) != 200) continue;
    if (a.leave_at_head) return 200;
    if (a.leave_at_event && got.find("data: ", head_end) != std::string::npos) return 200;
  }
}

std::string class_of(int status) {
  if (status == no_answer) return "no_answer";
  if (status == timed_out) return "timeout";
  if (status == refused) return "refused";
  if (status >= 200 && status < 600) return std::to_string(status / 100) + "xx";
  return "other";
}

}  // namespace

void send_hostile(int port, int requests, int thread_count, uint64_t seed, hostile_report& h) {
  h.requests = requests;
  h.threads = thread_count;
  h.seed = seed;
  std::vector<int> status(static_cast<std::size_t>(requests), refused);
  std::vector<attack_kind> kind(static_cast<std::size_t>(requests));
  std::vector<double> took(static_cast<std::size_t>(requests));
  std::atomic<int> next{0};
  const auto t0 = clock_type::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < thread_count; ++t)
    threads.emplace_back([&] {
      for (int i = next++; i < requests; i = next++) {
        const attack a = make_attack(seed, static_cast<uint64_t>(i));
        kind[static_cast<std::size_t>(i)] = a.kind;
        const auto start = clock_type::now();
        status[static_cast<std::size_t>(i)] = run_attack(port, a);
        took[static_cast<std::size_t>(i)] =
            std::chrono::duration<double>(clock_type::now() - start).count();
      }
    });
  for (auto& t : threads) t.join();
  h.seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
  for (std::size_t i = 0; i < status.size(); ++i) {
    const std::string c = class_of(status[i]);
    ++h.classes[c];
    if (status[i] > 0) ++h.statuses[status[i]];
    if (status[i] >= 500 && status[i] != 503) ++h.server_errors;
    h.unavailable += status[i] == 503;
    h.busy += status[i] == 429;
    const std::string name = attack_kinds[static_cast<std::size_t>(kind[i])].name;
    ++h.kinds[name]["sent"];
    ++h.kinds[name][c];
    h.seconds_by_kind[name].push_back(took[i]);
  }
}

std::vector<std::string> attack_kind_names() {
  std::vector<std::string> names;
  for (const auto& k : attack_kinds) names.push_back(k.name);
  return names;
}

}  // namespace cohort::cli
