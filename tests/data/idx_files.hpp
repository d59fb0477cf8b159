// Test helper: IDX files written by hand (big-endian header words, gzip-compressed).
#pragma once
#include <doctest/doctest.h>
#include <zlib.h>

#include <cstdint>
#include <string>

namespace cohort::test {

inline std::string be32(uint32_t v) {
  return std::string{static_cast<char>(v >> 24), static_cast<char>(v >> 16),
                     static_cast<char>(v >> 8), static_cast<char>(v)};
}

inline void write_gz(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) ==
          static_cast<int>(bytes.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

}  // namespace cohort::test
