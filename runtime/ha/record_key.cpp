// Sealing the run's records. The MAC's input is a fixed label, the key name's length and
// the key name, then the value: no (name, value) pair shares its input with another.
#include "runtime/ha/record_key.hpp"

#include <fcntl.h>
#include <openssl/rand.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "runtime/core/error.hpp"
#include "runtime/core/sha256.hpp"

namespace cohort::ha {

namespace {

constexpr const char* magic = "cohort-rec-v1 ";
constexpr std::size_t mac_hex = 64;
constexpr std::size_t min_secret = 32;

std::string from_hex(const std::string& text) {
  std::string out;
  if (text.size() % 2 != 0) return out;
  for (std::size_t i = 0; i < text.size(); i += 2) {
    auto nib = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      return -1;
    };
    const int hi = nib(text[i]), lo = nib(text[i + 1]);
    if (hi < 0 || lo < 0) return {};
    out += static_cast<char>(hi << 4 | lo);
  }
  return out;
}

}  // namespace

record_key::record_key(std::string secret) : secret_(std::move(secret)) {
  if (secret_.size() < min_secret)
    throw usage_error("the run's record key has " + std::to_string(secret_.size()) +
                      " bytes; it needs at least " + std::to_string(min_secret));
}

record_key record_key::from_coordinator_secret(const std::string& secret_z85) {
  if (secret_z85.empty())
    throw usage_error("no coordinator secret key to derive the run's record key from");
  // HMAC as a key derivation (HKDF's extract step): the record key reveals nothing of the
  // CURVE secret, and is the same in every candidate that holds it.
  return record_key(from_hex(hmac_sha256_hex(secret_z85, "cohort etcd record key v1")));
}

record_key record_key::load(const std::string& file) {
  const std::string fix =
      "; write one with `cohort launch` (it makes one per run) or "
      "`head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n' > FILE; "
      "chmod 600 FILE`";
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0)
    throw usage_error("record key " + file + ": " + std::strerror(errno) + fix);
  if ((st.st_mode & 077) != 0)
    throw usage_error("record key " + file + " is readable by group or others: chmod 600 " + file);
  std::ifstream in(file);
  std::string text;
  std::getline(in, text);
  while (!text.empty() && (text.back() == '\r' || text.back() == ' ')) text.pop_back();
  const std::string secret = from_hex(text);
  if (secret.size() < min_secret)
    throw usage_error("record key " + file + " is not " + std::to_string(2 * min_secret) +
                      "+ lowercase hex characters on its first line" + fix);
  return record_key(secret);
}

void record_key::write_new(const std::string& file) {
  unsigned char bytes[min_secret];
  if (RAND_bytes(bytes, sizeof bytes) != 1)
    throw io_error("record key " + file + ": OpenSSL has no random bytes to give");
  static const char* hex = "0123456789abcdef";
  std::string text;
  for (unsigned char b : bytes) {
    text += hex[b >> 4];
    text += hex[b & 15];
  }
  text += '\n';
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0)
    throw usage_error("record key " + file + ": cannot create it: " + std::strerror(errno) +
                      (errno == EEXIST ? " (never overwritten: remove it, or use it)" : ""));
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
                  ::fsync(fd) == 0;
  ::close(fd);
  if (!ok) {
    ::unlink(file.c_str());
    throw io_error("record key " + file + ": write failed; check the disk");
  }
}

std::string record_key::mac(const std::string& name, const std::string& value) const {
  std::string input = "cohort etcd record v1\n" + std::to_string(name.size()) + "\n";
  input += name;
  input += value;
  return hmac_sha256_hex(secret_, input);
}

std::string record_key::seal(const std::string& name, const std::string& value) const {
  return magic + mac(name, value) + " " + value;
}

opened_record record_key::open(const std::string& name, const std::string& record) const {
  const std::size_t head = std::strlen(magic);
  if (record.compare(0, head, magic) != 0 || record.size() < head + mac_hex + 1 ||
      record[head + mac_hex] != ' ')
    return {std::nullopt, "not a sealed record (written by something that is not this run)"};
  const std::string value = record.substr(head + mac_hex + 1);
  if (!equal_secret(record.substr(head, mac_hex), mac(name, value)))
    return {std::nullopt,
            "its seal does not hold (written without the run's record key, or "
            "for another key)"};
  return {value, {}};
}

void refusal_log::refuse(const char* who, const std::string& key, long long revision,
                         const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = seen_.find(key);
  if (it != seen_.end() && it->second == revision) return;
  if (seen_.size() >= 4096 && it == seen_.end()) seen_.clear();  // bounded under a flood
  seen_[key] = revision;
  const auto line = limiter_.admit();
  if (!line) return;
  ++logged_;
  spdlog::warn("{}: ignoring etcd key {} (revision {}): {}{}", who, log_quoted(key, 200), revision, why,
               log_limiter::suffix(*line, "refused records"));
}

long long refusal_log::logged() const {
  std::lock_guard<std::mutex> lock(mu_);
  return logged_;
}

}  // namespace cohort::ha
