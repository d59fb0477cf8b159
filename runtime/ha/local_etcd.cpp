// Starting and stopping the run's own etcd. Started without a shell (fork + exec; it dies
// with the thread that started it: PR_SET_PDEATHSIG) with the signal mask and dispositions
// reset: cohort's threads block SIGTERM, and a child that inherited that mask would ignore
// stop()'s SIGTERM until the SIGKILL.
#include "runtime/ha/local_etcd.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "runtime/core/error.hpp"
#include "runtime/ha/etcd_certs.hpp"
#include "runtime/ha/etcd_client.hpp"

extern char** environ;

namespace cohort::ha {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

constexpr const char* install_hint =
    "ha.etcd: local needs Debian's etcd-server (tools/setup.sh installs it)";
constexpr int start_attempts = 4;

bool executable_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

// Two distinct ports free now, both picked by the OS. Another process may take one before
// etcd binds it: the caller retries when etcd says so.
std::pair<int, int> two_free_ports() {
  int fds[2] = {-1, -1};
  int ports[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    fds[i] = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fds[i] < 0 || ::bind(fds[i], reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::getsockname(fds[i], reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      const int e = errno;
      for (int f : fds)
        if (f >= 0) ::close(f);
      throw error(std::string("local etcd: cannot pick a free port on 127.0.0.1: ") +
                  std::strerror(e) + "; check that the loopback interface is up");
    }
    ports[i] = ntohs(a.sin_port);
  }
  for (int f : fds) ::close(f);
  return {ports[0], ports[1]};
}

// The last lines of the file at PATH (at most ~2 KB), for error messages.
std::string tail_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "(no log at " + path + ")";
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  const std::streamoff from = size > 2048 ? size - 2048 : 0;
  in.seekg(from);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (from > 0) {
    const auto nl = text.find('\n');
    if (nl != std::string::npos) text.erase(0, nl + 1);
  }
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text.empty() ? "(empty log " + path + ")" : text;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exit " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  return "status " + std::to_string(status);
}

}  // namespace

std::string local_etcd::find_binary(const std::string& binary) {
  if (!binary.empty()) {
    if (executable_file(binary)) return binary;
    throw error("etcd not found: " + binary + " is not an executable file; " + install_hint);
  }
  if (executable_file("/usr/bin/etcd")) return "/usr/bin/etcd";
  const char* path = std::getenv("PATH");
  const std::string dirs = path != nullptr ? path : "";
  std::size_t start = 0;
  while (start < dirs.size()) {
    std::size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    if (end > start) {
      const std::string exe = dirs.substr(start, end - start) + "/etcd";
      if (executable_file(exe)) return exe;
    }
    start = end + 1;
  }
  throw error(std::string("etcd not found (neither /usr/bin/etcd nor etcd on PATH): ") +
              install_hint);
}

local_etcd::local_etcd(local_etcd_options opts) : opts_(std::move(opts)) {
  if (opts_.dir.empty()) throw usage_error("local etcd: no folder given for its data and log");
  if (opts_.heartbeat_ms < 1 || opts_.election_ms < 5 * opts_.heartbeat_ms)
    throw usage_error("local etcd: election timeout (" + std::to_string(opts_.election_ms) +
                      " ms) must be at least 5 heartbeats (" + std::to_string(opts_.heartbeat_ms) +
                      " ms each)");
  const std::string exe = find_binary(opts_.binary);
  std::error_code ec;
  std::filesystem::create_directories(opts_.dir, ec);
  if (ec)
    throw error("local etcd: cannot create " + opts_.dir + ": " + ec.message() +
                "; choose a writable folder");
  // Only this user may enter: the client key below is what lets a process into etcd.
  if (::chmod(opts_.dir.c_str(), 0700) != 0)
    throw error("local etcd: cannot make " + opts_.dir +
                " private (chmod 700): " + std::strerror(errno));
  make_etcd_certs(opts_.dir);
  tls_ = etcd_tls_in(opts_.dir);
  for (int attempt = 1; attempt <= start_attempts; ++attempt)
    if (try_start(exe)) return;
  throw error("local etcd: its ports were taken " + std::to_string(start_attempts) +
              " times in a row; " + log_path() + " ends with:\n" + tail_of(log_path()));
}

local_etcd::~local_etcd() { stop(); }

std::string local_etcd::log_path() const { return opts_.dir + "/etcd.log"; }

