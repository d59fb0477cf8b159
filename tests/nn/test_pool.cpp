// The page pool and tensors: reuse of freed runs, coalescing, closed-form statistics,
// accounts inside a parent pool, concurrent use from two threads.
#include <doctest/doctest.h>

#include <cstdint>
#include <thread>
#include <vector>

#include "runtime/nn/pool.hpp"
#include "runtime/nn/tensor.hpp"

using namespace cohort::nn;

TEST_CASE("allocations take ceil(bytes/page) pages and statistics add up") {
  pool p(1024, 8);  // 1 KiB pages, 8-page chunks
  auto s0 = p.stats();
  CHECK(s0.blocks_total == 0);
  CHECK(s0.bytes_in_use == 0);
  CHECK(s0.fragmentation == 0.0);

  allocation a = p.allocate(100);   // 1 page
  allocation b = p.allocate(2048);  // 2 pages
  allocation c = p.allocate(2049);  // 3 pages
  auto s = p.stats();
  CHECK(s.page_bytes == 1024);
  CHECK(s.bytes_in_use == 100 + 2048 + 2049);
  CHECK(s.peak_bytes == s.bytes_in_use);
  CHECK(s.blocks_in_use == 6);
  CHECK(s.blocks_total == 8);
  CHECK(s.blocks_free == 2);
  CHECK(s.largest_free_run == 2);
  CHECK(s.fragmentation == 0.0);
  CHECK(s.allocations == 3);
  CHECK(s.internal_waste_bytes == 6 * 1024 - (100 + 2048 + 2049));
  CHECK(reinterpret_cast<std::uintptr_t>(a.data()) % 1024 == 0);
  CHECK(static_cast<char*>(b.data()) == static_cast<char*>(a.data()) + 1024);
  CHECK(static_cast<char*>(c.data()) == static_cast<char*>(a.data()) + 3 * 1024);

  // Freeing b leaves holes of 2 (b) and 2 (tail): largest run 2 of 4 free pages.
  b.reset();
  s = p.stats();
  CHECK(s.bytes_in_use == 100 + 2049);
  CHECK(s.peak_bytes == 100 + 2048 + 2049);
  CHECK(s.blocks_free == 4);
  CHECK(s.largest_free_run == 2);
  CHECK(s.fragmentation == doctest::Approx(0.5));

  // A 2-page request reuses b's hole (best fit, lowest address) without a new chunk.
  void* b_addr = static_cast<char*>(a.data()) + 1024;
  allocation d = p.allocate(1500);
  CHECK(d.data() == b_addr);
  CHECK(p.stats().blocks_total == 8);

  // A request larger than any hole grabs a new chunk sized for it.
  allocation e = p.allocate(20 * 1024);
  s = p.stats();
  CHECK(s.chunks == 2);
  CHECK(s.blocks_total == 8 + 20);
}

TEST_CASE("an account measures its own allocations inside the parent's pages") {
  pool parent(1024, 8);
  allocation outside = parent.allocate(1000);  // not the account's
  {
    pool acts(pool::account, parent);
    allocation a = acts.allocate(3000);  // 3 pages
    {
      basic_tensor<float> t({500}, acts);  // 2000 bytes, 2 pages
      auto s = acts.stats();
      CHECK(s.bytes_in_use == 5000);
      CHECK(s.peak_bytes == 5000);
      CHECK(s.blocks_in_use == 5);
      CHECK(s.blocks_total == 5);
      CHECK(s.blocks_free == 0);
      CHECK(s.chunks == 0);
      CHECK(s.allocations == 2);
      // The parent holds the pages and counts them with its own.
      CHECK(parent.stats().bytes_in_use == 6000);
      CHECK(parent.stats().blocks_in_use == 6);
    }
    a.reset();
    auto s = acts.stats();
    CHECK(s.bytes_in_use == 0);
    CHECK(s.peak_bytes == 5000);  // the most held at once
    CHECK(s.allocations == 0);
    CHECK(parent.stats().bytes_in_use == 1000);
    CHECK(parent.stats().peak_bytes == 6000);
    // The pages went back to the parent: the same run serves the next request.
    allocation b = acts.allocate(3000);
    CHECK(parent.stats().blocks_total == 8);
    acts.reset_peak();
    CHECK(acts.stats().peak_bytes == 3000);
  }
  CHECK(parent.stats().bytes_in_use == 1000);
}

TEST_CASE("freed neighbours merge back into one run") {
  pool p(4096, 4);
  {
    allocation a = p.allocate(4096), b = p.allocate(4096), c = p.allocate(4096);
    a.reset();
    c.reset();
    CHECK(p.stats().largest_free_run == 2);  // c merged with the free tail page
    b.reset();                               // b joins both sides
  }
  auto s = p.stats();
  CHECK(s.blocks_in_use == 0);
  CHECK(s.largest_free_run == 4);
  CHECK(s.fragmentation == 0.0);
  allocation whole = p.allocate(4 * 4096);
  CHECK(p.stats().chunks == 1);
}

TEST_CASE("runs never merge across chunks") {
  pool p(1024, 2);
  allocation a = p.allocate(2048), b = p.allocate(2048);  // two chunks, each full
  CHECK(p.stats().chunks == 2);
  a.reset();
  b.reset();
  auto s = p.stats();
  CHECK(s.blocks_free == 4);
  CHECK(s.largest_free_run == 2);
  CHECK(s.fragmentation == doctest::Approx(0.5));
}

TEST_CASE("zero-byte allocations get distinct pages - moved allocations free once") {
  pool p(1024, 4);
  allocation a = p.allocate(0), b = p.allocate(0);
  CHECK(a.data() != b.data());
  allocation c = std::move(a);
  CHECK(a.data() == nullptr);
  CHECK(p.stats().blocks_in_use == 2);
  c.reset();
  CHECK(p.stats().blocks_in_use == 1);
}

TEST_CASE("two threads allocating and freeing leave the pool consistent") {
  pool p(1024, 16);
  auto work = [&](int salt) {
    for (int i = 0; i < 2000; ++i) {
      allocation a = p.allocate(static_cast<std::size_t>((i * 7 + salt) % 5000));
      static_cast<char*>(a.data())[0] = 1;
    }
  };
  std::thread t1(work, 1), t2(work, 3);
  t1.join();
  t2.join();
  auto s = p.stats();
  CHECK(s.bytes_in_use == 0);
  CHECK(s.blocks_in_use == 0);
  CHECK(s.allocations == 0);
  CHECK(s.fragmentation == 0.0);  // everything merged back
}

TEST_CASE("tensors: zero-filled, views share storage, pages return when the last view dies") {
  pool p(1024, 8);
  {
    tensor t({3, 100}, p);
    CHECK(t.numel() == 300);
    CHECK(t.bytes() == 1200);
    CHECK(t.shape() == shape_t{3, 100});
    for (int64_t i = 0; i < t.numel(); ++i) REQUIRE(t[i] == 0.0f);
    CHECK(p.stats().blocks_in_use == 2);
    tensor row = t.view(100, {100});
    row.fill(2.0f);
    CHECK(t[100] == 2.0f);
    CHECK(t[99] == 0.0f);
    CHECK(t.reshape({300}).dim(0) == 300);
    t = tensor();
    CHECK(p.stats().blocks_in_use == 2);  // the view still holds the storage
    CHECK(row[5] == 2.0f);
  }
  CHECK(p.stats().blocks_in_use == 0);
  itensor ids({4}, p);
  ids[3] = 7;
  CHECK(ids.data()[3] == 7);
  CHECK(shape_str(ids.shape()) == "[4]");
}
