// Host side of gpu/: status values, device discovery on a machine without a GPU (or with
// one), and the device pool's bookkeeping over host chunks. Runs on every machine.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gpu/bounded_call.hpp"
#include "gpu/device.hpp"
#include "gpu/device_pool.hpp"

namespace g = cohort::gpu;

namespace {
// Independent evidence of an NVIDIA driver: its control node exists whenever the kernel
// module is loaded. Without it, CUDA can see no device.
bool nvidia_driver_present() { return std::filesystem::exists("/dev/nvidiactl"); }

g::device_pool::options small_chunks(std::size_t chunk) {
  g::device_pool::options o;
  o.chunk_bytes = chunk;
  o.min_block = 256;
  return o;
}
}  // namespace

TEST_CASE("status strings are distinct and never null") {
  std::set<std::string> seen;
  for (g::status s : {g::status::ok, g::status::no_device, g::status::invalid_argument,
                      g::status::out_of_memory, g::status::cuda_error, g::status::cublas_error}) {
    REQUIRE(g::status_string(s) != nullptr);
    seen.insert(g::status_string(s));
  }
  CHECK(seen.size() == 6);
  CHECK(std::string(g::status_string(g::status::ok)) == "ok");
}

TEST_CASE("set_error keeps a per-thread detail message") {
  CHECK(g::set_error(g::status::cuda_error, "probe from main") == g::status::cuda_error);
  CHECK(std::string(g::last_error_message()) == "CUDA error: probe from main");
  std::string other;
  std::thread([&] {
    other = g::last_error_message();  // a fresh thread has seen no failure
    g::set_error(g::status::out_of_memory, "probe from thread");
  }).join();
  CHECK(other.empty());
  CHECK(std::string(g::last_error_message()) == "CUDA error: probe from main");
}

TEST_CASE("device_count is 0 without a driver or without CUDA, and never crashes") {
  const int n = g::device_count();
  CHECK(n >= 0);
  CHECK(g::device_count() == n);  // stable across calls
  if (!g::cuda_compiled() || !nvidia_driver_present()) CHECK(n == 0);
  if (n == 0) {
    g::device_info info;
    CHECK(g::device_info_of(0, &info) == g::status::no_device);
    CHECK(std::string(g::last_error_message()).find("device_info_of") != std::string::npos);
    CHECK(g::set_device(0) == g::status::no_device);
    void* p = reinterpret_cast<void*>(0x1);
    CHECK(g::device_malloc(&p, 1024) == g::status::no_device);
    CHECK(p == nullptr);
    CHECK(g::device_free(nullptr) == g::status::ok);
  } else {
    for (int i = 0; i < n; ++i) {
      g::device_info info;
      REQUIRE(g::device_info_of(i, &info) == g::status::ok);
      CHECK(info.index == i);
      CHECK(!info.name.empty());
      CHECK(info.total_bytes > 0);
      CHECK(info.free_bytes <= info.total_bytes);
    }
    g::device_info info;
    CHECK(g::device_info_of(n, &info) == g::status::invalid_argument);
  }
  CHECK(g::device_info_of(0, nullptr) == g::status::invalid_argument);
}

