// Byte layout of the protocol: fixed-width little-endian integers, u32-length-prefixed
// strings and vectors, structs as their fields in declaration order (protocol.hpp's
// `fields`). The reader checks every length against the bytes left before using it, so a
// hostile length can neither read out of bounds nor make us allocate more than the frame.
#include "runtime/net/codec.hpp"

#include <cstring>
#include <new>
#include <utility>

namespace cohort::net {
namespace {

// Enum ranges: a value outside them is a bad frame, not something to carry along.
bool valid(peer_role v) { return static_cast<uint8_t>(v) <= 1; }
bool valid(member_state v) { return static_cast<uint8_t>(v) <= 3; }
bool valid(fault_action v) { return static_cast<uint8_t>(v) <= 3; }
bool valid(kv_status v) {
  const auto u = static_cast<uint8_t>(v);
  return u == 0 || (u >= 2 && u <= 5);
}

class writer {
 public:
  explicit writer(std::string* out) : out_(out) {}

  template <class T>
  std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>> put(T v) {
    using U = std::make_unsigned_t<T>;
    U u;
    std::memcpy(&u, &v, sizeof u);
    for (size_t i = 0; i < sizeof(U); ++i)
      out_->push_back(static_cast<char>((u >> (8 * i)) & 0xff));
  }
  void put(bool b) { put<uint8_t>(b ? 1 : 0); }
  // IEEE-754 bits, little-endian like every integer.
  void put(double d) {
    uint64_t u;
    std::memcpy(&u, &d, sizeof u);
    put(u);
  }
  template <class E>
  std::enable_if_t<std::is_enum_v<E>> put(E e) {
    put(static_cast<std::underlying_type_t<E>>(e));
  }
  void put(const std::string& s) {
    put(static_cast<uint32_t>(s.size()));
    out_->append(s);
  }
  template <class T>
  void put(const std::vector<T>& v) {
    put(static_cast<uint32_t>(v.size()));
    for (const auto& x : v) put(x);
  }
  template <class T>
  std::enable_if_t<detail::has_fields<T>::value> put(const T& x) {
    std::apply([&](const auto&... f) { (put(f), ...); }, T::fields(x));
  }

 private:
  std::string* out_;
};

class reader {
 public:
  reader(const unsigned char* p, size_t n) : p_(p), end_(p + n) {}

  decode_error error() const { return error_; }
  size_t remaining() const { return static_cast<size_t>(end_ - p_); }

