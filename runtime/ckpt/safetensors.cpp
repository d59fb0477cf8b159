#include "runtime/ckpt/safetensors.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "runtime/core/error.hpp"
#include "runtime/core/sha256.hpp"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors data is little-endian; this code copies host memory as is");

namespace cohort {

namespace {

using json = nlohmann::json;

constexpr dtype all_dtypes[] = {dtype::f64, dtype::f32, dtype::f16, dtype::bf16, dtype::i64,
                                dtype::i32, dtype::i16, dtype::i8,  dtype::u8,   dtype::boolean};
// More dimensions than any model uses; a longer shape is a hostile or broken header.
constexpr size_t max_rank = 16;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw checkpoint_error("checkpoint " + path + ": " + what);
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// prod(shape) * elem with overflow detection; false when it does not fit in 63 bits.
// Zeros are looked for before multiplying: a zero dimension makes the tensor empty whatever
// the others are, and a left-to-right product would call [2^62, 0] an overflow.
bool byte_size(const std::vector<int64_t>& shape, size_t elem, uint64_t* out) {
  constexpr uint64_t limit = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  for (int64_t d : shape) {
    if (d < 0) return false;
    if (d == 0) {  // an empty tensor, whatever the other dimensions say
      *out = 0;
      return true;
    }
  }
  uint64_t n = elem;
  for (int64_t d : shape) {
    const uint64_t u = static_cast<uint64_t>(d);
    if (u != 0 && n > limit / u) return false;
    n *= u;
  }
  *out = n;
  return true;
}

// An fd closed on every path out.
struct fd_guard {
  int fd = -1;
  ~fd_guard() {
    if (fd >= 0) ::close(fd);
  }
};

void write_all_fd(int fd, const void* data, uint64_t size, const std::string& tmp) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(size, 1u << 30));
    const ssize_t w = ::write(fd, p, chunk);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw checkpoint_error("write to " + tmp + " failed: " + std::strerror(errno));
    p += w;
    size -= static_cast<uint64_t>(w);
  }
}

// Reads exactly `size` bytes at `offset` or explains the short read.
void read_exact_fd(int fd, void* dst, uint64_t size, uint64_t offset, const std::string& path) {
  auto* p = static_cast<uint8_t*>(dst);
  while (size > 0) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(size, 1u << 30));
    const ssize_t r = ::pread(fd, p, chunk, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) fail(path, std::string("read failed: ") + std::strerror(errno));
    if (r == 0) fail(path, "file shrank while being read");
    p += r;
    offset += static_cast<uint64_t>(r);
    size -= static_cast<uint64_t>(r);
  }
}

bool parse_dtype(const std::string& s, dtype* out) {
  for (dtype t : all_dtypes) {
    if (s == dtype_name(t)) {
      *out = t;
      return true;
    }
  }
  return false;
}

}  // namespace

const char* dtype_name(dtype t) {
  switch (t) {
    case dtype::f64:
      return "F64";
    case dtype::f32:
      return "F32";
    case dtype::f16:
      return "F16";
    case dtype::bf16:
      return "BF16";
    case dtype::i64:
      return "I64";
    case dtype::i32:
      return "I32";
    case dtype::i16:
      return "I16";
    case dtype::i8:
      return "I8";
    case dtype::u8:
      return "U8";
    case dtype::boolean:
      return "BOOL";
  }
  COHORT_CHECK(false);
  return "";
}

size_t dtype_size(dtype t) {
  switch (t) {
    case dtype::f64:
    case dtype::i64:
      return 8;
    case dtype::f32:
    case dtype::i32:
      return 4;
    case dtype::f16:
    case dtype::bf16:
    case dtype::i16:
      return 2;
    case dtype::i8:
    case dtype::u8:
    case dtype::boolean:
      return 1;
  }
  COHORT_CHECK(false);
  return 0;
}

// ---- writing ----

