// Wire formats and the compressed sum: rounding of each format at its edges (ties to even,
// saturation, subnormals), encoded sizes, decoding with the block scale, error feedback that
// loses nothing over many blocks, and compressed_allreduce_sum over shared memory, Gloo and
// the hierarchy with ranks as threads: closed-form sums, the same bits on every rank, bytes
// handed to the transport equal to the formula, error memory that accounts for every
// value fed in, the hierarchy's bits equal to a flat group's on any host layout, and plain
// float sums in rank order on every backend.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/compress.hpp"
#include "runtime/comm/compressed_allreduce.hpp"
#include "runtime/comm/factory.hpp"
#include "runtime/core/error.hpp"
#include "tests/comm/comm_test_util.hpp"

using namespace cohort::comm;
using cohort::comm_backend;
using cohort::comm_hierarchy;
using cohort::comm_transport;
using cohort::parse_choice;
using namespace cohort::comm::test;

namespace {

std::vector<float> round_trip(wire_format f, const std::vector<float>& x, float* error = nullptr) {
  std::vector<std::uint8_t> wire(encoded_bytes(f, x.size()));
  encode(f, x.data(), x.size(), error, wire.data());
  std::vector<float> out(x.size());
  decode(f, wire.data(), x.size(), out.data());
  return out;
}

// One group of `hosts.size()` ranks through the factory (rank r on host hosts[r]).
std::vector<std::unique_ptr<communicator>> make_group(kv_client& kv,
                                                      const std::vector<std::string>& hosts,
                                                      std::uint64_t gen,
                                                      const std::string& transport,
                                                      const std::string& hierarchy) {
  const int n = static_cast<int>(hosts.size());
  std::vector<std::unique_ptr<communicator>> comms(n);
  rethrow_first(run_ranks(n, [&](int r) {
    transport_options t;
    t.group = "dp";
    t.transport = parse_choice<comm_transport>(transport).value();
    t.hierarchy = parse_choice<comm_hierarchy>(hierarchy).value();
    t.host_id = hosts[r];
    t.rendezvous_timeout_ms = 20000;
    comms[r] = make_communicator(comm_backend::gloo, "cpu", kv, r, n, gen, 20000, t);
  }));
  return comms;
}

struct group_kind {
  const char* name;
  const char* transport;
  const char* hierarchy;
  bool split_hosts;  // ranks on two hosts (the hierarchy needs them)
};

const group_kind kKinds[] = {{"shm", "shm", "flat", false},
                             {"gloo", "gloo", "flat", false},
                             {"hierarchical", "auto", "hierarchical", true}};

std::vector<std::string> hosts_for(const group_kind& k, int n) {
  std::vector<std::string> h;
  for (int r = 0; r < n; ++r) h.push_back(k.split_hosts && r >= n / 2 ? "h1" : "h0");
  return h;
}

using group = std::vector<std::unique_ptr<communicator>>;

// Equal bit for bit (== would take -0 for +0).
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// FN(kind, n, comms) for every backend (shm, Gloo, the hierarchy) at every group size 1..4
// it can have, each group a new generation from GEN on.
void for_each_group(std::uint64_t gen,
                    const std::function<void(const group_kind&, int, group&)>& fn) {
  for (const group_kind& kind : kKinds)
    for (int n : {1, 2, 3, 4}) {
      if (kind.split_hosts && n < 2) continue;
      CAPTURE(kind.name);
      CAPTURE(n);
      memory_kv kv;
      group comms = make_group(kv, hosts_for(kind, n), gen++, kind.transport, kind.hierarchy);
      fn(kind, n, comms);
    }
}

}  // namespace