TEST_CASE("the thread's stream, pinned memory and asynchronous copies without a device") {
  // The current stream is per thread and starts as the default stream, in every build.
  CHECK(g::current_stream() == nullptr);
  int token = 0;
  g::set_stream(&token);
  CHECK(g::current_stream() == &token);
  void* other = &token;
  std::thread([&] { other = g::current_stream(); }).join();
  CHECK(other == nullptr);
  g::set_stream(nullptr);
  // Argument errors come first, so they read the same with or without a device; zero bytes
  // is a no-op.
  int host = 0;
  CHECK(g::copy_to_device_async(nullptr, &host, 4) == g::status::invalid_argument);
  CHECK(std::string(g::last_error_message()).find("copy_to_device_async: null pointer") !=
        std::string::npos);
  CHECK(g::copy_to_host_async(&host, nullptr, 4) == g::status::invalid_argument);
  CHECK(g::device_copy(nullptr, &host, 4) == g::status::invalid_argument);
  CHECK(g::device_fill_zero_async(nullptr, 4) == g::status::invalid_argument);
  CHECK(g::host_alloc_pinned(nullptr, 4) == g::status::invalid_argument);
  CHECK(g::copy_to_device_async(nullptr, nullptr, 0) == g::status::ok);
  CHECK(g::host_free_pinned(nullptr) == g::status::ok);
  if (g::device_count() > 0) return;  // the device side is test_gpu_kernels' part
  void* p = reinterpret_cast<void*>(0x1);
  CHECK(g::host_alloc_pinned(&p, 1024) == g::status::no_device);
  CHECK(p == nullptr);
  CHECK(std::string(g::last_error_message()).find("no CUDA device") == 0);
  // Non-null pointers that are never dereferenced: without a device nothing is queued.
  void* fake = reinterpret_cast<void*>(0x1000);
  CHECK(g::copy_to_device_async(fake, &host, 4) == g::status::no_device);
  CHECK(g::copy_to_host_async(&host, fake, 4) == g::status::no_device);
  CHECK(g::device_copy(fake, fake, 4) == g::status::no_device);
  CHECK(g::device_fill_zero_async(fake, 4) == g::status::no_device);
  CHECK(g::stream_synchronize() == g::status::no_device);
}

TEST_CASE("block_size_for: classes, alignment and bounded rounding") {
  // Closed-form cases: below 4 * min_block the granule is min_block itself.
  CHECK(g::device_pool::block_size_for(1, 256) == 256);
  CHECK(g::device_pool::block_size_for(256, 256) == 256);
  CHECK(g::device_pool::block_size_for(257, 256) == 512);
  CHECK(g::device_pool::block_size_for(1000, 256) == 1024);
  CHECK(g::device_pool::block_size_for(1025, 256) == 1280);  // granule 1024/4
  CHECK(g::device_pool::block_size_for(1280, 256) == 1280);
  CHECK(g::device_pool::block_size_for(1281, 256) == 1536);
  CHECK(g::device_pool::block_size_for((5u << 20) + 1, 256) == (6u << 20));
  std::size_t prev = 0, violations = 0;
  for (std::size_t b = 1; b < 200000; b += 7) {
    const std::size_t s = g::device_pool::block_size_for(b, 256);
    const bool ok = s >= b && s % 256 == 0 &&
                    s >= prev &&                    // monotone: bigger requests, bigger blocks
                    (b <= 1024 || s * 4 <= b * 5);  // <= 25% rounding above 4 * min_block
    if (!ok && violations++ == 0) MESSAGE("first violation: " << b << " -> " << s);
    prev = s;
  }
  CHECK(violations == 0);
}

