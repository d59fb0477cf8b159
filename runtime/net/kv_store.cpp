// Rendezvous store logic; see kv_store.hpp.
#include "runtime/net/kv_store.hpp"

#include <algorithm>

namespace cohort::net::kv {

namespace {

reply fail(request_id id, status code, std::string reason) {
  reply r;
  r.id = id;
  r.code = code;
  r.reason = std::move(reason);
  return r;
}

std::string quoted(const std::string& key) {
  // Keys are opaque bytes; clip long ones so a reason stays one readable line.
  constexpr std::size_t shown = 64;
  if (key.size() <= shown) return "'" + key + "'";
  return "'" + key.substr(0, shown) + "...' (" + std::to_string(key.size()) + " bytes)";
}

std::int64_t ms_between(mono_time from, mono_time to) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(to - from).count();
}

}  // namespace

const char* to_string(status s) {
  switch (s) {
    case status::ok:
      return "ok";
    case status::pending:
      return "pending";
    case status::not_found:
      return "not_found";
    case status::timeout:
      return "timeout";
    case status::superseded:
      return "superseded";
    case status::invalid:
      return "invalid";
  }
  return "unknown";
}

store::store(options opts) : opts_(opts) {}

void store::set_ceiling(generation_t g) {
  if (ceiling_ == ~generation_t{0} || g > ceiling_) ceiling_ = g;
}

reply store::check_generation(generation_t g) const {
  if (g > ceiling_)
    return fail(0, status::invalid,
                "generation " + std::to_string(g) + " does not exist yet (the roster is at " +
                    std::to_string(ceiling_) + ")");
  if (g < floor_)
    return fail(0, status::superseded,
                "generation " + std::to_string(g) + " was superseded (the store serves " +
                    std::to_string(floor_) + " and later): rebuild for the current generation");
  return reply{};
}

// Validates a (generation, key) pair; ok means usable.
reply store::check(generation_t g, const std::string& key) const {
  reply r = check_generation(g);
  if (!r.ok()) return r;
  if (key.empty()) return fail(0, status::invalid, "empty key");
  if (key.size() > opts_.max_key_bytes)
    return fail(0, status::invalid,
                "key " + quoted(key) + " is " + std::to_string(key.size()) +
                    " bytes; the limit is " + std::to_string(opts_.max_key_bytes));
  return r;
}

set_result store::set(generation_t g, const std::string& key, std::string value) {
  set_result out;
  out.result = check(g, key);
  if (!out.result.ok()) return out;
  if (value.size() > opts_.max_value_bytes) {
    out.result = fail(0, status::invalid,
                      "value for " + quoted(key) + " is " + std::to_string(value.size()) +
                          " bytes; the limit is " + std::to_string(opts_.max_value_bytes));
    return out;
  }
  full_key fk{g, key};
  auto it = entries_.find(fk);
  const std::size_t old_bytes = it == entries_.end() ? 0 : key.size() + it->second.size();
  const std::size_t new_total = total_bytes_ - old_bytes + key.size() + value.size();
  const std::size_t new_overhead =
      overhead_bytes_ + (it == entries_.end() ? opts_.entry_overhead_bytes : 0);
  if (new_total + waiting_bytes_ + new_overhead > opts_.max_total_bytes) {
    out.result =
        fail(0, status::invalid,
             "store full: setting " + quoted(key) + " would hold " +
                 std::to_string(new_total + waiting_bytes_ + new_overhead) +
                 " bytes; the limit is " + std::to_string(opts_.max_total_bytes) +
                 " (old generations not dropped?)");
    return out;
  }
  total_bytes_ = new_total;
  overhead_bytes_ = new_overhead;
  if (it == entries_.end()) {
    entries_.emplace(std::move(fk), std::move(value));
  } else {
    it->second = std::move(value);
  }
  for (auto w = waiters_.begin(); w != waiters_.end();) {
    const bool concerned =
        w->second.gen == g &&
        std::find(w->second.keys.begin(), w->second.keys.end(), key) != w->second.keys.end();
    if (concerned && ready(w->second)) {
      out.woken.push_back(complete(w->first, w->second));
      w = erase_waiter(w);
    } else {
      ++w;
    }
  }
  return out;
}

reply store::get(generation_t g, const std::string& key) const {
  reply r = check(g, key);
  if (!r.ok()) return r;
  auto it = entries_.find(full_key{g, key});
  if (it == entries_.end())
    return fail(0, status::not_found,
                "key " + quoted(key) + " is not set in generation " + std::to_string(g));
  r.value = it->second;
  return r;
}

bool store::ready(const waiter& w) const {
  return std::all_of(w.keys.begin(), w.keys.end(), [&](const std::string& k) {
    return entries_.count(full_key{w.gen, k}) != 0;
  });
}

reply store::complete(request_id id, const waiter& w) const {
  reply r;
  r.id = id;
  if (w.want_value) r.value = entries_.at(full_key{w.gen, w.keys.front()});
  return r;
}