TEST_CASE("bf16, fp16 and fp8 round to nearest even, saturate and flush as their formats say") {
  // bf16 keeps 7 mantissa bits: 1 + 2^-8 is half an ulp above 1 (ties to the even 1),
  // 1 + 3 * 2^-8 half-way between 1 + 2^-7 (odd) and 1 + 2^-6 (even).
  CHECK(round_bf16(1.0f) == 1.0f);
  CHECK(round_bf16(1.0f + std::ldexp(1.0f, -8)) == 1.0f);
  CHECK(round_bf16(1.0f + 3 * std::ldexp(1.0f, -8)) == 1.0f + std::ldexp(1.0f, -6));
  CHECK(round_bf16(-1e30f) == doctest::Approx(-1e30f).epsilon(0.01));
  CHECK(std::isnan(round_bf16(NAN)));
  // fp16: largest 65504; smallest subnormal 2^-24, and 2^-26 flushes to zero.
  CHECK(round_fp16(65504.0f) == 65504.0f);
  CHECK(round_fp16(1e6f) == 65504.0f);
  CHECK(round_fp16(-1e6f) == -65504.0f);
  CHECK(round_fp16(std::ldexp(1.0f, -24)) == std::ldexp(1.0f, -24));
  CHECK(round_fp16(std::ldexp(1.0f, -26)) == 0.0f);
  // E4M3FN: 3 mantissa bits, largest 448, subnormals m * 2^-9.
  CHECK(round_fp8(448.0f) == 448.0f);
  CHECK(round_fp8(500.0f) == 448.0f);
  CHECK(round_fp8(-1e9f) == -448.0f);
  CHECK(round_fp8(1.0f) == 1.0f);
  CHECK(round_fp8(1.0625f) == 1.0f);   // half-way between 1 (even) and 1.125
  CHECK(round_fp8(1.1875f) == 1.25f);  // half-way between 1.125 and 1.25 (even)
  CHECK(round_fp8(-3.0f) == -3.0f);
  CHECK(round_fp8(std::ldexp(1.0f, -9)) == std::ldexp(1.0f, -9));
  CHECK(round_fp8(std::ldexp(1.0f, -10)) == 0.0f);  // half of the smallest: ties to 0
  CHECK(round_fp8(3 * std::ldexp(1.0f, -10)) == std::ldexp(1.0f, -8));
  CHECK(round_fp8(7.5f * std::ldexp(1.0f, -9)) == std::ldexp(1.0f, -6));  // into the normals
  CHECK(round_fp8(416.0f) == 416.0f);
  CHECK(std::isnan(round_fp8(NAN)));
  CHECK(parse_wire_format("none") == wire_format::f32);
  CHECK(parse_wire_format("fp8") == wire_format::fp8);
  CHECK_THROWS_AS(parse_wire_format("int4"), cohort::usage_error);
}

TEST_CASE("encoded blocks are a 4-byte scale and the values at the format's width") {
  CHECK(encoded_bytes(wire_format::f32, 10) == 44);
  CHECK(encoded_bytes(wire_format::bf16, 10) == 24);
  CHECK(encoded_bytes(wire_format::fp16, 10) == 24);
  CHECK(encoded_bytes(wire_format::fp8, 10) == 14);
  CHECK(encoded_bytes(wire_format::sign, 10) == 6);
  CHECK(encoded_bytes(wire_format::sign, 0) == 4);
  CHECK(encoded_bytes(wire_format::sign, 16) == 6);
}

TEST_CASE("scaled formats decode to the rounded values times a power of two") {
  // fp8: amax 1000 -> scale 2^ceil(log2(1000 / 448)) = 4; 250 rounds to 256, 125 to 128.
  std::vector<float> error = {0, 0, 0};
  const std::vector<float> x = {1000.0f, -500.0f, 0.5f};
  const std::vector<float> y = round_trip(wire_format::fp8, x, error.data());
  CHECK(y == std::vector<float>{1024.0f, -512.0f, 0.5f});
  CHECK(error == std::vector<float>{-24.0f, 12.0f, 0.0f});
  // Tiny gradients keep their digits: the scale moves them into fp8's range.
  const std::vector<float> tiny = {3e-6f, -1e-6f, 0.0f};
  const std::vector<float> t = round_trip(wire_format::fp8, tiny);
  CHECK(t[0] == doctest::Approx(3e-6).epsilon(0.07));
  CHECK(t[1] == doctest::Approx(-1e-6).epsilon(0.07));
  CHECK(t[2] == 0.0f);
  // fp16 likewise (round_fp16 alone would flush 1e-9).
  CHECK(round_trip(wire_format::fp16, {1e-9f, 2e-9f})[1] == doctest::Approx(2e-9).epsilon(1e-3));
  // bf16 and f32 need no scale; f32 is exact.
  CHECK(round_trip(wire_format::bf16, {1.5f, -2.25f}) == std::vector<float>{1.5f, -2.25f});
  CHECK(round_trip(wire_format::f32, {0.1f, 1e-30f}) == std::vector<float>{0.1f, 1e-30f});
  // A zero block and an empty one.
  CHECK(round_trip(wire_format::fp8, {0.0f, 0.0f}) == std::vector<float>{0.0f, 0.0f});
  CHECK(round_trip(wire_format::sign, {}).empty());
}

