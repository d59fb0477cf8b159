// Rendezvous store tests with an injected clock: waits are pending requests, no sleeps.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "runtime/net/kv_store.hpp"

namespace kv = cohort::net::kv;
using S = kv::status;

namespace {

const kv::mono_time t0{};
kv::mono_time at(int ms) { return t0 + std::chrono::milliseconds(ms); }

std::vector<kv::request_id> ids_of(const std::vector<kv::reply>& rs) {
  std::vector<kv::request_id> out;
  for (const auto& r : rs) out.push_back(r.id);
  return out;
}

}  // namespace

TEST_CASE("set then get - overwrite - missing key") {
  kv::store s;
  CHECK(s.get(1, "a").code == S::not_found);
  CHECK(s.get(1, "a").reason == "key 'a' is not set in generation 1");
  const auto r = s.set(1, "a", std::string("\x00\x01\xff", 3));
  CHECK(r.result.ok());
  CHECK(r.woken.empty());
  const auto g = s.get(1, "a");
  CHECK(g.ok());
  CHECK(g.value == std::string("\x00\x01\xff", 3));  // opaque bytes, NUL included
  CHECK(s.total_bytes() == 1 + 3);
  CHECK(s.set(1, "a", "xy").result.ok());
  CHECK(s.get(1, "a").value == "xy");
  CHECK(s.total_bytes() == 1 + 2);  // overwrite replaces, does not add
  CHECK(s.key_count() == 1);
}

TEST_CASE("wait is satisfied by a later set - several keys need all of them") {
  kv::store s;
  auto w = s.wait(7, 3, {"rank0", "rank1", "rank2"}, at(0), at(1000));
  CHECK(w.code == S::pending);
  CHECK(w.id == 7);
  auto g = s.get_or_wait(8, 3, "rank1", at(0), at(1000));
  CHECK(g.code == S::pending);
  CHECK(s.waiter_count() == 2);
  CHECK(s.next_deadline() == at(1000));

  auto r0 = s.set(3, "rank0", "A");
  CHECK(r0.woken.empty());  // 7 still needs rank1, rank2
  auto r1 = s.set(3, "rank1", "B");
  REQUIRE(r1.woken.size() == 1);  // only the get_or_wait
  CHECK(r1.woken[0].id == 8);
  CHECK(r1.woken[0].ok());
  CHECK(r1.woken[0].value == "B");
  auto other_gen = s.set(4, "rank2", "C");  // same key, other generation: not it
  CHECK(other_gen.woken.empty());
  auto r2 = s.set(3, "rank2", "C");
  REQUIRE(r2.woken.size() == 1);
  CHECK(r2.woken[0].id == 7);
  CHECK(r2.woken[0].ok());
  CHECK(r2.woken[0].value.empty());  // wait returns no values
  CHECK(s.waiter_count() == 0);
  CHECK(!s.next_deadline().has_value());
}

TEST_CASE("wait and get_or_wait answer at once when the keys are there") {
  kv::store s;
  s.set(1, "a", "1");
  s.set(1, "b", "2");
  CHECK(s.wait(1, 1, {"a", "b"}, at(0), at(10)).ok());
  const auto g = s.get_or_wait(2, 1, "b", at(0), at(10));
  CHECK(g.ok());
  CHECK(g.value == "2");
  CHECK(s.wait(3, 1, {}, at(0), at(10)).ok());  // nothing to wait for
  CHECK(s.waiter_count() == 0);
}

TEST_CASE("many waiters woken by one set come out in request-id order") {
  kv::store s;
  for (kv::request_id id : {30, 10, 20})
    CHECK(s.wait(id, 1, {"k"}, at(0), at(100)).code == S::pending);
  const auto r = s.set(1, "k", "v");
  CHECK(ids_of(r.woken) == std::vector<kv::request_id>{10, 20, 30});
}

TEST_CASE("deadline expiry with the injected clock, exactly at the deadline") {
  kv::store s;
  s.set(2, "have", "x");
  CHECK(s.wait(1, 2, {"have", "missing"}, at(0), at(500)).code == S::pending);
  CHECK(s.get_or_wait(2, 2, "later", at(100), at(300)).code == S::pending);
  CHECK(s.next_deadline() == at(300));
  CHECK(s.expire(at(299)).empty());
  auto e = s.expire(at(300));
  REQUIRE(e.size() == 1);
  CHECK(e[0].id == 2);
  CHECK(e[0].code == S::timeout);
  CHECK(e[0].reason == "timed out after 200 ms with 1 of 1 key(s) of generation 2 unset: 'later'");
  CHECK(s.next_deadline() == at(500));
  CHECK(s.expire(at(499)).empty());
  e = s.expire(at(501));
  REQUIRE(e.size() == 1);
  CHECK(e[0].id == 1);
  CHECK(e[0].reason ==
        "timed out after 501 ms with 1 of 2 key(s) of generation 2 unset: 'missing'");
  CHECK(s.waiter_count() == 0);
  // A set after the timeout wakes nobody: the waiter was answered already.
  CHECK(s.set(2, "missing", "y").woken.empty());
  // A deadline already past and keys absent: timeout at once, nothing registered.
  CHECK(s.wait(3, 2, {"nope"}, at(1000), at(1000)).code == S::timeout);
  CHECK(s.waiter_count() == 0);
}

