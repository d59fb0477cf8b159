// Envelope and message codec: every message type round-trips, every truncation and every
// corrupted header decodes to an error value, random frames never crash or throw.
#include <doctest/doctest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "runtime/net/codec.hpp"

using namespace cohort::net;

namespace {

constexpr size_t max_bytes = 1 << 20;

// One fully populated value of every message type, with non-default values in every field
// (including negative ints, empty and binary strings), so a dropped or swapped field shows.
std::vector<message> samples() {
  std::vector<message> out;
  out.push_back(register_request{peer_role::client, "worker-7", 4242, 31, 30});
  out.push_back(register_ok{17, "w1", 2, coords{1, 0, -1}, 9, 50, 300});
  register_reject standby{"world is full (3 of 3 workers)", 0};
  standby.leader = "tcp://10.0.0.2:5555";
  standby.leader_term = 4711;
  standby.standby = true;
  out.push_back(standby);
  out.push_back(heartbeat{17, 9, 123456789012345ull, false});
  out.push_back(heartbeat_ack{17, 10, 77, true});
  roster_update ru;
  ru.generation = 12;
  ru.base_generation = 10;
  ru.rank = 1;
  ru.at = coords{1, 2, 3};
  ru.world_size = 7;
  ru.left = {4, 9, 0xffffffffffffull};
  out.push_back(ru);
  out.push_back(kv_set{3, 12, "g12/rank0", std::string("\0\x01\xff bytes", 9)});
  out.push_back(kv_get{4, 12, "g12/rank1", 1000});
  out.push_back(kv_wait{5, 12, {"k1", "k2", ""}, 2500});
  out.push_back(kv_reply{5, kv_status::superseded, "v", "generation 12 was dropped"});
  out.push_back(status_request{99});
  status_reply sr;
  sr.request_id = 99;
  sr.generation = 4;
  sr.step = -1;
  sr.workers.push_back(
      worker_status{member_info{2, "w", 0, coords{0, 1, 0}, member_state::leaving, 7}, 42});
  sr.dropped.push_back(counter{"truncated", 3});
  sr.job = "{\"steps_per_s\":2}";
  sr.coordinator = "{\"term\":3}";
  out.push_back(sr);
  out.push_back(stop{"ctl stop"});
  out.push_back(leave{8, 3});
  out.push_back(exit_notice{"worker-2", 31337, 137});
  out.push_back(ping{1, 0xfedcba9876543210ull});
  out.push_back(pong{2, 1, 0x123456789abcull});
  out.push_back(
      job_spec{"train:\n  steps: 3\n", "ab12", "/ck/step_00000040.safetensors", 77, true});
  out.push_back(worker_ready{7, 3, -5});
  out.push_back(step_open{3, 41, 4, -1, 2, 1, 3, 56});
  const step_timing t{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 2, 21};
  out.push_back(
      step_vote{7, 3, 41, false, true, true, true, "gloo: peer lost", -2.5e-300, 96, t, true});
  out.push_back(step_result{3, 41, true, 0.6931471805599453, "member 2 voted failed"});
  out.push_back(train_report{7, 3, 42, "deadbeef", true, 0.25, 0.875, 10000, 40, 0.83, 1 << 20,
                             "/c/step_00000042.safetensors", 118282, t, "h.0.w:00\n",
                             stage_stats{1, 0, 1, 9, 8, 7, 70, 6, 5, 4, 3, 2}, 12, 13,
                             14, 15, 16, 17, 18});
  out.push_back(fault_order{3, 30, fault_action::partition, 3000, 2.5});
  out.push_back(admin_request{11, "inject", "kill rank=2 at step=30"});
  out.push_back(admin_reply{11, false, "no live worker named 'w9'"});
  out.push_back(scale_order{2, "scale to=4", 7, 3});
  telemetry tm{7, 3, 41, -1234567, 8500, 2, 40, 0.5, 0.875, 1 << 20, 3 << 20, {}};
  tm.spans.push_back(trace_span{"forward", "compute", 'X', 99, 1000, 0, "\"mb\":1"});
  tm.spans.push_back(trace_span{"kill", "fault", 'i', -5, 0, 3, ""});
  out.push_back(tm);
  out.push_back(host_beat{12, true, {relayed_beat{"w0", 7, 3, 41}, relayed_beat{"w1", 8, 3, 40}}});
  out.push_back(host_beat_ack{12});
  return out;
}

void put_u16(std::string& s, size_t at, uint16_t v) {
  s[at] = static_cast<char>(v & 0xff);
  s[at + 1] = static_cast<char>(v >> 8);
}
void put_u32(std::string& s, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) s[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

}  // namespace

TEST_CASE("every message type round-trips field for field") {
  const auto all = samples();
  // One sample per alternative of `message`, so a new message cannot go untested.
  REQUIRE(all.size() == std::variant_size_v<message>);
  std::vector<bool> seen(std::variant_size_v<message>, false);
  for (const auto& m : all) {
    seen[m.index()] = true;
    const std::string frame = encode(m);
    CAPTURE(type_name(type_of(m)));
    decoded d = decode(frame, max_bytes);
    REQUIRE(d.ok());
    CHECK(type_of(d.msg) == type_of(m));
    CHECK(d.msg == m);
    CHECK(encode(d.msg) == frame);
  }
  for (bool s : seen) CHECK(s);
}

TEST_CASE("envelope layout is the documented little-endian header") {
  const std::string f = encode(heartbeat{0x0102030405060708ull, 2, 3});
  REQUIRE(f.size() == envelope_header_bytes + 25);
  CHECK(f.substr(0, 4) == "CHRT");
  CHECK(static_cast<uint8_t>(f[4]) == protocol_version);
  CHECK(static_cast<uint8_t>(f[5]) == 0);
  CHECK(static_cast<uint8_t>(f[6]) == static_cast<uint16_t>(msg_type::heartbeat));
  CHECK(static_cast<uint8_t>(f[7]) == 0);
  CHECK(static_cast<uint8_t>(f[8]) == 25);
  CHECK(f[9] == 0);
  CHECK(f[10] == 0);
  CHECK(f[11] == 0);
  // term 0 (no ha), then member_id, least significant byte first.
  for (int i = 12; i < 20; ++i) CHECK(f[static_cast<size_t>(i)] == 0);
  CHECK(static_cast<uint8_t>(f[20]) == 0x08);
  CHECK(static_cast<uint8_t>(f[27]) == 0x01);
  CHECK(decode(f, 1 << 20).term == 0);
}

TEST_CASE("a term stamped on a frame is read back from its envelope") {
  const std::string f = encode(stop{"x"}, 0x1122334455667788ull);
  CHECK(static_cast<uint8_t>(f[12]) == 0x88);
  CHECK(static_cast<uint8_t>(f[19]) == 0x11);
  CHECK(frame_term(f) == 0x1122334455667788ull);
  const decoded d = decode(f, 1 << 20);
  REQUIRE(d.ok());
  CHECK(d.term == 0x1122334455667788ull);
  CHECK(std::get<stop>(d.msg).reason == "x");
  CHECK(frame_term("CHRT") == 0);  // shorter than the envelope
}

TEST_CASE("every truncation of every message is an error value") {
  for (const auto& m : samples()) {
    const std::string frame = encode(m);
    CAPTURE(type_name(type_of(m)));
    for (size_t len = 0; len < frame.size(); ++len) {
      CAPTURE(len);
      std::string cut = frame.substr(0, len);
      decoded d = decode(cut, max_bytes);
      REQUIRE_FALSE(d.ok());
      if (len < envelope_header_bytes) {
        CHECK(d.error == decode_error::too_short);
      } else {
        // The header still claims the full payload.
        CHECK(d.error == decode_error::length_mismatch);
      }
      // Same bytes with the length field fixed up: now the payload itself is short.
      if (len >= envelope_header_bytes) {
        put_u32(cut, 8, static_cast<uint32_t>(len - envelope_header_bytes));
        decoded e = decode(cut, max_bytes);
        // Every field is mandatory, so no proper prefix of a payload is a message.
        CHECK(e.error == decode_error::truncated);
      }
    }
  }
}

TEST_CASE("corrupted headers and payloads are rejected with the right reason") {
  const std::string good = encode(register_ok{1, "w", 0, coords{}, 1, 50, 300});
  SUBCASE("wrong magic") {
    std::string f = good;
    f[0] = 'X';
    CHECK(decode(f, max_bytes).error == decode_error::bad_magic);
  }
  SUBCASE("wrong version") {
    std::string f = good;
    put_u16(f, 4, protocol_version + 1);
    CHECK(decode(f, max_bytes).error == decode_error::bad_version);
  }
  SUBCASE("unknown type ids") {
    for (uint16_t t : {0, 31, 255, 65535}) {
      std::string f = good;
      put_u16(f, 6, t);
      CHECK(decode(f, max_bytes).error == decode_error::unknown_type);
    }
  }
  SUBCASE("length field larger or smaller than the frame") {
    std::string f = good;
    put_u32(f, 8, 0xffffffffu);
    CHECK(decode(f, max_bytes).error == decode_error::length_mismatch);
    put_u32(f, 8, 0);
    CHECK(decode(f, max_bytes).error == decode_error::length_mismatch);
  }
  SUBCASE("trailing bytes after the last field") {
    std::string f = good + "x";
    put_u32(f, 8, static_cast<uint32_t>(f.size() - envelope_header_bytes));
    CHECK(decode(f, max_bytes).error == decode_error::trailing_bytes);
  }
  SUBCASE("oversized frames are refused before parsing") {
    CHECK(decode(good, good.size()).ok());
    CHECK(decode(good, good.size() - 1).error == decode_error::too_large);
    // Even a frame with garbage in it reports too_large first.
    CHECK(decode(std::string(100, 'z'), 99).error == decode_error::too_large);
  }
  SUBCASE("a bool that is neither 0 nor 1") {
    std::string f = encode(heartbeat_ack{3, 1, 2, true});
    f.back() = 2;
    CHECK(decode(f, max_bytes).error == decode_error::bad_value);
  }
  SUBCASE("an enum out of range") {
    std::string f = encode(register_request{peer_role::worker, "", 0});
    f[envelope_header_bytes] = 7;  // role is the first payload byte
    CHECK(decode(f, max_bytes).error == decode_error::bad_value);
  }
  SUBCASE("kv_status 1 is `pending`, which never crosses the wire") {
    std::string f = encode(kv_reply{1, kv_status::ok, "", ""});
    f[envelope_header_bytes + 8] = 1;  // status follows the u64 request id
    CHECK(decode(f, max_bytes).error == decode_error::bad_value);
    f[envelope_header_bytes + 8] = 5;
    CHECK(decode(f, max_bytes).ok());
  }
  SUBCASE("a string length beyond the frame") {
    std::string f = encode(register_reject{"abc"});
    put_u32(f, envelope_header_bytes, 0x7fffffffu);
    CHECK(decode(f, max_bytes).error == decode_error::truncated);
  }
  SUBCASE("a vector count beyond the frame does not allocate for it") {
    roster_update ru;
    ru.generation = 1;
    std::string f = encode(ru);
    // generation, base, rank, at (3 x i32), world_size, then the count of `left`
    put_u32(f, envelope_header_bytes + 36, 0xffffffffu);
    CHECK(decode(f, max_bytes).error == decode_error::truncated);
  }
}

TEST_CASE("random frames and random corruptions never crash or throw") {
  std::mt19937_64 gen(20240601);
  std::uniform_int_distribution<int> byte(0, 255);
  const auto all = samples();
  size_t decoded_ok = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string f;
    if (i % 2 == 0) {
      // Pure noise, sometimes behind a valid magic + version so parsing goes deeper.
      f.resize(gen() % 200);
      for (auto& c : f) c = static_cast<char>(byte(gen));
      if (i % 4 == 0 && f.size() >= envelope_header_bytes) {
        std::memcpy(f.data(), envelope_magic, 4);
        put_u16(f, 4, protocol_version);
        put_u16(f, 6, static_cast<uint16_t>(1 + gen() % 24));
        put_u32(f, 8, static_cast<uint32_t>(f.size() - envelope_header_bytes));
      }
    } else {
      // A valid frame with a few bytes flipped in its payload.
      f = encode(all[gen() % all.size()]);
      const int flips = 1 + static_cast<int>(gen() % 4);
      for (int k = 0; k < flips && f.size() > envelope_header_bytes; ++k) {
        const size_t at = envelope_header_bytes + gen() % (f.size() - envelope_header_bytes);
        f[at] = static_cast<char>(byte(gen));
      }
    }
    decoded d;
    CHECK_NOTHROW(d = decode(f, max_bytes));
    if (d.ok()) {
      ++decoded_ok;
      // Whatever decodes must re-encode to exactly the bytes it came from.
      CHECK(encode(d.msg, d.term) == f);
    } else {
      CHECK(d.error != decode_error::none);
    }
  }
  // Flipping a byte inside an integer field still decodes; make sure that path ran.
  CHECK(decoded_ok > 0);
}
