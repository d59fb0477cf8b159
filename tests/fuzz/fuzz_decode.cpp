// libFuzzer target for the control-plane decoder: any byte string must decode to a message
// or an error value, never crash, hang, throw or read out of bounds (ASan watches), and
// whatever decodes must re-encode, under the term its envelope carried, to exactly the
// input bytes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "runtime/net/codec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view frame(reinterpret_cast<const char*>(data), size);
  // A small limit too, so the too_large path is exercised alongside full parsing.
  (void)cohort::net::decode(frame, 64);
  const cohort::net::decoded d = cohort::net::decode(frame, 1 << 20);
  if (d.ok() && cohort::net::encode(d.msg, d.term) != frame) std::abort();
  return 0;
}
