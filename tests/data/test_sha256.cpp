// SHA-256 against the FIPS 180-2 test vectors, incremental vs one-shot; HMAC-SHA256 against
// RFC 4231's.
#include <doctest/doctest.h>

#include <string>

#include "runtime/core/sha256.hpp"

using cohort::equal_secret;
using cohort::hmac_sha256_hex;
using cohort::sha256;
using cohort::sha256_hex;

TEST_CASE("sha256: FIPS 180-2 vectors") {
  CHECK(sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  const std::string million(1000000, 'a');
  CHECK(sha256_hex(million) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("sha256: incremental equals one-shot, digest does not end the stream") {
  const std::string text = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    sha256 h;
    h.update(text.substr(0, cut));
    const std::string partial = h.hex_digest();
    CHECK(partial == sha256_hex(text.substr(0, cut)));
    h.update(text.substr(cut));
    CHECK(h.hex_digest() == "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  }
  sha256 empty;
  empty.update(nullptr, 0);
  CHECK(empty.hex_digest() == sha256_hex(""));
}

TEST_CASE("sha256: move keeps the state") {
  sha256 a;
  a.update("ab");
  sha256 b(std::move(a));
  b.update("c");
  CHECK(b.hex_digest() == sha256_hex("abc"));
  sha256 c;
  c = std::move(b);
  CHECK(c.hex_digest() == sha256_hex("abc"));
  const auto raw = c.digest();
  CHECK(raw[0] == 0xba);
  CHECK(raw[31] == 0xad);
}

TEST_CASE("hmac-sha256: RFC 4231 vectors") {
  // Test case 1: a 20-byte key of 0x0b.
  CHECK(hmac_sha256_hex(std::string(20, '\x0b'), "Hi There") ==
        "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  // Test case 2: a key shorter than the output.
  CHECK(hmac_sha256_hex("Jefe", "what do ya want for nothing?") ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // Test case 6: a key longer than the block, hashed first.
  CHECK(hmac_sha256_hex(std::string(131, '\xaa'),
                        "Test Using Larger Than Block-Size Key - Hash Key First") ==
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

TEST_CASE("equal_secret: equal bytes only, any length") {
  CHECK(equal_secret("", ""));
  CHECK(equal_secret("abc", "abc"));
  CHECK_FALSE(equal_secret("abc", "abd"));
  CHECK_FALSE(equal_secret("abc", "ab"));
  CHECK_FALSE(equal_secret("", "a"));
}
