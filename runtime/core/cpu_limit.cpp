#include "runtime/core/cpu_limit.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "runtime/core/error.hpp"

namespace cohort::proc {

namespace {

constexpr long period_us = 100000;

bool write_text(const std::string& path, const std::string& text, std::string* why) {
  std::ofstream f(path);
  f << text;
  f.flush();
  if (f) return true;
  if (why != nullptr) *why = path + ": " + std::strerror(errno);
  return false;
}

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool has_word(const std::string& list, const std::string& word, char sep) {
  std::stringstream ss(list);
  for (std::string w; std::getline(ss, w, sep);) {
    while (!w.empty() && (w.back() == '\n' || w.back() == ' ')) w.pop_back();
    if (w == word) return true;
  }
  return false;
}

// The v1 `cpu` mount, or a cgroup2 mount offering `cpu`, from /proc/self/mountinfo:
// "ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS [TAGS...] - FSTYPE SOURCE SUPER_OPTIONS".
struct cpu_mount {
  std::string dir;
  bool v2 = false;
};

std::optional<cpu_mount> find_cpu_mount() {
  std::ifstream f("/proc/self/mountinfo");
  std::optional<cpu_mount> v2;
  for (std::string line; std::getline(f, line);) {
    std::stringstream ss(line);
    std::vector<std::string> w;
    for (std::string x; ss >> x;) w.push_back(x);
    std::size_t dash = 0;
    while (dash < w.size() && w[dash] != "-") ++dash;
    if (w.size() < 5 || dash + 3 >= w.size()) continue;
    const std::string& type = w[dash + 1];
    const std::string& mount_point = w[4];
    if (type == "cgroup" && has_word(w[dash + 3], "cpu", ','))
      return cpu_mount{mount_point, false};
    if (type == "cgroup2" && !v2 &&
        has_word(read_text(mount_point + "/cgroup.controllers"), "cpu", ' '))
      v2 = cpu_mount{mount_point, true};
  }
  return v2;
}

}  // namespace

std::optional<std::string> cpu_cgroup_root(std::string* why) {
  const auto m = find_cpu_mount();
  if (!m) {
    if (why != nullptr)
      *why = "no cgroup mount offers the cpu controller (/proc/self/mountinfo)";
    return std::nullopt;
  }
  if (::access(m->dir.c_str(), W_OK) != 0) {
    if (why != nullptr) *why = m->dir + " is not writable: " + std::strerror(errno);
    return std::nullopt;
  }
  if (m->v2 && !has_word(read_text(m->dir + "/cgroup.subtree_control"), "cpu", ' ') &&
      !write_text(m->dir + "/cgroup.subtree_control", "+cpu", why))
    return std::nullopt;
  return m->dir;
}

std::string limit_cpu(pid_t pid, double cpus) {
  if (!std::isfinite(cpus) || cpus < min_cpus || cpus > max_cpus)
    throw usage_error("cpu limit: " + std::to_string(cpus) +
                      " cores is out of range: give a number of cores in [0.01, 1024]");
  std::string why;
  const auto root = cpu_cgroup_root(&why);
  if (!root)
    throw error("cpu limit: " + why +
                ": run as root on a host with cgroups, or leave the cpu limit out");
  const bool v2 = ::access((*root + "/cgroup.controllers").c_str(), F_OK) == 0;
  const std::string dir = *root + "/cohort-cpu-" + std::to_string(pid);
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
    throw error("cpu limit: cannot make " + dir + ": " + std::strerror(errno) +
                ": run as root, or leave the cpu limit out");
  const long quota = std::max(1000L, std::lround(cpus * period_us));
  const bool ok = v2 ? write_text(dir + "/cpu.max",
                                  std::to_string(quota) + " " + std::to_string(period_us), &why)
                     : write_text(dir + "/cpu.cfs_period_us", std::to_string(period_us), &why) &&
                           write_text(dir + "/cpu.cfs_quota_us", std::to_string(quota), &why);
  if (!ok || !write_text(dir + "/cgroup.procs", std::to_string(pid), &why)) {
    ::rmdir(dir.c_str());
    throw error("cpu limit: " + why + ": the kernel refused the limit for pid " +
                std::to_string(pid) + " (run as root, or leave the cpu limit out)");
  }
  return dir;
}

bool remove_cpu_limit(const std::string& dir) { return ::rmdir(dir.c_str()) == 0; }

void release_own_cpu_limit(const std::string& dir) {
  const auto slash = dir.rfind('/');
  if (slash == std::string::npos) return;
  write_text(dir.substr(0, slash) + "/cgroup.procs", std::to_string(::getpid()), nullptr);
  remove_cpu_limit(dir);
}

}  // namespace cohort::proc
