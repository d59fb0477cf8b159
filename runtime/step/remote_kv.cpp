#include "runtime/step/remote_kv.hpp"

#include <limits>
#include <utility>

#include "runtime/comm/comm_error.hpp"

namespace cohort::step {

namespace {

using comm::comm_error;
using comm::comm_failure;
using std::chrono::milliseconds;

// The wire carries timeouts as u32 milliseconds; a negative timeout means "now".
uint32_t wire_ms(milliseconds t) {
  if (t.count() <= 0) return 0;
  constexpr auto most = std::numeric_limits<uint32_t>::max();
  return t.count() >= static_cast<int64_t>(most) ? most : static_cast<uint32_t>(t.count());
}

// own + slack without overflowing milliseconds::max() (a caller may pass "forever").
milliseconds with_slack(milliseconds own, milliseconds slack) {
  if (own.count() < 0) own = milliseconds(0);
  if (own > milliseconds::max() - slack) return milliseconds::max();
  return own + slack;
}

std::string quoted_keys(const std::vector<std::string>& keys) {
  std::string out;
  for (size_t i = 0; i < keys.size() && i < 8; ++i) out += (i ? ", '" : "'") + keys[i] + "'";
  if (keys.size() > 8) out += ", ... (" + std::to_string(keys.size()) + " keys)";
  return out;
}

// Turns a reply that is not ok into the comm_error a communicator's builder expects.
[[noreturn]] void fail(const net::kv_reply& r, const std::string& op, uint64_t generation,
                       const std::string& timeout_hint) {
  const std::string reason = r.reason.empty() ? "no reason given" : r.reason;
  switch (r.status) {
    case net::kv_status::timeout:
      throw comm_error(comm_failure::timeout, op, reason + timeout_hint);
    case net::kv_status::not_found:
      // Only a get answered at once says not_found: for a rendezvous that is a key some
      // rank did not publish in time, the same thing as a timeout.
      throw comm_error(comm_failure::timeout, op, reason + timeout_hint);
    case net::kv_status::superseded:
      throw comm_error(
          comm_failure::rendezvous, op,
          "generation " + std::to_string(generation) +
              " was superseded: rebuild for the current generation (coordinator: " + reason + ")");
    case net::kv_status::invalid:
      throw comm_error(comm_failure::invalid, op, reason);
    case net::kv_status::ok:
      break;
  }
  throw comm_error(comm_failure::rendezvous, op,
                   "unexpected answer (status " + std::to_string(static_cast<int>(r.status)) +
                       ") from the coordinator: " + reason);
}

const char* const rank_hint =
    " (a rank did not arrive: check that every rank runs and uses the same generation)";

}  // namespace

remote_kv::remote_kv(call_fn call, std::uint64_t generation, milliseconds slack)
    : call_(std::move(call)), generation_(generation), slack_(slack) {
  COHORT_CHECK(call_ != nullptr);
  COHORT_CHECK(slack_.count() >= 0);
}

net::kv_reply remote_kv::call(net::message req, milliseconds own_timeout) const {
  return call_(std::move(req), with_slack(own_timeout, slack_));
}

void remote_kv::set(const std::string& key, const std::vector<char>& value) {
  const net::kv_reply r = call(
      net::kv_set{0, generation_, key, std::string(value.begin(), value.end())}, milliseconds(0));
  if (r.status == net::kv_status::ok) return;
  // The store answers a set at once, so a timeout here is a coordinator that never
  // answered: down, or the frame was too large for its control channel and dropped.
  fail(r, "rendezvous set '" + key + "'", generation_,
       " (is the coordinator running? a " + std::to_string(value.size()) +
           "-byte value in a frame over control.max_message_bytes is dropped unanswered)");
}

std::vector<char> remote_kv::get(const std::string& key, milliseconds timeout) {
  const net::kv_reply r = call(net::kv_get{0, generation_, key, wire_ms(timeout)}, timeout);
  if (r.status != net::kv_status::ok)
    fail(r, "rendezvous get '" + key + "'", generation_, rank_hint);
  return std::vector<char>(r.value.begin(), r.value.end());
}

void remote_kv::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  const net::kv_reply r = call(net::kv_wait{0, generation_, keys, wire_ms(timeout)}, timeout);
  if (r.status != net::kv_status::ok)
    fail(r, "rendezvous wait " + quoted_keys(keys), generation_, rank_hint);
}

}  // namespace cohort::step
