#include "runtime/comm/factory.hpp"

#include <cctype>

#include "runtime/comm/device_staged_comm.hpp"
#include "runtime/comm/gloo_comm.hpp"
#include "runtime/comm/hier_comm.hpp"
#include "runtime/comm/nccl_communicator.hpp"
#include "runtime/comm/shm_comm.hpp"
#include "runtime/comm/transport_plan.hpp"
#include "runtime/core/rules.hpp"

namespace cohort::comm {

int parse_device(const std::string& device) {
  if (device == "cpu") return -1;
  if (device == "cuda") return 0;
  if (device.rfind("cuda:", 0) == 0 && device.size() > 5 && device.size() <= 8) {
    int index = 0;
    for (std::size_t i = 5; i < device.size(); ++i) {
      if (!std::isdigit(static_cast<unsigned char>(device[i]))) index = -1;
      if (index >= 0) index = index * 10 + (device[i] - '0');
    }
    if (index >= 0) return index;
  }
  throw usage_error("device '" + device + "' is not one of: cpu, cuda, cuda:N");
}

comm_backend resolve_backend(comm_backend backend, const std::string& device) {
  const bool gpu = parse_device(device) >= 0;
  switch (backend) {
    case comm_backend::automatic:
      // The host transports even for a GPU worker: the trainer stages a GPU's buckets through
      // host memory for them. NCCL stays opt-in (comm.backend: nccl) until it has been
      // measured, and its multi-rank paths run, on a real multi-GPU machine.
      return comm_backend::gloo;
    case comm_backend::gloo:
      return comm_backend::gloo;
    case comm_backend::nccl:
      if (!gpu)
        throw usage_error("comm.backend: nccl needs a CUDA device, but the device is '" + device +
                          "'; use comm.backend: gloo or auto");
      return comm_backend::nccl;
  }
  throw usage_error("comm.backend " + std::to_string(static_cast<int>(backend)) +
                    " is not one of: auto, gloo, nccl");
}

namespace {

// Rank 0's decision for a group with transport automatic, from every rank's host.
transport_plan decide_plan(const std::vector<std::string>& ids, comm_hierarchy hierarchy) {
  transport_plan p;
  p.layout = host_layout::from_identities(ids);
  if (ids.size() == 1)
    p.kind = plan_kind::gloo;
  else if (p.layout.hosts() == 1)
    p.kind = plan_kind::shm;
  else if (hierarchy == comm_hierarchy::hierarchical ||
           (hierarchy == comm_hierarchy::automatic && p.layout.max_per_host() >= 2))
    p.kind = plan_kind::hier;
  else
    p.kind = plan_kind::gloo;
  return p;
}

}  // namespace

std::unique_ptr<communicator> make_communicator(comm_backend backend, const std::string& device,
                                                kv_client& kv, int rank, int size,
                                                std::uint64_t generation, int timeout_ms,
                                                const transport_options& transport) {
  if (timeout_ms <= 0) throw usage_error("communicator timeout must be > 0 ms");
  const std::chrono::milliseconds timeout(timeout_ms);
  const std::chrono::milliseconds rendezvous_timeout(
      transport.rendezvous_timeout_ms > 0 ? transport.rendezvous_timeout_ms : timeout_ms);
  if (transport.cancel) transport.cancel->check("build of group '" + transport.group + "'");
  if (!transport.member.device.empty()) {
    // Before any backend: a mixed group would otherwise fail apart (a CPU member cannot
    // join NCCL) or, worse, train on with replicas that drift.
    check_group_devices(kv, generation, transport.group, rank, size, transport.member,
                        rendezvous_timeout);
    transport_options checked = transport;
    checked.member = group_member{};
    return make_communicator(backend, device, kv, rank, size, generation, timeout_ms, checked);
  }
  if (resolve_backend(backend, device) == comm_backend::nccl) {
    // The gradients are device memory; the step's control path passes host memory through
    // the same group (the counters after a state transfer): that goes through a device scratch.
    const int index = parse_device(device);
    return std::make_unique<device_staged_comm>(
        std::make_unique<nccl_communicator>(kv, generation, rank, size, index, timeout,
                                            rendezvous_timeout, transport.group + "/nccl"),
        gpu_staging_memory(index));
  }
  if (!rules::hierarchy_fits_transport(transport.hierarchy, transport.transport))
    throw usage_error(
        "comm.hierarchy: hierarchical combines shared memory and Gloo, so it needs "
        "comm.transport: auto (it is '" +
        std::string(to_string(transport.transport)) + "')");
  transport_plan plan;
  switch (transport.transport) {
    case comm_transport::gloo:
      plan.kind = plan_kind::gloo;
      break;
    case comm_transport::shm:
      plan.kind = plan_kind::shm;
      break;
    case comm_transport::automatic: {
      // Every rank says where it runs; rank 0 decides for the group and publishes the plan
      // as a versioned record (transport_plan.hpp), which every other rank reads back.
      const auto key = [&](const std::string& k) {
        return generation_key(generation, transport.group + "/transport/" + k);
      };
      const std::string me = transport.host_id.empty() ? host_identity() : transport.host_id;
      if (rank == 0) {
        std::vector<std::string> ids{me};
        for (int r = 1; r < size; ++r) {
          const std::vector<char> v = kv.get(key("host/" + std::to_string(r)), rendezvous_timeout);
          ids.emplace_back(v.begin(), v.end());
        }
        plan = decide_plan(ids, transport.hierarchy);
        kv.set(key("kind"), encode_plan(plan));
      } else {
        kv.set(key("host/" + std::to_string(rank)), std::vector<char>(me.begin(), me.end()));
        if (transport.cancel) transport.cancel->check("build of group '" + transport.group + "'");
        plan = decode_plan(kv.get(key("kind"), rendezvous_timeout), size);
      }
      break;
    }
  }
  if (plan.kind == plan_kind::hier) {
    // This host's ranks over shared memory, then (on the host's leader) the leaders over
    // Gloo; non-leaders never meet the other hosts.
    host_layout& layout = plan.layout;
    const int host = layout.host_of[rank];
    transport_options local = transport;
    local.transport = comm_transport::shm;
    local.hierarchy = comm_hierarchy::flat;
    local.group = transport.group + "/host" + std::to_string(host);
    auto local_comm = make_communicator(backend, device, kv, layout.local_rank(rank),
                                        static_cast<int>(layout.ranks_of(host).size()), generation,
                                        timeout_ms, local);
    std::unique_ptr<communicator> leaders;
    if (layout.local_rank(rank) == 0) {
      transport_options lead = transport;
      lead.transport = comm_transport::gloo;
      lead.hierarchy = comm_hierarchy::flat;
      lead.group = transport.group + "/leaders";
      leaders = make_communicator(backend, device, kv, host, layout.hosts(), generation, timeout_ms,
                                  lead);
    }
    return std::make_unique<hier_comm>(rank, std::move(layout), std::move(local_comm),
                                       std::move(leaders));
  }
  if (plan.kind == plan_kind::shm) {
    shm_options o;
    o.prefix = transport.group + "/shm";
    o.timeout = timeout;
    o.rendezvous_timeout = rendezvous_timeout;
    o.cancel = transport.cancel;
    return std::make_unique<shm_comm>(kv, generation, rank, size, o);
  }
  // The store adapter is needed only while gloo_comm connects.
  kv_gloo_store store(kv, generation, rendezvous_timeout);
  gloo_options o;
  o.prefix = transport.group + "/gloo";
  o.timeout = timeout;
  o.rendezvous_timeout = rendezvous_timeout;
  o.hostname = transport.hostname;
  o.iface = transport.iface;
  o.cancel = transport.cancel;
  return std::make_unique<gloo_comm>(store, rank, size, o);
}

}  // namespace cohort::comm
