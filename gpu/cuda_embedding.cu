// CUDA twin of the embedding ops of runtime/cpu/linear.cpp (declared in gpu/cuda_kernels.hpp):
// the gather, and a deterministic backward. Token ids repeat, so rows of dwte are shared
// between positions; instead of float atomics (whose order varies run to run) the positions
// are sorted by token id with CUB's stable radix sort and each (run of one id, channel) is
// summed by one thread in ascending position order: the CPU twin's order, hence its bits.
#include <cuda_runtime.h>

#include <cub/device/device_radix_sort.cuh>
#include <limits>

#include "gpu/cuda_common.cuh"
#include "gpu/cuda_kernels.hpp"

namespace cohort::gpu::cuda {

// The launch geometry and host helpers of gpu/cuda_common.cuh.
using namespace detail;

namespace {

__global__ void embedding_fwd_kernel(float* out, const int32_t* ids, const float* wte,
                                     const float* wpe, int t, int c, int64_t n) {
  COHORT_GRID_STRIDE(i, n) {
    const int64_t row = i / c;
    const int k = static_cast<int>(i % c);
    float e = wte[static_cast<int64_t>(ids[row]) * c + k];
    if (wpe) e += wpe[(row % t) * c + k];
    out[i] = e;
  }
}

__global__ void iota_kernel(int32_t* v, int n) {
  COHORT_GRID_STRIDE(i, n) { v[i] = static_cast<int32_t>(i); }
}

// One thread per (sorted index k, channel), n*c in all: the thread at the first k of a run of
// equal ids walks the run (positions ascending: the sort is stable and its input was
// 0, 1, ..., n-1) and adds those rows of dout onto dwte's old value one at a time, exactly
// as the CPU twin's row loop does; the others return at once. Threads of a warp share k and
// read adjacent channels (coalesced). A run of r repeats costs its threads r serial adds.
__global__ void embedding_bwd_wte_kernel(float* dwte, const float* dout, const int32_t* ids_sorted,
                                         const int32_t* pos_sorted, int n, int c) {
  COHORT_GRID_STRIDE(i, static_cast<int64_t>(n) * c) {
    const int k = static_cast<int>(i / c);
    const int ch = static_cast<int>(i % c);
    const int32_t id = ids_sorted[k];
    if (k > 0 && ids_sorted[k - 1] == id) continue;  // not the start of a run
    float* g = dwte + static_cast<int64_t>(id) * c + ch;
    float acc = *g;
    for (int r = k; r < n && ids_sorted[r] == id; ++r)
      acc += dout[static_cast<int64_t>(pos_sorted[r]) * c + ch];
    *g = acc;
  }
}

// Position j only ever receives rows (bi, j): one thread per (j, channel) adds them onto
// dwpe's old value in batch order, the CPU twin's order (same bits), no atomics needed.
__global__ void embedding_bwd_wpe_kernel(float* dwpe, const float* dout, int b, int t, int c) {
  COHORT_GRID_STRIDE(i, static_cast<int64_t>(t) * c) {
    float acc = dwpe[i];
    for (int bi = 0; bi < b; ++bi) acc += dout[static_cast<int64_t>(bi) * t * c + i];
    dwpe[i] = acc;
  }
}

constexpr std::size_t align256(std::size_t x) { return (x + 255) / 256 * 256; }

// Sorts the n positions by token id into the thread's scratch and runs the dwte kernel; the
// lease keeps the scratch until the kernel is queued.
status embedding_bwd_wte(float* dwte, const float* dout, const int32_t* ids, int n, int c) {
  std::size_t temp_bytes = 0;
  // Size query only (no work, no stream use): CUB's temporary storage for n pairs.
  if (status s = from_cuda(
          cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, ids, static_cast<int32_t*>(nullptr),
                                          static_cast<const int32_t*>(nullptr),
                                          static_cast<int32_t*>(nullptr), n, 0, 32, stream()),
          "cub::DeviceRadixSort::SortPairs (size query)");
      s != status::ok)
    return s;
  // Layout: CUB's storage, then sorted ids, positions in, positions out (256-byte aligned).
  const std::size_t arr = align256(sizeof(int32_t) * static_cast<std::size_t>(n));
  const std::size_t off_keys = align256(temp_bytes);
  scratch_lease lease(scratch_use::embedding_sort);
  void* base = nullptr;
  if (status s = lease.acquire(off_keys + 3 * arr, &base); s != status::ok) return s;
  char* p = static_cast<char*>(base);
  int32_t* ids_sorted = reinterpret_cast<int32_t*>(p + off_keys);
  int32_t* pos_in = reinterpret_cast<int32_t*>(p + off_keys + arr);
  int32_t* pos_sorted = reinterpret_cast<int32_t*>(p + off_keys + 2 * arr);
  iota_kernel<<<blocks_for(n), k_threads, 0, stream()>>>(pos_in, n);
  if (status s = launched("iota_kernel"); s != status::ok) return s;
  if (status s = from_cuda(cub::DeviceRadixSort::SortPairs(base, temp_bytes, ids, ids_sorted,
                                                           pos_in, pos_sorted, n, 0, 32, stream()),
                           "cub::DeviceRadixSort::SortPairs");
      s != status::ok)
    return s;
  embedding_bwd_wte_kernel<<<blocks_for(static_cast<int64_t>(n) * c), k_threads, 0, stream()>>>(
      dwte, dout, ids_sorted, pos_sorted, n, c);
  return launched("embedding_bwd_wte_kernel");
}

}  // namespace

status embedding_fwd(float* out, const int32_t* ids, const float* wte, const float* wpe, int b,
                     int t, int c) {
  if (b < 0 || t < 0 || c < 0) return record(bad("embedding_fwd: negative size"));
  const int64_t n = static_cast<int64_t>(b) * t * c;
  if (n == 0) return record(status::ok);
  embedding_fwd_kernel<<<blocks_for(n), k_threads, 0, stream()>>>(out, ids, wte, wpe, t, c, n);
  return record(launched("embedding_fwd_kernel"));
}

status embedding_bwd(float* dwte, float* dwpe, const float* dout, const int32_t* ids, int b, int t,
                     int c) {
  if (b < 0 || t < 0 || c < 0) return record(bad("embedding_bwd: negative size"));
  const int64_t positions = static_cast<int64_t>(b) * t;
  if (positions > std::numeric_limits<int>::max())
    return record(bad("embedding_bwd: b*t beyond 2^31 - 1 positions"));
  if (positions == 0 || c == 0) return record(status::ok);
  if (status s = embedding_bwd_wte(dwte, dout, ids, static_cast<int>(positions), c);
      s != status::ok)
    return record(s);
  if (dwpe == nullptr) return record(status::ok);
  embedding_bwd_wpe_kernel<<<blocks_for(static_cast<int64_t>(t) * c), k_threads, 0, stream()>>>(
      dwpe, dout, b, t, c);
  return record(launched("embedding_bwd_wpe_kernel"));
}

}  // namespace cohort::gpu::cuda
