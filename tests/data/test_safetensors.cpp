// Safetensors: bit-exact round trips, the byte layout read back independently, and every
// kind of damaged or hostile file rejected with a checkpoint_error (never a crash, never a
// partial copy). Atomic writes: a failed write leaves the old file and no temporary.
#include <doctest/doctest.h>
#include <sys/resource.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/ckpt/safetensors.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/sha256.hpp"
#include "temp_dir.hpp"

using cohort::checkpoint_error;
using cohort::dtype;
using cohort::safetensors_file;
using cohort::tensor_target;
using cohort::tensor_view;
using cohort::test::read_all;
using cohort::test::temp_dir;
using cohort::test::write_all;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(v >> (8 * i));
  return s;
}

// A file from raw parts: the writer is bypassed so headers can be broken on purpose.
void craft(const std::string& path, const std::string& header, const std::string& data) {
  write_all(path, le64(header.size()) + header + data);
}

// A well-formed header for `data` with metadata sha256 set (tensors given as JSON).
std::string header_with_checksum(json tensors, const std::string& data) {
  tensors["__metadata__"] = {{"sha256", cohort::sha256_hex(data)}};
  return tensors.dump();
}

// Unlinks and recreates `path`: rewriting it in place (open with O_TRUNC) would make ext4
// flush it on every close (auto_da_alloc), which makes the loops below crawl.
void replace_file(const std::string& path, const std::string& bytes) {
  fs::remove(path);
  write_all(path, bytes);
}

template <class Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const checkpoint_error& e) {
    return e.what();
  }
  return "<no checkpoint_error>";
}

struct sample_tensors {
  std::vector<float> w{1.5f,
                       -0.0f,
                       std::numeric_limits<float>::denorm_min(),
                       std::numeric_limits<float>::infinity(),
                       3.0e38f,
                       -7.25f};
  std::vector<int64_t> counts{-1, 0, int64_t{1} << 40, std::numeric_limits<int64_t>::min()};
  std::vector<uint8_t> mask{1, 0, 1};
  float scalar = 0.125f;
  std::vector<tensor_view> views() const {
    return {{"b.weight", {2, 3}, w.data(), dtype::f32},
            {"a.counts", {4}, counts.data(), dtype::i64},
            {"c.mask", {3}, mask.data(), dtype::u8},
            {"d.scalar", {}, &scalar, dtype::f32},
            {"e.empty", {0, 5}, nullptr, dtype::f32}};
  }
  sample_tensors() {
    uint32_t nan_bits = 0x7fc12345u;  // a NaN with a payload: must survive bit for bit
    std::memcpy(&w[5], &nan_bits, 4);
  }
};

}  // namespace

TEST_CASE("safetensors: round trip is bit-exact, with metadata") {
  temp_dir dir;
  const std::string path = dir.file("m.safetensors");
  const sample_tensors s;
  const cohort::metadata_map meta{{"step", "12"}, {"note", "line\nbreak \"quoted\" \xc3\xa9"}};
  cohort::write_safetensors(path, s.views(), meta);

  const auto f = safetensors_file::read(path);
  CHECK(f.metadata().at("step") == "12");
  CHECK(f.metadata().at("note") == meta.at("note"));
  CHECK(f.metadata().at("sha256").size() == 64);
  CHECK(f.metadata().size() == 3);
  REQUIRE(f.tensors().size() == 5);

  std::vector<float> w(6, 9.0f);
  std::vector<int64_t> counts(4);
  std::vector<uint8_t> mask(3);
  float scalar = 0;
  f.copy_into({{"b.weight", {2, 3}, w.data(), dtype::f32},
               {"a.counts", {4}, counts.data(), dtype::i64},
               {"c.mask", {3}, mask.data(), dtype::u8},
               {"d.scalar", {}, &scalar, dtype::f32},
               {"e.empty", {0, 5}, nullptr, dtype::f32}},
              /*exact=*/true);
  CHECK(std::memcmp(w.data(), s.w.data(), w.size() * 4) == 0);
  CHECK(counts == s.counts);
  CHECK(mask == s.mask);
  CHECK(scalar == 0.125f);
  CHECK(std::signbit(w[1]));
}

