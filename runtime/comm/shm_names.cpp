// A segment's name is unlinked by its group once every rank has mapped it; until then only the
// name keeps it, so a maker killed during the rendezvous leaves it for good unless a later
// process removes it. The maker's pid in the name says whether it is gone, as the private run
// folders of `cohort launch` do (proc::private_run_dir).
#include "runtime/comm/shm_names.hpp"

#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <random>
#include <sstream>

namespace cohort::comm {
namespace {

constexpr const char* head = "cohort-";

// This process's pid namespace as a number (the inode of /proc/self/ns/pid): pids compare
// only within one namespace, and containers may share /dev/shm without sharing pids.
std::string pid_namespace() {
  struct stat st {};
  if (::stat("/proc/self/ns/pid", &st) != 0) return "0";
  return std::to_string(static_cast<unsigned long long>(st.st_ino));
}

bool all_digits(const std::string& s) {
  return !s.empty() && s.size() <= 18 && s.find_first_not_of("0123456789") == std::string::npos;
}

}  // namespace

std::string shm_segment_name(std::uint64_t generation) {
  std::random_device rd;
  std::ostringstream s;
  s << "/" << head << ::getpid() << "-n" << pid_namespace() << "-" << std::hex << rd() << rd()
    << "-g" << std::dec << generation;
  return s.str();
}

std::vector<std::string> remove_stale_shm_segments() {
  std::vector<std::string> removed;
  const std::string ns = pid_namespace();
  const uid_t me = ::geteuid();
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string leaf = e.path().filename().string();
    if (leaf.rfind(head, 0) != 0) continue;
    // cohort-PID-nNS-RANDOM-gGEN: anything else is not a segment of ours.
    std::istringstream parts(leaf.substr(std::char_traits<char>::length(head)));
    std::string pid, n;
    if (!std::getline(parts, pid, '-') || !std::getline(parts, n, '-')) continue;
    if (!all_digits(pid) || n.size() < 2 || n[0] != 'n' || n.substr(1) != ns) continue;
    struct stat st {};
    if (::lstat(e.path().c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != me) continue;
    const long long id = std::stoll(pid);
    if (id <= 0 || id > 0x7fffffff) continue;
    if (::kill(static_cast<pid_t>(id), 0) == 0 || errno != ESRCH) continue;  // alive (or not ours)
    if (::shm_unlink(("/" + leaf).c_str()) == 0) removed.push_back(leaf);
  }
  return removed;
}

}  // namespace cohort::comm
