// Host memory given back to the kernel page by page while its addresses stay reserved:
// sharded gradients (train.zero: 2) keep one flat buffer that backward writes and views
// point into, yet hold in RAM only the ranges this worker owns, as FSDP frees what it does
// not own. Private anonymous memory (what malloc and aligned_alloc hand out) reads back as
// zeros after MADV_DONTNEED and takes a page again only when written.
#pragma once
#include <cstddef>
#include <utility>
#include <vector>

namespace cohort {

/// The bytes of [P, P + BYTES) become zeros: the whole pages inside are given back to the
/// kernel (read back as zeros, taken again when written), the partial pages at the two
/// ends are written with zeros. Falls back to writing zeros where the kernel refuses.
void zero_by_release(void* p, std::size_t bytes);
/// Zeros N elements of ELEMENT_BYTES at P: the elements inside KEEP (sorted, disjoint
/// [begin, end) element ranges, memory kept: written with zeros), and the rest by giving its
/// pages back (zero_by_release), so that a buffer whose kept ranges stay in RAM costs no page
/// faults for them, and what lies outside takes no memory until written.
void zero_keeping(void* p, std::size_t element_bytes, std::size_t n,
                  const std::vector<std::pair<std::size_t, std::size_t>>& keep);
/// The whole pages inside [P, P + BYTES) are given back; what they held is lost (they read
/// as zeros). Partial pages at the ends keep their bytes. For memory whose values are dead.
void release_pages(void* p, std::size_t bytes);
/// Bytes of [P, P + BYTES) in RAM now (mincore, whole pages: the partial ones at the ends
/// count whole); -1 where the kernel cannot say.
long long resident_bytes(const void* p, std::size_t bytes);

}  // namespace cohort