TEST_CASE("safetensors: the byte layout, read back independently") {
  temp_dir dir;
  const std::string path = dir.file("m.safetensors");
  const sample_tensors s;
  cohort::write_safetensors(path, s.views(), {{"k", "v"}});
  const std::string bytes = read_all(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  CHECK((8 + n) % 8 == 0);  // data section aligned
  const json h = json::parse(bytes.substr(8, n));
  const std::string data = bytes.substr(8 + n);
  // Name order, contiguous from 0: a.counts (32), b.weight (24), c.mask (3), d.scalar (4), e.empty.
  CHECK(h["a.counts"]["dtype"] == "I64");
  CHECK(h["a.counts"]["shape"] == json::array({4}));
  CHECK(h["a.counts"]["data_offsets"] == json::array({0, 32}));
  CHECK(h["b.weight"]["data_offsets"] == json::array({32, 56}));
  CHECK(h["b.weight"]["shape"] == json::array({2, 3}));
  CHECK(h["c.mask"]["data_offsets"] == json::array({56, 59}));
  CHECK(h["d.scalar"]["shape"] == json::array());
  CHECK(h["d.scalar"]["data_offsets"] == json::array({59, 63}));
  CHECK(h["e.empty"]["data_offsets"] == json::array({63, 63}));
  CHECK(data.size() == 63);
  CHECK(std::memcmp(data.data(), s.counts.data(), 32) == 0);
  CHECK(std::memcmp(data.data() + 32, s.w.data(), 24) == 0);
  CHECK(h["__metadata__"]["k"] == "v");
  CHECK(h["__metadata__"]["sha256"] == cohort::sha256_hex(data));
}

TEST_CASE("safetensors: every truncation of a small file is refused") {
  temp_dir dir;
  const std::string path = dir.file("m.safetensors");
  const sample_tensors s;
  cohort::write_safetensors(path, s.views(), {{"k", "v"}});
  const std::string whole = read_all(path);
  const std::string cut = dir.file("cut.safetensors");
  int refused = 0;
  for (size_t len = 0; len < whole.size(); ++len) {
    replace_file(cut, whole.substr(0, len));
    const std::string msg = error_of([&] { safetensors_file::read(cut); });
    refused += msg.find(cut) != std::string::npos;
  }
  CHECK(refused == static_cast<int>(whole.size()));
  replace_file(cut, whole + "x");  // one byte too many
  CHECK(error_of([&] { safetensors_file::read(cut); }).find("trailing") != std::string::npos);
}

TEST_CASE("safetensors: a flipped data byte fails the checksum - header damage never crashes") {
  temp_dir dir;
  const std::string path = dir.file("m.safetensors");
  const sample_tensors s;
  cohort::write_safetensors(path, s.views(), {{"k", "v"}});
  const std::string whole = read_all(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(whole[i]);
  const std::string bad = dir.file("bad.safetensors");
  int checksum_errors = 0;
  for (size_t i = 8 + n; i < whole.size(); ++i) {
    std::string b = whole;
    b[i] = static_cast<char>(b[i] ^ 0x01);
    replace_file(bad, b);
    checksum_errors +=
        error_of([&] { safetensors_file::read(bad); }).find("checksum") != std::string::npos;
  }
  CHECK(checksum_errors == static_cast<int>(whole.size() - 8 - n));

  // Every byte of the length and the header, three different flips: the result is either a
  // valid file (a renamed tensor, say) or a checkpoint_error; anything else fails the test.
  int errors = 0, accepted = 0;
  for (size_t i = 0; i < 8 + n; ++i) {
    for (int mask : {0x01, 0x20, 0x80}) {
      std::string b = whole;
      b[i] = static_cast<char>(b[i] ^ mask);
      replace_file(bad, b);
      try {
        safetensors_file::read(bad);
        ++accepted;
      } catch (const checkpoint_error&) {
        ++errors;
      }
    }
  }
  CHECK(errors + accepted == static_cast<int>(3 * (8 + n)));
  CHECK(errors > accepted);
}

TEST_CASE("safetensors: broken headers are named precisely") {
  temp_dir dir;
  const std::string path = dir.file("h.safetensors");
  const std::string data(8, '\x11');
  auto read_err = [&] { return error_of([&] { safetensors_file::read(path); }); };
  auto has = [](const std::string& msg, const std::string& part) {
    INFO("message: " << msg);
    CHECK(msg.find(part) != std::string::npos);
  };

  SUBCASE("corrupt JSON") {
    craft(path, "{\"a\": {\"dtype\": \"F32\", ", data);
    has(read_err(), "not valid JSON");
  }
  SUBCASE("header length larger than the file") {
    write_all(path, le64(1000) + "{}");
    has(read_err(), "larger than");
  }
  SUBCASE("huge header length") {
    write_all(path, le64(uint64_t{1} << 63) + "{}");
    has(read_err(), "exceeds the limit");
  }
  SUBCASE("header is not an object") {
    craft(path, "[1, 2]", "");
    has(read_err(), "not a JSON object");
  }
  SUBCASE("deep nesting") {
    craft(path, "{\"a\": " + std::string(10000, '[') + std::string(10000, ']') + "}", "");
    has(read_err(), "deeper");
  }
  SUBCASE("duplicate tensor") {
    const std::string t = R"({"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
    craft(path, "{\"a\":" + t + ",\"a\":" + t + "}", data.substr(0, 4));
    has(read_err(), "twice");
  }
  SUBCASE("unsupported dtype") {
    craft(path,
          header_with_checksum(
              {{"a", {{"dtype", "F8_E4M3"}, {"shape", {8}}, {"data_offsets", {0, 8}}}}}, data),
          data);
    has(read_err(), "unsupported dtype 'F8_E4M3'");
  }
  SUBCASE("negative dimension") {
    craft(path,
          header_with_checksum(
              {{"a", {{"dtype", "U8"}, {"shape", {-8}}, {"data_offsets", {0, 8}}}}}, data),
          data);
    has(read_err(), "invalid dimension -8");
  }
  SUBCASE("fractional dimension") {
    craft(path,
          header_with_checksum(
              {{"a", {{"dtype", "U8"}, {"shape", {8.0}}, {"data_offsets", {0, 8}}}}}, data),
          data);
    has(read_err(), "invalid dimension");
  }
  SUBCASE("shape product overflows") {
    const uint64_t big = uint64_t{1} << 62;
    craft(
        path,
        header_with_checksum(
            {{"a", {{"dtype", "F32"}, {"shape", {big, big, 4}}, {"data_offsets", {0, 8}}}}}, data),
        data);
    has(read_err(), "overflows");
  }
  SUBCASE("huge shape that multiplies to zero still must match its offsets") {
    // A zero anywhere makes the tensor empty, wherever the huge dimensions stand: a size
    // multiplied left to right would overflow on the huge ones before reaching the zero.
    const uint64_t big = uint64_t{1} << 62;
    const std::vector<std::vector<uint64_t>> shapes = {
        {big, 0}, {0, big}, {big, 0, big}, {big, big, 0}};
    for (const auto& shape : shapes) {
      INFO("shape " << json(shape).dump());
      craft(path,
            header_with_checksum(
                {{"a", {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {0, 8}}}}}, data),
            data);
      has(read_err(), "needs 0 bytes");
      // The same shape with offsets [0, 0] is a valid empty tensor.
      craft(path,
            header_with_checksum(
                {{"a", {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {0, 0}}}}}, ""),
            "");
      const safetensors_file f = safetensors_file::read(path);
      REQUIRE(f.find("a") != nullptr);
      CHECK(f.find("a")->shape == std::vector<int64_t>(shape.begin(), shape.end()));
      CHECK(f.find("a")->end == f.find("a")->begin);
    }
  }
  SUBCASE("size does not match the shape") {
    craft(path,
          header_with_checksum(
              {{"a", {{"dtype", "F32"}, {"shape", {3}}, {"data_offsets", {0, 8}}}}}, data),
          data);
    has(read_err(), "needs 12 bytes");
  }
  SUBCASE("offsets reversed") {
    craft(path,
          header_with_checksum({{"a", {{"dtype", "U8"}, {"shape", {0}}, {"data_offsets", {8, 0}}}}},
                               data),
          data);
    has(read_err(), "data_offsets [8, 0]");
  }
  SUBCASE("offsets beyond the file") {
    craft(path,
          header_with_checksum(
              {{"a", {{"dtype", "U8"}, {"shape", {16}}, {"data_offsets", {0, 16}}}}}, data),
          data);
    has(read_err(), "truncated");
  }
  SUBCASE("overlapping tensors") {
    craft(path,
          header_with_checksum({{"a", {{"dtype", "U8"}, {"shape", {8}}, {"data_offsets", {0, 8}}}},
                                {"b", {{"dtype", "U8"}, {"shape", {4}}, {"data_offsets", {4, 8}}}}},
                               data),
          data);
    has(read_err(), "overlaps");
  }
  SUBCASE("gap between tensors") {
    craft(path,
          header_with_checksum({{"a", {{"dtype", "U8"}, {"shape", {2}}, {"data_offsets", {0, 2}}}},
                                {"b", {{"dtype", "U8"}, {"shape", {4}}, {"data_offsets", {4, 8}}}}},
                               data),
          data);
    has(read_err(), "gap");
  }
  SUBCASE("unknown field") {
    craft(path,
          header_with_checksum(
              {{"a", {{"dtype", "U8"}, {"shape", {8}}, {"data_offsets", {0, 8}}, {"x", 1}}}}, data),
          data);
    has(read_err(), "unknown field 'x'");
  }
  SUBCASE("metadata value not a string") {
    craft(path, R"({"__metadata__":{"step":3}})", "");
    has(read_err(), "'step' is not a string");
  }
  SUBCASE("no checksum") {
    craft(path, R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})", data);
    has(read_err(), "no sha256");
    // Accepted when the caller allows files of other writers.
    cohort::read_options lax;
    lax.require_checksum = false;
    CHECK(safetensors_file::read(path, lax).tensors().size() == 1);
  }
  SUBCASE("missing file") { has(read_err(), "cannot open"); }
}

