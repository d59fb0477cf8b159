#include "runtime/comm/factory.hpp"

#include <cctype>

#include "runtime/comm/gloo_comm.hpp"
#include "runtime/comm/hier_comm.hpp"
#include "runtime/comm/nccl_communicator.hpp"
#include "runtime/comm/shm_comm.hpp"
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

std::string resolve_backend(const std::string& backend, const std::string& device) {
  const bool gpu = parse_device(device) >= 0;
  if (backend == "auto") return gpu ? "nccl" : "gloo";
  if (backend == "gloo") return "gloo";
  if (backend == "nccl") {
    if (!gpu)
      throw usage_error("comm.backend: nccl needs a CUDA device, but the device is '" + device +
                        "'; use comm.backend: gloo or auto");
    return "nccl";
  }
  throw usage_error("comm.backend '" + backend + "' is not one of: auto, gloo, nccl");
}

std::unique_ptr<communicator> make_communicator(const std::string& backend,
                                                const std::string& device, kv_client& kv, int rank,
                                                int size, std::uint64_t generation, int timeout_ms,
                                                const transport_options& transport) {
  if (timeout_ms <= 0) throw usage_error("communicator timeout must be > 0 ms");
  const std::chrono::milliseconds timeout(timeout_ms);
  const std::chrono::milliseconds rendezvous_timeout(
      transport.rendezvous_timeout_ms > 0 ? transport.rendezvous_timeout_ms : timeout_ms);
  if (transport.cancel) transport.cancel->check("build of group '" + transport.group + "'");
  if (resolve_backend(backend, device) == "nccl")
    return std::make_unique<nccl_communicator>(kv, generation, rank, size, parse_device(device),
                                               timeout, rendezvous_timeout,
                                               transport.group + "/nccl");
  if (transport.hierarchy != "auto" && transport.hierarchy != "flat" &&
      transport.hierarchy != "hierarchical")
    throw usage_error("comm.hierarchy '" + transport.hierarchy +
                      "' is not one of: auto, flat, hierarchical");
  if (!rules::hierarchy_fits_transport(transport.hierarchy, transport.transport))
    throw usage_error(
        "comm.hierarchy: hierarchical combines shared memory and Gloo, so it needs "
        "comm.transport: auto (it is '" +
        transport.transport + "')");
  std::string transport_kind = transport.transport;
  host_layout layout;
  if (transport_kind == "auto") {
    // Every rank says where it runs; rank 0 decides for the group and publishes the plan:
    // "shm", "gloo" or "hier:<host of each rank>".
    const auto key = [&](const std::string& k) {
      return generation_key(generation, transport.group + "/transport/" + k);
    };
    const std::string me = transport.host_id.empty() ? host_identity() : transport.host_id;
    std::string plan;
    if (rank == 0) {
      std::vector<std::string> ids{me};
      for (int r = 1; r < size; ++r) {
        const std::vector<char> v = kv.get(key("host/" + std::to_string(r)), rendezvous_timeout);
        ids.emplace_back(v.begin(), v.end());
      }
      layout = host_layout::from_identities(ids);
      if (size == 1)
        plan = "gloo";
      else if (layout.hosts() == 1)
        plan = "shm";
      else if (transport.hierarchy == "hierarchical" ||
               (transport.hierarchy == "auto" && layout.max_per_host() >= 2))
        plan = "hier:" + layout.to_text();
      else
        plan = "gloo";
      kv.set(key("kind"), std::vector<char>(plan.begin(), plan.end()));
    } else {
      kv.set(key("host/" + std::to_string(rank)), std::vector<char>(me.begin(), me.end()));
      if (transport.cancel) transport.cancel->check("build of group '" + transport.group + "'");
      const std::vector<char> v = kv.get(key("kind"), rendezvous_timeout);
      plan.assign(v.begin(), v.end());
    }
    transport_kind = plan.rfind("hier:", 0) == 0 ? "hier" : plan;
    if (transport_kind == "hier" && rank != 0) layout = host_layout::parse(plan.substr(5), size);
  }
  if (transport_kind == "hier") {
    // This host's ranks over shared memory, then (on the host's leader) the leaders over
    // Gloo; non-leaders never meet the other hosts.
    const int host = layout.host_of[rank];
    transport_options local = transport;
    local.transport = "shm";
    local.hierarchy = "flat";
    local.group = transport.group + "/host" + std::to_string(host);
    auto local_comm = make_communicator(backend, device, kv, layout.local_rank(rank),
                                        static_cast<int>(layout.ranks_of(host).size()), generation,
                                        timeout_ms, local);
    std::unique_ptr<communicator> leaders;
    if (layout.local_rank(rank) == 0) {
      transport_options lead = transport;
      lead.transport = "gloo";
      lead.hierarchy = "flat";
      lead.group = transport.group + "/leaders";
      leaders = make_communicator(backend, device, kv, host, layout.hosts(), generation, timeout_ms,
                                  lead);
    }
    return std::make_unique<hier_comm>(rank, std::move(layout), std::move(local_comm),
                                       std::move(leaders));
  }
  if (transport_kind == "shm") {
    shm_options o;
    o.prefix = transport.group + "/shm";
    o.timeout = timeout;
    o.rendezvous_timeout = rendezvous_timeout;
    o.cancel = transport.cancel;
    return std::make_unique<shm_comm>(kv, generation, rank, size, o);
  }
  if (transport_kind != "gloo")
    throw usage_error("comm.transport '" + transport.transport +
                      "' is not one of: auto, gloo, shm");
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
