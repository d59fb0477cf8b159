#include "runtime/core/sha256.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "runtime/core/error.hpp"

namespace cohort {

namespace {

std::string to_hex(const unsigned char* d, size_t n) {
  static const char* const hex = "0123456789abcdef";
  std::string s(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    s[2 * i] = hex[d[i] >> 4];
    s[2 * i + 1] = hex[d[i] & 15];
  }
  return s;
}

}  // namespace

sha256::sha256() : ctx_(EVP_MD_CTX_new()) {
  // Allocation or init failure in libcrypto means the process is out of memory or
  // libcrypto is broken: neither is a condition a caller can act on.
  COHORT_CHECK(ctx_ != nullptr);
  COHORT_CHECK(EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr) == 1);
}

sha256::~sha256() { EVP_MD_CTX_free(ctx_); }

sha256::sha256(sha256&& other) noexcept : ctx_(other.ctx_) { other.ctx_ = nullptr; }

sha256& sha256::operator=(sha256&& other) noexcept {
  if (this != &other) {
    EVP_MD_CTX_free(ctx_);
    ctx_ = other.ctx_;
    other.ctx_ = nullptr;
  }
  return *this;
}

void sha256::update(const void* data, size_t size) {
  COHORT_CHECK(ctx_ != nullptr);  // use after move
  if (size == 0) return;
  COHORT_CHECK(EVP_DigestUpdate(ctx_, data, size) == 1);
}

std::array<uint8_t, 32> sha256::digest() const {
  COHORT_CHECK(ctx_ != nullptr);
  // Finalise a copy so the caller may keep feeding this hasher.
  EVP_MD_CTX* copy = EVP_MD_CTX_new();
  COHORT_CHECK(copy != nullptr);
  COHORT_CHECK(EVP_MD_CTX_copy_ex(copy, ctx_) == 1);
  std::array<uint8_t, 32> out{};
  unsigned int len = 0;
  const int ok = EVP_DigestFinal_ex(copy, out.data(), &len);
  EVP_MD_CTX_free(copy);
  COHORT_CHECK(ok == 1 && len == out.size());
  return out;
}

std::string sha256::hex_digest() const {
  const auto d = digest();
  return to_hex(d.data(), d.size());
}

std::string sha256_hex(const void* data, size_t size) {
  sha256 h;
  h.update(data, size);
  return h.hex_digest();
}

std::string sha256_hex(std::string_view text) { return sha256_hex(text.data(), text.size()); }

std::string hmac_sha256_hex(std::string_view key, std::string_view message) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  COHORT_CHECK(HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
                    reinterpret_cast<const unsigned char*>(message.data()), message.size(), out,
                    &len) != nullptr);
  COHORT_CHECK(len == 32);
  return to_hex(out, len);
}

bool equal_secret(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace cohort
