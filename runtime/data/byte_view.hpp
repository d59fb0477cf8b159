// byte_view: read-only bytes shared by whoever holds a copy, whether a vector owns them or a
// read-only file mapping does (runtime/data/decoded_cache.hpp maps cached data sets).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace cohort {

/// Read-only bytes that stay valid while any copy of the view lives: a decoded buffer, or a
/// read-only mapping of a cached file (the page cache then serves every worker of the host).
class byte_view {
 public:
  byte_view() = default;
  explicit byte_view(std::vector<uint8_t> bytes) : size_(bytes.size()) {
    auto owner = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
    bytes_ = std::shared_ptr<const uint8_t>(owner, owner->data());
  }
  byte_view(std::shared_ptr<const uint8_t> bytes, std::size_t size)
      : bytes_(std::move(bytes)), size_(size) {}
  const uint8_t* data() const { return bytes_.get(); }
  std::size_t size() const { return size_; }
  const uint8_t* begin() const { return data(); }
  const uint8_t* end() const { return data() + size_; }
  uint8_t operator[](std::size_t i) const { return bytes_.get()[i]; }

 private:
  std::shared_ptr<const uint8_t> bytes_;
  std::size_t size_ = 0;
};

}  // namespace cohort
