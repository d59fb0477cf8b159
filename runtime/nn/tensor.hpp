// Tensors: a shape plus a view into pool-backed storage on the pool's device (float32 for
// values, int32 for token ids and labels). Owns shape bookkeeping and storage lifetime;
// does not do arithmetic (layers call their device's kernels on data()) and never reallocates.
// data() is a device pointer on a GPU: only host_visible() tensors may be indexed.
#pragma once
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "runtime/core/error.hpp"
#include "runtime/nn/device.hpp"
#include "runtime/nn/pool.hpp"

namespace cohort::nn {

using shape_t = std::vector<int64_t>;

/// Elements in a shape (1 for the empty shape, a scalar).
inline int64_t shape_numel(const shape_t& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

/// "[2, 3]" for messages.
inline std::string shape_str(const shape_t& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

/// A dense row-major tensor of T. Copies share storage (like a view); the pages go back to
/// the pool when the last tensor using them is destroyed. Fresh tensors are zero-filled.
template <class T>
class basic_tensor {
 public:
  basic_tensor() = default;
  /// New zero-filled storage from `p`.
  explicit basic_tensor(shape_t shape, pool& p = pool::global())
      : dev_(&p.dev()), shape_(std::move(shape)), numel_(shape_numel(shape_)) {
    COHORT_CHECK(numel_ >= 0);
    storage_ = std::make_shared<allocation>(p.allocate(numel_ * sizeof(T)));
    data_ = static_cast<T*>(storage_->data());
    zero();
  }
  basic_tensor(std::initializer_list<int64_t> shape, pool& p = pool::global())
      : basic_tensor(shape_t(shape), p) {}

  T* data() { return data_; }
  const T* data() const { return data_; }
  int64_t numel() const { return numel_; }
  std::size_t bytes() const { return static_cast<std::size_t>(numel_) * sizeof(T); }
  const shape_t& shape() const { return shape_; }
  int64_t dim(std::size_t i) const { return shape_.at(i); }
  std::size_t ndim() const { return shape_.size(); }
  bool empty() const { return data_ == nullptr; }
  /// The device the elements live on.
  device& dev() const { return dev_ ? *dev_ : cpu_device(); }
  /// True when the host may index the elements (operator[], fill).
  bool host_visible() const { return dev().host_visible(); }

  T& operator[](int64_t i) { return data_[i]; }
  const T& operator[](int64_t i) const { return data_[i]; }

  /// Sets every element to zero.
  void zero() {
    if (numel_ > 0) dev().zero(data_, bytes());
  }
  /// Sets every element to v.
  void fill(T v) {
    if (host_visible()) {
      for (int64_t i = 0; i < numel_; ++i) data_[i] = v;
      return;
    }
    const std::vector<T> host(static_cast<std::size_t>(numel_), v);
    dev().from_host(data_, host.data(), bytes());
  }
  /// The elements, copied to the host.
  std::vector<T> to_vector() const {
    std::vector<T> out(static_cast<std::size_t>(numel_));
    if (numel_ > 0) dev().to_host(out.data(), data_, bytes());
    return out;
  }
  /// Copies numel() elements from host memory.
  void copy_from_host(const T* host) {
    if (numel_ > 0) dev().from_host(data_, host, bytes());
  }
  /// A tensor of `shape` over elements [offset, offset + numel(shape)) of this one,
  /// sharing its storage.
  basic_tensor view(int64_t offset, shape_t shape) const {
    basic_tensor v;
    v.numel_ = shape_numel(shape);
    COHORT_CHECK(offset >= 0 && offset + v.numel_ <= numel_);
    v.shape_ = std::move(shape);
    v.storage_ = storage_;
    v.dev_ = dev_;
    v.data_ = data_ + offset;
    return v;
  }
  /// The same elements under another shape with the same numel.
  basic_tensor reshape(shape_t shape) const {
    COHORT_CHECK(shape_numel(shape) == numel_);
    return view(0, std::move(shape));
  }
  /// Copies the elements of `src` (same numel) into this tensor.
  void copy_from(const basic_tensor& src) {
    COHORT_CHECK(src.numel_ == numel_ && &src.dev() == &dev());
    if (numel_ > 0) dev().copy(data_, src.data_, bytes());
  }

 private:
  std::shared_ptr<allocation> storage_;
  device* dev_ = nullptr;  // null: an empty tensor (the CPU's)
  T* data_ = nullptr;
  shape_t shape_;
  int64_t numel_ = 0;
};

using tensor = basic_tensor<float>;     ///< activations, parameters, gradients
using itensor = basic_tensor<int32_t>;  ///< token ids, labels

/// T's first N elements where the host reads them: T's own memory on the CPU, else a copy
/// in COPY.
inline const float* on_host(const tensor& t, int64_t n, std::vector<float>& copy) {
  if (t.host_visible()) return t.data();
  copy.resize(static_cast<std::size_t>(n));
  t.dev().to_host(copy.data(), t.data(), static_cast<std::size_t>(n) * sizeof(float));
  return copy.data();
}

}  // namespace cohort::nn
