// Picks and builds the communicator of a group for one generation: `comm.backend: auto |
// gloo | nccl` and the worker's device decide between Gloo (TCP, host memory) and NCCL
// (GPU memory); on the CPU, `comm.transport` and `comm.hierarchy` with the ranks' hosts
// decide between Gloo, shared memory and the two combined per host. Owns that choice
// only; the backends are gloo_comm, shm_comm, hier_comm and nccl_communicator.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "runtime/comm/build_abort.hpp"
#include "runtime/comm/communicator.hpp"
#include "runtime/comm/group_devices.hpp"
#include "runtime/comm/kv_client.hpp"
#include "runtime/core/comm_choices.hpp"

namespace cohort::comm {

/// How a group reaches its peers beyond backend and timeout (defaults fit one machine).
struct transport_options {
  /// Name of the group inside a generation ("dp", "tp", ...): keys are
  /// gen/<g>/<group>/gloo/... or gen/<g>/<group>/nccl/unique_id.
  std::string group = "dp";
  std::string hostname = "127.0.0.1";  ///< Gloo: address to listen on and advertise
  std::string iface;                   ///< Gloo: interface instead of hostname
  int rendezvous_timeout_ms = 0;       ///< 0: timeout_ms (peers may start later)
  /// CPU groups: gloo (TCP), shm (shared memory: every rank on this host), or automatic
  /// (shm when every rank of the group has this host's identity, else gloo; decided by
  /// rank 0 and sent to the others as a transport_plan, so every rank builds the same kind).
  comm_transport transport = comm_transport::gloo;
  /// Only with transport automatic, for a group whose ranks span several hosts: flat (one
  /// Gloo group over every rank), hierarchical (shared memory inside each host, Gloo among
  /// one leader per host: hier_comm), or automatic (hierarchical when some host holds two
  /// or more of the group's ranks, else flat). Decided by rank 0 with the transport.
  comm_hierarchy hierarchy = comm_hierarchy::automatic;
  /// This rank's host for "same host" decisions; empty: host_identity() (host name,
  /// network namespace, boot id). Ranks with equal ids must really share /dev/shm.
  std::string host_id;
  /// Optional: aborting it from another thread ends the build with comm_error(aborted).
  /// Gloo: at once, in the rendezvous or a TCP connect. NCCL: checked before the build
  /// (its init is bounded by the rendezvous timeout; see docs/collectives.md).
  std::shared_ptr<build_abort> cancel;
  /// Who this rank is and the device it computes on, for the group's device check
  /// (group_devices.hpp) before anything is built: a group whose members compute on
  /// different kinds of device is refused on every member. Empty device: no check (lanes
  /// and subgroups of a group already checked, tools that build host groups).
  group_member member;
};

/// The CUDA device index `device` names: -1 for "cpu", N for "cuda:N" (and 0 for
/// "cuda"). Throws usage_error for anything else.
int parse_device(const std::string& device);

/// The backend `backend` resolves to on `device`: gloo or nccl. automatic is always the host
/// transports (gloo here; comm.transport picks Gloo or shared memory): NCCL is opt-in.
/// Throws usage_error for nccl on a CPU device or a bad device.
comm_backend resolve_backend(comm_backend backend, const std::string& device);

/// Builds this rank's communicator for `generation`, rendezvousing through `kv` (blocks
/// until every rank has joined). `timeout_ms` bounds every collective (config-derived,
/// never a library default). Throws usage_error (bad backend/device, a hierarchy the
/// transport leaves no room for) or comm_error (a plan record it cannot read among them).
std::unique_ptr<communicator> make_communicator(comm_backend backend, const std::string& device,
                                                kv_client& kv, int rank, int size,
                                                std::uint64_t generation, int timeout_ms,
                                                const transport_options& transport = {});

}  // namespace cohort::comm
