// The decoded-data cache (runtime/data/decoded_cache.hpp): a second load reads the cached
// form, a changed source is decoded again, a corrupt, truncated or foreign cached file and a
// folder others can write are never used, the cache folder's default, and Fashion-MNIST gives
// the same bytes through the cache as without it.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <zlib.h>

#include <cstdlib>
#include <algorithm>
#include <filesystem>
#include <optional>
#include <string>

#include "fixtures.hpp"
#include "idx_files.hpp"
#include "runtime/data/decoded_cache.hpp"
#include "tests/ckpt/env_guard.hpp"

using cohort::cached_idx;
using cohort::cached_idx_path;
using cohort::data_cache_dir;
using cohort::fashion_mnist;
using cohort::read_idx_cached;
using cohort::test::be32;
using cohort::test::env_guard;
using cohort::test::read_all;
using cohort::test::temp_dir;
using cohort::test::write_all;
using cohort::test::write_gz;
namespace fs = std::filesystem;

namespace {

std::string text(const cached_idx& f) { return std::string(f.data.begin(), f.data.end()); }

// A 2x2x3 IDX file of "abcdefghijkl" at DIR/src/ok.gz; its path.
std::string source(const temp_dir& dir, const std::string& payload = "abcdefghijkl") {
  fs::create_directories(dir.path() / "src");
  const std::string path = dir.file("src/ok.gz");
  write_gz(path, be32(0x803) + be32(2) + be32(2) + be32(3) + payload);
  return path;
}

// Replaces the cached payload of FILE (its last 12 bytes) with PAYLOAD, the CRC fixed up
// (the 4 bytes before it) when FIX_CRC: a cached file that differs from the source while
// every check holds, so that what a load returns shows where it came from.
void rewrite_payload(const std::string& file, const std::string& payload, bool fix_crc) {
  std::string bytes = read_all(file);
  REQUIRE(bytes.size() > payload.size() + 4);
  bytes.replace(bytes.size() - payload.size(), payload.size(), payload);
  if (fix_crc) {
    uLong crc = crc32(0L, Z_NULL, 0);
    crc = crc32(crc, reinterpret_cast<const Bytef*>(payload.data()),
                static_cast<uInt>(payload.size()));
    const auto c = static_cast<uint32_t>(crc);
    bytes.replace(bytes.size() - payload.size() - 4, 4, reinterpret_cast<const char*>(&c), 4);
  }
  write_all(file, bytes);
}

// A source file and its cache folder, the source read once through it (so cached).
struct cached_source {
  temp_dir dir;
  std::string path = source(dir);
  std::string cache = dir.file("cache");
  std::string file = cached_idx_path(cache, path);
  cached_source() { read_idx_cached(path, 3, cache, 0); }
};

}  // namespace