TEST_CASE("device_pool over host chunks: carving, reuse and exact stats") {
  g::device_pool pool(g::host_chunks(), small_chunks(1 << 20));
  void* a = nullptr;
  void* b = nullptr;
  void* c = nullptr;
  REQUIRE(pool.allocate(&a, 1000) == g::status::ok);
  REQUIRE(pool.allocate(&b, 1000) == g::status::ok);
  REQUIRE(pool.allocate(&c, 1000) == g::status::ok);
  // Blocks of one class are carved back to back from one chunk.
  CHECK(static_cast<char*>(b) - static_cast<char*>(a) == 1024);
  CHECK(static_cast<char*>(c) - static_cast<char*>(b) == 1024);
  CHECK(reinterpret_cast<std::uintptr_t>(a) % 256 == 0);
  // The memory is real and the blocks do not overlap.
  std::memset(a, 0xA1, 1000);
  std::memset(b, 0xB2, 1000);
  std::memset(c, 0xC3, 1000);
  CHECK(static_cast<unsigned char*>(a)[999] == 0xA1);
  CHECK(static_cast<unsigned char*>(b)[0] == 0xB2);

  g::pool_stats s = pool.stats();
  CHECK(s.bytes_in_use == 3000);
  CHECK(s.block_bytes_in_use == 3072);
  CHECK(s.internal_waste_bytes == 72);
  CHECK(s.peak_bytes == 3000);
  CHECK(s.reserved_bytes == (1u << 20));
  CHECK(s.blocks_in_use == 3);
  CHECK(s.chunks == 1);
  CHECK(s.allocate_calls == 3);
  CHECK(s.fragmentation() == doctest::Approx(1.0 - 3000.0 / (1 << 20)));

  REQUIRE(pool.release(b) == g::status::ok);
  s = pool.stats();
  CHECK(s.block_bytes_in_use == 2048);
  CHECK(s.bytes_in_use == 2000);
  CHECK(s.peak_bytes == 3000);
  CHECK(s.blocks_free == 1);
  CHECK(s.blocks_total == 3);
  CHECK(s.free_block_bytes == 1024);

  // A request of the same class gets the released block back; no new chunk.
  void* d = nullptr;
  REQUIRE(pool.allocate(&d, 900) == g::status::ok);
  CHECK(d == b);
  s = pool.stats();
  CHECK(s.chunk_allocations == 1);
  CHECK(s.blocks_free == 0);
  CHECK(s.bytes_in_use == 2900);

  // A different class is carved fresh, right after the last carved block.
  void* e = nullptr;
  REQUIRE(pool.allocate(&e, 2000) == g::status::ok);
  CHECK(static_cast<char*>(e) - static_cast<char*>(c) == 1024);
  CHECK(pool.stats().block_bytes_in_use == 3 * 1024 + 2048);
}

TEST_CASE("device_pool: chunk rollover, dedicated chunks for large blocks") {
  g::device_pool pool(g::host_chunks(), small_chunks(4096));
  std::vector<void*> blocks(9);
  // 512 = chunk/8: still carved, 8 per chunk; the 9th opens a second chunk.
  for (auto& p : blocks) REQUIRE(pool.allocate(&p, 512) == g::status::ok);
  g::pool_stats s = pool.stats();
  CHECK(s.chunks == 2);
  CHECK(s.reserved_bytes == 8192);
  CHECK(std::set<void*>(blocks.begin(), blocks.end()).size() == 9);

  // Larger than chunk/8: a chunk of exactly the block size.
  void* big = nullptr;
  REQUIRE(pool.allocate(&big, 10000) == g::status::ok);  // class 10240 (granule 2048)
  s = pool.stats();
  CHECK(s.chunks == 3);
  CHECK(s.reserved_bytes == 8192 + 10240);
  REQUIRE(pool.release(big) == g::status::ok);
  void* big2 = nullptr;
  REQUIRE(pool.allocate(&big2, 9000) == g::status::ok);  // same class: reused
  CHECK(big2 == big);
  CHECK(pool.stats().chunk_allocations == 3);
}

TEST_CASE("device_pool: bad releases are refused and change nothing") {
  g::device_pool pool(g::host_chunks(), small_chunks(1 << 16));
  void* a = nullptr;
  REQUIRE(pool.allocate(&a, 100) == g::status::ok);
  REQUIRE(pool.release(a) == g::status::ok);
  const g::pool_stats before = pool.stats();
  CHECK(pool.release(a) == g::status::invalid_argument);  // double release
  int local = 0;
  CHECK(pool.release(&local) == g::status::invalid_argument);  // foreign pointer
  CHECK(std::string(g::last_error_message()).find("not allocated by this pool") !=
        std::string::npos);
  const g::pool_stats after = pool.stats();
  CHECK(after.blocks_free == before.blocks_free);
  CHECK(after.free_block_bytes == before.free_block_bytes);
  CHECK(pool.release(nullptr) == g::status::ok);
  void* z = reinterpret_cast<void*>(0x1);
  CHECK(pool.allocate(&z, 0) == g::status::ok);
  CHECK(z == nullptr);
}

