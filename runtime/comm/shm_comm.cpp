#include "runtime/comm/shm_comm.hpp"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "runtime/comm/build_abort.hpp"
#include "runtime/comm/holders_sum.hpp"
#include "runtime/comm/shm_names.hpp"

namespace cohort::comm {

namespace {

constexpr std::uint32_t kMagic = 0x434f5348;  // "HSOC"
constexpr int kMaxRanks = 256;
using clock_type = std::chrono::steady_clock;

struct alignas(64) arrival {
  std::atomic<std::uint64_t> phase;
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "shared atomics need lock-free");
static_assert(std::atomic<std::uint32_t>::is_always_lock_free, "shared atomics need lock-free");

long futex(std::atomic<std::uint32_t>* addr, int op, std::uint32_t val, const timespec* t) {
  // Not FUTEX_PRIVATE: the word is shared between processes.
  return ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(addr), op, val, t, nullptr, 0);
}

std::string read_first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

}  // namespace

// The mapped segment: a header, then 2 x size buffers of chunk bytes (two sets, used by
// alternate chunks, so a rank may fill the next chunk while a slower one still reads the
// last: one synchronisation per chunk suffices).
struct shm_comm::segment {
  std::atomic<std::uint32_t> magic;  // set last by the creator
  std::uint32_t size;
  std::uint64_t chunk;
  alignas(64) std::atomic<std::uint32_t> wake;  // futex word: +1 at every arrival
  alignas(64) std::atomic<std::uint32_t> sleepers;
  alignas(64) std::atomic<std::uint32_t> aborted;
  alignas(64) std::atomic<std::int32_t> pid[kMaxRanks];
  arrival arrived[kMaxRanks];
};

namespace {

std::size_t header_bytes() { return (sizeof(shm_comm::segment) + 63) / 64 * 64; }

}  // namespace

std::string host_identity() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  char ns[128] = {};
  const ssize_t n = ::readlink("/proc/self/ns/net", ns, sizeof ns - 1);
  return std::string(host) + "|" + (n > 0 ? std::string(ns, static_cast<std::size_t>(n)) : "") +
         "|" + read_first_line("/proc/sys/kernel/random/boot_id");
}

shm_comm::shm_comm(kv_client& kv, std::uint64_t generation, int rank, int size,
                   const shm_options& o)
    : rank_(rank), size_(size), opts_(o) {
  const std::string what = "shm rendezvous (rank " + std::to_string(rank) + " of " +
                           std::to_string(size) + ", prefix '" + o.prefix + "')";
  if (size < 1 || size > kMaxRanks || rank < 0 || rank >= size)
    throw comm_error(comm_failure::invalid, what,
                     "rank must be in [0, size) and size in [1, " + std::to_string(kMaxRanks) + "]");
  if (o.chunk_bytes < 64 || o.chunk_bytes % 64 != 0 || o.timeout.count() <= 0)
    throw comm_error(comm_failure::invalid, what,
                     "chunk_bytes must be a positive multiple of 64 and the timeout > 0");
  auto check = [&] {
    if (o.cancel) o.cancel->check(what);
  };
  const auto key = [&](const std::string& k) { return generation_key(generation, o.prefix + "/" + k); };
  mapped_bytes_ = header_bytes() + 2 * static_cast<std::size_t>(size) * o.chunk_bytes;
  std::string name;
  int fd = -1;
  check();
  if (rank == 0) {
    name = shm_segment_name(generation);  // names its maker, for remove_stale_shm_segments
    fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(mapped_bytes_)) != 0) {
      const std::string why = std::strerror(errno);
      if (fd >= 0) ::close(fd);
      ::shm_unlink(name.c_str());
      throw comm_error(comm_failure::unavailable, what,
                       "cannot create " + std::to_string(mapped_bytes_) + " bytes in /dev/shm" +
                           name + ": " + why);
    }
  } else {
    const std::vector<char> v = kv.get(key("name"), o.rendezvous_timeout);
    name.assign(v.begin(), v.end());
    check();
    fd = ::shm_open(name.c_str(), O_RDWR, 0600);
    struct stat st {};
    if (fd < 0 || ::fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) != mapped_bytes_) {
      const std::string why = fd < 0 ? std::strerror(errno) : "its size is not the group's";
      if (fd >= 0) ::close(fd);
      throw comm_error(comm_failure::unavailable, what,
                       "cannot open /dev/shm" + name + " (rank 0 is on another host?): " + why);
    }
  }
  void* p = ::mmap(nullptr, mapped_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) {
    if (rank == 0) ::shm_unlink(name.c_str());
    throw comm_error(comm_failure::unavailable, what, std::string("mmap: ") + std::strerror(errno));
  }
  seg_ = static_cast<segment*>(p);
  try {
    if (rank == 0) {
      // The file is zero-filled: every atomic starts at 0. Set the shape, then the magic.
      seg_->size = static_cast<std::uint32_t>(size);
      seg_->chunk = o.chunk_bytes;
      seg_->magic.store(kMagic, std::memory_order_release);
      kv.set(key("name"), std::vector<char>(name.begin(), name.end()));
    } else if (seg_->magic.load(std::memory_order_acquire) != kMagic ||
               seg_->size != static_cast<std::uint32_t>(size) || seg_->chunk != o.chunk_bytes) {
      throw comm_error(comm_failure::invalid, what, "the segment " + name + " is not this group's");
    }
    seg_->pid[rank].store(static_cast<std::int32_t>(::getpid()));
    check();
    kv.set(key("attached/" + std::to_string(rank)), {'1'});
    std::vector<std::string> all;
    for (int r = 0; r < size; ++r) all.push_back(key("attached/" + std::to_string(r)));
    kv.wait(all, o.rendezvous_timeout);
  } catch (...) {
    ::munmap(seg_, mapped_bytes_);
    seg_ = nullptr;
    if (rank == 0) ::shm_unlink(name.c_str());
    throw;
  }
  // Every rank has it mapped: the name is not needed any more (nothing is left behind when
  // the ranks exit, however they exit).
  ::shm_unlink(name.c_str());
}