TEST_CASE("sign keeps one bit a value and the block's mean magnitude") {
  std::vector<float> error = {0, 0};
  const std::vector<float> y = round_trip(wire_format::sign, {3.0f, -4.0f}, error.data());
  const float s = 3.5f;  // (|3| + |-4|) / 2: the least-squares magnitude
  CHECK(y[0] == doctest::Approx(s));
  CHECK(y[1] == doctest::Approx(-s));
  CHECK(error[0] == doctest::Approx(3.0f - s));
  CHECK(error[1] == doctest::Approx(-4.0f + s));
  // Zero counts as positive; a non-finite input is not hidden.
  CHECK(round_trip(wire_format::sign, {0.0f, 0.0f}) == std::vector<float>{0.0f, 0.0f});
  CHECK(std::isnan(round_trip(wire_format::sign, {1.0f, NAN})[0]));
  CHECK(std::isnan(round_trip(wire_format::fp8, {1.0f, INFINITY})[0]));
}

TEST_CASE("sign packs value i into bit i%8 of byte i/8, whole bytes and a ragged tail alike") {
  // Lengths around whole bytes: the codec handles 8 values at a time, then the rest.
  for (std::size_t n : {1u, 7u, 8u, 9u, 16u, 23u}) {
    CAPTURE(n);
    std::vector<float> x(n), error(n, 0.0f);
    for (std::size_t i = 0; i < n; ++i)
      x[i] = (i * 7 + 3) % 5 < 2 ? -0.5f * static_cast<float>(i + 1) : static_cast<float>(i);
    x[0] = -0.0f;  // -0 >= 0: a set bit, like +0
    std::vector<std::uint8_t> wire(encoded_bytes(wire_format::sign, n));
    encode(wire_format::sign, x.data(), n, error.data(), wire.data());
    double sum_abs = 0.0;
    for (float v : x) sum_abs += std::fabs(v);
    const float s = static_cast<float>(sum_abs / static_cast<double>(n));
    std::vector<float> y(n), acc(n, 1.0f);
    decode(wire_format::sign, wire.data(), n, y.data());
    decode_add(wire_format::sign, wire.data(), n, acc.data());
    for (std::size_t i = 0; i < n; ++i) {
      CAPTURE(i);
      const bool up = x[i] >= 0.0f;
      CHECK(((wire[4 + i / 8] >> (i % 8)) & 1) == (up ? 1 : 0));
      CHECK(y[i] == (up ? s : -s));
      CHECK(acc[i] == 1.0f + (up ? s : -s));
      CHECK(error[i] == x[i] - (up ? s : -s));
    }
    // Bits past the last value are zero: the bytes are a function of the values alone.
    if (n % 8 != 0) CHECK((wire.back() >> (n % 8)) == 0);
  }
}

TEST_CASE("error feedback loses nothing: T blocks decode to T times the input minus the memory") {
  for (wire_format f : {wire_format::sign, wire_format::fp8, wire_format::bf16}) {
    CAPTURE(name_of(f));
    const std::size_t n = 257;
    std::vector<float> x(n), error(n, 0.0f);
    for (std::size_t i = 0; i < n; ++i) x[i] = std::sin(0.37f * float(i)) * (1.0f + float(i % 7));
    std::vector<double> sum(n, 0.0);
    const int T = 400;
    double early_avg = 0;  // the worst |average sent - x| after T / 4 blocks
    for (int t = 0; t < T; ++t) {
      const std::vector<float> y = round_trip(f, x, error.data());
      for (std::size_t i = 0; i < n; ++i) sum[i] += y[i];
      if (t + 1 == T / 4)
        for (std::size_t i = 0; i < n; ++i)
          early_avg = std::max(early_avg, std::fabs(sum[i] / (T / 4) - x[i]));
    }
    // sum_t decode_t + e_T = T x exactly in real arithmetic; the memory stays bounded, so
    // the average of what was sent converges to x (like 1 / T).
    double worst = 0, worst_avg = 0;
    for (std::size_t i = 0; i < n; ++i) {
      worst = std::max(worst, std::fabs(sum[i] + error[i] - T * double(x[i])) / T);
      worst_avg = std::max(worst_avg, std::fabs(sum[i] / T - x[i]));
    }
    CHECK(worst < 1e-4);
    CHECK(worst_avg < 0.5);  // inputs up to 7: within 7% after 400 blocks
    if (early_avg > 1e-6) CHECK(worst_avg < 0.5 * early_avg);
  }
}

