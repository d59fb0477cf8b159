#include "runtime/data/kjv.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "runtime/core/error.hpp"
#include "runtime/core/rng.hpp"

extern char** environ;

namespace cohort {

namespace fs = std::filesystem;

namespace {

// First and last lines of `bible -l0 Gen1:1-Rev22:21`; a cache without both was cut off.
constexpr std::string_view kjv_head = "\nGenesis 1\n\n  1 In the beginning God created";
constexpr std::string_view kjv_tail = "Christ be with you all. Amen.\n";

bool write_file_atomically(const fs::path& path, const std::string& bytes, std::string* why) {
  const fs::path tmp = path.string() + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    *why = tmp.string() + ": " + std::strerror(errno);
    return false;
  }
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      *why = tmp.string() + ": write failed: " + std::strerror(errno);
      ::close(fd);
      ::unlink(tmp.c_str());
      return false;
    }
    done += static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    *why = tmp.string() + ": " + std::strerror(errno);
    ::unlink(tmp.c_str());
    return false;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    *why = path.string() + ": rename failed: " + std::strerror(errno);
    ::unlink(tmp.c_str());
    return false;
  }
  return true;
}

}  // namespace

kjv::kjv(std::string text, int context) : text_(std::move(text)), context_(context) {
  if (context_ < 1) throw data_error("kjv: model.context must be at least 1");
  split_ = static_cast<int64_t>(text_.size()) * 9 / 10;
  const int64_t val = static_cast<int64_t>(text_.size()) - split_;
  // Training windows need an offset range of at least one; validation at least one window.
  if (split_ < context_ + 2 || val < context_ + 1) {
    throw data_error("kjv: text of " + std::to_string(text_.size()) +
                     " characters is too short for model.context " + std::to_string(context_) +
                     " (each split needs context+2 characters)");
  }
  bool present[256] = {};
  for (unsigned char ch : text_) present[ch] = true;
  id_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    if (present[b]) {
      id_[b] = static_cast<int16_t>(vocab_.size());
      vocab_.push_back(static_cast<char>(b));
    }
  }
  ids_.resize(text_.size());
  for (size_t i = 0; i < text_.size(); ++i)
    ids_[i] = static_cast<uint8_t>(id_[static_cast<unsigned char>(text_[i])]);
}

std::string kjv::expand_home(const std::string& path) {
  if (path.empty() || path[0] != '~') return path;
  if (path.size() > 1 && path[1] != '/') return path;  // ~user is not supported; keep as is
  const char* home = std::getenv("HOME");
  if (!home || !*home) {
    throw data_error("data.cache_dir '" + path +
                     "' starts with ~ but $HOME is not set (set HOME or give an absolute path)");
  }
  return std::string(home) + path.substr(1);
}

bool kjv::looks_complete(std::string_view text) {
  return text.size() > kjv_head.size() + kjv_tail.size() &&
         text.substr(0, kjv_head.size()) == kjv_head &&
         text.substr(text.size() - kjv_tail.size()) == kjv_tail;
}

std::string kjv::run_bible(const std::string& program) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    throw data_error(std::string("kjv: pipe failed: ") + std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  std::string a0 = program, a1 = "-l0", a2 = bible_range;
  char* argv[] = {a0.data(), a1.data(), a2.data(), nullptr};
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, program.c_str(), &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    if (rc == ENOENT) {
      throw data_error("kjv: the program `" + program +
                       "` was not found on PATH: install it with `apt-get install bible-kjv`");
    }
    throw data_error("kjv: cannot run `" + program + "`: " + std::strerror(rc));
  }
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t got = ::read(fds[0], buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    out.append(buf, static_cast<size_t>(got));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw data_error("kjv: `" + program + " -l0 " + bible_range + "` failed (" +
                     (WIFEXITED(status) ? "exit status " + std::to_string(WEXITSTATUS(status))
                                        : "killed by a signal") +
                     "); reinstall bible-kjv");
  }
  if (out.empty()) throw data_error("kjv: `" + program + "` printed nothing; reinstall bible-kjv");
  return out;
}

