#include "runtime/obs/metrics_connections.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <system_error>
#include <vector>

namespace cohort::obs {
namespace {

using clock = std::chrono::steady_clock;

// Whether the request of HEAD carries a body httplib will read before it calls a handler: a
// POST, PUT or PATCH (httplib reads theirs even without a Content-Length, until the client
// closes), or any Content-Length other than 0.
bool request_has_body(std::string head) {
  for (char& ch : head) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (head.rfind("post ", 0) == 0 || head.rfind("put ", 0) == 0 || head.rfind("patch ", 0) == 0)
    return true;
  const auto at = head.find("\r\ncontent-length:");
  if (at == std::string::npos) return false;
  std::size_t i = at + 17;
  while (i < head.size() && (head[i] == ' ' || head[i] == '\t')) ++i;
  return !(i < head.size() && head[i] == '0' && (i + 1 == head.size() || head[i + 1] == '\r'));
}

// Whether a whole request head (up to the blank line) arrives on FD before DEADLINE, within
// MAX bytes. It only peeks: httplib reads the head itself afterwards, all of it already in
// the socket's buffer, so its line reader (unbounded in 0.11.4) never sees more than MAX.
// SO_RCVLOWAT makes poll() wait for more bytes than were peeked last time, so a trickle is
// followed without spinning; it is set back to 1 before httplib reads.
bool head_arrives(int fd, clock::time_point deadline, std::size_t max, bool* body) {
  std::vector<char> buf(max);
  int want = 1;
  bool whole = false;
  while (true) {
    setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &want, sizeof want);
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - clock::now());
    if (left.count() <= 0) break;
    pollfd p{fd, POLLIN, 0};
    const int ready = poll(&p, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) break;  // late, or the socket failed
    const ssize_t n = recv(fd, buf.data(), buf.size(), MSG_PEEK | MSG_DONTWAIT);
    const void* end =
        n > 0 ? memmem(buf.data(), static_cast<std::size_t>(n), "\r\n\r\n", 4) : nullptr;
    if (end != nullptr) {
      whole = true;
      *body = request_has_body(
          std::string(buf.data(), static_cast<std::size_t>(static_cast<const char*>(end) - buf.data())));
      break;
    }
    // Readable without a byte more than last time: the peer closed (or the socket was cut).
    if (n < want || static_cast<std::size_t>(n) >= max) break;
    want = static_cast<int>(n) + 1;
  }
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &one, sizeof one);
  return whole;
}

}  // namespace

metrics_connections::metrics_connections(metrics_server_limits limits, int port)
    : limits_(limits), port_(port) {}

metrics_connections::~metrics_connections() { shutdown(); }

std::size_t metrics_connections::open() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::size_t n = 0;
  for (const connection& c : connections_) n += c.state != phase::done && !c.cut ? 1 : 0;
  return n;
}

// httplib hands over a closure, not the socket it accepted: find that socket among the
// process's descriptors. It is the one bound to our port that is not listening and not one of
// ours already (told apart by inode, which a duplicate shares and a new socket never has).
// Only this thread accepts, so no other connection of ours can appear during the scan.
int metrics_connections::find_new_socket(ino_t* inode) const {
  std::set<ino_t> known;
  for (const connection& c : connections_) known.insert(c.inode);
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int found = -1;
  while (const dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    struct stat st {};
    if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    if (known.count(st.st_ino) > 0) continue;
    sockaddr_in local{};
    socklen_t len = sizeof local;
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &len) != 0 ||
        local.sin_family != AF_INET || ntohs(local.sin_port) != port_) {
      continue;
    }
    int listening = 1;
    socklen_t size = sizeof listening;
    if (getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_ACCEPTCONN, &listening, &size) != 0 ||
        listening != 0) {
      continue;
    }
    found = static_cast<int>(fd);
    *inode = st.st_ino;
    break;
  }
  closedir(dir);
  return found < 0 ? -1 : fcntl(found, F_DUPFD_CLOEXEC, 0);
}

void metrics_connections::cut(connection& c) {
  if (c.cut) return;
  c.cut = true;
  if (c.fd >= 0) ::shutdown(c.fd, SHUT_RDWR);
}

void metrics_connections::reap(clock::time_point now) {
  for (auto it = connections_.begin(); it != connections_.end();) {
    if (it->state == phase::done) {
      it->thread.join();  // it has left serve(): it needs mutex_ no more
      if (it->fd >= 0) close(it->fd);
      it = connections_.erase(it);
      continue;
    }
    if (now - it->accepted > limits_.connection_deadline ||
        (it->state == phase::head && now - it->accepted > limits_.head_deadline) ||
        (it->state == phase::body && now - it->accepted > limits_.request_deadline)) {
      cut(*it);
    }
    ++it;
  }
}

void metrics_connections::enqueue(std::function<void()> fn) {
  const auto now = clock::now();
  std::lock_guard<std::mutex> lock(mutex_);
  reap(now);
  connection c;
  c.accepted = now;
  c.fd = find_new_socket(&c.inode);
  std::size_t held = 0;
  for (const connection& o : connections_) held += o.cut || o.state == phase::done ? 0 : 1;
  bool room = held < limits_.max_connections;
  // Full: the oldest connection that has not yet sent its head or body makes room. One being
  // served keeps its place; when all are, the new one is cut.
  for (auto it = connections_.begin(); !room && it != connections_.end(); ++it) {
    if ((it->state == phase::head || it->state == phase::body) && !it->cut) {
      cut(*it);
      room = true;
    }
  }
  connection& added = connections_.emplace_back(std::move(c));
  if (!room) cut(added);
  // httplib's closure must run even for a cut connection: it is what closes httplib's socket.
  try {
    added.thread = std::thread(&metrics_connections::serve, this, &added, fn);
  } catch (const std::system_error&) {
    // No thread to be had (the process is at its limit): refuse this one here, where httplib
    // then finds the socket shut down and closes it at once.
    cut(added);
    fn();
    added.state = phase::done;
  }
}

namespace {
// What request_read() does on this thread: marks its connection served (serve() sets it).
thread_local std::function<void()> t_request_read;
}  // namespace

void metrics_connections::request_read() {
  if (t_request_read) t_request_read();
}

void metrics_connections::serve(connection* c, std::function<void()> fn) {
  // Without our own handle on the socket (not found: never seen) only httplib's timeouts hold.
  bool body = false;
  const bool whole = c->fd < 0 || head_arrives(c->fd, c->accepted + limits_.head_deadline,
                                               limits_.head_max_bytes, &body);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!whole) cut(*c);
    if (!c->cut) c->state = body ? phase::body : phase::serving;
  }
  t_request_read = [this, c] {
    std::lock_guard<std::mutex> lock(mutex_);
    if (c->state == phase::body) c->state = phase::serving;
  };
  fn();  // httplib: reads the head, answers, shuts its socket down and closes it
  t_request_read = nullptr;
  std::lock_guard<std::mutex> lock(mutex_);
  c->state = phase::done;
}

void metrics_connections::on_idle() {
  const auto now = clock::now();
  std::lock_guard<std::mutex> lock(mutex_);
  reap(now);
}

void metrics_connections::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (connection& c : connections_) cut(c);
  }
  // Every socket is shut down, so every thread is at most finishing a render: join without
  // the lock, which they take to mark themselves done. Only this thread changes the list.
  for (connection& c : connections_) {
    if (c.thread.joinable()) c.thread.join();
  }
  std::lock_guard<std::mutex> lock(mutex_);
  for (connection& c : connections_) {
    if (c.fd >= 0) close(c.fd);
  }
  connections_.clear();
}

}  // namespace cohort::obs