TEST_CASE("safetensors: expectations are checked before anything is copied") {
  temp_dir dir;
  const std::string path = dir.file("m.safetensors");
  const sample_tensors s;
  cohort::write_safetensors(path, s.views());
  std::vector<float> w(6, 42.0f);
  std::vector<int64_t> counts(4, 42);
  auto untouched = [&] {
    for (float v : w) CHECK(v == 42.0f);
    for (int64_t v : counts) CHECK(v == 42);
  };
  // a.counts comes first in the file and matches; b.weight is wrong in each case.
  auto try_load = [&](tensor_target bad, bool exact = false) {
    return error_of([&] {
      cohort::load_safetensors(path, {{"a.counts", {4}, counts.data(), dtype::i64}, bad}, exact);
    });
  };
  std::string msg = try_load({"b.weight", {3, 2}, w.data(), dtype::f32});
  CHECK(msg.find("'b.weight' has shape [2, 3], expected [3, 2]") != std::string::npos);
  CHECK(msg.find(path) != std::string::npos);
  untouched();
  msg = try_load({"b.weight", {2, 3}, w.data(), dtype::i32});
  CHECK(msg.find("'b.weight' is F32, expected I32") != std::string::npos);
  untouched();
  msg = try_load({"b.weights", {2, 3}, w.data(), dtype::f32});
  CHECK(msg.find("'b.weights' is missing") != std::string::npos);
  untouched();
  msg = try_load({"b.weight", {2, 3}, w.data(), dtype::f32}, /*exact=*/true);
  CHECK(msg.find("unexpected tensor 'c.mask'") != std::string::npos);
  untouched();
  // Without `exact`, a subset loads.
  cohort::load_safetensors(path, {{"b.weight", {2, 3}, w.data(), dtype::f32}});
  CHECK(w[0] == 1.5f);
}