TEST_CASE("compressed sums over shm, Gloo and the hierarchy: closed forms, one result everywhere") {
  for_each_group(1, [](const group_kind&, int n, group& comms) {
    for (std::size_t count : {std::size_t(1), std::size_t(3), std::size_t(1001)}) {
      CAPTURE(count);
      // bf16 and fp8: every rank sends v_i = (i % 4) + 1, so the sum n * v_i is exact in
      // both formats (at most 16: integers up to 16 are exact in E4M3).
      for (wire_format f : {wire_format::bf16, wire_format::fp8, wire_format::f32}) {
        CAPTURE(name_of(f));
        std::vector<std::vector<float>> d(n, std::vector<float>(count));
        std::vector<std::vector<float>> worker(n, std::vector<float>(count, 0.0f));
        std::vector<std::vector<float>> server(n, std::vector<float>(count, 0.0f));
        REQUIRE_NOTHROW(rethrow_first(run_ranks(n, [&](int r) {
          for (std::size_t i = 0; i < count; ++i) d[r][i] = float(i % 4 + 1);
          compressed_allreduce_sum(*comms[r], d[r].data(), count, f,
                                   {worker[r].data(), server[r].data()});
        })));
        for (int r = 0; r < n; ++r)
          for (std::size_t i = 0; i < count; ++i) {
            REQUIRE(d[r][i] == float(n) * float(i % 4 + 1));
            REQUIRE(worker[r][i] == 0.0f);  // nothing was lost
            REQUIRE(server[r][i] == 0.0f);
          }
      }
    }
  });
}

TEST_CASE("sign sums: each chunk's owner sends the mean magnitude, and the memory holds the rest") {
  std::uint64_t gen = 100;
  for (const group_kind& kind : kKinds) {
    const int n = 4;
    CAPTURE(kind.name);
    memory_kv kv;
    auto comms = make_group(kv, hosts_for(kind, n), gen++, kind.transport, kind.hierarchy);
    const std::size_t count = 1000;
    std::vector<std::vector<float>> x(n, std::vector<float>(count)), d = x;
    std::vector<std::vector<float>> worker(n, std::vector<float>(count, 0.0f)), server = worker;
    for (int r = 0; r < n; ++r)
      for (std::size_t i = 0; i < count; ++i)
        x[r][i] = std::sin(float(i) * 0.01f + float(r)) * float(r + 1);
    d = x;
    REQUIRE_NOTHROW(rethrow_first(run_ranks(n, [&](int r) {
      compressed_allreduce_sum(*comms[r], d[r].data(), count, wire_format::sign,
                               {worker[r].data(), server[r].data()});
    })));
    for (int r = 1; r < n; ++r) REQUIRE(d[r] == d[0]);
    // The result plus every rank's memory is what was fed in (the memory accounts for
    // everything compression lost).
    for (std::size_t i = 0; i < count; ++i) {
      double fed = 0, kept = 0;
      for (int r = 0; r < n; ++r) {
        fed += x[r][i];
        kept += double(worker[r][i]) + server[r][i];
      }
      REQUIRE(d[0][i] + kept == doctest::Approx(fed).epsilon(1e-5).scale(10));
    }
    // Every group sends signs: every value of a chunk has one magnitude.
    for (int j = 0; j < n; ++j) {
      const std::size_t b = chunk_begin(count, n, j), e = chunk_begin(count, n, j + 1);
      for (std::size_t i = b; i < e; ++i) REQUIRE(std::fabs(d[0][i]) == std::fabs(d[0][b]));
    }
  }
}

