#include "runtime/comm/local_kv.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <thread>

#include "runtime/comm/comm_error.hpp"

namespace cohort::comm {

namespace {

using clock_type = std::chrono::steady_clock;

std::string missing_keys_detail(const std::vector<std::string>& missing,
                                std::chrono::milliseconds timeout) {
  std::string s = "not set within " + std::to_string(timeout.count()) + " ms:";
  for (const auto& k : missing) s += " '" + k + "'";
  return s + " (a rank did not arrive: check that every rank runs and uses the same store)";
}

}  // namespace

// ---- memory_kv ----

void memory_kv::set(const std::string& key, const std::vector<char>& value) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    values_[key] = value;
  }
  changed_.notify_all();
}

std::vector<char> memory_kv::get(const std::string& key, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (values_.count(key) == 0 && before_wait) before_wait();
  if (!changed_.wait_for(lock, timeout, [&] { return values_.count(key) != 0; }))
    throw comm_error(comm_failure::timeout, "rendezvous get", missing_keys_detail({key}, timeout));
  return values_.at(key);
}

void memory_kv::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto all_set = [&] {
    for (const auto& k : keys)
      if (values_.count(k) == 0) return false;
    return true;
  };
  if (!all_set() && before_wait) before_wait();
  if (!changed_.wait_for(lock, timeout, all_set)) {
    std::vector<std::string> missing;
    for (const auto& k : keys)
      if (values_.count(k) == 0) missing.push_back(k);
    throw comm_error(comm_failure::timeout, "rendezvous wait",
                     missing_keys_detail(missing, timeout));
  }
}

std::vector<std::string> memory_kv::keys() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> out;
  for (const auto& kv : values_) out.push_back(kv.first);
  return out;
}

// ---- file_kv ----

namespace {

// Reads the whole file; false if it does not exist (yet). Other errors throw.
bool read_whole(const std::string& path, std::vector<char>* out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return false;
    throw comm_error(comm_failure::rendezvous, "rendezvous get",
                     "cannot open " + path + ": " + std::strerror(errno));
  }
  out->clear();
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      throw comm_error(comm_failure::rendezvous, "rendezvous get",
                       "cannot read " + path + ": " + std::strerror(e));
    }
    if (n == 0) break;
    out->insert(out->end(), buf, buf + n);
  }
  ::close(fd);
  return true;
}

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// Polls `ready` with a growing sleep until it is true or the deadline passes; `before_wait`
// (when set) runs once, when the first look found it false.
template <class Pred>
bool poll_until(Pred ready, std::chrono::milliseconds timeout,
                const std::function<void()>& before_wait) {
  const auto deadline = clock_type::now() + timeout;
  auto pause = std::chrono::milliseconds(1);
  for (bool first = true;; first = false) {
    if (ready()) return true;
    if (first && before_wait) before_wait();
    const auto now = clock_type::now();
    if (now >= deadline) return false;
    std::this_thread::sleep_for(std::min<clock_type::duration>(pause, deadline - now));
    pause = std::min(pause * 2, std::chrono::milliseconds(20));
  }
}

}  // namespace

file_kv::file_kv(std::string dir) : dir_(std::move(dir)) {
  if (::mkdir(dir_.c_str(), 0700) != 0 && errno != EEXIST)
    throw comm_error(comm_failure::rendezvous, "file store",
                     "cannot create directory " + dir_ + ": " + std::strerror(errno));
}

std::string file_kv::path_of(const std::string& key) const {
  // Keys never map to names starting with '~' (it is encoded), which set() uses for its
  // temporary files, and never contain '/'.
  static const char* hex = "0123456789ABCDEF";
  std::string name;
  for (unsigned char c : key) {
    if (std::isalnum(c) || c == '.' || c == '_' || c == '-') {
      name += static_cast<char>(c);
    } else {
      name += '%';
      name += hex[c >> 4];
      name += hex[c & 15];
    }
  }
  if (name.empty() || name == "." || name == "..") name = "%" + name;  // not a real entry
  return dir_ + "/" + name;
}

void file_kv::set(const std::string& key, const std::vector<char>& value) {
  static std::atomic<unsigned long> counter{0};
  const std::string final_path = path_of(key);
  const std::string tmp =
      dir_ + "/~tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0)
    throw comm_error(comm_failure::rendezvous, "rendezvous set '" + key + "'",
                     "cannot create " + tmp + ": " + std::strerror(errno));
  std::size_t done = 0;
  while (done < value.size()) {
    const ssize_t n = ::write(fd, value.data() + done, value.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw comm_error(comm_failure::rendezvous, "rendezvous set '" + key + "'",
                       "cannot write " + tmp + ": " + std::strerror(e));
    }
    done += static_cast<std::size_t>(n);
  }
  ::close(fd);
  // rename(2) is atomic within a directory: readers see the old value or the new one.
  if (::rename(tmp.c_str(), final_path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw comm_error(comm_failure::rendezvous, "rendezvous set '" + key + "'",
                     "cannot rename into " + final_path + ": " + std::strerror(e));
  }
}

std::vector<char> file_kv::get(const std::string& key, std::chrono::milliseconds timeout) {
  const std::string path = path_of(key);
  std::vector<char> value;
  if (!poll_until([&] { return read_whole(path, &value); }, timeout, before_wait))
    throw comm_error(comm_failure::timeout, "rendezvous get",
                     missing_keys_detail({key}, timeout) + " in " + dir_);
  return value;
}

void file_kv::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::vector<std::string> paths;
  for (const auto& k : keys) paths.push_back(path_of(k));
  auto all = [&] {
    for (const auto& p : paths)
      if (!exists(p)) return false;
    return true;
  };
  if (!poll_until(all, timeout, before_wait)) {
    std::vector<std::string> missing;
    for (std::size_t i = 0; i < keys.size(); ++i)
      if (!exists(paths[i])) missing.push_back(keys[i]);
    throw comm_error(comm_failure::timeout, "rendezvous wait",
                     missing_keys_detail(missing, timeout) + " in " + dir_);
  }
}

}  // namespace cohort::comm