shm_comm::~shm_comm() {
  if (seg_ != nullptr) ::munmap(seg_, mapped_bytes_);
}

unsigned char* shm_comm::buffer(int parity, int rank) const {
  return reinterpret_cast<unsigned char*>(seg_) + header_bytes() +
         (static_cast<std::size_t>(parity) * size_ + rank) * opts_.chunk_bytes;
}

void shm_comm::fail(comm_failure kind, const char* op, const std::string& detail) {
  dead_ = true;
  if (kind != comm_failure::aborted) {
    // The group cannot finish this call: make every peer fail now, not at its timeout.
    seg_->aborted.store(1);
    seg_->wake.fetch_add(1);
    futex(&seg_->wake, FUTEX_WAKE, INT_MAX, nullptr);
  }
  throw comm_error(kind,
                   std::string("shm ") + op + " (rank " + std::to_string(rank_) + " of " +
                       std::to_string(size_) + ")",
                   detail);
}

void shm_comm::check_usable(const char* op) {
  if (dead_.load())
    throw comm_error(aborted_.load() ? comm_failure::aborted : comm_failure::invalid,
                     std::string("shm ") + op,
                     "this communicator is dead after an earlier failure or abort(); build a "
                     "new one");
}

void shm_comm::sync(const char* op) {
  ++phase_;
  seg_->arrived[rank_].phase.store(phase_, std::memory_order_release);
  seg_->wake.fetch_add(1);
  if (seg_->sleepers.load() > 0) futex(&seg_->wake, FUTEX_WAKE, INT_MAX, nullptr);
  const auto deadline = clock_type::now() + opts_.timeout;
  int missing = -1;
  auto everyone = [&] {
    for (int i = 0; i < size_; ++i)
      if (seg_->arrived[i].phase.load(std::memory_order_acquire) < phase_) {
        missing = i;
        return false;
      }
    return true;
  };
  for (int spins = 0;; ++spins) {
    // Everyone arrived: this phase is complete, whatever a peer did after it. (A peer that
    // finished the group's last collective may tear the group down, aborting it, before a
    // slower rank has seen the last arrival; that rank's collective completed all the same.)
    if (everyone()) return;
    if (seg_->aborted.load() != 0) {
      aborted_ = true;
      fail(comm_failure::aborted, op, "the group was aborted");
    }
    if (spins < 256) {
      __builtin_ia32_pause();
      continue;
    }
    if (spins < 272) {
      std::this_thread::yield();
      continue;
    }
    // Sleep until the next arrival anywhere (or 10 ms, to look at the missing peer).
    const std::uint32_t seen = seg_->wake.load();
    if (everyone()) return;
    const auto now = clock_type::now();
    if (now >= deadline)
      fail(comm_failure::timeout, op,
           "rank " + std::to_string(missing) + " did not arrive within " +
               std::to_string(opts_.timeout.count()) + " ms");
    const std::int32_t pid = seg_->pid[missing].load();
    if (pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH)
      fail(comm_failure::peer_lost, op,
           "rank " + std::to_string(missing) + " (pid " + std::to_string(pid) + ") is gone");
    const auto left = std::min<clock_type::duration>(deadline - now, std::chrono::milliseconds(10));
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
    timespec t{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
    if (opts_.before_wait) opts_.before_wait();
    seg_->sleepers.fetch_add(1);
    futex(&seg_->wake, FUTEX_WAIT, seen, &t);
    seg_->sleepers.fetch_sub(1);
  }
}

template <class T>
void shm_comm::allreduce(T* data, std::size_t n, const char* op) {
  check_usable(op);
  if (size_ == 1) return;  // the sum of one rank: nothing moves (as with Gloo)
  const std::size_t per = opts_.chunk_bytes / sizeof(T);
  for (std::size_t off = 0; off < n; off += per) {
    const std::size_t m = std::min(per, n - off);
    const int p = parity_;
    parity_ ^= 1;
    std::memcpy(buffer(p, rank_), data + off, m * sizeof(T));
    sent_ += m * sizeof(T);
    sync(op);
    // This rank's slice of the chunk, summed over the ranks in rank order into rank 0's
    // buffer (nobody else touches the slice in this phase).
    const std::size_t lo = m * static_cast<std::size_t>(rank_) / size_;
    const std::size_t hi = m * static_cast<std::size_t>(rank_ + 1) / size_;
    T* acc = reinterpret_cast<T*>(buffer(p, 0));
    for (int r = 1; r < size_; ++r) {
      const T* x = reinterpret_cast<const T*>(buffer(p, r));
      for (std::size_t i = lo; i < hi; ++i) acc[i] += x[i];
    }
    sync(op);
    std::memcpy(data + off, acc, m * sizeof(T));
    received_ += m * sizeof(T);
  }
}

template <class T>
void shm_comm::to_holders(T* data, std::size_t offset, std::size_t count, const holding& h,
                          const char* op) {
  check_usable(op);
  if (size_ == 1 || count == 0) return;
  COHORT_CHECK(h.ranks() == size_);
  const auto mine = h.inside(rank_, offset, count);
  const std::size_t per = opts_.chunk_bytes / sizeof(T);
  const std::size_t end = offset + count;
  for (std::size_t off = offset; off < end; off += per) {
    const std::size_t m = std::min(per, end - off);
    const int p = parity_;
    parity_ ^= 1;
    std::memcpy(buffer(p, rank_), data + off, m * sizeof(T));
    sent_ += m * sizeof(T);
    // One synchronisation a chunk, as allgather: a rank writes this parity again only after
    // the next chunk's synchronisation, which every rank reaches after reading this one.
    sync(op);
    for (const auto& [b, e] : mine) {
      const std::size_t lo = std::max(b, off), hi = std::min(e, off + m);
      if (lo >= hi) continue;
      T* out = data + lo;
      const std::size_t at = lo - off, n = hi - lo;
      std::memcpy(out, reinterpret_cast<const T*>(buffer(p, 0)) + at, n * sizeof(T));
      for (int r = 1; r < size_; ++r) {
        const T* x = reinterpret_cast<const T*>(buffer(p, r)) + at;
        for (std::size_t i = 0; i < n; ++i) out[i] += x[i];
      }
      received_ += n * sizeof(T) * static_cast<std::size_t>(size_);
    }
  }
}

void shm_comm::holders_sum(float* data, std::size_t offset, std::size_t count, const holding& h) {
  to_holders(data, offset, count, h, "holders_sum(float)");
}

void shm_comm::holders_sum(std::int64_t* data, std::size_t offset, std::size_t count,
                           const holding& h) {
  to_holders(data, offset, count, h, "holders_sum(int64)");
}

void shm_comm::allreduce_sum(float* data, std::size_t n) {
  allreduce(data, n, "allreduce_sum(float)");
}

void shm_comm::allreduce_sum(std::int64_t* data, std::size_t n) {
  allreduce(data, n, "allreduce_sum(int64)");
}

void shm_comm::allgather(const void* send, void* recv, std::size_t bytes) {
  check_usable("allgather");
  const auto* in = static_cast<const unsigned char*>(send);
  auto* out = static_cast<unsigned char*>(recv);
  if (size_ == 1) {
    if (bytes > 0 && recv != send) std::memmove(recv, send, bytes);
    return;
  }
  if (bytes == 0) return sync("allgather");
  for (std::size_t off = 0; off < bytes; off += opts_.chunk_bytes) {
    const std::size_t m = std::min(opts_.chunk_bytes, bytes - off);
    const int p = parity_;
    parity_ ^= 1;
    std::memcpy(buffer(p, rank_), in + off, m);
    sent_ += m;
    sync("allgather");
    for (int r = 0; r < size_; ++r)
      std::memcpy(out + static_cast<std::size_t>(r) * bytes + off, buffer(p, r), m);
    received_ += m * static_cast<std::size_t>(size_);
  }
}

void shm_comm::alltoall(const void* send, void* recv, std::size_t bytes) {
  check_usable("alltoall");
  const auto* in = static_cast<const unsigned char*>(send);
  auto* out = static_cast<unsigned char*>(recv);
  if (size_ == 1) {
    if (bytes > 0 && recv != send) std::memmove(recv, send, bytes);
    return;
  }
  if (bytes == 0) return sync("alltoall");
  const std::size_t ranks = static_cast<std::size_t>(size_);
  // Each round, every rank writes a slice of each of its blocks into its own buffer (slice
  // j for rank j) and reads slice `rank_` of every rank's buffer.
  const std::size_t slice = std::max<std::size_t>(1, opts_.chunk_bytes / ranks);
  for (std::size_t off = 0; off < bytes; off += slice) {
    const std::size_t m = std::min(slice, bytes - off);
    const int p = parity_;
    parity_ ^= 1;
    for (std::size_t j = 0; j < ranks; ++j) std::memcpy(buffer(p, rank_) + j * m, in + j * bytes + off, m);
    sent_ += m * ranks;
    sync("alltoall");
    for (std::size_t r = 0; r < ranks; ++r)
      std::memcpy(out + r * bytes + off, buffer(p, static_cast<int>(r)) + rank_ * m, m);
    received_ += m * ranks;
  }
}

void shm_comm::broadcast(void* data, std::size_t bytes, int root) {
  if (root < 0 || root >= size_)
    throw comm_error(
        comm_failure::invalid, "shm broadcast",
        "root " + std::to_string(root) + " is not a rank of a group of " + std::to_string(size_));
  check_usable("broadcast");
  if (size_ == 1) return;
  auto* d = static_cast<unsigned char*>(data);
  for (std::size_t off = 0; off < bytes; off += opts_.chunk_bytes) {
    const std::size_t m = std::min(opts_.chunk_bytes, bytes - off);
    const int p = parity_;
    parity_ ^= 1;
    if (rank_ == root) {
      std::memcpy(buffer(p, root), d + off, m);
      sent_ += m;
    }
    sync("broadcast");
    if (rank_ != root) {
      std::memcpy(d + off, buffer(p, root), m);
      received_ += m;
    }
  }
}

void shm_comm::barrier() {
  check_usable("barrier");
  sync("barrier");
}

void shm_comm::abort() {
  aborted_ = true;
  dead_ = true;
  if (seg_ == nullptr) return;
  seg_->aborted.store(1);
  seg_->wake.fetch_add(1);
  futex(&seg_->wake, FUTEX_WAKE, INT_MAX, nullptr);
}

comm_traffic shm_comm::traffic() const {
  comm_traffic t;
  t.sent = sent_.load();
  t.received = received_.load();
  t.measured = true;
  return t;
}

}  // namespace cohort::comm
