// NCCL on the stand-in GPU (tests/nn/shifted_device.hpp), for tests of the paths that hand
// a communicator device memory: stand_in_nccl wraps the fake NCCL communicator
// (tests/comm/fake_device_comm.hpp) and, like NCCL, reads device memory only (through its
// real address), counting any host pointer that reaches it; stand_in_memory is the staging
// memory device_staged_comm takes on the stand-in.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "runtime/comm/communicator.hpp"
#include "runtime/comm/device_staged_comm.hpp"
#include "tests/comm/fake_device_comm.hpp"
#include "tests/nn/shifted_device.hpp"

namespace cohort::test {

inline constexpr std::uintptr_t kShift = test::shifted_device::shift;
inline bool on_device(const void* p) { return reinterpret_cast<std::uintptr_t>(p) >= kShift; }
template <class T>
T* real(T* p) {
  return reinterpret_cast<T*>(reinterpret_cast<std::uintptr_t>(p) - kShift);
}

// What NCCL does with a pointer, on the stand-in: device memory is read (through its real
// address); a host pointer would be an illegal address on a GPU, so it is counted (and used
// as it is, so that the count, not a crash, reports it).
class stand_in_nccl : public comm::communicator {
 public:
  explicit stand_in_nccl(std::shared_ptr<comm::testing::fake_device_comm> c) : c_(std::move(c)) {}
  int rank() const override { return c_->rank(); }
  int size() const override { return c_->size(); }
  const char* backend() const override { return "nccl"; }
  void allreduce_sum(float* d, std::size_t n) override { c_->allreduce_sum(at(d), n); }
  void allreduce_sum(std::int64_t* d, std::size_t n) override { c_->allreduce_sum(at(d), n); }
  void allgather(const void* s, void* r, std::size_t b) override { c_->allgather(at(s), at(r), b); }
  void alltoall(const void* s, void* r, std::size_t b) override { c_->alltoall(at(s), at(r), b); }
  void broadcast(void* d, std::size_t b, int root) override { c_->broadcast(at(d), b, root); }
  void barrier() override { c_->barrier(); }
  void abort() override { c_->abort(); }
  void interrupt() override { c_->interrupt(); }
  bool can_shrink() const override { return c_->can_shrink(); }
  /// The fake's ncclCommShrink, the result on the stand-in too.
  std::unique_ptr<comm::communicator> shrink(const std::vector<int>& excluded, bool abort_parent,
                                             int) override {
    if (!c_->can_shrink()) return nullptr;
    return std::make_unique<stand_in_nccl>(c_->shrink(excluded, abort_parent));
  }
  bool dead() const override { return c_->dead(); }
  comm::comm_traffic traffic() const override { return {}; }
  int host_pointers = 0;

 private:
  template <class T>
  T* at(T* p) {
    if (on_device(p)) return real(p);
    ++host_pointers;
    return p;
  }
  std::shared_ptr<comm::testing::fake_device_comm> c_;
};

// The stand-in's memory for the staging scratch.
inline comm::staging_memory stand_in_memory() {
  comm::staging_memory m;
  m.is_device = [](const void* p) { return on_device(p); };
  m.allocate = [](std::size_t n) {
    return reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(std::malloc(n)) + kShift);
  };
  m.release = [](void* p) { std::free(real(p)); };
  m.to_device = [](void* d, const void* h, std::size_t n) { std::memcpy(real(d), h, n); };
  m.to_host = [](void* h, const void* d, std::size_t n) { std::memcpy(h, real(d), n); };
  return m;
}

}  // namespace cohort::test