bool local_etcd::try_start(const std::string& exe) {
  const auto [client_port, peer_port] = two_free_ports();
  const std::string client_url = "https://127.0.0.1:" + std::to_string(client_port);
  const std::string peer_url = "https://127.0.0.1:" + std::to_string(peer_port);
  const std::string cert = opts_.dir + "/" + etcd_server_cert_name;
  const std::string key = opts_.dir + "/" + etcd_server_key_name;
  std::vector<std::string> args = {
      "etcd", "--name=cohort", "--data-dir=" + opts_.dir + "/data",
      "--listen-client-urls=" + client_url, "--advertise-client-urls=" + client_url,
      "--listen-peer-urls=" + peer_url, "--initial-advertise-peer-urls=" + peer_url,
      "--initial-cluster=cohort=" + peer_url,
      "--heartbeat-interval=" + std::to_string(opts_.heartbeat_ms),
      "--election-timeout=" + std::to_string(opts_.election_ms),
      // Both listeners speak TLS and admit only a certificate
      // of the run's CA, whose key no longer exists.
      "--cert-file=" + cert, "--key-file=" + key, "--trusted-ca-file=" + tls_.ca_file,
      "--client-cert-auth", "--peer-cert-file=" + cert, "--peer-key-file=" + key,
      "--peer-trusted-ca-file=" + tls_.ca_file, "--peer-client-cert-auth"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  // etcd also reads its flags from ETCD_* variables: none of the caller's may change ours.
  std::vector<char*> envp;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e)
    if (std::strncmp(*e, "ETCD_", 5) != 0) envp.push_back(*e);
  envp.push_back(nullptr);

  // fork + exec rather than posix_spawn: the child must carry PR_SET_PDEATHSIG, so that
  // even a SIGKILLed launcher leaves no etcd behind (as it leaves no other child).
  const std::string log = log_path();
  const int in_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  const int log_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (in_fd < 0 || log_fd < 0) {
    const int err = errno;
    if (in_fd >= 0) ::close(in_fd);
    if (log_fd >= 0) ::close(log_fd);
    throw error("local etcd: cannot open " + log + ": " + std::strerror(err));
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    // Only async-signal-safe calls here: another thread may hold malloc's lock.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGPIPE}) ::signal(sig, SIG_DFL);
    ::dup2(in_fd, 0);
    ::dup2(log_fd, 1);
    ::dup2(log_fd, 2);
    ::execve(exe.c_str(), argv.data(), envp.data());
    ::_exit(127);
  }
  const int fork_errno = errno;
  ::close(in_fd);
  ::close(log_fd);
  if (pid < 0)
    throw error("local etcd: cannot start " + exe + ": " + std::strerror(fork_errno) +
                "; check that it runs (`" + exe + " --version`)");
  pid_ = pid;

  etcd_client probe({client_url}, etcd_timeouts{100, 500}, tls_);
  const auto deadline = steady_clock::now() + milliseconds(opts_.start_timeout_ms);
  while (true) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = 0;
      const std::string tail = tail_of(log);
      if (tail.find("address already in use") != std::string::npos) return false;
      throw error("local etcd: " + exe + " stopped during start (" + describe_status(status) +
                  "); " + log + " ends with:\n" + tail);
    }
    if (probe.healthy()) break;
    if (steady_clock::now() >= deadline) {
      stop();
      throw error("local etcd: not healthy " + std::to_string(opts_.start_timeout_ms) +
                  " ms after start (GET " + client_url + "/health); " + log + " ends with:\n" +
                  tail_of(log));
    }
    std::this_thread::sleep_for(milliseconds(10));
  }
  endpoint_ = client_url;
  return true;
}

void local_etcd::stop() {
  if (pid_ == 0) return;
  const pid_t pid = pid_;
  pid_ = 0;
  if (::kill(pid, SIGTERM) != 0) {
    ::waitpid(pid, nullptr, WNOHANG);
    return;
  }
  const auto deadline = steady_clock::now() + milliseconds(opts_.stop_grace_ms);
  while (steady_clock::now() < deadline) {
    const pid_t r = ::waitpid(pid, nullptr, WNOHANG);
    if (r == pid || (r < 0 && errno != EINTR)) return;  // reaped, or not our child to reap
    std::this_thread::sleep_for(milliseconds(5));
  }
  ::kill(pid, SIGKILL);
  while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
  }
}

}  // namespace cohort::ha