written_file write_safetensors(const std::string& path, const std::vector<tensor_view>& tensors,
                               const metadata_map& metadata) {
  // Everything is checked before the first byte goes to disk.
  if (metadata.count(checksum_key)) {
    fail(path, std::string("metadata key '") + checksum_key + "' is reserved for the checksum");
  }
  std::vector<const tensor_view*> order;
  order.reserve(tensors.size());
  for (const auto& t : tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(),
            [](const tensor_view* a, const tensor_view* b) { return a->name < b->name; });
  std::vector<uint64_t> sizes;
  for (size_t i = 0; i < order.size(); ++i) {
    const tensor_view& t = *order[i];
    if (t.name.empty() || t.name == "__metadata__")
      fail(path, "invalid tensor name '" + t.name + "'");
    if (i > 0 && order[i - 1]->name == t.name) fail(path, "tensor '" + t.name + "' given twice");
    uint64_t bytes = 0;
    if (t.shape.size() > max_rank || !byte_size(t.shape, dtype_size(t.type), &bytes))
      fail(path, "tensor '" + t.name + "' has an invalid shape " + shape_str(t.shape));
    if (bytes > 0 && t.data == nullptr) fail(path, "tensor '" + t.name + "' has no data");
    sizes.push_back(bytes);
  }

  json header = json::object();
  sha256 hash;
  uint64_t offset = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    const tensor_view& t = *order[i];
    header[t.name] = {{"dtype", dtype_name(t.type)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + sizes[i]}}};
    hash.update(t.data, sizes[i]);
    offset += sizes[i];
  }
  json meta = json::object();
  for (const auto& [k, v] : metadata) meta[k] = v;
  meta[checksum_key] = hash.hex_digest();
  header["__metadata__"] = meta;
  std::string text = header.dump();
  // Pad with spaces (valid JSON whitespace) so the data section starts 8-byte aligned, as
  // the reference writer does: a reader may then map the file and use the data in place.
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');
  uint8_t len[8];
  for (int i = 0; i < 8; ++i)
    len[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));

  // The whole file's hash, for the checkpoint marker: header bytes, then the data.
  sha256 file_hash;
  file_hash.update(len, sizeof len);
  file_hash.update(text);
  for (size_t i = 0; i < order.size(); ++i) file_hash.update(order[i]->data, sizes[i]);
  written_file result{sizeof len + text.size() + offset, file_hash.hex_digest()};

  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  fd_guard f;
  // Owner-only (a checkpoint holds the whole model); a fresh file, so that the mode holds
  // even over a temporary a killed writer of the same pid left.
  ::unlink(tmp.c_str());
  f.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (f.fd < 0) fail(path, "cannot create " + tmp + ": " + std::strerror(errno));
  try {
    write_all_fd(f.fd, len, sizeof len, tmp);
    write_all_fd(f.fd, text.data(), text.size(), tmp);
    for (size_t i = 0; i < order.size(); ++i) write_all_fd(f.fd, order[i]->data, sizes[i], tmp);
    if (::fsync(f.fd) != 0)
      throw checkpoint_error("fsync of " + tmp + " failed: " + std::strerror(errno));
    const int fd = f.fd;
    f.fd = -1;
    if (::close(fd) != 0)
      throw checkpoint_error("close of " + tmp + " failed: " + std::strerror(errno));
    if (::rename(tmp.c_str(), path.c_str()) != 0)
      throw checkpoint_error("rename of " + tmp + " failed: " + std::strerror(errno));
  } catch (const checkpoint_error& e) {
    ::unlink(tmp.c_str());
    fail(path, std::string("not written (") + e.what() + ")");
  }
  // Make the rename itself durable: fsync the folder that holds the new entry.
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  fd_guard d;
  d.fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (d.fd < 0 || ::fsync(d.fd) != 0)
    fail(path, "written, but fsync of its folder " + dir + " failed: " + std::strerror(errno));
  return result;
}

// ---- reading ----

safetensors_file safetensors_file::read_header(const std::string& path) {
  return load(path, false, read_options{});
}

safetensors_file safetensors_file::read(const std::string& path, const read_options& opts) {
  return load(path, true, opts);
}

