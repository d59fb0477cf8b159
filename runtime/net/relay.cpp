// Relayed peers' names and the agent's heartbeat table; see relay.hpp.
#include "runtime/net/relay.hpp"

#include <algorithm>

namespace cohort::net {
namespace {

constexpr char relay_mark = '\x1f';

}  // namespace

bool is_agent_name(std::string_view name) {
  constexpr std::string_view prefix = "agent-";
  return name.size() > prefix.size() && name.substr(0, prefix.size()) == prefix;
}

std::string relay_peer(std::string_view agent, std::string_view worker) {
  std::string out;
  out.reserve(2 + agent.size() + worker.size());
  out.push_back(relay_mark);
  out.push_back(static_cast<char>(static_cast<unsigned char>(std::min<size_t>(agent.size(), 255))));
  out.append(agent.substr(0, 255));
  out.append(worker);
  return out;
}

bool is_relay_peer(std::string_view peer) { return !peer.empty() && peer[0] == relay_mark; }

std::optional<std::pair<std::string_view, std::string_view>> split_relay_peer(
    std::string_view peer) {
  if (peer.size() < 2 || peer[0] != relay_mark) return std::nullopt;
  const size_t n = static_cast<unsigned char>(peer[1]);
  if (n == 0 || peer.size() < 2 + n + 1) return std::nullopt;
  return std::make_pair(peer.substr(2, n), peer.substr(2 + n));
}

bool relayed_by(std::string_view peer, std::string_view agent) {
  const auto p = split_relay_peer(peer);
  return p && p->first == agent;
}

bool is_relay_peer_of(std::string_view peer, std::string_view agent, std::string_view worker) {
  const auto p = split_relay_peer(peer);
  return p && agent.size() <= 255 && p->first == agent && p->second == worker;
}

relay_beats::relay_beats(std::chrono::milliseconds hung_after, std::size_t max_workers)
    : hung_after_(hung_after), max_(std::max<std::size_t>(1, max_workers)) {}

relay_beats::worker& relay_beats::slot(const std::string& id, mono now) {
  auto it = workers_.find(id);
  if (it == workers_.end()) {
    if (workers_.size() >= max_) {
      // Full (identities cost a peer nothing to make): the longest quiet one goes.
      auto oldest = std::min_element(workers_.begin(), workers_.end(), [](const auto& a, const auto& b) {
        return a.second.seen < b.second.seen;
      });
      workers_.erase(oldest);
    }
    it = workers_.emplace(id, worker{}).first;
  }
  it->second.seen = now;
  return it->second;
}

void relay_beats::on_register(const std::string& id, const register_request& r, mono now) {
  worker& w = slot(id, now);
  // A registration starts the worker over (a new member after a rejoin): its old beats and
  // any report of its silence belong to the member it was.
  w = worker{};
  w.name = r.name;
  w.pid = r.pid;
  w.seen = now;
}

void relay_beats::on_beat(const std::string& id, const heartbeat& hb, mono now) {
  worker& w = slot(id, now);
  w.beaten = true;
  w.reported = false;
  w.last = hb;
  w.last_at = now;
}

std::vector<relayed_beat> relay_beats::take(mono now) {
  std::vector<relayed_beat> out;
  for (auto& [id, w] : workers_) {
    if (!w.beaten || w.reported || now - w.last_at > hung_after_) continue;
    out.push_back(relayed_beat{id, w.last.member_id, w.last.generation, w.last.seq});
  }
  std::sort(out.begin(), out.end(),
            [](const relayed_beat& a, const relayed_beat& b) { return a.worker < b.worker; });
  return out;
}

std::vector<relay_beats::silent> relay_beats::hung(mono now) {
  std::vector<silent> out;
  for (auto& [id, w] : workers_) {
    if (!w.beaten || w.reported || w.pid <= 0 || w.name.empty()) continue;
    const auto quiet = std::chrono::duration_cast<std::chrono::milliseconds>(now - w.last_at);
    if (quiet <= hung_after_) continue;
    w.reported = true;
    out.push_back(silent{id, w.name, w.pid, quiet});
  }
  std::sort(out.begin(), out.end(),
            [](const silent& a, const silent& b) { return a.worker < b.worker; });
  return out;
}

void relay_beats::forget_name(const std::string& name) {
  for (auto it = workers_.begin(); it != workers_.end();) {
    if (it->second.name == name)
      it = workers_.erase(it);
    else
      ++it;
  }
}

}  // namespace cohort::net