TEST_CASE("safetensors: the writer refuses bad input before touching the file") {
  temp_dir dir;
  const std::string path = dir.file("m.safetensors");
  float x[2] = {1, 2};
  CHECK(error_of([&] {
          cohort::write_safetensors(path, {{"a", {2}, x, dtype::f32}, {"a", {2}, x, dtype::f32}});
        }).find("twice") != std::string::npos);
  CHECK(error_of([&] {
          cohort::write_safetensors(path, {{"a", {2}, x}}, {{"sha256", "x"}});
        }).find("reserved") != std::string::npos);
  CHECK(error_of([&] {
          cohort::write_safetensors(path, {{"a", {2}, nullptr}});
        }).find("no data") != std::string::npos);
  CHECK(error_of([&] {
          cohort::write_safetensors(path, {{"a", {-2}, x}});
        }).find("invalid shape") != std::string::npos);
  CHECK(error_of([&] {
          cohort::write_safetensors(path, {{"", {2}, x}});
        }).find("invalid tensor name") != std::string::npos);
  CHECK_FALSE(fs::exists(path));
  CHECK(fs::is_empty(dir.path()));
}

TEST_CASE("safetensors: a failed write keeps the old file and leaves no temporary") {
  temp_dir dir;
  const std::string path = dir.file("m.safetensors");
  const sample_tensors s;
  cohort::write_safetensors(path, s.views(), {{"version", "old"}});
  const std::string before = read_all(path);

  SUBCASE("the disk refuses the bytes (file size limit)") {
    std::vector<float> big(1 << 16, 1.0f);  // 256 KiB > the 64 KiB limit below
    auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
    rlimit old{};
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
    rlimit small = old;
    small.rlim_cur = 64 << 10;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
    const std::string msg = error_of([&] {
      cohort::write_safetensors(path, {{"w", {1 << 16}, big.data()}}, {{"version", "new"}});
    });
    ::setrlimit(RLIMIT_FSIZE, &old);
    std::signal(SIGXFSZ, old_handler);
    CHECK(msg.find(path) != std::string::npos);
    CHECK(msg.find("File too large") != std::string::npos);
  }
  SUBCASE("the target cannot be replaced (it became a folder)") {
    const std::string folder = dir.file("f.safetensors");
    fs::create_directories(fs::path(folder) / "inside");
    const std::string msg = error_of([&] { cohort::write_safetensors(folder, s.views()); });
    CHECK(msg.find("rename") != std::string::npos);
    CHECK(fs::is_directory(folder));
  }
  SUBCASE("the folder does not exist") {
    const std::string msg =
        error_of([&] { cohort::write_safetensors(dir.file("no/such/m.safetensors"), s.views()); });
    CHECK(msg.find("cannot create") != std::string::npos);
  }
  CHECK(read_all(path) == before);
  CHECK(safetensors_file::read(path).metadata().at("version") == "old");
  for (const auto& e : fs::directory_iterator(dir.path()))
    CHECK(e.path().filename().string().find(".tmp.") == std::string::npos);
}

TEST_CASE("safetensors: read_header skips the data") {
  temp_dir dir;
  const std::string path = dir.file("m.safetensors");
  const sample_tensors s;
  cohort::write_safetensors(path, s.views(), {{"k", "v"}});
  std::string b = read_all(path);
  b.back() = static_cast<char>(b.back() ^ 1);  // damage data only
  write_all(path, b);
  const auto h = safetensors_file::read_header(path);
  CHECK(h.metadata().at("k") == "v");
  REQUIRE(h.find("b.weight") != nullptr);
  CHECK(h.find("b.weight")->shape == std::vector<int64_t>{2, 3});
  CHECK(h.find("nope") == nullptr);
  CHECK(error_of([&] { safetensors_file::read(path); }).find("checksum") != std::string::npos);
}
