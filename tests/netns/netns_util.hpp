// Emulated hosts for tests/netns: a bed of network namespaces on a private bridge
// (tools/netns.sh), removed with everything still running in it when the test ends, and
// the shell helpers the cases share. Only for tests; nothing here is part of the runtime.
#pragma once
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/mp/mp_util.hpp"

namespace cohort::mp {

inline std::string netns_script() { return std::string(COHORT_SOURCE_DIR) + "/tools/netns.sh"; }

inline std::string ip_binary() {
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"})
    if (::access(p, X_OK) == 0) return p;
  return "ip";
}

// Runs SCRIPT ARGS; its exit code (stdout and stderr into *OUT when given).
inline int run_script(const std::string& args, std::string* out = nullptr) {
  return run_shell(netns_script() + " " + args + " 2>&1", out);
}

// Skips the case (exit 77, the reason on stdout) when this machine cannot make namespaces.
inline void require_netns() {
  std::string why;
  if (run_script("check", &why) == 0) return;
  std::printf("skipped: %s\n", why.c_str());
  std::fflush(stdout);
  std::_Exit(77);
}

// A bed of N emulated hosts, removed (with anything still running in it) on destruction.
class bed {
 public:
  explicit bed(int n, const std::string& shape = "") {
    static int count = 0;
    name_ = "cn" + std::to_string(::getpid()) + "-" + std::to_string(++count);
    std::string out;
    const int rc = run_script("up " + name_ + " " + std::to_string(n) + " " + shape, &out);
    REQUIRE_MESSAGE(rc == 0, out);
  }
  ~bed() { run_script("down " + name_); }
  bed(const bed&) = delete;
  bed& operator=(const bed&) = delete;

  /// Prefix that runs a child on host I.
  std::vector<std::string> on(int i) const {
    return {ip_binary(), "netns", "exec", name_ + "-h" + std::to_string(i)};
  }
  static std::string address(int i) { return "10.77.0." + std::to_string(i); }
  /// Cuts host I's cable, or cables it back.
  void link(int i, bool up) const {
    std::string out;
    REQUIRE_MESSAGE(
        run_script("link " + name_ + " " + std::to_string(i) + (up ? " up" : " down"), &out) == 0,
        out);
  }

 private:
  std::string name_;
};

}  // namespace cohort::mp
