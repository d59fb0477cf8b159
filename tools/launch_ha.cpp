// The etcd side of `cohort launch` with coordinator standbys.
#include "tools/launch_ha.hpp"

#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "runtime/core/process.hpp"
#include "runtime/core/error.hpp"
#include "runtime/net/curve.hpp"

namespace cohort::cli {

launch_ha::launch_ha(const config& cfg, const std::string& keys_dir) {
  std::random_device rd;
  char tag[16];
  std::snprintf(tag, sizeof tag, "%08x", rd());
  name_ = "launch-" + std::to_string(::getpid()) + "-" + tag;
  dir_ = proc::private_run_dir("cohort-etcd");
  try {
    start(cfg, keys_dir);
  } catch (...) {
    etcd_.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);  // no half-made private folder left behind
    throw;
  }
}

void launch_ha::start(const config& cfg, const std::string& keys_dir) {
  ha::etcd_tls tls;
  if (!cfg.ha.etcd_local) {
    urls_ = cfg.ha.etcd_endpoints;
    const bool https = std::any_of(urls_.begin(), urls_.end(), [](const std::string& u) {
      return u.rfind("https://", 0) == 0;
    });
    if (https && keys_dir.empty())
      throw usage_error(
          "ha.etcd names https endpoints: launch reads etcd's CA and its client "
          "certificate from the job's key folder; pass --keys DIR holding "
          "etcd-ca.crt, etcd-client.crt and etcd-client.key");
    if (https) tls = ha::etcd_tls_in(keys_dir);
  } else {
    ha::local_etcd_options eo;
    eo.dir = dir_;
    eo.heartbeat_ms = cfg.ha.etcd_heartbeat_ms;
    eo.election_ms = cfg.ha.etcd_election_ms;
    etcd_ = std::make_unique<ha::local_etcd>(eo);
    urls_ = {etcd_->endpoint()};
    tls = etcd_->client_tls();
    tls_dir_ = dir_;
    std::printf("launch: etcd for the run at %s (data in %s, removed at exit)\n", urls_[0].c_str(),
                dir_.c_str());
  }
  if (!keys_dir.empty()) {
    record_key_ = std::make_unique<ha::record_key>(
        ha::record_key::from_coordinator_secret(net::load_server_keys(keys_dir).self.secret_key));
  } else {
    record_key_file_ = dir_ + "/etcd-record.key";
    ha::record_key::write_new(record_key_file_);
    record_key_ = std::make_unique<ha::record_key>(ha::record_key::load(record_key_file_));
  }
  client_ = std::make_unique<ha::etcd_client>(urls_, ha::etcd_timeouts{300, 1000}, tls);
  watch_ = std::make_unique<ha::leader_election>(*client_, "/cohort/" + name_ + "/leader", "",
                                                 std::max(1, cfg.ha.lease_ttl_s), 100);
}

std::vector<std::string> launch_ha::coordinator_args() const {
  std::string urls;
  for (const auto& u : urls_) urls += (urls.empty() ? "" : ",") + u;
  std::vector<std::string> args{"--ha-etcd", urls, "--ha-name", name_};
  if (!tls_dir_.empty()) args.insert(args.end(), {"--ha-tls", tls_dir_});
  if (!record_key_file_.empty()) args.insert(args.end(), {"--ha-record-key", record_key_file_});
  return args;
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
    // Only the run's own record names a leader (the candidates delete any other).
    const std::string key = "/cohort/" + name_ + "/leader";
    const auto o = record_key_->open(key, l->value);
    if (!o.value) {
      refusals_.refuse("launch", key, l->term, o.problem);
      return std::nullopt;
    }
    const auto j = nlohmann::json::parse(*o.value, nullptr, false);
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
