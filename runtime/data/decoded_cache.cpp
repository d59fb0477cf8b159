#include "runtime/data/decoded_cache.hpp"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <vector>

#include "runtime/core/atomic_file.hpp"
#include "runtime/core/error.hpp"
#include "runtime/core/folder_trust.hpp"

namespace cohort {
namespace {

namespace fs = std::filesystem;

constexpr char magic[] = "cohort decoded idx 1\n";  // 21 bytes, no NUL written
constexpr std::size_t magic_len = sizeof magic - 1;
constexpr uint32_t max_dims = 8;

// What identifies the source file's content without reading it.
struct source_id {
  uint64_t size = 0, mtime_ns = 0, ino = 0, dev = 0;
  bool operator==(const source_id& o) const {
    return size == o.size && mtime_ns == o.mtime_ns && ino == o.ino && dev == o.dev;
  }
};

std::optional<source_id> identify(const std::string& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  source_id id;
  id.size = static_cast<uint64_t>(st.st_size);
  id.mtime_ns = static_cast<uint64_t>(st.st_mtim.tv_sec) * 1000000000ull +
                static_cast<uint64_t>(st.st_mtim.tv_nsec);
  id.ino = static_cast<uint64_t>(st.st_ino);
  id.dev = static_cast<uint64_t>(st.st_dev);
  return id;
}

// The header after the magic: the source's identity, the dims, the payload's size and CRC.
struct header {
  source_id source;
  std::vector<int64_t> dims;
  uint64_t payload = 0;
  uint32_t crc = 0;
};

template <class T>
void put(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

std::string encode(const header& h) {
  std::string out(magic, magic_len);
  put(out, h.source.size);
  put(out, h.source.mtime_ns);
  put(out, h.source.ino);
  put(out, h.source.dev);
  put(out, static_cast<uint32_t>(h.dims.size()));
  for (int64_t d : h.dims) put(out, d);
  put(out, h.payload);
  put(out, h.crc);
  return out;
}

// Closes a descriptor on every path out.
struct fd_closer {
  int fd;
  ~fd_closer() {
    if (fd >= 0) ::close(fd);
  }
};

// Reads a T at AT of the N mapped bytes P, advancing AT; false past the end.
template <class T>
bool take(const uint8_t* p, std::size_t n, std::size_t& at, T& v) {
  if (n - at < sizeof v) return false;
  std::memcpy(&v, p + at, sizeof v);
  at += sizeof v;
  return true;
}

uint32_t crc_of(const uint8_t* p, std::size_t left) {
  uLong crc = crc32(0L, Z_NULL, 0);
  while (left > 0) {  // crc32 takes a uInt length
    const uInt n = static_cast<uInt>(std::min<std::size_t>(left, 1u << 30));
    crc = crc32(crc, p, n);
    p += n;
    left -= n;
  }
  return static_cast<uint32_t>(crc);
}

// The cached form of the source whose identity is ID, mapped read-only, or nothing (with
// WHY set when the file exists but does not hold: a stale one, said nothing, is no fault).
std::optional<cached_idx> read_cached(const std::string& file, const source_id& id, int dims,
                                      std::string& why) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return std::nullopt;
  fd_closer closer{fd};
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0) return std::nullopt;
  const auto n = static_cast<std::size_t>(st.st_size);
  void* m = ::mmap(nullptr, n, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
  if (m == MAP_FAILED) {
    why = std::string("it cannot be mapped: ") + std::strerror(errno);
    return std::nullopt;
  }
  std::shared_ptr<const uint8_t> map(static_cast<const uint8_t*>(m),
                                     [n](const uint8_t* q) { ::munmap(const_cast<uint8_t*>(q), n); });
  const uint8_t* p = map.get();
  std::size_t at = 0;
  header h;
  uint32_t ndims = 0;
  if (n < magic_len || std::memcmp(p, magic, magic_len) != 0) {
    why = "not a decoded-data file of this version";
    return std::nullopt;
  }
  at = magic_len;
  if (!take(p, n, at, h.source.size) || !take(p, n, at, h.source.mtime_ns) ||
      !take(p, n, at, h.source.ino) || !take(p, n, at, h.source.dev) ||
      !take(p, n, at, ndims) || ndims > max_dims) {
    why = "its header is cut short";
    return std::nullopt;
  }
  if (!(h.source == id)) return std::nullopt;  // the source changed: decoded again, silently
  if (static_cast<int>(ndims) != dims) {
    why = "it holds " + std::to_string(ndims) + " dimensions, not " + std::to_string(dims);
    return std::nullopt;
  }
  h.dims.resize(ndims);
  uint64_t total = 1;
  for (auto& d : h.dims) {
    if (!take(p, n, at, d) || d < 0 || d > (int64_t{1} << 40)) {
      why = "its header is cut short or out of range";
      return std::nullopt;
    }
    total *= static_cast<uint64_t>(d);
  }
  if (!take(p, n, at, h.payload) || !take(p, n, at, h.crc)) {
    why = "its header is cut short";
    return std::nullopt;
  }
  if (total != h.payload || n - at != h.payload) {
    why = "its size does not match its header (" + std::to_string(n) + " bytes)";
    return std::nullopt;
  }
  if (crc_of(p + at, h.payload) != h.crc) {
    why = "its CRC-32 does not match its contents";
    return std::nullopt;
  }
  cached_idx out;
  out.dims = std::move(h.dims);
  out.data = byte_view(std::shared_ptr<const uint8_t>(map, p + at), h.payload);
  return out;
}

// Writes F (decoded from a source whose identity is ID) to FILE, atomically
// (write_file_atomic: a reader sees the old file or the whole new one), private to the user.
void write_cached(const std::string& file, const source_id& id, const idx_file& f) {
  header h;
  h.source = id;
  h.dims = f.dims;
  h.payload = f.data.size();
  h.crc = crc_of(f.data.data(), f.data.size());
  std::string bytes = encode(h);
  bytes.append(reinterpret_cast<const char*>(f.data.data()), f.data.size());
  write_file_atomic(file, bytes, 0600);
}

// One warning a process about the cache itself (the loads go on without it).
void warn_once(const std::string& what) {
  static std::atomic<bool> said{false};
  if (said.exchange(true)) return;
  spdlog::warn("data cache: {}; decoding the data set instead (set COHORT_CACHE_DIR to a "
               "private folder, or to none to silence this)",
               what);
}

// FNV-1a of S: names the cached file of a source path.
uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

std::string data_cache_dir() {
  const char* own = std::getenv("COHORT_CACHE_DIR");
  if (own != nullptr) {
    const std::string s = own;
    return s == "none" ? std::string() : s;
  }
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && x[0] == '/')
    return std::string(x) + "/cohort";
  if (const char* home = std::getenv("HOME"); home != nullptr && home[0] == '/')
    return std::string(home) + "/.cache/cohort";
  return {};
}

std::string cached_idx_path(const std::string& cache_dir, const std::string& source) {
  char name[24];
  std::snprintf(name, sizeof name, "%016llx",
                static_cast<unsigned long long>(fnv1a(source)));
  return cache_dir + "/decoded/" + name + "-" + fs::path(source).filename().string() + ".idx";
}

cached_idx read_idx_cached(const std::string& path, int expected_dims, const std::string& cache_dir,
                           std::size_t min_bytes) {
  std::error_code ec;
  const std::string source = fs::absolute(path, ec).lexically_normal().string();
  const std::optional<source_id> before = identify(path);
  const auto decoded = [](idx_file f) {
    cached_idx out;
    out.dims = std::move(f.dims);
    out.data = byte_view(std::move(f.data));
    return out;
  };
  if (cache_dir.empty() || ec || !before) return decoded(read_idx_gz(path, expected_dims));
  const std::string folder = cache_dir + "/decoded";
  const std::string file = cached_idx_path(cache_dir, source);
  bool usable = true;
  try {
    fs::create_directories(folder, ec);
    if (ec) throw error("cannot create " + folder + ": " + ec.message());
    // A folder another user can change could hand us their data: not used.
    require_private_folder(folder, "data cache folder", 1);
  } catch (const std::exception& e) {
    warn_once(e.what());
    usable = false;
  }
  if (usable) {
    std::string why;
    if (auto cached = read_cached(file, *before, expected_dims, why)) return std::move(*cached);
    if (!why.empty()) warn_once(file + ": " + why + " (it is written again)");
  }
  idx_file f = read_idx_gz(path, expected_dims);
  // Kept only when the source did not change while it was decoded.
  if (usable && f.data.size() >= min_bytes && identify(path) == before) {
    try {
      write_cached(file, *before, f);
    } catch (const std::exception& e) {
      warn_once(e.what());
    }
  }
  return decoded(std::move(f));
}

}  // namespace cohort