TEST_CASE("device_pool: a failing chunk source is reported, not hidden") {
  g::chunk_source failing;
  failing.allocate = [](void** p, std::size_t bytes) {
    *p = nullptr;
    return g::set_error(g::status::out_of_memory, "test source refuses " + std::to_string(bytes));
  };
  failing.release = [](void*) {};
  failing.name = "failing";
  g::device_pool pool(failing, small_chunks(1 << 16));
  void* p = reinterpret_cast<void*>(0x1);
  CHECK(pool.allocate(&p, 100) == g::status::out_of_memory);
  CHECK(p == nullptr);
  const g::pool_stats s = pool.stats();
  CHECK(s.failed_allocations == 1);
  CHECK(s.allocate_calls == 0);
  CHECK(s.reserved_bytes == 0);
  CHECK(s.fragmentation() == 0.0);
}

TEST_CASE("device_pool over CUDA chunks reports no_device when there is none") {
  if (g::device_count() != 0) return;  // covered by test_gpu_kernels on GPU machines
  g::device_pool pool;                 // cuda_chunks() by default
  void* p = nullptr;
  CHECK(pool.allocate(&p, 4096) == g::status::no_device);
  CHECK(p == nullptr);
  CHECK(pool.stats().failed_allocations == 1);
}

TEST_CASE("device_pool is safe to share between threads") {
  g::device_pool pool(g::host_chunks(), small_chunks(1 << 16));
  constexpr int k_threads = 4, k_rounds = 2000;
  std::atomic<int> errors{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < k_threads; ++t)
    ts.emplace_back([&, t] {
      for (int r = 0; r < k_rounds; ++r) {
        void* p = nullptr;
        const std::size_t bytes = 64 + 256 * ((t + r) % 5);
        if (pool.allocate(&p, bytes) != g::status::ok) ++errors;
        // Stamp the block and check it survives: a block handed to two threads would not.
        std::memset(p, t + 1, bytes);
        for (std::size_t i = 0; i < bytes; i += 61)
          if (static_cast<unsigned char*>(p)[i] != t + 1) ++errors;
        if (pool.release(p) != g::status::ok) ++errors;
      }
    });
  for (auto& t : ts) t.join();
  CHECK(errors == 0);
  const g::pool_stats s = pool.stats();
  CHECK(s.allocate_calls == k_threads * k_rounds);
  CHECK(s.blocks_in_use == 0);
  CHECK(s.block_bytes_in_use == 0);
  CHECK(s.bytes_in_use == 0);
  CHECK(s.peak_bytes <= k_threads * 1088u);  // largest request is 64 + 4 * 256
}

TEST_CASE("call_within: a call that returns is joined, one that hangs is left at its deadline") {
  using cohort::gpu::call_within;
  int ran = 0;
  CHECK(call_within([&ran] { ++ran; }, 5000));
  CHECK(ran == 1);  // joined: its effect is visible at once
  CHECK(call_within([] { throw std::runtime_error("inside NCCL"); }, 5000));  // returned, by a throw
  // A call stuck until released (ncclCommAbort's known hang): the wait ends at the deadline,
  // not when the call does; the call finishes later on its detached thread.
  struct gate {
    std::mutex mu;
    std::condition_variable cv;
    bool open = false, finished = false;
  };
  auto g = std::make_shared<gate>();
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(call_within(
      [g] {
        std::unique_lock<std::mutex> l(g->mu);
        g->cv.wait(l, [&] { return g->open; });
        g->finished = true;
        g->cv.notify_all();
      },
      200));
  const auto waited = std::chrono::steady_clock::now() - t0;
  CHECK(waited >= std::chrono::milliseconds(200));
  CHECK(waited < std::chrono::seconds(20));  // slack for a loaded 2-core machine
  {
    std::unique_lock<std::mutex> l(g->mu);
    CHECK_FALSE(g->finished);
    g->open = true;
    g->cv.notify_all();
    g->cv.wait(l, [&] { return g->finished; });  // the left thread still owned its captures
  }
}