TEST_CASE("the hierarchy's compressed sums are a flat group's bits, whichever ranks share a host") {
  // Three rounds with error memory in each lossy format: the results and both memories of
  // every rank, bit for bit, against one flat Gloo group of the same size. The chunk of
  // rank r is summed and its server memory kept at rank r, wherever r runs, so a run's bits
  // and its checkpointed memory do not depend on the order the workers registered in.
  const std::vector<std::vector<std::string>> layouts = {{"h0", "h0", "h1", "h1"},
                                                         {"h0", "h1", "h0", "h1"},
                                                         {"h0", "h0", "h0", "h1"},
                                                         {"a", "b", "a", "c", "b"}};
  const std::size_t count = 1001;  // ragged chunks
  std::uint64_t gen = 400;
  for (const auto& hosts : layouts) {
    const int n = static_cast<int>(hosts.size());
    CAPTURE(n);
    CAPTURE(hosts[1] + hosts[2]);
    memory_kv kv;
    auto flat = make_group(kv, std::vector<std::string>(n, "h0"), gen++, "gloo", "flat");
    auto hier = make_group(kv, hosts, gen++, "auto", "hierarchical");
    REQUIRE(std::string(hier[0]->backend()) == "hierarchical");
    for (wire_format f : {wire_format::sign, wire_format::fp8, wire_format::bf16}) {
      CAPTURE(std::string(name_of(f)));
      using state = std::vector<std::vector<float>>;
      state d[2], worker[2], server[2];
      for (int g = 0; g < 2; ++g) {
        worker[g] = server[g] = state(n, std::vector<float>(count, 0.0f));
        d[g] = state(n, std::vector<float>(count));
      }
      for (int round = 0; round < 3; ++round) {
        CAPTURE(round);
        for (int g = 0; g < 2; ++g) {
          group& comms = g == 0 ? flat : hier;
          REQUIRE_NOTHROW(rethrow_first(run_ranks(n, [&](int r) {
            for (std::size_t i = 0; i < count; ++i)
              d[g][r][i] = std::sin(0.013f * float(i) + float(r) + 0.7f * float(round)) *
                           float(r + 1 + (i % 3));
            compressed_allreduce_sum(*comms[r], d[g][r].data(), count, f,
                                     {worker[g][r].data(), server[g][r].data()});
          })));
        }
        for (int r = 0; r < n; ++r) {
          CAPTURE(r);
          REQUIRE(same_bits(d[1][r], d[0][r]));
          REQUIRE(same_bits(worker[1][r], worker[0][r]));
          REQUIRE(same_bits(server[1][r], server[0][r]));
        }
      }
    }
  }
}

TEST_CASE("ordered sums add the ranks' floats in rank order on every backend and host layout") {
  // Values whose float sum depends on its order: a ring's, shared memory's and the
  // hierarchy's allreduce_sum differ in the last bits; ordered_allreduce_sum is
  // ((0 + x0) + x1) + ... everywhere.
  const std::vector<std::vector<std::string>> layouts = {{"h0", "h0", "h0", "h0"},
                                                         {"h0", "h0", "h1", "h1"},
                                                         {"h0", "h1", "h0", "h1"},
                                                         {"a", "b", "a", "c", "b"}};
  const std::size_t count = 1001;
  std::uint64_t gen = 500;
  for (const auto& hosts : layouts) {
    const int n = static_cast<int>(hosts.size());
    CAPTURE(n);
    CAPTURE(hosts[1] + hosts[2]);
    auto value = [](int r, std::size_t i) {
      return std::sin(0.37f * float(i) + 1.1f * float(r)) *
             std::ldexp(1.0f, int((i * 7 + std::size_t(r) * 13) % 24) - 12);
    };
    std::vector<float> expect(count, 0.0f);
    for (std::size_t i = 0; i < count; ++i)
      for (int r = 0; r < n; ++r) expect[i] += value(r, i);
    for (const std::string transport : {"gloo", "shm", "auto"}) {
      CAPTURE(transport);
      memory_kv kv;
      const bool hier = transport == "auto";
      if (hier && std::count(hosts.begin(), hosts.end(), hosts[0]) == n) continue;  // one host
      auto comms = make_group(kv, hier ? hosts : std::vector<std::string>(n, "h0"), gen++,
                              transport, hier ? "hierarchical" : "flat");
      std::vector<std::vector<float>> d(n, std::vector<float>(count));
      REQUIRE_NOTHROW(rethrow_first(run_ranks(n, [&](int r) {
        for (std::size_t i = 0; i < count; ++i) d[r][i] = value(r, i);
        ordered_allreduce_sum(*comms[r], d[r].data(), count);
      })));
      bool ordered = true;
      for (int r = 0; r < n; ++r) ordered = ordered && same_bits(d[r], expect);
      CHECK(ordered);
    }
  }
}

