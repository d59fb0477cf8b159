// The coordinator's side of the rendezvous store: who may ask (live members only: the store
// holds the data plane's addresses), answering at once or parking a waiter, and answering
// waiters later. The store's decisions are runtime/net/kv_store's.
#include <chrono>
#include <functional>

#include "actors/coordinator_internal.hpp"

namespace cohort::actors::coord {
namespace {

using std::chrono::milliseconds;

// kv::status and net::kv_status share values; `pending` never reaches the wire.
net::kv_reply to_wire(uint64_t request_id, const net::kv::reply& r) {
  return net::kv_reply{request_id, static_cast<net::kv_status>(r.code), r.value, r.reason};
}

}  // namespace

uint64_t store_owner(const std::string& peer) { return std::hash<std::string>{}(peer) | 1; }

void answer_waiter(self_ptr self, const net::kv::reply& r) {
  auto& st = self->state;
  auto it = st.kv_waiters.find(r.id);
  if (it == st.kv_waiters.end()) return;
  send(self, it->second.peer, to_wire(it->second.request_id, r));
  st.kv_waiters.erase(it);
}

void on_kv(self_ptr self, const std::string& peer, const net::message& m) {
  auto& st = self->state;
  const auto* set = std::get_if<net::kv_set>(&m);
  const auto* get = std::get_if<net::kv_get>(&m);
  const auto* wait = std::get_if<net::kv_wait>(&m);
  if (set == nullptr && get == nullptr && wait == nullptr) return;
  const uint64_t request_id = set ? set->request_id : get ? get->request_id : wait->request_id;
  // Only a live member reads or writes (the store itself refuses generations the roster has
  // not reached). A member declared dead may still be building its last generation's links:
  // it gets the answer a dropped generation gets, and learns of its death from the next
  // heartbeat ack. A stranger is refused.
  const auto at = st.member_at.find(peer);
  if (at == st.member_at.end() || st.roster.find(at->second) == nullptr) {
    const bool was_member = at != st.member_at.end();
    if (!was_member) warn_peer(self, "a store request from a peer that is not a member is refused");
    send(self, peer,
         net::kv_reply{request_id,
                       was_member ? net::kv_status::superseded : net::kv_status::invalid, "",
                       was_member ? "this member is no longer in the roster"
                                  : "the rendezvous store answers live members only"});
    return;
  }
  if (set != nullptr) {
    net::kv::set_result r = st.store.set(set->generation, set->key, set->value);
    send(self, peer, to_wire(request_id, r.result));
    for (const auto& w : r.woken) answer_waiter(self, w);
    return;
  }
  const auto t = now(self);
  const uint64_t id = st.next_kv_id++;
  const net::kv::reply r =
      get == nullptr ? st.store.wait(id, wait->generation, wait->keys, t,
                                     t + milliseconds(wait->timeout_ms), store_owner(peer))
      : get->timeout_ms == 0
          ? st.store.get(get->generation, get->key)
          : st.store.get_or_wait(id, get->generation, get->key, t,
                                 t + milliseconds(get->timeout_ms), store_owner(peer));
  if (r.code == net::kv::status::pending) {
    st.kv_waiters[id] = coordinator_state::kv_waiter{peer, request_id};
  } else {
    send(self, peer, to_wire(request_id, r));
  }
}

}  // namespace cohort::actors::coord
