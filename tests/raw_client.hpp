// A raw TCP client of 127.0.0.1, for tests of HTTP servers (the metrics endpoint,
// `cohort serve`): what httplib::Client cannot be, one that stops halfway, trickles bytes
// or holds its end open. The one definition the unit and multi-process tests share.
#pragma once
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

namespace cohort::test {

// A raw TCP connection to 127.0.0.1:PORT, for clients httplib's would never be.
class raw_client {
 public:
  explicit raw_client(int port) : fd_(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd_ < 0 || connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
      throw std::runtime_error("connect to port " + std::to_string(port) + " failed");
  }
  ~raw_client() { close(fd_); }
  raw_client(const raw_client&) = delete;
  raw_client& operator=(const raw_client&) = delete;

  int fd() const { return fd_; }

  /// False once the server has closed (EPIPE, ECONNRESET).
  bool send_all(const std::string& data) {
    std::size_t done = 0;
    while (done < data.size()) {
      const ssize_t n = send(fd_, data.data() + done, data.size() - done, MSG_NOSIGNAL);
      if (n <= 0) return false;
      done += static_cast<std::size_t>(n);
    }
    return true;
  }

  /// All the server sends until it closes the connection; nullopt if it has not closed
  /// within LIMIT.
  std::optional<std::string> read_until_closed(std::chrono::milliseconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    std::string got;
    while (true) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return std::nullopt;
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char buf[4096];
      const ssize_t n = recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) return got;  // closed (0) or reset after what it sent
      got.append(buf, static_cast<std::size_t>(n));
    }
  }

 private:
  int fd_;
};

}  // namespace cohort::test