TEST_CASE("generations are isolated namespaces") {
  kv::store s;
  s.set(1, "addr", "old");
  CHECK(s.get(2, "addr").code == S::not_found);
  s.set(2, "addr", "new");
  CHECK(s.get(1, "addr").value == "old");
  CHECK(s.get(2, "addr").value == "new");
  CHECK(s.wait(1, 3, {"addr"}, at(0), at(10)).code == S::pending);  // 3 has no addr
}

TEST_CASE("dropping old generations fails their waiters and refuses late messages") {
  kv::store s;
  s.set(1, "a", "1111");
  s.set(2, "a", "22");
  CHECK(s.wait(11, 1, {"b"}, at(0), at(100)).code == S::pending);
  CHECK(s.get_or_wait(12, 2, "b", at(0), at(100)).code == S::pending);
  CHECK(s.wait(13, 3, {"b"}, at(0), at(100)).code == S::pending);
  const auto dropped = s.drop_generations_below(3);
  CHECK(ids_of(dropped) == std::vector<kv::request_id>{11, 12});
  for (const auto& r : dropped) {
    CHECK(r.code == S::superseded);
    CHECK(r.reason.find("generation superseded") != std::string::npos);
  }
  CHECK(s.floor() == 3);
  CHECK(s.key_count() == 0);
  CHECK(s.total_bytes() == 0);
  CHECK(s.waiter_count() == 1);
  // A late set of generation 2 cannot wake or join generation 3.
  const auto late = s.set(2, "b", "x");
  CHECK(late.result.code == S::superseded);
  CHECK(late.woken.empty());
  CHECK(s.get(2, "a").code == S::superseded);
  CHECK(s.wait(14, 1, {"a"}, at(0), at(100)).code == S::superseded);
  CHECK(s.get_or_wait(15, 2, "a", at(0), at(100)).code == S::superseded);
  // Dropping again below an older floor changes nothing.
  CHECK(s.drop_generations_below(2).empty());
  CHECK(s.floor() == 3);
  const auto now3 = s.set(3, "b", "y");
  CHECK(ids_of(now3.woken) == std::vector<kv::request_id>{13});
}

TEST_CASE("limits give error values, never a crash, and leave the store unchanged") {
  kv::options o;
  o.max_key_bytes = 8;
  o.max_value_bytes = 16;
  o.max_total_bytes = 40;
  o.entry_overhead_bytes = 0;  // bytes of keys and values only (overhead: its own case)
  o.max_waiters = 2;
  o.max_keys_per_wait = 3;
  kv::store s(o);
  CHECK(s.set(1, "", "v").result.code == S::invalid);
  const auto long_key = s.set(1, "123456789", "v");
  CHECK(long_key.result.code == S::invalid);
  CHECK(long_key.result.reason == "key '123456789' is 9 bytes; the limit is 8");
  CHECK(s.set(1, "12345678", "v").result.ok());  // exactly at the key limit
  const auto big = s.set(1, "k", std::string(17, 'x'));
  CHECK(big.result.code == S::invalid);
  CHECK(big.result.reason == "value for 'k' is 17 bytes; the limit is 16");
  CHECK(s.set(1, "k", std::string(16, 'x')).result.ok());  // exactly at the value limit
  CHECK(s.total_bytes() == 9 + 17);
  // 26 held; 'j' + 14 bytes = 15 would make 41 > 40.
  const auto full = s.set(1, "j", std::string(14, 'x'));
  CHECK(full.result.code == S::invalid);
  CHECK(full.result.reason.find("store full") != std::string::npos);
  CHECK(s.set(1, "j", std::string(13, 'x')).result.ok());  // exactly 40
  CHECK(s.total_bytes() == 40);
  // An overwrite that would grow past the limit is refused and keeps the old value.
  CHECK(s.set(1, "j", std::string(14, 'y')).result.code == S::invalid);
  CHECK(s.get(1, "j").value == std::string(13, 'x'));
  // An overwrite of the same size fits; a smaller one frees the difference.
  CHECK(s.set(1, "k", std::string(16, 'y')).result.ok());
  CHECK(s.set(1, "k", "zz").result.ok());
  CHECK(s.total_bytes() == 40 - 14);
  CHECK(s.get(1, "k").value == "zz");
  CHECK(s.get(1, "123456789").code == S::invalid);
  CHECK(s.key_count() == 3);

  CHECK(s.wait(1, 1, {"a", "b", "c", "d"}, at(0), at(9)).code == S::invalid);  // 4 keys > 3
  CHECK(s.wait(2, 1, {"a", ""}, at(0), at(9)).code == S::invalid);
  CHECK(s.wait(3, 1, {"a"}, at(0), at(9)).code == S::pending);
  const auto dup = s.wait(3, 1, {"b"}, at(0), at(9));
  CHECK(dup.code == S::invalid);
  CHECK(dup.reason == "request id 3 is already waiting; ids must be unique");
  CHECK(s.get_or_wait(4, 1, "b", at(0), at(9)).code == S::pending);
  const auto many = s.wait(5, 1, {"c"}, at(0), at(9));
  CHECK(many.code == S::invalid);
  CHECK(many.reason == "too many pending waits (2); the limit is 2");
  CHECK(s.waiter_count() == 2);
}