std::string kjv::load_text(const std::string& cache_dir) {
  const fs::path dir = expand_home(cache_dir);
  const fs::path cache = dir / cache_name;
  {
    std::ifstream in(cache, std::ios::binary);
    if (in) {
      std::ostringstream ss;
      ss << in.rdbuf();
      std::string text = ss.str();
      if (looks_complete(text)) return text;
      spdlog::warn("kjv: cache {} is incomplete; regenerating it", cache.string());
    }
  }
  std::string text = run_bible();
  if (!looks_complete(text)) {
    throw data_error("kjv: `bible -l0 " + std::string(bible_range) +
                     "` did not print the whole KJV (unexpected first or last line); "
                     "reinstall bible-kjv");
  }
  // The cache only saves the 0.1 s of running `bible`: failing to write it is a warning.
  std::error_code ec;
  fs::create_directories(dir, ec);
  std::string why;
  if (ec) {
    spdlog::warn("kjv: cannot create cache folder {}: {}", dir.string(), ec.message());
  } else if (!write_file_atomically(cache, text, &why)) {
    spdlog::warn("kjv: cannot write cache: {}", why);
  }
  return text;
}

int64_t kjv::window_offset(uint64_t seed, int64_t step, int64_t index) const {
  const uint64_t range = static_cast<uint64_t>(split_ - context_ - 1);
  return static_cast<int64_t>(
      hash_coords(seed, static_cast<uint64_t>(step), static_cast<uint64_t>(index)) % range);
}

void kjv::train_micro_batch(uint64_t seed, int64_t step, int micro, int micro_batch,
                            int global_batch, batch& out) const {
  COHORT_CHECK(step >= 0);
  const int n = micro_batch_rows(micro, micro_batch, global_batch);
  fill_windows(n, out, [&](int j) {
    return ids_.data() + window_offset(seed, step, static_cast<int64_t>(micro) * micro_batch + j);
  });
}

int64_t kjv::eval_size(int64_t max_tokens) const {
  const int64_t val = static_cast<int64_t>(text_.size()) - split_;
  int64_t windows = (val - 1) / context_;
  if (max_tokens > 0) windows = std::min(windows, std::max<int64_t>(1, max_tokens / context_));
  return windows;
}

void kjv::eval_batch(int64_t first, int n, batch& out) const {
  COHORT_CHECK(first >= 0 && n >= 0 && first + n <= eval_size());
  fill_windows(n, out, [&](int j) { return ids_.data() + split_ + (first + j) * context_; });
}

template <class WindowStart>
void kjv::fill_windows(int n, batch& out, WindowStart start_of) const {
  // Row j holds window start_of(j): ids are its first T characters, targets the T after
  // each of them (the next-character labels).
  const int T = context_;
  out.n = n;
  out.t = T;
  out.features = 0;
  out.x.clear();
  out.ids.resize(static_cast<size_t>(n) * T);
  out.targets.resize(static_cast<size_t>(n) * T);
  for (int j = 0; j < n; ++j) {
    const uint8_t* w = start_of(j);
    for (int t = 0; t < T; ++t) {
      out.ids[static_cast<size_t>(j) * T + t] = w[t];
      out.targets[static_cast<size_t>(j) * T + t] = w[t + 1];
    }
  }
}

std::vector<int32_t> kjv::encode(std::string_view text) const {
  std::vector<int32_t> out(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const int16_t id = id_[static_cast<unsigned char>(text[i])];
    if (id < 0) {
      throw data_error("kjv: character code " +
                       std::to_string(static_cast<unsigned char>(text[i])) + " at position " +
                       std::to_string(i) + " is not in the vocabulary");
    }
    out[i] = id;
  }
  return out;
}

std::string kjv::decode(const std::vector<int32_t>& ids) const {
  std::string out(ids.size(), '\0');
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= static_cast<int32_t>(vocab_.size())) {
      throw data_error("kjv: token id " + std::to_string(ids[i]) + " at position " +
                       std::to_string(i) + " is outside the vocabulary of " +
                       std::to_string(vocab_.size()));
    }
    out[i] = vocab_[ids[i]];
  }
  return out;
}

std::map<std::string, std::string> kjv::preprocessing_metadata() const {
  return {{"data.input", "bytes of the KJV text (bible -l0), id = rank in data.vocab"},
          {"data.vocab", vocab_},
          {"data.vocab_size", std::to_string(vocab_.size())},
          {"data.context", std::to_string(context_)},
          {"data.train_chars", std::to_string(split_)},
          {"data.validation_chars", std::to_string(text_.size() - split_)}};
}

}  // namespace cohort