  template <class T>
  std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, bool> get(T& v) {
    using U = std::make_unsigned_t<T>;
    if (remaining() < sizeof(U)) return fail(decode_error::truncated);
    U u = 0;
    for (size_t i = 0; i < sizeof(U); ++i) u |= static_cast<U>(static_cast<U>(p_[i]) << (8 * i));
    p_ += sizeof(U);
    std::memcpy(&v, &u, sizeof v);
    return true;
  }
  bool get(double& d) {
    uint64_t u = 0;
    if (!get(u)) return false;
    std::memcpy(&d, &u, sizeof d);
    return true;
  }
  bool get(bool& b) {
    uint8_t v = 0;
    if (!get(v)) return false;
    if (v > 1) return fail(decode_error::bad_value);
    b = v == 1;
    return true;
  }
  template <class E>
  std::enable_if_t<std::is_enum_v<E>, bool> get(E& e) {
    std::underlying_type_t<E> v{};
    if (!get(v)) return false;
    e = static_cast<E>(v);
    return valid(e) ? true : fail(decode_error::bad_value);
  }
  bool get(std::string& s) {
    uint32_t n = 0;
    if (!get(n)) return false;
    if (n > remaining()) return fail(decode_error::truncated);
    s.assign(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    return true;
  }
  template <class T>
  bool get(std::vector<T>& v) {
    uint32_t n = 0;
    if (!get(n)) return false;
    // Every element takes at least one byte, so a count above the bytes left is a lie.
    // Elements are appended as they decode (no reserve(n)): memory follows real bytes.
    if (n > remaining()) return fail(decode_error::truncated);
    v.clear();
    for (uint32_t i = 0; i < n; ++i) {
      T x{};
      if (!get(x)) return false;
      v.push_back(std::move(x));
    }
    return true;
  }
  template <class T>
  std::enable_if_t<detail::has_fields<T>::value, bool> get(T& x) {
    return std::apply([&](auto&... f) { return (get(f) && ...); }, T::fields(x));
  }

 private:
  bool fail(decode_error e) {
    if (error_ == decode_error::none) error_ = e;
    return false;
  }
  const unsigned char* p_;
  const unsigned char* end_;
  decode_error error_ = decode_error::none;
};

uint16_t load_u16(const unsigned char* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t load_u32(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}
uint64_t load_u64(const unsigned char* p) {
  return static_cast<uint64_t>(load_u32(p)) | (static_cast<uint64_t>(load_u32(p + 4)) << 32);
}

// Decodes the payload as the variant alternative whose wire id is T; tries alternatives
// in order, so adding a message to `message` is all it takes to make it decodable.
template <size_t I = 0>
decoded decode_payload(msg_type t, reader& r) {
  if constexpr (I == std::variant_size_v<message>) {
    return decoded{decode_error::unknown_type, {}};
  } else {
    using T = std::variant_alternative_t<I, message>;
    if (T::type != t) return decode_payload<I + 1>(t, r);
    T x{};
    if (!r.get(x)) return decoded{r.error(), {}};
    if (r.remaining() != 0) return decoded{decode_error::trailing_bytes, {}};
    return decoded{decode_error::none, message{std::move(x)}};
  }
}

}  // namespace

const char* to_string(decode_error e) {
  switch (e) {
    case decode_error::none:
      return "none";
    case decode_error::too_short:
      return "too_short";
    case decode_error::too_large:
      return "too_large";
    case decode_error::bad_magic:
      return "bad_magic";
    case decode_error::bad_version:
      return "bad_version";
    case decode_error::unknown_type:
      return "unknown_type";
    case decode_error::length_mismatch:
      return "length_mismatch";
    case decode_error::truncated:
      return "truncated";
    case decode_error::trailing_bytes:
      return "trailing_bytes";
    case decode_error::bad_value:
      return "bad_value";
    case decode_error::count_:
      break;
  }
  return "unknown";
}

const char* type_name(msg_type t) {
  switch (t) {
    case msg_type::register_request:
      return "register_request";
    case msg_type::register_ok:
      return "register_ok";
    case msg_type::register_reject:
      return "register_reject";
    case msg_type::heartbeat:
      return "heartbeat";
    case msg_type::heartbeat_ack:
      return "heartbeat_ack";
    case msg_type::roster_update:
      return "roster_update";
    case msg_type::kv_set:
      return "kv_set";
    case msg_type::kv_get:
      return "kv_get";
    case msg_type::kv_wait:
      return "kv_wait";
    case msg_type::kv_reply:
      return "kv_reply";
    case msg_type::status_request:
      return "status_request";
    case msg_type::status_reply:
      return "status_reply";
    case msg_type::stop:
      return "stop";
    case msg_type::leave:
      return "leave";
    case msg_type::exit_notice:
      return "exit_notice";
    case msg_type::ping:
      return "ping";
    case msg_type::pong:
      return "pong";
    case msg_type::job_spec:
      return "job_spec";
    case msg_type::worker_ready:
      return "worker_ready";
    case msg_type::step_open:
      return "step_open";
    case msg_type::step_vote:
      return "step_vote";
    case msg_type::step_result:
      return "step_result";
    case msg_type::train_report:
      return "train_report";
    case msg_type::fault_order:
      return "fault_order";
    case msg_type::admin_request:
      return "admin_request";
    case msg_type::admin_reply:
      return "admin_reply";
    case msg_type::scale_order:
      return "scale_order";
    case msg_type::telemetry:
      return "telemetry";
    case msg_type::host_beat:
      return "host_beat";
    case msg_type::host_beat_ack:
      return "host_beat_ack";
  }
  return "unknown";
}

std::string encode(const message& m, uint64_t term) {
  std::string out(envelope_header_bytes, '\0');
  writer w(&out);
  std::visit([&w](const auto& x) { w.put(x); }, m);
  const size_t payload = out.size() - envelope_header_bytes;
  std::string header;
  writer h(&header);
  for (char c : envelope_magic) h.put(static_cast<uint8_t>(c));
  h.put(protocol_version);
  h.put(static_cast<uint16_t>(type_of(m)));
  h.put(static_cast<uint32_t>(payload));
  h.put(term);
  out.replace(0, envelope_header_bytes, header);
  return out;
}

decoded decode(std::string_view frame, size_t max_bytes) noexcept {
  // Size first: an oversized frame is refused before a single field of it is read.
  if (frame.size() > max_bytes) return decoded{decode_error::too_large, {}};
  if (frame.size() < envelope_header_bytes) return decoded{decode_error::too_short, {}};
  const auto* p = reinterpret_cast<const unsigned char*>(frame.data());
  if (std::memcmp(p, envelope_magic, sizeof envelope_magic) != 0) {
    return decoded{decode_error::bad_magic, {}};
  }
  if (load_u16(p + 4) != protocol_version) return decoded{decode_error::bad_version, {}};
  const auto type = static_cast<msg_type>(load_u16(p + 6));
  const uint32_t length = load_u32(p + 8);
  if (length != frame.size() - envelope_header_bytes) {
    return decoded{decode_error::length_mismatch, {}};
  }
  try {
    reader r(p + envelope_header_bytes, length);
    decoded d = decode_payload(type, r);
    d.term = load_u64(p + 12);
    return d;
  } catch (const std::bad_alloc&) {
    // Only reachable when the process is out of memory: lengths are bounded by the frame.
    return decoded{decode_error::too_large, {}};
  }
}

int frame_version(std::string_view frame) noexcept {
  if (frame.size() < envelope_header_bytes) return -1;
  const auto* p = reinterpret_cast<const unsigned char*>(frame.data());
  if (std::memcmp(p, envelope_magic, sizeof envelope_magic) != 0) return -1;
  return load_u16(p + 4);
}

uint64_t frame_term(std::string_view frame) noexcept {
  if (frame.size() < envelope_header_bytes) return 0;
  return load_u64(reinterpret_cast<const unsigned char*>(frame.data()) + 12);
}

int frame_type(std::string_view frame) noexcept {
  if (frame_version(frame) < 0) return -1;
  return load_u16(reinterpret_cast<const unsigned char*>(frame.data()) + 6);
}

}  // namespace cohort::net
