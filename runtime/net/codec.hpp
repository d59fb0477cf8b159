// The versioned envelope and the byte layout of every message in protocol.hpp. Owns
// encode/decode only; decoding never throws, never trusts a length it has not checked
// against the bytes at hand, and reports every failure as a decode_error value.
//
// Envelope (little-endian, 20 bytes, then the payload):
//   offset 0  magic    4 bytes  "CHRT"
//   offset 4  version  u16      protocol_version
//   offset 6  type     u16      msg_type
//   offset 8  length   u32      payload bytes; must equal frame size - 20
//   offset 12 term     u64      the sender's leadership term: a coordinator elected through
//                               etcd (ha) stamps its term on every frame it sends, and a
//                               worker drops frames of a lower term than it has seen
//                               (fencing); 0 without ha and on frames workers send
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "runtime/net/protocol.hpp"

namespace cohort::net {

inline constexpr char envelope_magic[4] = {'C', 'H', 'R', 'T'};
inline constexpr uint16_t protocol_version = 18;
inline constexpr size_t envelope_header_bytes = 20;

/// Why a frame was rejected. Values index drop counters; append only.
enum class decode_error : uint8_t {
  none = 0,
  too_short,        ///< fewer bytes than the envelope header
  too_large,        ///< frame larger than the receiver's max_message_bytes
  bad_magic,        ///< first four bytes are not "CHRT"
  bad_version,      ///< a protocol version this build does not speak
  unknown_type,     ///< type id not in msg_type
  length_mismatch,  ///< envelope length field disagrees with the frame size
  truncated,        ///< payload ends inside a field
  trailing_bytes,   ///< payload has bytes after the last field
  bad_value,        ///< a field holds an impossible value (enum out of range, bool not 0/1)
  count_            ///< number of reasons, not a reason
};

/// Short stable name of a decode error ("truncated"), used in counters and logs.
const char* to_string(decode_error e);

/// Result of decode(): msg is meaningful only when error == decode_error::none.
struct decoded {
  decode_error error = decode_error::none;
  message msg;
  uint64_t term = 0;  ///< the envelope's term
  bool ok() const { return error == decode_error::none; }
};

/// Encodes M in its envelope stamped with TERM, ready to be one ZeroMQ frame.
std::string encode(const message& m, uint64_t term = 0);

/// Decodes one frame. Frames larger than max_bytes are refused before anything else is
/// read. Never throws: every malformed input ends in an error value.
decoded decode(std::string_view frame, size_t max_bytes) noexcept;

/// The protocol version a frame's envelope names, or -1 when the frame is shorter than the
/// envelope or its magic is not "CHRT". The magic and this field keep their place in every
/// version, so two builds that disagree can still tell each other which version they speak.
int frame_version(std::string_view frame) noexcept;

/// The message type a frame's envelope names, or -1 as for frame_version. Reads nothing
/// past the envelope (the payload may be anything).
int frame_type(std::string_view frame) noexcept;

/// The term a frame's envelope carries, or 0 for a frame shorter than the envelope.
uint64_t frame_term(std::string_view frame) noexcept;

}  // namespace cohort::net
