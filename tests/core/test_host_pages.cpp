// runtime/core/host_pages: zeros by giving pages back, dead pages given back, and what is
// in RAM counted by the kernel.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "runtime/core/host_pages.hpp"

namespace {

struct buffer {
  std::size_t bytes;
  char* p;
  explicit buffer(std::size_t n)
      : bytes(n), p(static_cast<char*>(std::aligned_alloc(4096, (n + 4095) / 4096 * 4096))) {}
  ~buffer() { std::free(p); }
};

}  // namespace

TEST_CASE("zero_by_release: every byte reads zero, the inner pages leave RAM, the edges stay") {
  const long ps = sysconf(_SC_PAGESIZE);
  buffer b(static_cast<std::size_t>(64 * ps));
  std::memset(b.p, 0x5a, b.bytes);
  CHECK(cohort::resident_bytes(b.p, b.bytes) == 64 * ps);
  // From the middle of page 1 to the middle of page 40: pages 2..39 go, 1 and 40 are zeroed.
  char* from = b.p + ps + ps / 2;
  const std::size_t n = static_cast<std::size_t>(39 * ps);
  cohort::zero_by_release(from, n);
  for (std::size_t i = 0; i < b.bytes; ++i) {
    const bool inside = b.p + i >= from && b.p + i < from + n;
    if ((b.p[i] == 0) != inside) FAIL_CHECK("byte " << i << " is " << int(b.p[i]));
  }
  // Reading pages 2..39 above mapped the shared zero page; write nothing and count
  // before reading instead: a fresh buffer.
  buffer c(static_cast<std::size_t>(16 * ps));
  std::memset(c.p, 1, c.bytes);
  cohort::zero_by_release(c.p + ps, static_cast<std::size_t>(8 * ps));
  CHECK(cohort::resident_bytes(c.p, c.bytes) == 8 * ps);
  c.p[3 * ps] = 7;  // written again: the page comes back, zero but for what was written
  CHECK(cohort::resident_bytes(c.p, c.bytes) == 9 * ps);
  CHECK(c.p[3 * ps + 1] == 0);
}

TEST_CASE("release_pages gives back only whole pages, a range inside one page keeps it") {
  const long ps = sysconf(_SC_PAGESIZE);
  buffer b(static_cast<std::size_t>(8 * ps));
  std::memset(b.p, 3, b.bytes);
  cohort::release_pages(b.p + 10, static_cast<std::size_t>(ps - 20));
  CHECK(cohort::resident_bytes(b.p, b.bytes) == 8 * ps);
  CHECK(b.p[100] == 3);
  cohort::release_pages(b.p + ps / 2, static_cast<std::size_t>(4 * ps));  // pages 1, 2, 3 go
  CHECK(cohort::resident_bytes(b.p, b.bytes) == 5 * ps);
  CHECK(b.p[ps / 2] == 3);
  CHECK(cohort::resident_bytes(b.p, 0) == 0);
}