TEST_CASE("Gloo hands the transport the encoded bytes: the formula, a quarter of fp32's for fp8") {
  memory_kv kv;
  const int n = 4;
  auto comms = make_group(kv, hosts_for(kKinds[1], n), 200, "gloo", "flat");
  const std::size_t count = 100000;
  for (wire_format f : {wire_format::fp8, wire_format::bf16, wire_format::sign}) {
    CAPTURE(name_of(f));
    std::vector<std::uint64_t> sent(n), plain(n);
    REQUIRE_NOTHROW(rethrow_first(run_ranks(n, [&](int r) {
      std::vector<float> d(count, float(r));
      const comm_traffic t0 = comms[r]->traffic();
      compressed_allreduce_sum(*comms[r], d.data(), count, f);
      const comm_traffic t1 = comms[r]->traffic();
      comms[r]->allreduce_sum(d.data(), count);
      const comm_traffic t2 = comms[r]->traffic();
      sent[r] = t1.sent - t0.sent;
      plain[r] = t2.sent - t1.sent;
    })));
    for (int r = 0; r < n; ++r) {
      CHECK(sent[r] == compressed_bytes_sent(f, count, n));
      // A ring allreduce sends 2 (n - 1) / n of the floats; the compressed sum the same share
      // of the encoded values.
      const double ratio = double(plain[r]) / double(sent[r]);
      const double expect = f == wire_format::fp8 ? 4 : f == wire_format::bf16 ? 2 : 32;
      CHECK(ratio == doctest::Approx(expect).epsilon(0.01));
    }
  }
}

TEST_CASE("alltoall hands block j of rank r to rank j at offset r, on every backend") {
  for_each_group(300, [](const group_kind&, int n, group& comms) {
    for (std::size_t bytes : {std::size_t(0), std::size_t(5), std::size_t(70000)}) {
      CAPTURE(bytes);
      std::vector<std::vector<std::uint8_t>> out(n, std::vector<std::uint8_t>(bytes * n));
      REQUIRE_NOTHROW(rethrow_first(run_ranks(n, [&](int r) {
        std::vector<std::uint8_t> in(bytes * n);
        for (int j = 0; j < n; ++j)
          for (std::size_t b = 0; b < bytes; ++b)
            in[j * bytes + b] = static_cast<std::uint8_t>(r * 31 + j * 7 + b);
        comms[r]->alltoall(in.data(), out[r].data(), bytes);
      })));
      for (int j = 0; j < n; ++j)
        for (int r = 0; r < n; ++r)
          for (std::size_t b = 0; b < bytes; ++b)
            REQUIRE(out[j][r * bytes + b] == static_cast<std::uint8_t>(r * 31 + j * 7 + b));
    }
  });
}

TEST_CASE("a rank that never joins the compressed sum makes the others fail within the timeout") {
  memory_kv kv;
  auto comms = make_gloo_group(kv, 2, 500, std::chrono::milliseconds(300), "silent");
  std::vector<float> d(10000, 1.0f), worker(10000, 0.0f), server(10000, 0.0f);
  const auto t0 = std::chrono::steady_clock::now();
  comm_failure kind = comm_failure::invalid;
  try {
    compressed_allreduce_sum(*comms[0], d.data(), d.size(), wire_format::sign,
                             {worker.data(), server.data()});
    FAIL("the sum completed without rank 1");
  } catch (const comm_error& e) {
    kind = e.kind();
  }
  CHECK(seconds_since(t0) < 15.0);  // 0.3 s promised; slack for a loaded machine
  CHECK((kind == comm_failure::timeout || kind == comm_failure::peer_lost));
  CHECK(comms[0]->dead());
}