TEST_CASE("decoded cache: the second load reads the cached form, written private and whole") {
  temp_dir dir;
  const std::string path = source(dir);
  const std::string cache = dir.file("cache");
  const std::string file = cached_idx_path(cache, path);
  CHECK_FALSE(fs::exists(file));
  const cached_idx a = read_idx_cached(path, 3, cache, 0);
  CHECK(a.dims == std::vector<int64_t>{2, 2, 3});
  CHECK(text(a) == "abcdefghijkl");
  REQUIRE(fs::exists(file));
  struct stat st{};
  REQUIRE(::stat(file.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  // Nothing but the cached file is left in the folder (no temporary file).
  int entries = 0;
  for (const auto& e : fs::directory_iterator(fs::path(file).parent_path())) {
    (void)e;
    ++entries;
  }
  CHECK(entries == 1);
  // A cached payload that differs from the source with every check holding is what the
  // next load returns: it read the cache, not the source.
  rewrite_payload(file, "ABCDEFGHIJKL", true);
  const cached_idx b = read_idx_cached(path, 3, cache, 0);
  CHECK(text(b) == "ABCDEFGHIJKL");
  CHECK(b.dims == std::vector<int64_t>{2, 2, 3});
}

TEST_CASE("decoded cache: a changed source is decoded again and cached anew") {
  const cached_source c;
  // A new file at the same path (another inode, size or time): its own bytes.
  fs::remove(c.path);
  source(c.dir, "mnopqrstuvwx");
  CHECK(text(read_idx_cached(c.path, 3, c.cache, 0)) == "mnopqrstuvwx");
  rewrite_payload(c.file, "MNOPQRSTUVWX", true);
  CHECK(text(read_idx_cached(c.path, 3, c.cache, 0)) == "MNOPQRSTUVWX");  // the new one is cached
}

TEST_CASE("decoded cache: a corrupt, truncated or foreign cached file is never used") {
  const cached_source c;
  SUBCASE("a payload byte flipped (CRC-32 no longer holds)") {
    rewrite_payload(c.file, "abcdefghijkX", false);
  }
  SUBCASE("cut short") {
    const std::string bytes = read_all(c.file);
    write_all(c.file, bytes.substr(0, bytes.size() - 5));
  }
  SUBCASE("cut inside its header") { write_all(c.file, read_all(c.file).substr(0, 30)); }
  SUBCASE("not a cached c.file at all") { write_all(c.file, "hello"); }
  SUBCASE("another shape (its dims say 4x3 where the source is 2x2x3)") {
    std::string bytes = read_all(c.file);
    // dims start after the magic (21), the identity (32) and the dimension count (4).
    const int64_t four = 4;
    bytes.replace(21 + 32 + 4, 8, reinterpret_cast<const char*>(&four), 8);
    write_all(c.file, bytes);
  }
  const cached_idx f = read_idx_cached(c.path, 3, c.cache, 0);
  CHECK(text(f) == "abcdefghijkl");
  CHECK(f.dims == std::vector<int64_t>{2, 2, 3});
  // Written again whole: the next load reads it (proved as above).
  rewrite_payload(c.file, "ABCDEFGHIJKL", true);
  CHECK(text(read_idx_cached(c.path, 3, c.cache, 0)) == "ABCDEFGHIJKL");
}

TEST_CASE("decoded cache: a folder others can write is not used, and no cache is no c.file") {
  const cached_source c;
  rewrite_payload(c.file, "ABCDEFGHIJKL", true);  // what a stranger would plant
  fs::permissions(fs::path(c.file).parent_path(), fs::perms::all);
  CHECK(text(read_idx_cached(c.path, 3, c.cache, 0)) == "abcdefghijkl");
  // Without a cache folder nothing is written anywhere; below the size floor neither.
  temp_dir other;
  const std::string p2 = source(other);
  CHECK(text(read_idx_cached(p2, 3, "", 0)) == "abcdefghijkl");
  CHECK(text(read_idx_cached(p2, 3, other.file("cache"), 13)) == "abcdefghijkl");
  CHECK_FALSE(fs::exists(cached_idx_path(other.file("cache"), p2)));
}

TEST_CASE("decoded cache: the folder is COHORT_CACHE_DIR, else XDG_CACHE_HOME, else HOME's") {
  const env_guard a("COHORT_CACHE_DIR", std::nullopt), b("XDG_CACHE_HOME", std::nullopt),
      c("HOME", "/home/u");
  CHECK(data_cache_dir() == "/home/u/.cache/cohort");
  {
    const env_guard x("XDG_CACHE_HOME", "/xdg");
    CHECK(data_cache_dir() == "/xdg/cohort");
    const env_guard own("COHORT_CACHE_DIR", "/mine");
    CHECK(data_cache_dir() == "/mine");
  }
  const env_guard off("COHORT_CACHE_DIR", "none");
  CHECK(data_cache_dir().empty());
}

TEST_CASE("decoded cache: Fashion-MNIST through the cache gives the same bytes as without") {
  temp_dir dir;
  const env_guard none("COHORT_CACHE_DIR", "none");
  const fashion_mnist plain(fashion_mnist::default_dir);
  const env_guard own("COHORT_CACHE_DIR", dir.path().string());
  const fashion_mnist first(fashion_mnist::default_dir);   // decodes and writes the cache
  const fashion_mnist second(fashion_mnist::default_dir);  // maps it
  CHECK(fs::exists(cached_idx_path(dir.path().string(),
                                   std::string(fashion_mnist::default_dir) +
                                       "/train-images-idx3-ubyte.gz")));
  for (const fashion_mnist* ds : {&first, &second}) {
    CHECK(std::equal(ds->train_images().begin(), ds->train_images().end(),
                     plain.train_images().begin(), plain.train_images().end()));
    CHECK(std::equal(ds->test_images().begin(), ds->test_images().end(),
                     plain.test_images().begin(), plain.test_images().end()));
    CHECK(ds->train_labels() == plain.train_labels());
  }
}