reply store::add_waiter(request_id id, waiter w, mono_time now) {
  // Order matters: a caller bug (duplicate id) or a dead generation is reported before
  // anything that depends on the store's contents.
  if (waiters_.count(id) != 0)
    return fail(id, status::invalid,
                "request id " + std::to_string(id) + " is already waiting; ids must be unique");
  reply r = check_generation(w.gen);
  if (!r.ok()) {
    r.id = id;
    return r;
  }
  if (w.keys.size() > opts_.max_keys_per_wait)
    return fail(id, status::invalid,
                "wait on " + std::to_string(w.keys.size()) + " keys; the limit is " +
                    std::to_string(opts_.max_keys_per_wait));
  for (const auto& k : w.keys) {
    r = check(w.gen, k);
    if (!r.ok()) {
      r.id = id;
      return r;
    }
  }
  if (ready(w)) return complete(id, w);
  if (w.deadline <= now)
    return fail(id, status::timeout,
                "deadline already passed for keys of generation " + std::to_string(w.gen));
  if (w.deadline - now > opts_.max_wait)
    return fail(id, status::invalid,
                "a wait of " + std::to_string(ms_between(now, w.deadline)) +
                    " ms; the longest the store accepts is " +
                    std::to_string(opts_.max_wait.count()) + " ms");
  if (waiters_.size() >= opts_.max_waiters)
    return fail(id, status::invalid,
                "too many pending waits (" + std::to_string(waiters_.size()) + "); the limit is " +
                    std::to_string(opts_.max_waiters));
  if (w.owner != 0 && waiters_of_[w.owner] >= opts_.max_waiters_per_owner)
    return fail(id, status::invalid,
                "this peer already has " + std::to_string(waiters_of_[w.owner]) +
                    " pending waits; the limit is " +
                    std::to_string(opts_.max_waiters_per_owner));
  // Pending keys hold memory too, so they count against the same byte budget as entries.
  for (const auto& k : w.keys) w.bytes += k.size();
  w.overhead = opts_.entry_overhead_bytes * (1 + w.keys.size());
  if (charged_bytes() + w.bytes + w.overhead > opts_.max_total_bytes)
    return fail(id, status::invalid,
                "store full: a wait on " + std::to_string(w.keys.size()) + " key(s) (" +
                    std::to_string(w.bytes + w.overhead) + " bytes) would exceed the limit of " +
                    std::to_string(opts_.max_total_bytes) + " bytes");
  w.since = now;
  waiting_bytes_ += w.bytes;
  overhead_bytes_ += w.overhead;
  if (w.owner != 0) ++waiters_of_[w.owner];
  waiters_.emplace(id, std::move(w));
  if (opts_.on_pending) opts_.on_pending();
  return fail(id, status::pending, "");
}

reply store::wait(request_id id, generation_t g, std::vector<std::string> keys, mono_time now,
                  mono_time deadline, std::uint64_t owner) {
  waiter w;
  w.owner = owner;
  w.gen = g;
  w.keys = std::move(keys);
  w.deadline = deadline;
  return add_waiter(id, std::move(w), now);
}

reply store::get_or_wait(request_id id, generation_t g, const std::string& key, mono_time now,
                         mono_time deadline, std::uint64_t owner) {
  waiter w;
  w.owner = owner;
  w.gen = g;
  w.keys = {key};
  w.want_value = true;
  w.deadline = deadline;
  return add_waiter(id, std::move(w), now);
}

std::vector<reply> store::expire(mono_time now) {
  std::vector<reply> out;
  for (auto w = waiters_.begin(); w != waiters_.end();) {
    if (w->second.deadline > now) {
      ++w;
      continue;
    }
    std::string missing;
    std::size_t n_missing = 0;
    for (const auto& k : w->second.keys) {
      if (entries_.count(full_key{w->second.gen, k}) != 0) continue;
      ++n_missing;
      if (n_missing <= 8) missing += (missing.empty() ? "" : ", ") + quoted(k);
    }
    if (n_missing > 8) missing += ", ...";
    out.push_back(fail(w->first, status::timeout,
                       "timed out after " + std::to_string(ms_between(w->second.since, now)) +
                           " ms with " + std::to_string(n_missing) + " of " +
                           std::to_string(w->second.keys.size()) + " key(s) of generation " +
                           std::to_string(w->second.gen) + " unset: " + missing));
    w = erase_waiter(w);
  }
  return out;
}

std::vector<reply> store::drop_generations_below(generation_t g) {
  std::vector<reply> out;
  if (g <= floor_) return out;
  floor_ = g;
  for (auto it = entries_.begin(); it != entries_.end() && it->first.first < g;) {
    total_bytes_ -= it->first.second.size() + it->second.size();
    overhead_bytes_ -= opts_.entry_overhead_bytes;
    it = entries_.erase(it);
  }
  for (auto w = waiters_.begin(); w != waiters_.end();) {
    if (w->second.gen >= g) {
      ++w;
      continue;
    }
    out.push_back(fail(w->first, status::superseded,
                       "generation superseded: waited in generation " +
                           std::to_string(w->second.gen) + ", the roster moved to " +
                           std::to_string(g) + "; rebuild for the current generation"));
    w = erase_waiter(w);
  }
  return out;
}

bool store::cancel(request_id id) {
  auto it = waiters_.find(id);
  if (it == waiters_.end()) return false;
  erase_waiter(it);
  return true;
}

std::vector<request_id> store::cancel_owner(std::uint64_t owner) {
  std::vector<request_id> out;
  if (owner == 0) return out;
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (it->second.owner == owner) {
      out.push_back(it->first);
      it = erase_waiter(it);
    } else {
      ++it;
    }
  }
  return out;
}

std::map<request_id, store::waiter>::iterator store::erase_waiter(
    std::map<request_id, waiter>::iterator it) {
  waiting_bytes_ -= it->second.bytes;
  overhead_bytes_ -= it->second.overhead;
  if (it->second.owner != 0) {
    auto o = waiters_of_.find(it->second.owner);
    if (--o->second == 0) waiters_of_.erase(o);
  }
  return waiters_.erase(it);
}

std::optional<mono_time> store::next_deadline() const {
  std::optional<mono_time> first;
  for (const auto& [id, w] : waiters_)
    if (!first || w.deadline < *first) first = w.deadline;
  return first;
}

}  // namespace cohort::net::kv
