// Running gnuplot for `cohort plot`: a child process started without a shell (no user text is
// ever parsed as a command line), its stderr captured for the error message; and the PNG
// check of what it drew.
#include "runtime/obs/plot.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "runtime/core/error.hpp"

extern char** environ;

namespace cohort::obs {

std::string gp_quote(const std::string& text) {
  // gnuplot's single-quoted strings expand nothing (no backslash escapes, no `command`
  // substitution); the only special character is the quote itself, doubled.
  std::string q = "'";
  for (const char c : text) {
    if (c == '\'')
      q += "''";
    else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
      q += ' ';
    else
      q += c;
  }
  return q + "'";
}

namespace {

// The gnuplot executable on $PATH, or empty. Looked up here (not left to exec) so that a
// missing gnuplot gets its own message rather than a bare ENOENT.
std::string find_gnuplot() {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  std::size_t start = 0;
  while (start <= dirs.size()) {
    std::size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    const std::string d = end > start ? dirs.substr(start, end - start) : ".";
    const std::string exe = d + "/gnuplot";
    struct stat st {};
    if (::stat(exe.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(exe.c_str(), X_OK) == 0)
      return exe;
    start = end + 1;
  }
  return {};
}

// Closes both ends of a pipe on every path out.
struct pipe_fds {
  int fd[2] = {-1, -1};
  ~pipe_fds() {
    for (int f : fd)
      if (f >= 0) ::close(f);
  }
};

struct spawn_actions {
  posix_spawn_file_actions_t a{};
  spawn_actions() { posix_spawn_file_actions_init(&a); }
  ~spawn_actions() { posix_spawn_file_actions_destroy(&a); }
};

std::string read_all(int fd) {
  std::string out;
  std::array<char, 4096> buf{};
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n > 0) {
      out.append(buf.data(), static_cast<std::size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      return out;
    }
  }
}

int wait_for(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return -1;
  return status;
}

std::string trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace

std::string run_gnuplot(const std::string& dir, const std::string& script) {
  const std::string exe = find_gnuplot();
  if (exe.empty())
    throw error(
        "gnuplot is not installed (not found on PATH); `cohort plot` draws with it: run "
        "tools/setup.sh (it installs gnuplot-nox) or `apt-get install gnuplot-nox`");
  pipe_fds err;
  if (::pipe2(err.fd, O_CLOEXEC) != 0)
    throw error(std::string("cohort plot: pipe for gnuplot's stderr: ") + std::strerror(errno));
  spawn_actions act;
  posix_spawn_file_actions_addopen(&act.a, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&act.a, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_adddup2(&act.a, err.fd[1], 2);
  // The scripts name their files relative to DIR, so they still run after DIR is moved.
  posix_spawn_file_actions_addchdir_np(&act.a, dir.c_str());
  std::string arg0 = "gnuplot", arg1 = script;
  char* argv[] = {arg0.data(), arg1.data(), nullptr};
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, exe.c_str(), &act.a, nullptr, argv, environ);
  if (rc != 0)
    throw error("cannot start " + exe + " in " + dir + ": " + std::strerror(rc) +
                "; check that the folder exists and gnuplot runs (tools/setup.sh installs it)");
  ::close(err.fd[1]);
  err.fd[1] = -1;
  const std::string message = trimmed(read_all(err.fd[0]));
  const int status = wait_for(pid);
  if (status < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    const std::string how = status >= 0 && WIFSIGNALED(status)
                                ? "killed by signal " + std::to_string(WTERMSIG(status))
                                : "exit " + std::to_string(status >= 0 ? WEXITSTATUS(status) : -1);
    throw error("gnuplot failed on " + dir + "/" + script + " (" + how +
                "): " + (message.empty() ? std::string("no message") : message));
  }
  return message;
}

std::optional<png_size> read_png_size(const std::string& path) {
  static const unsigned char signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  std::ifstream in(path, std::ios::binary);
  unsigned char h[24] = {};
  if (!in.read(reinterpret_cast<char*>(h), sizeof h)) return std::nullopt;
  if (std::memcmp(h, signature, 8) != 0 || std::memcmp(h + 12, "IHDR", 4) != 0) return std::nullopt;
  const auto be32 = [&](int o) {
    return static_cast<uint32_t>(h[o]) << 24 | static_cast<uint32_t>(h[o + 1]) << 16 |
           static_cast<uint32_t>(h[o + 2]) << 8 | static_cast<uint32_t>(h[o + 3]);
  };
  return png_size{be32(16), be32(20)};
}

}  // namespace cohort::obs
