// The compressed sum of a float buffer over a communicator, with worker and server error
// feedback (DeepSpeed's compressed allreduce, generalised to every wire format): each rank
// encodes chunk j of its contribution for rank j, an alltoall hands every chunk to its
// owner, the owner decodes and adds the ranks' chunks in fp32 in rank order, encodes the
// sum once more, and an allgather gives everyone every chunk. Owns the algorithm and the
// layout of the error memory; not the memory itself (training state, held by the seat)
// nor the formats (runtime/comm/compress.hpp).
//
// On a hierarchical communicator the same algorithm runs, its alltoall and allgather routed
// through the host leaders: the slow links carry encoded bytes, and the result, the chunks
// and the error memory are the flat group's, whichever ranks share a host.
#pragma once
#include <cstddef>

#include "runtime/comm/communicator.hpp"
#include "runtime/comm/compress.hpp"

namespace cohort::comm {

/// Where a buffer's error feedback lives: two buffers the same length as the summed data,
/// indexed like it (null: no error feedback). `worker`: what this rank's contributions lost
/// when it encoded them. `server`: what the sums of the chunks this rank owns lost when it
/// encoded them again; only the positions of those chunks are used (chunk j of a buffer of
/// n elements over W ranks is [n*j/W, n*(j+1)/W)), the others stay 0. Both are in the
/// units of the sum: the result plus every rank's worker and server error is the exact sum
/// of what was fed in since the memory was zero.
struct error_memory {
  float* worker = nullptr;
  float* server = nullptr;
};

/// Chunk j of n elements over `ranks` ranks: [chunk_begin(n, ranks, j), chunk_begin(.., j + 1)).
std::size_t chunk_begin(std::size_t n, int ranks, int j);

/// In place: data becomes the sum over ranks of every rank's data, travelling as `format`
/// (each rank's chunks once, their sums once). Every rank ends with the same bits; for a
/// given group size and rank order the result does not depend on timing (sums in rank
/// order; nor on which ranks share a host). f32 without error memory is a plain allreduce_sum. A
/// group of one sends nothing and leaves data (and the error memory) as they are. Throws comm_error
/// like the communicator's own calls.
void compressed_allreduce_sum(communicator& c, float* data, std::size_t n, wire_format format,
                              error_memory memory = {});

/// In place: data becomes the sum over ranks, by the algorithm above at f32 without error
/// memory: each chunk's owner adds the ranks' parts in rank order. The bytes of a ring
/// allreduce; the same bits on every backend and host layout for one group size and rank
/// order (a ring's, shared memory's and the hierarchy's float sums each have their own
/// order). What bitwise jobs whose buffer is float (compression, 1-bit Adam) sum their
/// plain stretches with. A group of one leaves data as it is.
void ordered_allreduce_sum(communicator& c, float* data, std::size_t n);

/// Bytes this rank hands to the transport for one compressed_allreduce_sum of n elements
/// over a flat group of `ranks` (the alltoall and the allgather, each sending ranks - 1 of
/// its ranks blocks): what busbw-equivalent figures and the tests' expectations use.
std::size_t compressed_bytes_sent(wire_format format, std::size_t n, int ranks);

}  // namespace cohort::comm
