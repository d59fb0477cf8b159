// The safetensors file format (the Hugging Face layout PyTorch loads with
// safetensors.torch.load_file): atomic checksummed writes and fully validated reads over
// plain named buffers. Knows nothing of models, optimizers or what the tensors mean.
// Layout: u64 little-endian N | N bytes of JSON header | data (little-endian, no gaps).
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace cohort {

/// Element types of the format (the JSON "dtype" strings are F64, F32, F16, BF16, I64,
/// I32, I16, I8, U8, BOOL).
enum class dtype : uint8_t { f64, f32, f16, bf16, i64, i32, i16, i8, u8, boolean };

/// The header string of `t` ("F32").
const char* dtype_name(dtype t);
/// Bytes per element of `t`.
size_t dtype_size(dtype t);

/// A tensor to write: `data` points at prod(shape) elements of `type` in host order.
struct tensor_view {
  std::string name;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  dtype type = dtype::f32;
};

/// Where a read tensor goes: the file must hold `name` with exactly this type and shape;
/// `data` has room for prod(shape) elements.
struct tensor_target {
  std::string name;
  std::vector<int64_t> shape;
  void* data = nullptr;
  dtype type = dtype::f32;
};

/// One tensor as the header describes it; offsets are into the data section.
struct tensor_info {
  std::string name;
  dtype type = dtype::f32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

using metadata_map = std::map<std::string, std::string>;

/// Header fields the writer owns: the SHA-256 (hex) of the data section.
inline constexpr const char* checksum_key = "sha256";
/// Largest header accepted (the reference implementation's limit is 100 MB as well).
inline constexpr uint64_t max_header_bytes = 100u << 20;

/// Size and SHA-256 (hex) of a whole file as written: what a checkpoint's marker records.
struct written_file {
  uint64_t bytes = 0;
  std::string sha256;
};

/// Writes `tensors` (in name order) and `metadata` plus metadata["sha256"] to `path`
/// atomically: a temporary `path.tmp.<pid>` is written, fsynced and renamed over `path`,
/// then the folder is fsynced. The file is its owner's only (mode 0600). On any failure `path` is
/// untouched, the temporary is removed and a checkpoint_error names the file and the cause. Names
/// must be unique and non-empty; "sha256" is reserved in metadata. Returns the size and SHA-256 of
/// the whole file.
written_file write_safetensors(const std::string& path, const std::vector<tensor_view>& tensors,
                               const metadata_map& metadata = {});

/// What to demand of a file when reading it.
struct read_options {
  /// Refuse files without metadata["sha256"] (files from other writers lack it).
  bool require_checksum = true;
  /// When set, the SHA-256 (hex) the whole file must have (from a checkpoint's marker);
  /// a mismatch is a checkpoint_error, checked before anything is returned.
  std::string file_sha256;
};

/// A safetensors file read whole and validated: header length against the file size,
/// JSON, every dtype, shape and offset (contiguous, in bounds, no overlap, size =
/// prod(shape) * dtype size, overflow-safe) and the checksum. Every problem is a
/// checkpoint_error naming the file and what is wrong.
class safetensors_file {
 public:
  /// Reads and validates `path`.
  static safetensors_file read(const std::string& path, const read_options& opts = {});
  /// Reads and validates only the header (no data, no checksum): cheap inspection.
  static safetensors_file read_header(const std::string& path);

  const std::string& path() const { return path_; }
  const metadata_map& metadata() const { return metadata_; }
  /// Tensors in data order.
  const std::vector<tensor_info>& tensors() const { return tensors_; }
  /// The tensor called `name`, or null.
  const tensor_info* find(const std::string& name) const;
  /// Raw little-endian bytes of `t` (only after read(), not read_header()).
  const uint8_t* bytes(const tensor_info& t) const;

  /// Checks every target (present, same dtype, same shape) and, only if all pass, copies
  /// them all. When `exact` is set, tensors of the file that no target names are an error.
  void copy_into(const std::vector<tensor_target>& targets, bool exact = false) const;

 private:
  static safetensors_file load(const std::string& path, bool with_data, const read_options& opts);

  std::string path_;
  metadata_map metadata_;
  std::vector<tensor_info> tensors_;
  std::vector<uint8_t> data_;  ///< the data section (empty after read_header)
  uint64_t data_size_ = 0;
  bool has_data_ = false;
};

/// Reads `path`, validates it and the targets, then fills the targets; returns the
/// metadata. Nothing is copied unless everything checks out.
metadata_map load_safetensors(const std::string& path, const std::vector<tensor_target>& targets,
                              bool exact = false, const read_options& opts = {});

}  // namespace cohort
