#include "runtime/core/host_pages.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace cohort {

namespace {

std::uintptr_t page_size() {
  static const std::uintptr_t size = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  return size;
}

// The whole pages inside [a, a + bytes): [first, last), empty when there are none.
void inner_pages(std::uintptr_t a, std::size_t bytes, std::uintptr_t& first,
                 std::uintptr_t& last) {
  const std::uintptr_t ps = page_size();
  first = (a + ps - 1) / ps * ps;
  last = (a + bytes) / ps * ps;
  if (last < first) last = first;
}

}  // namespace

void zero_by_release(void* p, std::size_t bytes) {
  if (bytes == 0) return;
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::uintptr_t first = 0, last = 0;
  inner_pages(a, bytes, first, last);
  if (last == first || madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED) != 0) {
    std::memset(p, 0, bytes);
    return;
  }
  std::memset(p, 0, first - a);
  std::memset(reinterpret_cast<void*>(last), 0, a + bytes - last);
}

void zero_keeping(void* p, std::size_t element_bytes, std::size_t n,
                  const std::vector<std::pair<std::size_t, std::size_t>>& keep) {
  auto* base = static_cast<unsigned char*>(p);
  std::size_t at = 0;
  for (const auto& [b, e] : keep) {
    if (b > at) zero_by_release(base + at * element_bytes, (b - at) * element_bytes);
    if (e > b) std::memset(base + b * element_bytes, 0, (e - b) * element_bytes);
    at = std::max(at, e);
  }
  if (n > at) zero_by_release(base + at * element_bytes, (n - at) * element_bytes);
}

void release_pages(void* p, std::size_t bytes) {
  std::uintptr_t first = 0, last = 0;
  inner_pages(reinterpret_cast<std::uintptr_t>(p), bytes, first, last);
  if (last > first) (void)madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

long long resident_bytes(const void* p, std::size_t bytes) {
  if (bytes == 0) return 0;
  const std::uintptr_t ps = page_size();
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t first = a / ps * ps;
  const std::uintptr_t last = (a + bytes + ps - 1) / ps * ps;
  std::vector<unsigned char> in((last - first) / ps);
  if (mincore(reinterpret_cast<void*>(first), last - first, in.data()) != 0) return -1;
  long long n = 0;
  for (unsigned char c : in) n += (c & 1) ? 1 : 0;
  return n * static_cast<long long>(ps);
}

}  // namespace cohort