TEST_CASE("pending keys share the byte budget and give it back however the wait ends") {
  kv::options o;
  o.max_total_bytes = 20;
  o.entry_overhead_bytes = 0;
  kv::store s(o);
  s.set(1, "key", "0123456");                                                // 10 bytes held
  CHECK(s.wait(1, 1, {"aaaa", "bbbb"}, at(0), at(100)).code == S::pending);  // +8
  CHECK(s.waiting_bytes() == 8);
  const auto over = s.wait(2, 1, {"ccc"}, at(0), at(100));  // 10 + 8 + 3 > 20
  CHECK(over.code == S::invalid);
  CHECK(over.reason ==
        "store full: a wait on 1 key(s) (3 bytes) would exceed the limit of 20 bytes");
  CHECK(s.set(1, "xyz", "").result.code == S::invalid);                // 10 + 8 + 3 > 20: sets too
  CHECK(s.get_or_wait(3, 1, "cc", at(0), at(50)).code == S::pending);  // exactly 20
  CHECK(s.waiting_bytes() == 10);
  CHECK(s.expire(at(50)).size() == 1);  // frees "cc"
  CHECK(s.waiting_bytes() == 8);
  CHECK(s.cancel(1));
  CHECK(s.waiting_bytes() == 0);
  CHECK(s.wait(4, 2, {"dd"}, at(0), at(100)).code == S::pending);
  CHECK(s.set(2, "dd", "").woken.size() == 1);  // completion frees it
  CHECK(s.wait(5, 2, {"ee"}, at(0), at(100)).code == S::pending);
  CHECK(s.drop_generations_below(3).size() == 1);  // so does a drop
  CHECK(s.waiting_bytes() == 0);
  CHECK(s.total_bytes() == 0);
}

TEST_CASE("cancel forgets a waiter without an answer") {
  kv::store s;
  CHECK(s.wait(1, 1, {"k"}, at(0), at(50)).code == S::pending);
  CHECK(s.cancel(1));
  CHECK(!s.cancel(1));
  CHECK(s.set(1, "k", "v").woken.empty());
  CHECK(s.expire(at(100)).empty());
  // The id is free again.
  CHECK(s.wait(1, 1, {"q"}, at(0), at(50)).code == S::pending);
}

TEST_CASE("gloo-style rendezvous of 4 ranks: each sets its address, then waits for all") {
  // Every rank publishes "rank<r>" = address and waits for the other ranks; each wait must
  // complete exactly once, on the set of the last key it lacked.
  kv::store s;
  const int n = 4;
  std::vector<int> completed_at(n, -1);
  for (int r = 0; r < n; ++r) {
    auto set = s.set(5, "rank" + std::to_string(r), "10.0.0." + std::to_string(r));
    REQUIRE(set.result.ok());
    for (const auto& w : set.woken) {
      CHECK(completed_at[w.id] == -1);
      completed_at[w.id] = r;
    }
    std::vector<std::string> keys;
    for (int q = 0; q < n; ++q) keys.push_back("rank" + std::to_string(q));
    auto w = s.wait(static_cast<kv::request_id>(r), 5, keys, at(r), at(1000));
    if (w.ok())
      completed_at[r] = r;
    else
      CHECK(w.code == S::pending);
  }
  // Ranks 0..2 wait until rank 3's set; rank 3 finds everything at once.
  CHECK(completed_at == std::vector<int>{3, 3, 3, 3});
  for (int r = 0; r < n; ++r)
    CHECK(s.get(5, "rank" + std::to_string(r)).value == "10.0.0." + std::to_string(r));
}

