// The etcd side of `cohort launch` with coordinator standbys.
#include "tools/launch_ha.hpp"

#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "actors/process.hpp"
#include "runtime/core/error.hpp"

namespace cohort::cli {

launch_ha::launch_ha(const config& cfg) {
  std::random_device rd;
  char tag[16];
  std::snprintf(tag, sizeof tag, "%08x", rd());
  name_ = "launch-" + std::to_string(::getpid()) + "-" + tag;
  if (!cfg.ha.etcd_local) {
    urls_ = cfg.ha.etcd_endpoints;
  } else {
    dir_ = actors::private_run_dir("cohort-etcd");
    ha::local_etcd_options eo;
    eo.dir = dir_;
    eo.heartbeat_ms = cfg.ha.etcd_heartbeat_ms;
    eo.election_ms = cfg.ha.etcd_election_ms;
    etcd_ = std::make_unique<ha::local_etcd>(eo);
    urls_ = {etcd_->endpoint()};
    std::printf("launch: etcd for the run at %s (data in %s, removed at exit)\n", urls_[0].c_str(),
                dir_.c_str());
  }
  client_ = std::make_unique<ha::etcd_client>(urls_, ha::etcd_timeouts{300, 1000});
  watch_ = std::make_unique<ha::leader_election>(*client_, "/cohort/" + name_ + "/leader", "",
                                                 std::max(1, cfg.ha.lease_ttl_s), 100);
}

launch_ha::~launch_ha() {
  watch_.reset();
  client_.reset();
  if (etcd_) {
    etcd_->stop();
    etcd_.reset();
  }
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

std::string launch_ha::free_endpoint() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (fd >= 0) ::close(fd);
    throw io_error("launch: no free port on 127.0.0.1 for a standby coordinator");
  }
  ::close(fd);
  return "tcp://127.0.0.1:" + std::to_string(ntohs(a.sin_port));
}

std::optional<launch_ha::leader> launch_ha::leader_now() {
  try {
    const auto l = watch_->observe();
    if (!l) return std::nullopt;
    const auto j = nlohmann::json::parse(l->value, nullptr, false);
    if (!j.is_object()) return std::nullopt;
    return leader{j.value("endpoint", std::string()), j.value("pid", int64_t{0}), l->term};
  } catch (const std::exception& e) {
    spdlog::warn("launch: etcd: {}", e.what());
    return std::nullopt;
  }
}

std::optional<int64_t> launch_ha::depose_if_leader(pid_t pid) {
  const auto l = leader_now();
  if (!l || l->pid != static_cast<int64_t>(pid)) return std::nullopt;
  try {
    if (watch_->depose(l->term)) return l->term;
  } catch (const std::exception& e) {
    spdlog::warn("launch: etcd: {}", e.what());
  }
  return std::nullopt;
}

}  // namespace cohort::cli