safetensors_file safetensors_file::load(const std::string& path, bool with_data,
                                        const read_options& opts) {
  safetensors_file f;
  f.path_ = path;
  fd_guard fd;
  fd.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd.fd < 0) fail(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0) fail(path, std::string("cannot stat: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail(path, "not a regular file");
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    fail(path, "file is " + std::to_string(file_size) +
                   " bytes, too short for the 8-byte header length (truncated?)");
  }
  uint8_t len[8];
  read_exact_fd(fd.fd, len, 8, 0, path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
  if (n > max_header_bytes) {
    fail(path, "header length " + std::to_string(n) + " exceeds the limit of " +
                   std::to_string(max_header_bytes) + " bytes (not a safetensors file?)");
  }
  if (n > file_size - 8) {
    fail(path, "header length " + std::to_string(n) + " is larger than the " +
                   std::to_string(file_size - 8) + " bytes after it (truncated file?)");
  }
  std::string text(static_cast<size_t>(n), '\0');
  read_exact_fd(fd.fd, text.data(), n, 8, path);
  f.data_size_ = file_size - 8 - n;

  // Safetensors headers are three levels deep; refuse deeper nesting and duplicate names
  // while parsing so a hostile header can neither recurse deeply nor hide a second entry.
  std::set<std::string> keys;
  json::parser_callback_t guard = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth > 3) fail(path, "header nests deeper than a safetensors header can");
    if (event == json::parse_event_t::key && depth == 1) {
      if (!keys.insert(parsed.get<std::string>()).second)
        fail(path, "header names '" + parsed.get<std::string>() + "' twice");
    }
    return true;
  };
  json header;
  try {
    header = json::parse(text, guard);
  } catch (const json::exception& e) {
    fail(path, std::string("header is not valid JSON (") + e.what() + ")");
  }
  if (!header.is_object()) fail(path, "header is not a JSON object");

  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) fail(path, "__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string())
          fail(path, "__metadata__ entry '" + m.key() + "' is not a string");
        f.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor '" + name + "'";
    if (name.empty()) fail(path, "a tensor has an empty name");
    if (!v.is_object()) fail(path, where + " is not an object");
    for (auto k = v.begin(); k != v.end(); ++k) {
      if (k.key() != "dtype" && k.key() != "shape" && k.key() != "data_offsets")
        fail(path, where + " has an unknown field '" + k.key() + "'");
    }
    if (!v.contains("dtype") || !v["dtype"].is_string()) fail(path, where + " has no dtype string");
    tensor_info t;
    t.name = name;
    const std::string ds = v["dtype"].get<std::string>();
    if (!parse_dtype(ds, &t.type)) fail(path, where + " has an unsupported dtype '" + ds + "'");
    if (!v.contains("shape") || !v["shape"].is_array()) fail(path, where + " has no shape array");
    if (v["shape"].size() > max_rank)
      fail(path, where + " has " + std::to_string(v["shape"].size()) + " dimensions");
    for (const json& d : v["shape"]) {
      // Only non-negative integers below 2^62 (byte_size then catches overflow of products).
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 62))
        fail(path, where + " has an invalid dimension " + d.dump());
      t.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
    }
    if (!v.contains("data_offsets") || !v["data_offsets"].is_array() ||
        v["data_offsets"].size() != 2 || !v["data_offsets"][0].is_number_unsigned() ||
        !v["data_offsets"][1].is_number_unsigned())
      fail(path, where + " needs data_offsets [begin, end] of non-negative integers");
    t.begin = v["data_offsets"][0].get<uint64_t>();
    t.end = v["data_offsets"][1].get<uint64_t>();
    uint64_t bytes = 0;
    if (!byte_size(t.shape, dtype_size(t.type), &bytes))
      fail(path, where + " shape " + shape_str(t.shape) + " overflows");
    if (t.end < t.begin || t.end - t.begin != bytes) {
      fail(path, where + " has data_offsets [" + std::to_string(t.begin) + ", " +
                     std::to_string(t.end) + "] but " + dtype_name(t.type) + " " +
                     shape_str(t.shape) + " needs " + std::to_string(bytes) + " bytes");
    }
    f.tensors_.push_back(std::move(t));
  }

  // Offsets must tile the data section: sorted by begin, each starts where the last ended,
  // the last ends at the end of the file. That rules out gaps, overlap and out-of-bounds.
  std::sort(f.tensors_.begin(), f.tensors_.end(), [](const tensor_info& a, const tensor_info& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t at = 0;
  for (const auto& t : f.tensors_) {
    if (t.begin != at) {
      fail(path, "tensor '" + t.name + "' starts at data offset " + std::to_string(t.begin) +
                     ", expected " + std::to_string(at) +
                     (t.begin < at ? " (overlaps the tensor before it)" : " (gap)"));
    }
    at = t.end;
  }
  if (at != f.data_size_) {
    fail(path, "tensors cover " + std::to_string(at) + " data bytes but the file holds " +
                   std::to_string(f.data_size_) +
                   (at > f.data_size_ ? " (truncated file?)" : " (trailing bytes)"));
  }
  if (!with_data) return f;

  f.data_.resize(static_cast<size_t>(f.data_size_));
  read_exact_fd(fd.fd, f.data_.data(), f.data_size_, 8 + n, path);
  f.has_data_ = true;
  if (!opts.file_sha256.empty()) {
    sha256 h;
    h.update(len, sizeof len);
    h.update(text);
    h.update(f.data_.data(), f.data_.size());
    const std::string got = h.hex_digest();
    if (got != opts.file_sha256) {
      fail(path, "file checksum mismatch: the checkpoint marker says " + opts.file_sha256 +
                     ", the file hashes to " + got + " (the file is corrupt)");
    }
  }
  auto it = f.metadata_.find(checksum_key);
  if (it == f.metadata_.end()) {
    if (opts.require_checksum)
      fail(path, "no sha256 checksum in __metadata__ (not written by cohort?)");
  } else {
    const std::string got = sha256_hex(f.data_.data(), f.data_.size());
    if (got != it->second) {
      fail(path, "data checksum mismatch: header says " + it->second + ", data hashes to " + got +
                     " (the file is corrupt)");
    }
  }
  return f;
}

const tensor_info* safetensors_file::find(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

const uint8_t* safetensors_file::bytes(const tensor_info& t) const {
  COHORT_CHECK(has_data_);
  COHORT_CHECK(t.end <= data_.size());
  return data_.data() + t.begin;
}

void safetensors_file::copy_into(const std::vector<tensor_target>& targets, bool exact) const {
  COHORT_CHECK(has_data_);
  std::vector<const tensor_info*> src;
  std::vector<std::string> problems;
  std::set<std::string> wanted;
  for (const auto& t : targets) {
    wanted.insert(t.name);
    const tensor_info* info = find(t.name);
    src.push_back(info);
    if (!info) {
      problems.push_back("tensor '" + t.name + "' is missing");
    } else if (info->type != t.type) {
      problems.push_back("tensor '" + t.name + "' is " + dtype_name(info->type) + ", expected " +
                         dtype_name(t.type));
    } else if (info->shape != t.shape) {
      problems.push_back("tensor '" + t.name + "' has shape " + shape_str(info->shape) +
                         ", expected " + shape_str(t.shape));
    } else if (info->end > info->begin && t.data == nullptr) {
      problems.push_back("tensor '" + t.name + "' has no destination buffer");
    }
  }
  if (exact) {
    for (const auto& t : tensors_)
      if (!wanted.count(t.name)) problems.push_back("unexpected tensor '" + t.name + "'");
  }
  if (!problems.empty()) {
    std::string msg = "does not match the expected tensors: " + problems[0];
    const size_t shown = std::min<size_t>(problems.size(), 8);
    for (size_t i = 1; i < shown; ++i) msg += "; " + problems[i];
    if (problems.size() > shown)
      msg += "; and " + std::to_string(problems.size() - shown) + " more";
    fail(path_, msg);
  }
  for (size_t i = 0; i < targets.size(); ++i) {
    const size_t n = static_cast<size_t>(src[i]->end - src[i]->begin);
    if (n) std::memcpy(targets[i].data, bytes(*src[i]), n);
  }
}

metadata_map load_safetensors(const std::string& path, const std::vector<tensor_target>& targets,
                              bool exact, const read_options& opts) {
  const safetensors_file f = safetensors_file::read(path, opts);
  f.copy_into(targets, exact);
  return f.metadata();
}

}  // namespace cohort