TEST_CASE("the budget counts each entry's and each wait's overhead, not only its bytes") {
  kv::options o;
  o.max_total_bytes = 1000;
  o.entry_overhead_bytes = 100;
  kv::store s(o);
  // One-byte keys with empty values: 1 + 100 each, so nine fit and the tenth does not.
  for (int i = 0; i < 9; ++i) CHECK(s.set(1, std::string(1, char('a' + i)), "").result.ok());
  CHECK(s.charged_bytes() == 9 * 101);
  const auto full = s.set(1, "z", "");
  CHECK(full.result.code == S::invalid);
  CHECK(full.result.reason ==
        "store full: setting 'z' would hold 1010 bytes; the limit is 1000 (old generations not "
        "dropped?)");
  CHECK(s.set(1, "a", "").result.ok());  // an overwrite adds no entry
  // A wait is charged for itself and each key it names: 1 + 100 * 2 > 1000 - 909.
  CHECK(s.wait(1, 1, {"q"}, at(0), at(10)).code == S::invalid);
  CHECK(s.drop_generations_below(2).empty());  // frees entries and their overhead
  CHECK(s.charged_bytes() == 0);
  CHECK(s.wait(2, 2, {"q"}, at(0), at(10)).code == S::pending);
  CHECK(s.charged_bytes() == 1 + 200);
  CHECK(s.cancel(2));
  CHECK(s.charged_bytes() == 0);
}

TEST_CASE("generations beyond the roster's are refused, the ceiling never goes down") {
  kv::store s;
  CHECK(s.set(99, "a", "x").result.ok());  // no roster yet: every generation accepted
  s.set_ceiling(3);
  const auto ahead = s.set(4, "a", "x");
  CHECK(ahead.result.code == S::invalid);
  CHECK(ahead.result.reason == "generation 4 does not exist yet (the roster is at 3)");
  CHECK(s.wait(1, 4, {"a"}, at(0), at(10)).code == S::invalid);
  CHECK(s.get_or_wait(2, (1ull << 63), "a", at(0), at(10)).code == S::invalid);
  CHECK(s.get(4, "a").code == S::invalid);
  CHECK(s.set(3, "a", "x").result.ok());
  s.set_ceiling(2);  // ignored: rosters only grow
  CHECK(s.set(3, "b", "x").result.ok());
  s.set_ceiling(4);
  CHECK(s.set(4, "a", "x").result.ok());
  CHECK(s.waiter_count() == 0);
}

TEST_CASE("waits are bounded in length and per peer, and go when their peer goes") {
  kv::options o;
  o.max_wait = std::chrono::milliseconds(1000);
  o.max_waiters_per_owner = 2;
  kv::store s(o);
  const auto long_wait = s.wait(1, 1, {"a"}, at(0), at(1001));
  CHECK(long_wait.code == S::invalid);
  CHECK(long_wait.reason == "a wait of 1001 ms; the longest the store accepts is 1000 ms");
  CHECK(s.wait(2, 1, {"a"}, at(0), at(1000), 7).code == S::pending);  // exactly the limit
  CHECK(s.get_or_wait(3, 1, "b", at(0), at(10), 7).code == S::pending);
  const auto third = s.wait(4, 1, {"c"}, at(0), at(10), 7);
  CHECK(third.code == S::invalid);
  CHECK(third.reason == "this peer already has 2 pending waits; the limit is 2");
  CHECK(s.wait(5, 1, {"c"}, at(0), at(10), 8).code == S::pending);  // another peer
  CHECK(s.wait(6, 1, {"c"}, at(0), at(10)).code == S::pending);     // owner 0: no cap
  // Peer 7 leaves: its waits are forgotten (nobody to answer), the others stay.
  CHECK(s.cancel_owner(7) == std::vector<kv::request_id>{2, 3});
  CHECK(s.waiter_count() == 2);
  CHECK(s.cancel_owner(7).empty());
  CHECK(s.cancel_owner(0).empty());  // 0 is nobody
  CHECK(s.wait(7, 1, {"d"}, at(0), at(10), 7).code == S::pending);  // its quota is back
  // A completed or expired wait gives its slot back too.
  CHECK(s.wait(8, 1, {"e"}, at(0), at(10), 7).code == S::pending);
  CHECK(s.set(1, "d", "").woken.size() == 1);
  CHECK(s.wait(9, 1, {"f"}, at(0), at(10), 7).code == S::pending);
}
