// SHA-256 over OpenSSL's EVP interface: an incremental hasher, one-shot helpers, HMAC-SHA256
// and a constant-time comparison.
// Owns hashing only; what is hashed (config text, checkpoint data) is the caller's concern.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

struct evp_md_ctx_st;  // OpenSSL's EVP_MD_CTX, kept out of this header

namespace cohort {

/// Incremental SHA-256. update() any number of times; digest() may be taken at any point
/// and does not end the stream (it finalises a copy), so hashing can continue after it.
class sha256 {
 public:
  sha256();
  ~sha256();
  sha256(sha256&& other) noexcept;
  sha256& operator=(sha256&& other) noexcept;
  sha256(const sha256&) = delete;
  sha256& operator=(const sha256&) = delete;

  /// Feeds `size` bytes at `data` (data may be null when size is 0).
  void update(const void* data, size_t size);
  /// Feeds the bytes of `text`.
  void update(std::string_view text) { update(text.data(), text.size()); }
  /// The 32-byte digest of everything fed so far.
  std::array<uint8_t, 32> digest() const;
  /// The digest as 64 lowercase hex characters.
  std::string hex_digest() const;

 private:
  evp_md_ctx_st* ctx_ = nullptr;
};

/// SHA-256 of `size` bytes as 64 lowercase hex characters.
std::string sha256_hex(const void* data, size_t size);
/// SHA-256 of `text` as 64 lowercase hex characters.
std::string sha256_hex(std::string_view text);
/// HMAC-SHA256 (RFC 2104) of `message` under `key`, as 64 lowercase hex characters.
std::string hmac_sha256_hex(std::string_view key, std::string_view message);
/// Whether `a` and `b` are equal, in a time that depends on their lengths only (for
/// comparing secrets such as an HMAC a peer presents).
bool equal_secret(std::string_view a, std::string_view b);

}  // namespace cohort
