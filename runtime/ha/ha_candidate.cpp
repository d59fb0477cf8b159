// A coordinator candidate: standing by (answering registrations with the leader's address),
// campaigning, and the run's small records in etcd once it leads.
#include "runtime/ha/ha_candidate.hpp"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <thread>

#include "runtime/core/error.hpp"

namespace cohort::ha {

namespace {

using std::chrono::milliseconds;

int64_t realtime_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// The leader key's value: where it listens and which process it is.
std::string leader_value(const std::string& endpoint) {
  return nlohmann::json{{"endpoint", endpoint}, {"pid", static_cast<int64_t>(::getpid())}}.dump();
}

std::string endpoint_of(const std::string& value) {
  const auto j = nlohmann::json::parse(value, nullptr, false);
  return j.is_object() ? j.value("endpoint", std::string()) : std::string();
}

}  // namespace

ha_candidate::ha_candidate(ha_candidate_options o) : o_(std::move(o)) {
  if (o_.etcd.empty() || o_.name.empty())
    throw usage_error(
        "coordinator standbys need etcd endpoints and a run name (--ha-etcd, "
        "--ha-name)");
  if (!o_.record_key)
    throw usage_error(
        "coordinator standbys need the run's record key: --keys DIR (derived "
        "from coordinator.key) or --ha-record-key FILE");
  client_ = std::make_unique<ha::etcd_client>(o_.etcd, ha::etcd_timeouts{300, 1000}, o_.tls);
  wait_for_etcd();
  net::bridge_options bo;
  bo.kind = net::bridge_options::socket_kind::router;
  bo.endpoint = o_.bind;
  bo.max_message_bytes = o_.max_message_bytes;
  bo.curve_server = o_.keys;
  standby_ = std::make_unique<net::zmq_bridge>(
      bo, [this](const net::sender& from, net::message m) { answer(from.peer, m); });
  endpoint_ = standby_->endpoint();
  standby_out_ = standby_.get();
  // Renewed every fifth of the lease: a leader rides out a missed renewal or two.
  const int keepalive_ms = std::max(50, o_.ttl_s * 1000 / 5);
  election_ = std::make_unique<ha::leader_election>(
      *client_, key("leader"), o_.record_key->seal(key("leader"), leader_value(endpoint_)),
      o_.ttl_s, keepalive_ms);
  // Our presence, so the leader can list its standbys; it lapses with this process.
  presence_lease_ = client_->grant(std::max(2, o_.ttl_s));
  // Keyed by endpoint: a candidate restarted at its endpoint replaces its old record.
  put_sealed(key("candidates/" + endpoint_), endpoint_, presence_lease_);
  watcher_ = std::thread([this] { stand_by_loop(); });
}

void ha_candidate::wait_for_etcd() {
  // A coordinator (re)started while etcd is out of reach (its cluster electing, this host's
  // link just back and its first SYN lost) waits for it a while, as a worker waits for a
  // leader; then the grant below fails with the error that says what to check.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(etcd_patience_s);
  bool said = false;
  while (!client_->healthy() && std::chrono::steady_clock::now() < until) {
    if (!said)
      std::fprintf(stderr, "coordinator: etcd (%s) not reachable yet; waiting up to %d s\n",
                   o_.etcd.front().c_str(), etcd_patience_s);
    said = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

ha_candidate::~ha_candidate() {
  {
    // Under the lock the writer waits with: it cannot miss the wake-up.
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  events_cv_.notify_all();
  if (events_writer_.joinable()) events_writer_.join();
  if (watcher_.joinable()) watcher_.join();
  standby_out_ = nullptr;
  standby_.reset();
  try {
    if (presence_lease_ != 0) client_->revoke(presence_lease_);
  } catch (const std::exception&) {
    // etcd gone: the presence record lapses with its lease.
  }
}

void ha_candidate::put_sealed(const std::string& k, const std::string& value, int64_t lease) {
  client_->put(k, o_.record_key->seal(k, value), lease);
}

bool ha_candidate::fenced_sealed(const std::string& k, const std::string& value) {
  return election_->fenced_put(k, o_.record_key->seal(k, value));
}

std::optional<std::string> ha_candidate::opened(const ha::kv& kv) {
  auto o = o_.record_key->open(kv.key, kv.value);
  if (!o.value) refusals_.refuse("coordinator", kv.key, kv.mod_revision, o.problem);
  return std::move(o.value);
}

bool ha_candidate::done_recorded() {
  const auto d = client_->get(key("done"));
  if (!d) return false;
  const auto v = opened(*d);
  return v && *v == "1";
}

std::string ha_candidate::verified_leader(const std::optional<ha::leader_info>& leader) {
  if (!leader) return {};
  ha::kv kv;
  kv.key = key("leader");
  kv.value = leader->value;
  kv.mod_revision = leader->term;  // a leader record is written once, at its creation
  if (const auto v = opened(kv)) return endpoint_of(*v);
  // Not the run's: it names nobody, and it must not hold the election key either (a
  // stranger's key there would keep every candidate standing by). Deleted only if it is
  // still the record we read.
  client_->del_if_created_at(kv.key, leader->term);
  return {};
}

void ha_candidate::stand_by_loop() {
  int tick = 0;
  while (!stopping_.load()) {
    try {
      const auto leader = election_->observe();
      const std::string leader_endpoint = verified_leader(leader);
      const bool done = done_recorded();
      if (tick % 5 == 0) client_->keepalive(presence_lease_);
      std::vector<std::string> standbys;
      for (const auto& kv : client_->get_prefix(key("candidates/")))
        if (auto v = opened(kv)) standbys.push_back(std::move(*v));
      std::lock_guard<std::mutex> lock(mu_);
      leader_endpoint_ = leader_endpoint;
      leader_term_ = leader ? leader->term : 0;
      standbys_ = std::move(standbys);
      if (done) {
        done_ = true;
        quit_ = true;
      }
    } catch (const std::exception& e) {
      spdlog::warn("coordinator: etcd: {}", e.what());
    }
    ++tick;
    std::this_thread::sleep_for(milliseconds(100));
  }
}

void ha_candidate::answer(const std::string& peer, const net::message& m) {
  net::zmq_bridge* out = standby_out_.load();
  if (out == nullptr) return;
  std::string leader;
  int64_t term = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    leader = leader_endpoint_;
    term = leader_term_;
  }
  if (std::holds_alternative<net::register_request>(m)) {
    net::register_reject r(leader.empty() ? "a standby coordinator, and no leader yet"
                                          : "a standby coordinator: the leader is " + leader);
    r.standby = true;
    r.leader = leader;
    r.leader_term = static_cast<uint64_t>(term);
    out->reply(peer, r);
  }
}

bool ha_candidate::wait_for_leadership() {
  std::optional<int64_t> won;
  while (!quit_.load() && !won) {
    try {
      won = election_->campaign(quit_, 50);
    } catch (const std::exception& e) {
      spdlog::warn("coordinator: campaign: {}; trying again", e.what());
      std::this_thread::sleep_for(milliseconds(200));
    }
  }
  if (!won) return false;
  // A run that ended while we won needs no leader.
  if (done_recorded()) {
    done_ = true;
    election_->resign();
    return false;
  }
  leading_ = true;
  standby_out_ = nullptr;
  standby_.reset();  // the coordinator binds the endpoint next
  return true;
}

ha_run_record ha_candidate::read_run() {
  ha_run_record r;
  if (const auto job = client_->get(key("job"))) {
    const auto j = nlohmann::json::parse(opened(*job).value_or(""), nullptr, false);
    if (j.is_object() && j.contains("job_id") && j["job_id"].is_number_unsigned())
      r.job_id = j["job_id"].get<uint64_t>();
  }
  for (const auto& kv : client_->get_prefix(key("fired/"))) {
    const auto j = nlohmann::json::parse(opened(kv).value_or(""), nullptr, false);
    if (!j.is_object()) continue;
    r.fired.push_back(j.value("index", std::size_t{0}));
    const int64_t at = j.value("at_ns", int64_t{0});
    if (!r.fault_at_ns || at > *r.fault_at_ns) r.fault_at_ns = at;
  }
  for (const auto& kv : client_->get_prefix(key("events/"))) {
    const auto j = nlohmann::json::parse(opened(kv).value_or(""), nullptr, false);
    if (!j.is_array()) continue;
    for (const auto& e : j)
      if (e.is_object()) r.events.push_back(e);
  }
  for (const auto& kv : client_->get_prefix(key("worker_faults/"))) {
    const auto j = nlohmann::json::parse(opened(kv).value_or(""), nullptr, false);
    if (!j.is_object() || !j["index"].is_number_unsigned() || !j["step"].is_number_integer())
      continue;
    r.worker_faults.push_back({j["index"].get<std::size_t>(), j["step"].get<int64_t>()});
  }
  // Zero-padded keys: etcd lists them in the order the faults were added. A record that
  // does not open takes no place: the next fault added writes over it.
  for (const auto& kv : client_->get_prefix(key("added_faults/")))
    if (auto v = opened(kv)) r.added_faults.push_back(std::move(*v));
  added_faults_ = r.added_faults.size();
  if (const auto stop = client_->get(key("stop"))) r.stop = opened(*stop);
  return r;
}

bool ha_candidate::record_added_fault(const std::string& spec) {
  char place[24];
  std::snprintf(place, sizeof place, "%010zu", added_faults_);
  if (!fenced_sealed(key(std::string("added_faults/") + place), spec)) return false;
  ++added_faults_;
  return true;
}

bool ha_candidate::record_scale(const std::string& spec) {
  return fenced_sealed(key("scaled"), spec);
}

bool ha_candidate::record_stop(const std::string& by) { return fenced_sealed(key("stop"), by); }

void ha_candidate::clear_stop() {
  try {
    client_->del(key("stop"));
  } catch (const std::exception& e) {
    spdlog::warn("coordinator: cannot remove the run's stop record from etcd: {}", e.what());
  }
}

bool ha_candidate::record_worker_faults(const std::vector<faults::fault_fired>& fired) {
  for (const faults::fault_fired& f : fired) {
    std::string place = std::to_string(f.index);
    if (f.step >= 0) place += "@" + std::to_string(f.step);
    if (!fenced_sealed(key("worker_faults/" + place),
                       nlohmann::json{{"index", f.index}, {"step", f.step}}.dump()))
      return false;
  }
  return true;
}

bool ha_candidate::record_job(uint64_t job_id) {
  return fenced_sealed(key("job"), nlohmann::json{{"job_id", job_id}}.dump());
}

bool ha_candidate::record_fault(std::size_t index) {
  return fenced_sealed(key("fired/" + std::to_string(index)),
                       nlohmann::json{{"index", index}, {"at_ns", realtime_ns()}}.dump());
}

void ha_candidate::record_events(nlohmann::json job_events) {
  std::lock_guard<std::mutex> lock(mu_);
  job_events_ = std::move(job_events);
  publish_events();
}

void ha_candidate::record_failover(nlohmann::json event) {
  std::lock_guard<std::mutex> lock(mu_);
  failover_ = std::move(event);
  publish_events();
}

void ha_candidate::publish_events() {
  nlohmann::json all = job_events_;
  if (failover_) all.push_back(*failover_);
  std::string text = all.dump();
  if (text == events_written_) return;
  events_written_ = text;
  events_pending_ = std::move(text);
  if (!events_writer_.joinable()) {
    // Zero-padded: etcd lists keys in byte order, so the records come back in term order.
    char term[24];
    std::snprintf(term, sizeof term, "%020lld", static_cast<long long>(election_->term()));
    events_writer_ = std::thread([this, k = key(std::string("events/") + term)] {
      std::unique_lock<std::mutex> lock(mu_);
      while (!stopping_.load()) {
        events_cv_.wait(lock, [this] { return stopping_.load() || !events_pending_.empty(); });
        if (events_pending_.empty()) continue;
        std::string v;
        v.swap(events_pending_);
        lock.unlock();
        try {
          fenced_sealed(k, v);
        } catch (const std::exception& e) {
          spdlog::warn("coordinator: cannot record the run's events in etcd: {}", e.what());
        }
        lock.lock();
      }
    });
  }
  events_cv_.notify_all();
}

void ha_candidate::record_done() {
  try {
    fenced_sealed(key("done"), "1");
  } catch (const std::exception& e) {
    spdlog::warn("coordinator: cannot record the run's end in etcd: {}", e.what());
  }
}

std::string ha_candidate::status_json() const {
  std::lock_guard<std::mutex> lock(mu_);
  nlohmann::json j;
  if (leading_.load()) {
    j["leader"] = endpoint_;
    j["term"] = election_->term();
    j["pid"] = static_cast<int64_t>(::getpid());
  } else {
    j["leader"] = leader_endpoint_;
    j["term"] = leader_term_;
    j["pid"] = nullptr;
  }
  // Every candidate but the leader (the list may name the leader until the next refresh).
  const std::string leader = leading_.load() ? endpoint_ : leader_endpoint_;
  nlohmann::json standbys = nlohmann::json::array();
  for (const auto& e : standbys_)
    if (e != leader) standbys.push_back(e);
  j["standbys"] = standbys;
  return j.dump();
}

int64_t ha_now_realtime_ns() { return realtime_ns(); }

}  // namespace cohort::ha
